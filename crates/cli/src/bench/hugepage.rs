//! `cairn bench hugepage`: Ingens' experiments on this machine. Each workload runs under
//! the huge-page policies a user can choose between:
//!
//! * **base**: 4 KiB pages only (this kernel's THP setting is `madvise`, and the program
//!   does not ask);
//! * **greedy**: Linux's greedy huge pages for that program alone (`enabled=always`
//!   without changing the system setting): `libcairn_thp.so` marks every private
//!   anonymous mapping it makes and every block of 2 MiB or more it allocates
//!   `MADV_HUGEPAGE`;
//! * **hugepaged**: base pages at every fault, and `cairn hugepaged` (defaults) promoting
//!   the regions at least 90% populated;
//! * in the Redis experiment also **any-page**: `cairn hugepaged --threshold 0.001`,
//!   which promotes a region with a single page present, as `khugepaged` does at its
//!   default `max_ptes_none` (511), only faster.
//!
//! Parts: `tlb` (dependent loads and GUPS over `--mib` of anonymous memory, in a worker
//! process), `redis` (Ingens' bloat experiment: `redis-server` filled with
//! `--redis-keys` values of `--value` bytes, 70% deleted, refilled; resident memory and
//! throughput), `get` (`redis-benchmark GET` over `--get-keys` small keys), `fairness`
//! (two identical processes, a promotion budget below their demand: huge pages held by
//! each, every second). The daemon's CPU use per GiB watched is read from its status
//! file in the `tlb` and `get` parts.

use super::hugepage_worker::Measured;
use super::kv::{free_port, start_redis, Proc};
use super::{proc_kb, Rng};
use crate::error::{CliError, CliResult};
use crate::progress::note as progress;
use cairn_hugepage::daemon::Status;
use cairn_kvserver::client::{encode, Client, Reply};
use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct HugepageArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// The parts to run, comma-separated: tlb, redis, get, fairness
    #[arg(long, value_delimiter = ',', default_value = "tlb,redis,get,fairness")]
    pub parts: Vec<String>,
    /// Memory of the TLB-bound workloads, MiB (rounded down to a power of two)
    #[arg(long, value_name = "MIB", default_value_t = 4096)]
    pub mib: u64,
    /// Seconds of each TLB-bound measurement
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub seconds: f64,
    /// Redis experiment: keys filled
    #[arg(long, value_name = "N", default_value_t = 400_000)]
    pub redis_keys: u64,
    /// Redis experiment: bytes per value
    #[arg(long, value_name = "BYTES", default_value_t = 8192,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub value: u64,
    /// GET: keys filled (64-byte values)
    #[arg(long, value_name = "N", default_value_t = 3_000_000)]
    pub get_keys: u64,
    /// GET: requests per run of redis-benchmark
    #[arg(long, value_name = "N", default_value_t = 2_000_000)]
    pub requests: u64,
    /// Fairness: memory of each of the two processes, MiB
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    pub fair_mib: u64,
    /// Fairness: the daemon's promotion budget, MiB/s (below the processes' demand)
    #[arg(long, value_name = "MIB", default_value_t = 16.0)]
    pub fair_rate: f64,
    /// Fairness: seconds sampled
    #[arg(long, value_name = "SECS", default_value_t = 40.0)]
    pub fair_secs: f64,
    /// Run everything this many times and report each figure's median
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
}

/// A huge-page policy a workload runs under.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Base,
    Greedy,
    Hugepaged,
    AnyPage,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Base => "base",
            Mode::Greedy => "greedy",
            Mode::Hugepaged => "hugepaged",
            Mode::AnyPage => "any-page",
        }
    }

    /// `program` set up to run under this policy (the daemon is started separately).
    fn command(self, program: impl AsRef<std::ffi::OsStr>) -> CliResult<Command> {
        let mut c = Command::new(program);
        if self == Mode::Greedy {
            let lib = crate::commands::run::find_library(
                "libcairn_thp.so",
                "CAIRN_THP_PRELOAD",
                "cargo build --release -p cairn-thp",
            )?;
            c.env("LD_PRELOAD", lib);
        }
        Ok(c)
    }

    /// The daemon's extra arguments, if this policy has one.
    fn daemon(self) -> Option<&'static [&'static str]> {
        match self {
            Mode::Base | Mode::Greedy => None,
            Mode::Hugepaged => Some(&[]),
            Mode::AnyPage => Some(&["--threshold", "0.001"]),
        }
    }
}

/// TLB-bound speed under one policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tlb {
    pub mode: String,
    pub mib: u64,
    pub fill_secs: f64,
    /// The daemon's time to promote what it would (hugepaged only).
    pub promote_secs: Option<f64>,
    pub huge_bytes: u64,
    /// Whether the worker's memory was marked `MADV_HUGEPAGE` (greedy only).
    pub advised: bool,
    /// Huge-page faults of the machine that fell back to base pages during the fill.
    pub fault_fallbacks: u64,
    pub chase_ns: f64,
    pub gups_per_sec: f64,
}

/// The Redis experiment under one policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bloat {
    pub mode: String,
    pub keys: u64,
    pub value_bytes: u64,
    /// `RssAnon` of redis-server after the fill, after deleting 70% (and `MEMORY
    /// PURGE`), after the refill.
    pub rss_filled: u64,
    pub rss_deleted: u64,
    pub rss_refilled: u64,
    /// `AnonHugePages` after the refill.
    pub huge_refilled: u64,
    /// With the daemon: redis-server's 2 MiB regions after the refill, by utilization
    /// (as `cairn hugepaged status`: tenths of their base pages present, then huge).
    pub regions_refilled: Option<[u64; 11]>,
    /// Over base pages' `RssAnon` at the same point (after the deletion, the refill).
    pub bloat_deleted: f64,
    pub bloat_refilled: f64,
    pub fill_sets_per_sec: f64,
    pub refill_sets_per_sec: f64,
    pub get: Get,
}

/// One `redis-benchmark -t get` run.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Get {
    pub requests_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// GET over many small keys under one policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GetRow {
    pub mode: String,
    pub keys: u64,
    pub rss: u64,
    pub huge_bytes: u64,
    pub get: Get,
}

/// The fairness run.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Fairness {
    pub mib_each: u64,
    pub rate_mib: f64,
    /// Seconds since the daemon started, and the huge-page bytes of each process.
    pub samples: Vec<(f64, u64, u64)>,
    /// Largest |a − b| / max(a, b) over the samples where one held 32 MiB or more.
    pub max_gap: f64,
    pub final_gap: f64,
}

/// The daemon's CPU use while it watched a workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonCpu {
    pub workload: String,
    pub watched_gib: f64,
    /// CPU seconds to promote what it promoted (from its start), and how much that was.
    pub promote_cpu_secs: f64,
    pub promoted_gib: f64,
    /// Once promoted, its CPU use as a fraction of a core, and that per GiB watched.
    pub steady_cpu_fraction: f64,
    pub steady_per_gib: f64,
}

#[derive(Debug, Serialize, Deserialize, Default)]
struct Results {
    /// Runs each figure is the median of.
    runs: u32,
    tlb: Vec<Tlb>,
    redis: Vec<Bloat>,
    get: Vec<GetRow>,
    fairness: Option<Fairness>,
    daemon: Vec<DaemonCpu>,
    /// With `--runs` above 1: every run's results, of which the figures above are the
    /// medians.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    each_run: Vec<Value>,
}

const GIB: f64 = (1u64 << 30) as f64;

/// A `cairn hugepaged` started for a run, stopped at drop.
struct Daemon {
    child: Child,
    status: PathBuf,
}

impl Daemon {
    fn start(pids: &[u32], extra: &[&str]) -> CliResult<Daemon> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let status = std::env::temp_dir().join(format!(
            "cairn-bench-hugepaged-{}-{}.json",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&status);
        let mut c = Command::new(std::env::current_exe()?);
        c.arg("hugepaged");
        for p in pids {
            c.args(["--pid", &p.to_string()]);
        }
        c.args(extra).arg("--status-file").arg(&status);
        let child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
        let d = Daemon { child, status };
        let t = Instant::now();
        while d.status().is_none() {
            if t.elapsed() > Duration::from_secs(30) {
                return Err(CliError::new("cairn hugepaged wrote no status in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(d)
    }

    fn status(&self) -> Option<Status> {
        serde_json::from_str(&std::fs::read_to_string(&self.status).ok()?).ok()
    }

    /// Wait until the daemon has promoted what it would: no watched process has a
    /// region waiting, or three intervals passed without a change (refusals), or 10
    /// minutes. Its status then.
    fn settle(&self) -> CliResult<Status> {
        let t = Instant::now();
        let first = self.status().map_or(0, |s| s.intervals);
        let (mut last_huge, mut changed_at) = (u64::MAX, first);
        loop {
            std::thread::sleep(Duration::from_millis(250));
            let Some(s) = self.status() else { continue };
            let huge: u64 = s.processes.iter().map(|p| p.huge_bytes).sum();
            if huge != last_huge {
                (last_huge, changed_at) = (huge, s.intervals);
            }
            let done = s.intervals >= first + 2 && s.processes.iter().all(|p| p.waiting == 0);
            if done || s.intervals >= changed_at + 3 || t.elapsed().as_secs() > 600 {
                return Ok(s);
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.status);
    }
}

/// The daemon's CPU as a [`DaemonCpu`]: `promoted` its status when it had promoted what
/// it would, `end` its status at the end of the measurement.
fn daemon_cpu(workload: String, promoted: &Status, end: &Status) -> DaemonCpu {
    let watched_gib = end.watched_bytes as f64 / GIB;
    let span = end.uptime_secs - promoted.uptime_secs;
    let frac = if span > 0.0 {
        (end.cpu_secs - promoted.cpu_secs) / span
    } else {
        0.0
    };
    DaemonCpu {
        workload,
        watched_gib,
        promote_cpu_secs: promoted.cpu_secs,
        promoted_gib: promoted.processes.iter().map(|p| p.huge_bytes).sum::<u64>() as f64 / GIB,
        steady_cpu_fraction: frac,
        steady_per_gib: if watched_gib > 0.0 {
            frac / watched_gib
        } else {
            0.0
        },
    }
}

/// A worker process (`cairn bench hugepage-worker`) that has filled its memory.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(mode: Mode, mib: u64, seconds: f64) -> CliResult<(Worker, f64)> {
        let t = Instant::now();
        let mut child = mode
            .command(std::env::current_exe()?)?
            .args(["bench", "hugepage-worker", "--mib", &mib.to_string()])
            .args(["--seconds", &seconds.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut w = Worker {
            child,
            stdin,
            stdout,
        };
        if w.line()? != "ready" {
            return Err(CliError::new("the worker did not start"));
        }
        Ok((w, t.elapsed().as_secs_f64()))
    }

    fn line(&mut self) -> CliResult<String> {
        let mut l = String::new();
        self.stdout.read_line(&mut l)?;
        if l.is_empty() {
            let st = self.child.wait()?;
            return Err(CliError::new(format!("the worker exited: {st}")));
        }
        Ok(l.trim().to_string())
    }

    fn go(&mut self) -> CliResult {
        let i = self.stdin.as_mut().expect("stdin");
        i.write_all(b"go\n")?;
        i.flush()?;
        Ok(())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tlb(a: &HugepageArgs, out: &mut Results) -> CliResult {
    for mode in [Mode::Base, Mode::Greedy, Mode::Hugepaged] {
        progress(format_args!(
            "hugepage: {} MiB, {}: filling\n",
            a.mib,
            mode.name()
        ));
        let (mut w, fill_secs) = Worker::start(mode, a.mib, a.seconds)?;
        let pid = w.child.id();
        let daemon = match mode.daemon() {
            Some(extra) => {
                let t = Instant::now();
                let d = Daemon::start(&[pid], extra)?;
                let promoted = d.settle()?;
                Some((d, promoted, t.elapsed().as_secs_f64()))
            }
            None => None,
        };
        progress(format_args!(
            "hugepage: {} MiB, {}: dependent loads and GUPS, {} s each\n",
            a.mib,
            mode.name(),
            a.seconds
        ));
        w.go()?;
        let m: Measured = serde_json::from_str(&w.line()?)
            .map_err(|e| CliError::new(format!("the worker's result: {e}")))?;
        if let Some((d, promoted, _)) = &daemon {
            let end = d.status().unwrap_or_default();
            out.daemon
                .push(daemon_cpu(format!("tlb {} MiB", a.mib), promoted, &end));
        }
        out.tlb.push(Tlb {
            mode: mode.name().into(),
            mib: a.mib,
            fill_secs,
            promote_secs: daemon.as_ref().map(|d| d.2),
            huge_bytes: m.huge_bytes,
            advised: m.advised,
            fault_fallbacks: m.fault_fallbacks,
            chase_ns: m.chase_ns,
            gups_per_sec: m.gups_per_sec,
        });
    }
    Ok(())
}

/// A redis-server for one policy, killed at drop.
struct Redis {
    server: Proc,
    port: u16,
}

impl Redis {
    fn start(mode: Mode) -> CliResult<Redis> {
        let port = free_port()?;
        // Redis turns huge pages off for itself unless told not to (disable-thp).
        let server = start_redis(
            mode.command("redis-server")?,
            port,
            &["--appendonly", "no", "--disable-thp", "no"],
        )?;
        Ok(Redis { server, port })
    }

    fn pid(&self) -> u32 {
        self.server.child.id()
    }

    fn client(&self) -> CliResult<Client> {
        Ok(Client::connect(&format!("127.0.0.1:{}", self.port))?)
    }

    fn rss(&self) -> CliResult<u64> {
        proc_kb(self.pid(), "status", "RssAnon")
    }

    fn huge(&self) -> CliResult<u64> {
        proc_kb(self.pid(), "smaps_rollup", "AnonHugePages")
    }

    /// `redis-benchmark -t get` over keys `0..keys` (named as it names them).
    fn get(&self, keys: u64, requests: u64) -> CliResult<Get> {
        let o = Command::new("redis-benchmark")
            .args([
                "-p",
                &self.port.to_string(),
                "-t",
                "get",
                "-c",
                "50",
                "-P",
                "16",
            ])
            .args([
                "-r",
                &keys.to_string(),
                "-n",
                &requests.to_string(),
                "--csv",
            ])
            .output()?;
        let text = String::from_utf8_lossy(&o.stdout);
        text.lines()
            .map(|l| {
                l.split(',')
                    .map(|x| x.trim_matches('"'))
                    .collect::<Vec<_>>()
            })
            .find(|f| f.len() >= 7 && f[0] == "GET")
            .map(|f| Get {
                requests_per_sec: f[1].parse().unwrap_or(0.0),
                p50_ms: f[4].parse().unwrap_or(0.0),
                p99_ms: f[6].parse().unwrap_or(0.0),
            })
            .ok_or_else(|| CliError::new(format!("redis-benchmark printed no GET line: {text}")))
    }
}

/// The key redis-benchmark's `-r` names number `i` with.
fn key(i: u64) -> String {
    format!("key:{i:012}")
}

/// Send `SET key(i) value` (or `DEL key(i)` when `value` is empty) for each `i`,
/// pipelined 256 at a time; commands per second.
fn each(c: &mut Client, ids: &[u64], value: &[u8]) -> CliResult<f64> {
    let t = Instant::now();
    for chunk in ids.chunks(256) {
        let mut buf = Vec::new();
        for &i in chunk {
            let k = key(i);
            if value.is_empty() {
                encode(&mut buf, &[b"DEL", k.as_bytes()]);
            } else {
                encode(&mut buf, &[b"SET", k.as_bytes(), value]);
            }
        }
        let replies = c.pipeline(&buf, chunk.len())?;
        if let Some(Reply::Error(e)) = replies.iter().find(|r| matches!(r, Reply::Error(_))) {
            return Err(CliError::new(format!("redis-server: {e}")));
        }
    }
    Ok(ids.len() as f64 / t.elapsed().as_secs_f64())
}

fn settle(d: &Option<Daemon>) -> CliResult<Option<Status>> {
    d.as_ref().map(Daemon::settle).transpose()
}

fn redis(a: &HugepageArgs, out: &mut Results) -> CliResult {
    let value = vec![b'v'; a.value as usize];
    let all: Vec<u64> = (0..a.redis_keys).collect();
    // The same 70% deleted under every policy.
    let mut deleted = all.clone();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for i in (1..deleted.len()).rev() {
        deleted.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    deleted.truncate(a.redis_keys as usize * 7 / 10);
    let mut rows: Vec<Bloat> = Vec::new();
    for mode in [Mode::Base, Mode::Greedy, Mode::Hugepaged, Mode::AnyPage] {
        let r = Redis::start(mode)?;
        let d = mode
            .daemon()
            .map(|extra| Daemon::start(&[r.pid()], extra))
            .transpose()?;
        let mut c = r.client()?;
        progress(format_args!(
            "hugepage: redis, {}: {} keys of {} B\n",
            mode.name(),
            a.redis_keys,
            a.value
        ));
        let fill = each(&mut c, &all, &value)?;
        settle(&d)?;
        let rss_filled = r.rss()?;
        progress(format_args!(
            "hugepage: redis, {}: deleting 70%\n",
            mode.name()
        ));
        each(&mut c, &deleted, &[])?;
        c.call(&[b"MEMORY", b"PURGE"])?;
        std::thread::sleep(Duration::from_secs(1));
        settle(&d)?;
        let rss_deleted = r.rss()?;
        progress(format_args!(
            "hugepage: redis, {}: refilling\n",
            mode.name()
        ));
        let refill = each(&mut c, &deleted, &value)?;
        let regions_refilled = settle(&d)?.and_then(|s| s.processes.first().map(|p| p.regions));
        let (rss_refilled, huge_refilled) = (r.rss()?, r.huge()?);
        progress(format_args!("hugepage: redis, {}: GET\n", mode.name()));
        let get = r.get(a.redis_keys, a.requests / 4)?;
        let base = rows.first();
        let over = |x: u64, b: Option<u64>| b.map_or(0.0, |b| x as f64 / b as f64 - 1.0);
        rows.push(Bloat {
            mode: mode.name().into(),
            keys: a.redis_keys,
            value_bytes: a.value,
            rss_filled,
            rss_deleted,
            rss_refilled,
            huge_refilled,
            regions_refilled,
            bloat_deleted: over(rss_deleted, base.map(|b| b.rss_deleted)),
            bloat_refilled: over(rss_refilled, base.map(|b| b.rss_refilled)),
            fill_sets_per_sec: fill,
            refill_sets_per_sec: refill,
            get,
        });
    }
    out.redis = rows;
    Ok(())
}

fn get(a: &HugepageArgs, out: &mut Results) -> CliResult {
    let value = [b'v'; 64];
    let all: Vec<u64> = (0..a.get_keys).collect();
    for mode in [Mode::Base, Mode::Greedy, Mode::Hugepaged] {
        let r = Redis::start(mode)?;
        let d = mode
            .daemon()
            .map(|extra| Daemon::start(&[r.pid()], extra))
            .transpose()?;
        progress(format_args!(
            "hugepage: GET, {}: {} keys of 64 B\n",
            mode.name(),
            a.get_keys
        ));
        each(&mut r.client()?, &all, &value)?;
        let promoted = settle(&d)?;
        let get = r.get(a.get_keys, a.requests)?;
        if let (Some(d), Some(p)) = (&d, &promoted) {
            // The daemon's cost over an idle server too, long enough for the 10 ms
            // resolution of its CPU time.
            std::thread::sleep(Duration::from_secs(10));
            let end = d.status().unwrap_or_default();
            out.daemon
                .push(daemon_cpu(format!("redis {} keys", a.get_keys), p, &end));
        }
        out.get.push(GetRow {
            mode: mode.name().into(),
            keys: a.get_keys,
            rss: r.rss()?,
            huge_bytes: r.huge()?,
            get,
        });
    }
    Ok(())
}

fn fairness(a: &HugepageArgs, out: &mut Results) -> CliResult {
    progress(format_args!(
        "hugepage: fairness: two processes of {} MiB, {} MiB/s of promotions, {} s\n",
        a.fair_mib, a.fair_rate, a.fair_secs
    ));
    let (w1, _) = Worker::start(Mode::Base, a.fair_mib, 0.0)?;
    let (w2, _) = Worker::start(Mode::Base, a.fair_mib, 0.0)?;
    let (p1, p2) = (w1.child.id(), w2.child.id());
    let rate = a.fair_rate.to_string();
    let d = Daemon::start(&[p1, p2], &["--rate", &rate, "--interval", "1"])?;
    let t = Instant::now();
    let mut f = Fairness {
        mib_each: a.fair_mib,
        rate_mib: a.fair_rate,
        ..Fairness::default()
    };
    let gap = |x: u64, y: u64| x.abs_diff(y) as f64 / x.max(y).max(1) as f64;
    while t.elapsed().as_secs_f64() < a.fair_secs {
        std::thread::sleep(Duration::from_secs(1));
        let (h1, h2) = (
            proc_kb(p1, "smaps_rollup", "AnonHugePages")?,
            proc_kb(p2, "smaps_rollup", "AnonHugePages")?,
        );
        f.samples.push((t.elapsed().as_secs_f64(), h1, h2));
        if h1.max(h2) >= 32 << 20 {
            f.max_gap = f.max_gap.max(gap(h1, h2));
        }
    }
    if let Some(&(_, h1, h2)) = f.samples.last() {
        f.final_gap = gap(h1, h2);
    }
    drop(d);
    out.fairness = Some(f);
    Ok(())
}

pub fn run(a: &HugepageArgs) -> CliResult {
    for p in &a.parts {
        if !["tlb", "redis", "get", "fairness"].contains(&p.as_str()) {
            return Err(CliError::new(format!(
                "--parts: {p} is not one of tlb, redis, get, fairness"
            )));
        }
    }
    let has = |p: &str| a.parts.iter().any(|x| x == p);
    let mut runs = Vec::new();
    for k in 0..a.runs {
        if a.runs > 1 {
            progress(format_args!("hugepage: run {} of {}\n", k + 1, a.runs));
        }
        let mut r = Results::default();
        if has("tlb") {
            tlb(a, &mut r)?;
        }
        if has("redis") {
            redis(a, &mut r)?;
        }
        if has("get") {
            get(a, &mut r)?;
        }
        if has("fairness") {
            fairness(a, &mut r)?;
        }
        runs.push(serde_json::to_value(&r).map_err(|e| CliError::new(e.to_string()))?);
    }
    let mut r: Results =
        serde_json::from_value(median(&runs)).map_err(|e| CliError::new(e.to_string()))?;
    r.runs = a.runs;
    if a.runs > 1 {
        r.each_run = runs;
    }
    let mut o = std::io::stdout().lock();
    if a.json {
        writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| CliError::new(e.to_string()))?
        )?;
        return Ok(());
    }
    print(&mut o, &r)?;
    Ok(())
}

/// Each number of `runs` (the same shape in every run: rows in the same order)
/// replaced by its median over the runs (the mean of the middle two for an even count).
fn median(runs: &[Value]) -> Value {
    match &runs[0] {
        Value::Number(_) => {
            let mut v: Vec<f64> = runs.iter().filter_map(Value::as_f64).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len();
            let m = if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            };
            // Integers stay integers (byte counts).
            if runs[0].is_u64() {
                Value::from(m.round() as u64)
            } else {
                Value::from(m)
            }
        }
        Value::Array(first) => Value::Array(
            (0..first.len())
                .map(|i| {
                    let col: Vec<Value> = runs
                        .iter()
                        .filter_map(|r| r.as_array()?.get(i).cloned())
                        .collect();
                    median(&col)
                })
                .collect(),
        ),
        Value::Object(first) => Value::Object(
            first
                .keys()
                .map(|k| {
                    let col: Vec<Value> = runs.iter().filter_map(|r| r.get(k).cloned()).collect();
                    (k.clone(), median(&col))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn print(o: &mut impl Write, r: &Results) -> CliResult {
    let mib = |b: u64| b >> 20;
    if r.runs > 1 {
        writeln!(o, "(each figure the median of {} runs)\n", r.runs)?;
    }
    if let Some(base) = r.tlb.first() {
        writeln!(
            o,
            "TLB-bound, {} MiB of anonymous memory:\n{:<10} {:>8} {:>9} {:>9} {:>10} {:>8} {:>12} {:>8}",
            base.mib, "policy", "fill s", "promote s", "huge MiB", "load ns", "speed-up", "GUPS/s", "speed-up"
        )?;
        for t in &r.tlb {
            writeln!(
                o,
                "{:<10} {:>8.2} {:>9} {:>9} {:>10.1} {:>7.2}x {:>12.0} {:>7.2}x",
                t.mode,
                t.fill_secs,
                t.promote_secs.map_or("-".into(), |s| format!("{s:.1}")),
                mib(t.huge_bytes),
                t.chase_ns,
                base.chase_ns / t.chase_ns,
                t.gups_per_sec,
                t.gups_per_sec / base.gups_per_sec
            )?;
        }
        for t in r.tlb.iter().filter(|t| t.mode == "greedy") {
            if !t.advised {
                writeln!(
                    o,
                    "greedy: the worker's memory was not marked MADV_HUGEPAGE \
                     (libcairn_thp.so did not take effect)"
                )?;
            } else if t.huge_bytes < (t.mib << 20) / 2 && t.fault_fallbacks > 0 {
                writeln!(
                    o,
                    "greedy: {} huge-page faults fell back to base pages during the fill \
                     (no free 2 MiB block: memory too fragmented); its row is mostly base pages",
                    t.fault_fallbacks
                )?;
            }
        }
        writeln!(o)?;
    }
    if let Some(b) = r.redis.first() {
        writeln!(
            o,
            "Redis: {} keys of {} B, 70% deleted, refilled (RssAnon MiB; bloat over base):\n{:<10} {:>7} {:>14} {:>14} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}",
            b.keys, b.value_bytes, "policy", "filled", "deleted", "refilled", "huge MiB", "SET/s", "reSET/s", "GET/s", "p50 ms", "p99 ms"
        )?;
        for x in &r.redis {
            writeln!(
                o,
                "{:<10} {:>7} {:>6} {:>+6.1}% {:>6} {:>+6.1}% {:>9} {:>9.0} {:>9.0} {:>9.0} {:>7.3} {:>7.3}",
                x.mode,
                mib(x.rss_filled),
                mib(x.rss_deleted),
                x.bloat_deleted * 100.0,
                mib(x.rss_refilled),
                x.bloat_refilled * 100.0,
                mib(x.huge_refilled),
                x.fill_sets_per_sec,
                x.refill_sets_per_sec,
                x.get.requests_per_sec,
                x.get.p50_ms,
                x.get.p99_ms
            )?;
        }
        writeln!(o)?;
    }
    if let Some(b) = r.get.first() {
        writeln!(
            o,
            "redis-benchmark GET, {} keys of 64 B (-P 16, 50 clients):\n{:<10} {:>8} {:>9} {:>11} {:>8} {:>7} {:>7}",
            b.keys, "policy", "RSS MiB", "huge MiB", "GET/s", "speed-up", "p50 ms", "p99 ms"
        )?;
        for x in &r.get {
            writeln!(
                o,
                "{:<10} {:>8} {:>9} {:>11.0} {:>7.2}x {:>7.3} {:>7.3}",
                x.mode,
                mib(x.rss),
                mib(x.huge_bytes),
                x.get.requests_per_sec,
                x.get.requests_per_sec / b.get.requests_per_sec,
                x.get.p50_ms,
                x.get.p99_ms
            )?;
        }
        writeln!(o)?;
    }
    if let Some(f) = &r.fairness {
        writeln!(
            o,
            "Fairness: two processes of {} MiB, {} MiB/s of promotions: huge MiB held\n{:>6} {:>9} {:>9}",
            f.mib_each, f.rate_mib, "secs", "first", "second"
        )?;
        for (t, a, b) in &f.samples {
            writeln!(o, "{t:>6.1} {:>9} {:>9}", mib(*a), mib(*b))?;
        }
        writeln!(
            o,
            "largest gap {:.1}%, at the end {:.1}%\n",
            f.max_gap * 100.0,
            f.final_gap * 100.0
        )?;
    }
    if !r.daemon.is_empty() {
        writeln!(
            o,
            "cairn hugepaged's CPU:\n{:<22} {:>8} {:>12} {:>12} {:>10} {:>14}",
            "workload", "GiB", "promoted GiB", "promote CPU s", "steady %", "% per GiB"
        )?;
        for d in &r.daemon {
            writeln!(
                o,
                "{:<22} {:>8.2} {:>12.2} {:>12.2} {:>9.2}% {:>13.3}%",
                d.workload,
                d.watched_gib,
                d.promoted_gib,
                d.promote_cpu_secs,
                d.steady_cpu_fraction * 100.0,
                d.steady_per_gib * 100.0
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_by_position_and_key() {
        let runs: Vec<Value> = [
            r#"{"a":1,"b":[1.5,2.5],"c":null,"d":"x"}"#,
            r#"{"a":3,"b":[3.5,4.5],"c":null,"d":"y"}"#,
            r#"{"a":2,"b":[2.5,9.5],"c":null,"d":"z"}"#,
        ]
        .iter()
        .map(|t| serde_json::from_str(t).unwrap())
        .collect();
        let m = median(&runs);
        assert_eq!(m, serde_json::json!({"a":2,"b":[2.5,4.5],"c":null,"d":"x"}));
        // An even count: the mean of the middle two (integers rounded).
        assert_eq!(median(&runs[..2])["a"], 2);
        assert_eq!(median(&runs[..2])["b"][0], 2.5);
    }
}
