//! `cairn bench spacejmp kv`: the key-value store shared through memory
//! (`Store::open_shared`) by client processes that run `get` and `put` themselves,
//! against the same requests sent to `redis-server` (no persistence, Unix socket) and to
//! `cairn kv serve` by `redis-benchmark -c 50` (docs/BENCHMARKS.md, "SpaceJMP").
//!
//! `--keys` keys of `--value` bytes are loaded into a pool on `/dev/shm`; then for each
//! client count, GET and SET separately, that many processes each run `--ops` uniform
//! random operations, started together; the figure is the operations of all of them
//! over the longest one's time. Every SET is durable when it returns (fenced), as
//! `cairn kv serve`'s are; redis-server's are not (no persistence).

use super::super::kv::{free_port, start, start_redis, Proc};
use super::super::{median, Rng};
use crate::error::{CliError, CliResult};
use cairn_kv::{Options, Store};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// `cairn bench spacejmp kv` options.
#[derive(Debug, Args)]
pub struct KvSharedArgs {
    /// Print the results as JSON on stdout (progress goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Runs of each measurement: each figure is the median
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
    /// Keys loaded (and drawn from, uniformly)
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1000..=10_000_000))]
    pub keys: u64,
    /// Value size in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
    pub value: u64,
    /// Operations per client process and measurement
    #[arg(long, value_name = "N", default_value_t = 400_000,
          value_parser = clap::value_parser!(u64).range(1000..=1_000_000_000))]
    pub ops: u64,
    /// Client process counts
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub clients: Vec<u32>,
    /// Requests per redis-benchmark run (0: skip the servers)
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub requests: u64,
}

/// One client process of `bench spacejmp kv` (started by it).
#[derive(Debug, Args)]
pub struct KvSharedWorkerArgs {
    #[arg(long)]
    pub pool: PathBuf,
    #[arg(long, value_parser = ["get", "set"])]
    pub op: String,
    #[arg(long)]
    pub keys: u64,
    #[arg(long)]
    pub value: u64,
    #[arg(long)]
    pub ops: u64,
    #[arg(long)]
    pub seed: u64,
}

fn key(i: u64) -> [u8; 16] {
    let mut k = *b"key:000000000000";
    k[4..].copy_from_slice(format!("{:012}", i).as_bytes());
    k
}

fn options(keys: u64, value: u64) -> Options {
    // Three times the live data (compaction has room), at least 256 MiB.
    let live = keys * (value + 64);
    Options {
        size: (live * 3).max(256 << 20),
        expected_keys: Some(keys),
        ..Options::default()
    }
}

fn progress(msg: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().write_fmt(msg);
}

/// The client process: opens the store, says `ready`, waits for a line on stdin, runs
/// its operations, prints what it measured as JSON.
pub fn worker(a: &KvSharedWorkerArgs) -> CliResult {
    let s = Store::open_shared(&a.pool, &options(a.keys, a.value))
        .map_err(|e| CliError::new(format!("{}: {e}", a.pool.display())))?;
    let mut value = vec![0x5a; a.value as usize];
    let mut out = Vec::with_capacity(a.value as usize);
    let mut rng = Rng(a.seed | 1);
    let mut hist = Histogram::<u64>::new(3).expect("a histogram");
    println!("ready");
    std::io::stdout().flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let set = a.op == "set";
    let mut hits = 0u64;
    let start = Instant::now();
    for i in 0..a.ops {
        let k = key(rng.next() % a.keys);
        // Every 16th operation timed (a clock read costs a few percent of a GET).
        let t = (i % 16 == 0).then(Instant::now);
        if set {
            value[..8].copy_from_slice(&i.to_le_bytes());
            s.put(&k, &value)
                .map_err(|e| CliError::new(format!("put: {e}")))?;
        } else {
            out.clear();
            if s.get(&k, &mut out)
                .map_err(|e| CliError::new(format!("get: {e}")))?
                .is_some()
            {
                hits += 1;
            }
        }
        if let Some(t) = t {
            let _ = hist.record(t.elapsed().as_nanos() as u64);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({"ops": a.ops, "secs": secs, "hits": hits,
               "p50_ns": hist.value_at_quantile(0.5), "p99_ns": hist.value_at_quantile(0.99)})
    );
    Ok(())
}

/// `n` client processes running `op` together: ops/s over all of them, and the p50 and
/// p99 latencies (µs, the slowest process's).
fn clients(
    a: &KvSharedArgs,
    pool: &Path,
    op: &str,
    n: u32,
    run: u32,
) -> CliResult<(f64, f64, f64)> {
    let exe = std::env::current_exe()?;
    let mut procs = Vec::new();
    for c in 0..n {
        let child = Command::new(&exe)
            .args(["bench", "kv-shared-worker", "--op", op])
            .args([
                "--keys",
                &a.keys.to_string(),
                "--value",
                &a.value.to_string(),
            ])
            .args(["--ops", &a.ops.to_string()])
            .args([
                "--seed",
                &((u64::from(run) << 32) | (u64::from(c) + 1)).to_string(),
            ])
            .arg("--pool")
            .arg(pool)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        procs.push(child);
    }
    let mut readers = Vec::new();
    for p in &mut procs {
        let mut r = BufReader::new(p.stdout.take().expect("piped"));
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(CliError::new(format!("a client did not start: {line:?}")));
        }
        readers.push(r);
    }
    for p in &mut procs {
        p.stdin.take().expect("piped").write_all(b"go\n")?;
    }
    let (mut ops, mut secs, mut p50, mut p99) = (0.0, 0.0f64, 0.0f64, 0.0f64);
    for (p, mut r) in procs.into_iter().zip(readers) {
        let mut line = String::new();
        r.read_line(&mut line)?;
        let st = p.wait_with_output()?.status;
        let v: Value = serde_json::from_str(line.trim())
            .map_err(|_| CliError::new(format!("a client failed ({st}): {line:?}")))?;
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        ops += f("ops");
        secs = secs.max(f("secs"));
        p50 = p50.max(f("p50_ns") / 1000.0);
        p99 = p99.max(f("p99_ns") / 1000.0);
        if op == "get" && f("hits") < f("ops") {
            return Err(CliError::new(format!("a GET missed a loaded key: {line}")));
        }
    }
    Ok((ops / secs, p50, p99))
}

/// `redis-benchmark -c 50 -t set,get` at `target` (`-s PATH` or `-p PORT`): (test, req/s,
/// p50 ms, p99 ms).
fn redis_benchmark(a: &KvSharedArgs, target: &[String]) -> CliResult<Vec<(String, f64, f64, f64)>> {
    let o = Command::new("redis-benchmark")
        .args(target)
        .args(["-c", "50", "-t", "set,get", "-n", &a.requests.to_string()])
        .args([
            "-d",
            &a.value.to_string(),
            "-r",
            &a.keys.to_string(),
            "--csv",
        ])
        .output()
        .map_err(|e| {
            CliError::new(format!(
                "redis-benchmark: {e} (scripts/setup.sh installs redis)"
            ))
        })?;
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(|x| x.trim_matches('"')).collect();
            (f.len() >= 7 && (f[0] == "SET" || f[0] == "GET")).then(|| {
                let n = |i: usize| f[i].parse().unwrap_or(0.0);
                (f[0].to_lowercase(), n(1), n(4), n(6))
            })
        })
        .collect())
}

/// A pool file removed at drop (its region is removed by the last process to close
/// the store, this one).
struct PoolFile(PathBuf);

impl Drop for PoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn run(a: &KvSharedArgs) -> CliResult {
    if a.clients.iter().any(|&c| c == 0 || c > 64) {
        return Err(CliError::new("--clients: 1 to 64 processes"));
    }
    let pool = PoolFile(PathBuf::from(format!(
        "/dev/shm/cairn-bench-kvshared-{}.pool",
        std::process::id()
    )));
    let _ = std::fs::remove_file(&pool.0);
    progress(format_args!(
        "spacejmp kv: loading {} keys of {} bytes\n",
        a.keys, a.value
    ));
    // This process keeps the store open (the region stays) while clients come and go.
    let store = Store::open_shared(&pool.0, &options(a.keys, a.value))
        .map_err(|e| CliError::new(format!("{}: {e}", pool.0.display())))?;
    let value = vec![0x33u8; a.value as usize];
    for i in 0..a.keys {
        store
            .put(&key(i), &value)
            .map_err(|e| CliError::new(format!("load: {e}")))?;
    }
    // One SET pass untimed: the pool's pages are touched, compaction is under way (the
    // steady state a store that has run a while is in).
    progress(format_args!("spacejmp kv: warming up (one client, set)\n"));
    clients(a, &pool.0, "set", 1, a.runs)?;
    // (system, op, clients) → figures of each run: (ops/s, p50 µs, p99 µs).
    type Runs = Vec<(f64, f64, f64)>;
    let mut figures: Vec<((String, String, u32), Runs)> = Vec::new();
    let mut note = |sys: &str, op: &str, n: u32, f: (f64, f64, f64)| {
        let k = (sys.to_string(), op.to_string(), n);
        match figures.iter_mut().find(|(x, _)| *x == k) {
            Some((_, v)) => v.push(f),
            None => figures.push((k, vec![f])),
        }
    };
    for run in 0..a.runs {
        for &n in &a.clients {
            for op in ["set", "get"] {
                progress(format_args!(
                    "spacejmp kv: run {}/{}: {n} client processes, {op}\n",
                    run + 1,
                    a.runs
                ));
                note("cairn shared", op, n, clients(a, &pool.0, op, n, run)?);
            }
        }
        if a.requests > 0 {
            let sock_dir = std::env::temp_dir()
                .join(format!("cairn-bench-kvshared-{}-{run}", std::process::id()));
            std::fs::create_dir_all(&sock_dir)?;
            let sock = sock_dir.join("redis.sock");
            let sock_s = sock.display().to_string();
            let servers: [(&str, Proc, Vec<String>); 2] = [
                (
                    "redis-server",
                    start_redis(
                        Command::new("redis-server"),
                        free_port()?,
                        &["--appendonly", "no", "--unixsocket", &sock_s],
                    )?,
                    vec!["-s".into(), sock_s.clone()],
                ),
                {
                    let port = free_port()?;
                    (
                        "cairn kv serve",
                        start("cairn-kv append", port)?,
                        vec!["-p".into(), port.to_string()],
                    )
                },
            ];
            for (name, _proc, target) in &servers {
                progress(format_args!(
                    "spacejmp kv: run {}/{}: redis-benchmark -c 50 against {name}\n",
                    run + 1,
                    a.runs
                ));
                for (op, rps, p50, p99) in redis_benchmark(a, target)? {
                    note(name, &op, 50, (rps, p50 * 1000.0, p99 * 1000.0));
                }
            }
            drop(servers);
            let _ = std::fs::remove_dir_all(&sock_dir);
        }
    }
    drop(store);
    let rows: Vec<Value> = figures
        .iter()
        .map(|((sys, op, n), v)| {
            let m = |f: fn(&(f64, f64, f64)) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
            json!({"experiment": "kv", "system": sys, "op": op,
                   "clients": n, "ops_per_sec": m(|x| x.0),
                   "p50_us": m(|x| x.1), "p99_us": m(|x| x.2), "runs": v.len()})
        })
        .collect();
    // Each client count of the shared store against each server.
    let of = |sys: &str, op: &str, n: Option<u32>| {
        rows.iter()
            .find(|r| r["system"] == sys && r["op"] == op && n.is_none_or(|n| r["clients"] == n))
            .and_then(|r| r["ops_per_sec"].as_f64())
    };
    let mut ratios = Vec::new();
    for &n in &a.clients {
        for op in ["get", "set"] {
            let Some(mine) = of("cairn shared", op, Some(n)) else {
                continue;
            };
            for other in ["redis-server", "cairn kv serve"] {
                if let Some(o) = of(other, op, None).filter(|&o| o > 0.0) {
                    ratios.push(json!({"experiment": "kv ratio", "op": op, "clients": n,
                                       "versus": other, "ratio": mine / o}));
                }
            }
        }
    }
    let all: Vec<Value> = rows.into_iter().chain(ratios).collect();
    let text = if a.json {
        crate::util::json_text(&json!({ "runs": a.runs, "results": all }), "the results")?
    } else {
        super::table(&all)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}
