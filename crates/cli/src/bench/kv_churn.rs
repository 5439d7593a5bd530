//! `cairn bench kv`'s memory under churn: the same sequence of writes and deletes,
//! applied to `cairn-kv`, to `redis-server` (no persistence) and to a `HashMap` of
//! boxed values on the system allocator; each one's resident memory over the live
//! data (keys and values) at the end.
//!
//! * **Nibble's size-change patterns** (`60-70`, `1000-1024`, `1000-1030`, `1024-10240`):
//!   fill `--churn-bytes` of live data with objects of the first size, delete 90% of
//!   them at random, then fill with objects of the second size until the live data is
//!   back at `--churn-bytes`.
//! * **Postmark-like** (`postmark-50`, `-70`, `-90`): objects of 500–4096 B inserted
//!   until the live data is that share of `--churn-bytes` (the capacity: cairn-kv's pool
//!   is that size), then four transactions per object: a quarter inserts, a quarter
//!   deletes, half overwrites with a new size, the live data kept within 2% of its
//!   level. (Postmark's reads are left out: they change no memory.)
//!
//! Keys are 8 bytes. The HashMap and cairn-kv run in a child process each (`cairn bench
//! kv-churn-worker`), so that nothing else is in their memory; redis-server is its own
//! process, fed by pipelines of 256 commands. Memory is the process's anonymous
//! resident memory (`RssAnon`), plus for cairn-kv the pages of its pool file (the pool
//! is a shared file mapping on `/dev/shm`).

use super::Rng;
use crate::error::{CliError, CliResult};
use crate::progress::note as progress;
use cairn_kv::{KvError, Options, Store, UpdatePolicy};
use cairn_kvserver::client::{encode, Client, Reply};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The workloads, in the order the benchmark runs them.
pub const WORKLOADS: [&str; 7] = [
    "60-70",
    "1000-1024",
    "1000-1030",
    "1024-10240",
    "postmark-50",
    "postmark-70",
    "postmark-90",
];

/// Bytes of a key.
const KEY: u64 = 8;

/// One system's result on one workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Churn {
    pub workload: String,
    pub system: String,
    /// Keys and values present at the end.
    pub live_bytes: u64,
    /// Resident memory at the end (see the module's comment).
    pub memory_bytes: u64,
    /// `memory_bytes / live_bytes`.
    pub ratio: f64,
    pub secs: f64,
    /// Writes refused (a full pool).
    pub refused: u64,
    /// cairn-kv: bytes compaction copied.
    pub compacted_bytes: Option<u64>,
}

/// `cairn bench kv-churn-worker` (started by `cairn bench kv`).
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// `hashmap`, `cairn-kv append` or `cairn-kv in-place`
    #[arg(long)]
    pub system: String,
    #[arg(long)]
    pub workload: String,
    /// Live data (patterns) or capacity (Postmark-like), bytes
    #[arg(long)]
    pub bytes: u64,
    /// cairn-kv's garbage bound (`Options::max_garbage`)
    #[arg(long)]
    pub max_garbage: Option<f64>,
}

/// Where the writes go.
trait Sink {
    /// Set `key` to `len` bytes; false when the store refuses (full).
    fn put(&mut self, key: u64, len: usize) -> CliResult<bool>;
    /// Delete `key`; false when the store refuses (a full pool has no room for the
    /// deletion's record).
    fn del(&mut self, key: u64) -> CliResult<bool>;
    /// Wait until everything sent is done.
    fn finish(&mut self) -> CliResult;
}

fn value(len: usize) -> &'static [u8] {
    static V: [u8; 10240] = [b'x'; 10240];
    &V[..len]
}

/// What a workload did: live bytes at the end, writes refused.
struct Done {
    live: u64,
    refused: u64,
}

/// Run `workload` with `bytes` against `sink`.
fn drive(workload: &str, bytes: u64, sink: &mut dyn Sink) -> CliResult<Done> {
    if let Some(p) = workload.strip_prefix("postmark-") {
        let percent: u64 = p
            .parse()
            .map_err(|_| CliError::new(format!("{workload}: not a workload")))?;
        return postmark(bytes * percent / 100, sink);
    }
    let (a, b) =
        sizes(workload).ok_or_else(|| CliError::new(format!("{workload}: not a workload")))?;
    pattern(bytes, a, b, sink)
}

/// The two value sizes of a pattern (`1000-1024`), 1 to 10,240 bytes each.
fn sizes(workload: &str) -> Option<(u64, u64)> {
    let (a, b) = workload.split_once('-')?;
    let (a, b) = (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?);
    ((1..=10240).contains(&a) && (1..=10240).contains(&b)).then_some((a, b))
}

/// Nibble's pattern: fill with `a`-byte values, delete 90% at random, refill with
/// `b`-byte values.
fn pattern(total: u64, a: u64, b: u64, sink: &mut dyn Sink) -> CliResult<Done> {
    let (mut live, mut refused) = (0u64, 0u64);
    let n = fill(sink, 0, a, total, &mut live, &mut refused)?;
    // A random 90% (by a hash of the key), deleted in a scattered order (a stride
    // through the keys that visits each once).
    let stride = (0x9e37_79b1u64..)
        .step_by(2)
        .find(|p| gcd(*p, n) == 1)
        .unwrap_or(1);
    for i in 0..n {
        let k = (i as u128 * stride as u128 % n as u128) as u64;
        if !(k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32).is_multiple_of(10) {
            if sink.del(k)? {
                live -= KEY + a;
            } else {
                refused += 1;
            }
        }
    }
    fill(sink, n, b, total, &mut live, &mut refused)?;
    sink.finish()?;
    Ok(Done { live, refused })
}

/// Put keys from `k` on with values of `len` bytes until the live data is back at
/// `total` (or the store refuses one); the next key.
fn fill(
    sink: &mut dyn Sink,
    mut k: u64,
    len: u64,
    total: u64,
    live: &mut u64,
    refused: &mut u64,
) -> CliResult<u64> {
    while *live < total {
        if !sink.put(k, len as usize)? {
            *refused += 1;
            break;
        }
        *live += KEY + len;
        k += 1;
    }
    Ok(k)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The Postmark-like mix around `target` bytes of live data.
fn postmark(target: u64, sink: &mut dyn Sink) -> CliResult<Done> {
    let mut rng = Rng(0x5eed_1234_abcd);
    // Per key: its value's size (0: absent).
    let mut sizes: Vec<u16> = Vec::new();
    let (mut live, mut refused) = (0u64, 0u64);
    while live < target {
        let k = sizes.len();
        if !set_random(sink, &mut rng, &mut sizes, k, &mut live, &mut refused)? {
            break;
        }
    }
    let (low, high) = (target - target / 50, target + target / 50);
    let txns = 4 * sizes.len();
    for _ in 0..txns {
        let r = rng.next() % 4;
        let insert = (r == 0 && live < high) || live < low;
        let delete = !insert && (r == 1 || live > high);
        if insert {
            let k = sizes.len();
            set_random(sink, &mut rng, &mut sizes, k, &mut live, &mut refused)?;
            continue;
        }
        let k = loop {
            let k = (rng.next() % sizes.len() as u64) as usize;
            if sizes[k] != 0 {
                break k;
            }
        };
        if !delete {
            set_random(sink, &mut rng, &mut sizes, k, &mut live, &mut refused)?;
        } else if sink.del(k as u64)? {
            live -= KEY + sizes[k] as u64;
            sizes[k] = 0;
        } else {
            refused += 1;
        }
    }
    sink.finish()?;
    Ok(Done { live, refused })
}

/// Set key `k` (a new one when `k == sizes.len()`) to a value of 500–4096 bytes; the
/// live bytes and sizes follow. A refused write leaves the key as it was: false.
fn set_random(
    sink: &mut dyn Sink,
    rng: &mut Rng,
    sizes: &mut Vec<u16>,
    k: usize,
    live: &mut u64,
    refused: &mut u64,
) -> CliResult<bool> {
    let len = 500 + (rng.next() % 3597) as u16;
    if k == sizes.len() {
        sizes.push(0);
    }
    if !sink.put(k as u64, len as usize)? {
        *refused += 1;
        return Ok(false);
    }
    if sizes[k] != 0 {
        *live -= KEY + sizes[k] as u64;
    }
    *live += KEY + len as u64;
    sizes[k] = len;
    Ok(true)
}

struct MapSink(HashMap<u64, Box<[u8]>>);

impl Sink for MapSink {
    fn put(&mut self, key: u64, len: usize) -> CliResult<bool> {
        self.0.insert(key, value(len).into());
        Ok(true)
    }
    fn del(&mut self, key: u64) -> CliResult<bool> {
        self.0.remove(&key);
        Ok(true)
    }
    fn finish(&mut self) -> CliResult {
        Ok(())
    }
}

/// The store, and its garbage bound.
struct StoreSink(Store, f64);

impl Sink for StoreSink {
    fn put(&mut self, key: u64, len: usize) -> CliResult<bool> {
        match self.0.put(&key.to_le_bytes(), value(len)) {
            Ok(()) => Ok(true),
            Err(KvError::Full) => Ok(false),
            Err(e) => Err(CliError::new(e.to_string())),
        }
    }
    fn del(&mut self, key: u64) -> CliResult<bool> {
        match self.0.delete(&key.to_le_bytes()) {
            Ok(_) => Ok(true),
            Err(KvError::Full) => Ok(false),
            Err(e) => Err(CliError::new(e.to_string())),
        }
    }
    fn finish(&mut self) -> CliResult {
        // Let background compaction settle (the garbage within its bound and no
        // segment emptied for half a second; at most 60 s), and the memory of the
        // segments it freed go back to the system (after a second free).
        let t = Instant::now();
        let (mut last, mut still) = (u64::MAX, 0);
        while still < 5 && t.elapsed() < Duration::from_secs(60) {
            let st = self.0.stats();
            let n = st.compacted_segments;
            still = if n == last && st.garbage <= self.1 + 0.005 {
                still + 1
            } else {
                0
            };
            last = n;
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(1200));
        self.0.reclaim();
        Ok(())
    }
}

/// Commands pipelined to redis-server, 256 at a time.
struct RedisSink {
    client: Client,
    buf: Vec<u8>,
    n: usize,
}

impl RedisSink {
    fn flush(&mut self) -> CliResult {
        let replies = self.client.pipeline(&self.buf, self.n)?;
        if let Some(Reply::Error(e)) = replies.iter().find(|r| matches!(r, Reply::Error(_))) {
            return Err(CliError::new(format!("redis-server: {e}")));
        }
        self.buf.clear();
        self.n = 0;
        Ok(())
    }
    fn send(&mut self, args: &[&[u8]]) -> CliResult {
        encode(&mut self.buf, args);
        self.n += 1;
        if self.n == 256 {
            self.flush()?;
        }
        Ok(())
    }
}

impl Sink for RedisSink {
    fn put(&mut self, key: u64, len: usize) -> CliResult<bool> {
        self.send(&[b"SET", &key.to_le_bytes(), value(len)])?;
        Ok(true)
    }
    fn del(&mut self, key: u64) -> CliResult<bool> {
        self.send(&[b"DEL", &key.to_le_bytes()])?;
        Ok(true)
    }
    fn finish(&mut self) -> CliResult {
        self.flush()
    }
}

fn result(workload: &str, system: &str, done: &Done, memory: u64, t: Instant) -> Churn {
    Churn {
        workload: workload.into(),
        system: system.into(),
        live_bytes: done.live,
        memory_bytes: memory,
        ratio: memory as f64 / done.live.max(1) as f64,
        secs: t.elapsed().as_secs_f64(),
        refused: done.refused,
        compacted_bytes: None,
    }
}

/// The pool for a workload: its capacity for the Postmark-like mix; for a pattern,
/// room for the records of twice the live data (the pool's size is not its memory:
/// free segments are handed back).
fn pool_size(workload: &str, bytes: u64) -> u64 {
    let Some((a, b)) = sizes(workload) else {
        return bytes;
    };
    let smallest = a.min(b);
    let per_record = cairn_kv::format::record_len(KEY as usize, smallest as usize) as f64
        / (KEY + smallest) as f64;
    ((2.0 * per_record * bytes as f64) as u64).max(64 << 20)
}

/// About the most keys a workload has at once (the index is sized for them).
fn most_keys(workload: &str, bytes: u64) -> u64 {
    if let Some(p) = workload.strip_prefix("postmark-") {
        // Objects average 2,306 bytes with their key; a third more for the swings.
        let live = bytes / 100 * p.parse::<u64>().unwrap_or(100);
        return live / (KEY + 2298) * 4 / 3 + 1;
    }
    let smallest = sizes(workload).map_or(1, |(a, b)| a.min(b));
    bytes / (KEY + smallest) + 1
}

/// The child process: one system, one workload; prints its [`Churn`] as JSON.
pub fn worker(a: &WorkerArgs) -> CliResult {
    let t = Instant::now();
    let r = if a.system == "hashmap" {
        let mut sink = MapSink(HashMap::new());
        let done = drive(&a.workload, a.bytes, &mut sink)?;
        result(
            &a.workload,
            &a.system,
            &done,
            super::proc_kb(0, "status", "RssAnon")?,
            t,
        )
    } else {
        let policy = match a.system.as_str() {
            "cairn-kv append" => UpdatePolicy::Append,
            "cairn-kv in-place" => UpdatePolicy::InPlace,
            s => return Err(CliError::new(format!("{s}: not a system"))),
        };
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/cairn-bench-kv-churn-{}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let opts = Options {
            size: pool_size(&a.workload, a.bytes),
            expected_keys: Some(most_keys(&a.workload, a.bytes)),
            policy,
            max_garbage: a.max_garbage,
            ..Options::default()
        };
        let store = Store::open(&path, &opts);
        let _ = std::fs::remove_file(&path);
        let mut sink = StoreSink(
            store.map_err(|e| CliError::new(format!("{}: {e}", path.display())))?,
            a.max_garbage.unwrap_or(1.0),
        );
        let done = drive(&a.workload, a.bytes, &mut sink)?;
        let st = sink.0.stats();
        let mut r = result(
            &a.workload,
            &a.system,
            &done,
            super::proc_kb(0, "status", "RssAnon")? + st.resident_bytes,
            t,
        );
        r.compacted_bytes = Some(st.compacted_bytes);
        r
    };
    println!(
        "{}",
        serde_json::to_string(&r).map_err(|e| CliError::new(e.to_string()))?
    );
    Ok(())
}

/// Run one workload on redis-server (started here, no persistence).
fn on_redis(workload: &str, bytes: u64) -> CliResult<Churn> {
    let port = super::kv::free_port()?;
    let server = super::kv::start("redis none", port)?;
    let t = Instant::now();
    let mut sink = RedisSink {
        client: Client::connect(&format!("127.0.0.1:{port}"))?,
        buf: Vec::new(),
        n: 0,
    };
    let done = drive(workload, bytes, &mut sink)?;
    let memory = super::proc_kb(server.child.id(), "status", "RssAnon")?;
    Ok(result(workload, "redis-server", &done, memory, t))
}

/// Every workload on every system.
pub fn run(bytes: u64, max_garbage: f64) -> CliResult<Vec<Churn>> {
    let mut out = Vec::new();
    for w in WORKLOADS {
        let mut systems = vec!["cairn-kv append", "redis-server", "hashmap"];
        if w.starts_with("postmark-") {
            systems.insert(1, "cairn-kv in-place");
        }
        for sys in systems {
            progress(format_args!("kv: churn {w} on {sys}\n"));
            let r = if sys == "redis-server" {
                on_redis(w, bytes)?
            } else {
                let o = Command::new(std::env::current_exe()?)
                    .args(["bench", "kv-churn-worker", "--system", sys, "--workload", w])
                    .args(["--bytes", &bytes.to_string()])
                    .args(["--max-garbage", &max_garbage.to_string()])
                    .output()?;
                if !o.status.success() {
                    return Err(CliError::new(format!(
                        "churn worker ({sys}, {w}): {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    )));
                }
                serde_json::from_slice(&o.stdout)
                    .map_err(|e| CliError::new(format!("churn worker ({sys}, {w}): {e}")))?
            };
            progress(format_args!(
                "kv: {w} {sys}: {:.2}x of {} MiB live in {:.1} s{}\n",
                r.ratio,
                r.live_bytes >> 20,
                r.secs,
                if r.refused > 0 {
                    format!(", {} writes refused", r.refused)
                } else {
                    String::new()
                }
            ));
            out.push(r);
        }
    }
    Ok(out)
}
