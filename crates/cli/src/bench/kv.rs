//! `cairn bench kv`: the key-value store, in one run.
//!
//! * **Embedded** (YCSB-style): `--keys` keys of `--value` bytes loaded into a pool on
//!   `/dev/shm`, then for each update policy (append, in-place), key distribution
//!   (uniform, Zipfian 0.99, scrambled), GET share (100, 95, 50, 0%) and thread count
//!   (1, 2): `--ops` operations, ops/s and p50/p99 latency. The recovery of the loaded
//!   pool (reopening it) is timed too.
//! * **Server**: `redis-benchmark -t set,get -c 50` with `-P 1` and `-P 16` against
//!   `cairn kv serve` (append and in-place) and `redis-server` with `appendfsync
//!   always`, `everysec` and no persistence (its AOF in a temporary directory of the
//!   host file system), all started here.
//! * **Memory under churn** ([`super::kv_churn`]): Nibble's size-change patterns and a
//!   Postmark-like mix on cairn-kv, redis-server and a `HashMap` of boxed values.

use super::{median, Rng};
use crate::error::{CliError, CliResult};
use crate::progress::note as progress;
use cairn_kv::{Options, Store, UpdatePolicy};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::Write as _;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `cairn bench kv` options.
#[derive(Debug, Args)]
pub struct KvArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Keys loaded for the embedded runs
    #[arg(long, value_name = "N", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    pub keys: u64,
    /// Value size in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
    pub value: u64,
    /// Operations per embedded configuration (0: skip the embedded runs)
    #[arg(long, value_name = "N", default_value_t = 500_000,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000_000))]
    pub ops: u64,
    /// Requests per redis-benchmark run (0: skip the server runs)
    #[arg(long, value_name = "N", default_value_t = 200_000)]
    pub requests: u64,
    /// Live data of the churn patterns, and capacity of the Postmark-like mix (0: skip
    /// the memory-under-churn runs)
    #[arg(long, value_name = "SIZE", value_parser = crate::util::parse_size, default_value = "256M")]
    pub churn_bytes: u64,
    /// cairn-kv's garbage bound in the churn runs (see `cairn kv serve --max-garbage`)
    #[arg(long, value_name = "F", default_value_t = 0.05)]
    pub max_garbage: f64,
    /// Only the SET runs against redis-server (the four runs a new user tries: 3-byte
    /// and 1 KiB values, one key and 100,000; -P 16 and -P 1), skipping the rest
    #[arg(long)]
    pub versus_only: bool,
    /// Runs of the embedded and server measurements: each figure is the median
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
}

/// One embedded measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Embedded {
    pub policy: String,
    pub distribution: String,
    pub get_percent: u32,
    pub threads: usize,
    pub ops_per_sec: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

/// One redis-benchmark measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Served {
    pub server: String,
    pub test: String,
    pub pipeline: u32,
    pub requests_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// One SET run of redis-benchmark against `cairn kv serve` and `redis-server` without
/// persistence, taken in turns in the same run (medians of `--runs`).
#[derive(Debug, Clone, Serialize)]
pub struct Versus {
    /// The redis-benchmark command (without its port).
    pub command: String,
    pub pipeline: u32,
    pub value_bytes: u32,
    /// Keys written (1: redis-benchmark's default, one key).
    pub keys: u64,
    pub cairn_sets_per_sec: f64,
    pub redis_sets_per_sec: f64,
    /// cairn over redis-server.
    pub ratio: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    /// Runs each embedded and server figure is the median of.
    runs: u32,
    keys: u64,
    value_bytes: u64,
    load_secs: f64,
    recovery_secs: f64,
    embedded: Vec<Embedded>,
    server: Vec<Served>,
    versus: Vec<Versus>,
    churn: Vec<super::kv_churn::Churn>,
}

/// YCSB's Zipfian generator (Gray et al.), constant `theta`, items `0..n`.
struct Zipf {
    n: f64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2);
        Zipf {
            n: n as f64,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    /// An item for a uniform `u` in [0, 1).
    fn item(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        (self.n * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
    }
}

fn key(i: u64) -> [u8; 16] {
    let mut k = *b"user000000000000";
    let d = format!("{i:012}");
    k[4..].copy_from_slice(d.as_bytes());
    k
}

fn pool_path(tag: &str) -> PathBuf {
    PathBuf::from(format!(
        "/dev/shm/cairn-bench-kv-{tag}-{}.pool",
        std::process::id()
    ))
}

fn open(path: &Path, args: &KvArgs, policy: UpdatePolicy) -> CliResult<Store> {
    // The pool: twice the loaded data (about 50% utilization), at least 64 MiB.
    let data = args.keys * (args.value + 48);
    let opts = Options {
        size: (2 * data).max(64 << 20),
        expected_keys: Some(args.keys * 2),
        policy,
        ..Options::default()
    };
    Store::open(path, &opts).map_err(|e| CliError::new(format!("{}: {e}", path.display())))
}

fn embedded(args: &KvArgs, out: &mut Results) -> CliResult {
    let zipf = Arc::new(Zipf::new(args.keys, 0.99));
    for policy in [UpdatePolicy::Append, UpdatePolicy::InPlace] {
        let path = pool_path("embedded");
        let _ = std::fs::remove_file(&path);
        let value = vec![b'v'; args.value as usize];
        {
            let s = open(&path, args, policy)?;
            progress(format_args!(
                "kv: loading {} keys of {} B ({policy:?})\n",
                args.keys, args.value
            ));
            let t = Instant::now();
            for i in 0..args.keys {
                s.put(&key(i), &value)
                    .map_err(|e| CliError::new(e.to_string()))?;
            }
            out.load_secs = t.elapsed().as_secs_f64();
        }
        let t = Instant::now();
        let s = Arc::new(open(&path, args, policy)?);
        out.recovery_secs = t.elapsed().as_secs_f64();
        progress(format_args!(
            "kv: recovered {} keys in {:.2} s\n",
            s.len(),
            out.recovery_secs
        ));
        for dist in ["uniform", "zipfian"] {
            for get in [100u32, 95, 50, 0] {
                for threads in [1usize, 2] {
                    let per = args.ops / threads as u64;
                    let t = Instant::now();
                    let hs: Vec<_> = (0..threads)
                        .map(|th| {
                            let (s, zipf) = (s.clone(), zipf.clone());
                            let (keys, vlen) = (args.keys, args.value as usize);
                            std::thread::spawn(move || {
                                let mut h = Histogram::<u64>::new(3).expect("histogram");
                                let mut rng = Rng(0x9e37_79b9 + th as u64 * 7919);
                                let mut buf = Vec::with_capacity(vlen);
                                let mut val = vec![b'u'; vlen];
                                for op in 0..per {
                                    let i = if dist == "uniform" {
                                        rng.next() % keys
                                    } else {
                                        // Scrambled, as YCSB: hot keys spread over the table.
                                        let z = zipf.item(rng.unit()).min(keys - 1);
                                        z.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) % keys
                                    };
                                    let is_get = (rng.next() % 100) < get as u64;
                                    let t0 = Instant::now();
                                    if is_get {
                                        buf.clear();
                                        let _ = s.get(&key(i), &mut buf);
                                    } else {
                                        val[0] = op as u8;
                                        let _ = s.put(&key(i), &val);
                                    }
                                    let _ = h.record(t0.elapsed().as_nanos() as u64);
                                }
                                h
                            })
                        })
                        .collect();
                    let mut h = Histogram::<u64>::new(3).expect("histogram");
                    for j in hs {
                        let _ = h.add(j.join().map_err(|_| CliError::new("a worker panicked"))?);
                    }
                    let secs = t.elapsed().as_secs_f64();
                    let row = Embedded {
                        policy: format!("{policy:?}").to_lowercase(),
                        distribution: dist.into(),
                        get_percent: get,
                        threads,
                        ops_per_sec: (per * threads as u64) as f64 / secs,
                        p50_ns: h.value_at_quantile(0.5),
                        p99_ns: h.value_at_quantile(0.99),
                    };
                    progress(format_args!(
                        "kv: {} {} {}% GET {} thr: {:.0} ops/s p50 {} ns p99 {} ns\n",
                        row.policy, dist, get, threads, row.ops_per_sec, row.p50_ns, row.p99_ns
                    ));
                    out.embedded.push(row);
                }
            }
        }
        drop(s);
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}

/// A server process, killed at drop (and its files removed).
pub(crate) struct Proc {
    pub child: Child,
    cleanup: Vec<PathBuf>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for p in &self.cleanup {
            let _ = std::fs::remove_dir_all(p);
            let _ = std::fs::remove_file(p);
        }
    }
}

pub(crate) fn free_port() -> CliResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn wait_port(port: u16, child: &mut Child) -> CliResult {
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(CliError::new(format!("the server exited: {st}")));
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(CliError::new(format!("no server on port {port}")));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

pub(crate) fn start(name: &str, port: u16) -> CliResult<Proc> {
    let Some(mode) = name.strip_prefix("cairn-kv ") else {
        let persistence: &[&str] = match name {
            "redis always" => &["--appendonly", "yes", "--appendfsync", "always"],
            "redis everysec" => &["--appendonly", "yes", "--appendfsync", "everysec"],
            _ => &["--appendonly", "no"],
        };
        return start_redis(Command::new("redis-server"), port, persistence);
    };
    let pool = pool_path("server");
    let _ = std::fs::remove_file(&pool);
    let mut c = Command::new(std::env::current_exe()?);
    c.args([
        "kv",
        "serve",
        "--size",
        "1G",
        "--port",
        &port.to_string(),
        "--pool",
    ])
    .arg(&pool);
    if mode == "in-place" {
        c.arg("--in-place");
    }
    spawn(c, name, port, vec![pool])
}

/// `redis-server` (the program `c` runs, with the environment it sets) on `port`, saving
/// nothing, its files in a temporary directory, with `args` besides.
pub(crate) fn start_redis(mut c: Command, port: u16, args: &[&str]) -> CliResult<Proc> {
    let dir = std::env::temp_dir().join(format!("cairn-bench-redis-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    c.args(["--port", &port.to_string(), "--save", "", "--dir"])
        .arg(&dir)
        .args(args);
    spawn(c, "redis-server", port, vec![dir])
}

/// Start `cmd` (a server named `name`) and wait until it listens on `port`.
fn spawn(mut cmd: Command, name: &str, port: u16, cleanup: Vec<PathBuf>) -> CliResult<Proc> {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CliError::new(format!("{name}: {e} (scripts/setup.sh installs redis)")))?;
    // Killed (and its files removed) at drop, also when it never listens.
    let mut proc = Proc { child, cleanup };
    wait_port(port, &mut proc.child)?;
    Ok(proc)
}

fn server(args: &KvArgs, out: &mut Results) -> CliResult {
    for name in [
        "cairn-kv append",
        "cairn-kv in-place",
        "redis always",
        "redis everysec",
        "redis none",
    ] {
        let port = free_port()?;
        let _p = start(name, port)?;
        for pipeline in [1u32, 16] {
            progress(format_args!(
                "kv: redis-benchmark -P {pipeline} against {name}\n"
            ));
            let o = Command::new("redis-benchmark")
                .args(["-p", &port.to_string(), "-t", "set,get", "-c", "50"])
                .args([
                    "-n",
                    &args.requests.to_string(),
                    "-d",
                    &args.value.to_string(),
                ])
                .args(["-r", "100000", "-P", &pipeline.to_string(), "--csv"])
                .output()?;
            let text = String::from_utf8_lossy(&o.stdout);
            for line in text.lines() {
                let f: Vec<&str> = line.split(',').map(|x| x.trim_matches('"')).collect();
                if f.len() >= 7 && (f[0] == "SET" || f[0] == "GET") {
                    out.server.push(Served {
                        server: name.into(),
                        test: f[0].into(),
                        pipeline,
                        requests_per_sec: f[1].parse().unwrap_or(0.0),
                        p50_ms: f[4].parse().unwrap_or(0.0),
                        p99_ms: f[6].parse().unwrap_or(0.0),
                    });
                }
            }
        }
    }
    Ok(())
}

/// SETs per second that `redis-benchmark -q ... --csv` printed.
fn sets_per_sec(o: &std::process::Output) -> f64 {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(',').map(|x| x.trim_matches('"')).collect();
            (f.len() >= 2 && f[0] == "SET").then(|| f[1].parse().unwrap_or(0.0))
        })
        .unwrap_or(0.0)
}

/// The runs a new user tries (`redis-benchmark -t set -n N -c 50`, 3-byte values and
/// one key by default, `-r 100000`, `-d 1024`; `-P 16` and `-P 1`) against `cairn kv
/// serve` (append) and `redis-server` without persistence, both started here, each
/// run taken against one then the other.
fn versus(args: &KvArgs, out: &mut Results) -> CliResult {
    let (cp, rp) = (free_port()?, free_port()?);
    let _c = start("cairn-kv append", cp)?;
    let _r = start("redis none", rp)?;
    for pipeline in [16u32, 1] {
        for (value, keys) in [(3u32, 1u64), (3, 100_000), (1024, 1), (1024, 100_000)] {
            let mut a: Vec<String> = ["-t", "set", "-n", &args.requests.to_string(), "-c", "50"]
                .iter()
                .map(|x| x.to_string())
                .collect();
            a.extend(["-P".into(), pipeline.to_string()]);
            if value != 3 {
                a.extend(["-d".into(), value.to_string()]);
            }
            if keys > 1 {
                a.extend(["-r".into(), keys.to_string()]);
            }
            let run = |port: u16| -> CliResult<f64> {
                Ok(sets_per_sec(
                    &Command::new("redis-benchmark")
                        .args(["-p", &port.to_string()])
                        .args(&a)
                        .arg("--csv")
                        .output()?,
                ))
            };
            let command = format!("redis-benchmark {}", a.join(" "));
            progress(format_args!(
                "kv: {command} against cairn-kv and redis-server\n"
            ));
            let (c, r) = (run(cp)?, run(rp)?);
            out.versus.push(Versus {
                command,
                pipeline,
                value_bytes: value,
                keys,
                cairn_sets_per_sec: c,
                redis_sets_per_sec: r,
                ratio: if r > 0.0 { c / r } else { 0.0 },
            });
        }
    }
    Ok(())
}

/// Each figure of `runs` (rows in the same order in every run) replaced by its median.
fn medians(runs: Vec<Results>) -> Results {
    let mut r = Results {
        runs: runs.len() as u32,
        keys: runs[0].keys,
        value_bytes: runs[0].value_bytes,
        load_secs: median(&runs.iter().map(|x| x.load_secs).collect::<Vec<_>>()),
        recovery_secs: median(&runs.iter().map(|x| x.recovery_secs).collect::<Vec<_>>()),
        embedded: runs[0].embedded.clone(),
        server: runs[0].server.clone(),
        versus: runs[0].versus.clone(),
        churn: Vec::new(),
    };
    for (i, v) in r.versus.iter_mut().enumerate() {
        let of = |f: &dyn Fn(&Versus) -> f64| {
            median(&runs.iter().map(|x| f(&x.versus[i])).collect::<Vec<_>>())
        };
        v.cairn_sets_per_sec = of(&|x| x.cairn_sets_per_sec);
        v.redis_sets_per_sec = of(&|x| x.redis_sets_per_sec);
        // The median of the runs' ratios (each run's two figures taken together).
        v.ratio = of(&|x| x.ratio);
    }
    for (i, e) in r.embedded.iter_mut().enumerate() {
        let of = |f: &dyn Fn(&Embedded) -> f64| {
            median(&runs.iter().map(|x| f(&x.embedded[i])).collect::<Vec<_>>())
        };
        e.ops_per_sec = of(&|x| x.ops_per_sec);
        e.p50_ns = of(&|x| x.p50_ns as f64) as u64;
        e.p99_ns = of(&|x| x.p99_ns as f64) as u64;
    }
    for e in r.server.iter_mut() {
        // Matched by what was measured (a run whose redis-benchmark printed nothing for
        // one test lacks that row).
        let key = (e.server.clone(), e.test.clone(), e.pipeline);
        let of = |f: &dyn Fn(&Served) -> f64| {
            median(
                &runs
                    .iter()
                    .flat_map(|x| &x.server)
                    .filter(|s| (&s.server, &s.test, s.pipeline) == (&key.0, &key.1, key.2))
                    .map(f)
                    .collect::<Vec<_>>(),
            )
        };
        e.requests_per_sec = of(&|x| x.requests_per_sec);
        e.p50_ms = of(&|x| x.p50_ms);
        e.p99_ms = of(&|x| x.p99_ms);
    }
    r
}

pub fn run(args: &KvArgs) -> CliResult {
    let mut runs = Vec::new();
    for k in 0..args.runs {
        if args.runs > 1 {
            progress(format_args!("kv: run {} of {}\n", k + 1, args.runs));
        }
        let mut r = Results {
            runs: 1,
            keys: args.keys,
            value_bytes: args.value,
            load_secs: 0.0,
            recovery_secs: 0.0,
            embedded: Vec::new(),
            server: Vec::new(),
            versus: Vec::new(),
            churn: Vec::new(),
        };
        if args.ops > 0 && !args.versus_only {
            embedded(args, &mut r)?;
        }
        if args.requests > 0 {
            if !args.versus_only {
                server(args, &mut r)?;
            }
            versus(args, &mut r)?;
        }
        runs.push(r);
    }
    let mut r = medians(runs);
    if args.churn_bytes > 0 && !args.versus_only {
        if !(0.0..1.0).contains(&args.max_garbage) {
            return Err(CliError::new("--max-garbage: a fraction from 0 to 1"));
        }
        r.churn = super::kv_churn::run(args.churn_bytes, args.max_garbage)?;
    }
    let mut o = std::io::stdout().lock();
    if args.json {
        writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| CliError::new(e.to_string()))?
        )?;
        return Ok(());
    }
    if !r.embedded.is_empty() {
        writeln!(
            o,
            "cairn-kv, {} keys of {} B: load {:.2} s, recovery {:.2} s{}\n",
            r.keys,
            r.value_bytes,
            r.load_secs,
            r.recovery_secs,
            if r.runs > 1 {
                format!(" (medians of {} runs)", r.runs)
            } else {
                String::new()
            }
        )?;
        writeln!(
            o,
            "{:<9} {:<8} {:>5} {:>3} {:>12} {:>9} {:>9}",
            "policy", "keys", "GET%", "thr", "ops/s", "p50 ns", "p99 ns"
        )?;
    } else if r.runs > 1 {
        writeln!(o, "(medians of {} runs)", r.runs)?;
    }
    for e in &r.embedded {
        writeln!(
            o,
            "{:<9} {:<8} {:>5} {:>3} {:>12.0} {:>9} {:>9}",
            e.policy, e.distribution, e.get_percent, e.threads, e.ops_per_sec, e.p50_ns, e.p99_ns
        )?;
    }
    if !r.server.is_empty() {
        writeln!(
            o,
            "\n{:<18} {:<4} {:>3} {:>12} {:>8} {:>8}",
            "server", "test", "-P", "requests/s", "p50 ms", "p99 ms"
        )?;
        for s in &r.server {
            writeln!(
                o,
                "{:<18} {:<4} {:>3} {:>12.0} {:>8.3} {:>8.3}",
                s.server, s.test, s.pipeline, s.requests_per_sec, s.p50_ms, s.p99_ms
            )?;
        }
    }
    if !r.versus.is_empty() {
        writeln!(
            o,
            "\n{:<58} {:>11} {:>11} {:>6}",
            "SET, cairn kv serve vs redis-server (no persistence)", "cairn/s", "redis/s", "ratio"
        )?;
        for v in &r.versus {
            writeln!(
                o,
                "{:<58} {:>11.0} {:>11.0} {:>6.2}",
                v.command, v.cairn_sets_per_sec, v.redis_sets_per_sec, v.ratio
            )?;
        }
    }
    if !r.churn.is_empty() {
        writeln!(
            o,
            "\n{:<12} {:<18} {:>9} {:>10} {:>6} {:>8} {:>8} {:>13}",
            "churn",
            "system",
            "live MiB",
            "memory MiB",
            "ratio",
            "secs",
            "refused",
            "compacted MiB"
        )?;
        for c in &r.churn {
            writeln!(
                o,
                "{:<12} {:<18} {:>9} {:>10} {:>6.2} {:>8.1} {:>8} {:>13}",
                c.workload,
                c.system,
                c.live_bytes >> 20,
                c.memory_bytes >> 20,
                c.ratio,
                c.secs,
                c.refused,
                c.compacted_bytes
                    .map_or("-".into(), |b| (b >> 20).to_string())
            )?;
        }
    }
    Ok(())
}
