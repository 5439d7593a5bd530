//! `cairn bench apps`: real applications on Cairn and on what a user would use instead,
//! in one run: SQLite inserts per second (`synchronous=FULL`, one transaction per
//! insert), RocksDB `db_bench fillsync` µs per operation, Redis `SET`s per second with
//! `appendonly yes` and `appendfsync always`. Systems: Cairn through the `LD_PRELOAD`
//! library (`cairn-shim`, as `cairn run` starts programs), Cairn through the FUSE mount
//! (`cairn-fuse`), the host file system holding the store, and tmpfs (not durable).

use super::hostfs;
use super::latency::host_system_name;
use super::median;
use crate::error::{CliError, CliResult};
use crate::progress::note as progress;
use clap::Args;
use serde::Serialize;
use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `cairn bench apps` options.
#[derive(Debug, Args)]
pub struct AppsArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Directory for the host file system's runs [default: the store directory]
    #[arg(long, value_name = "DIR")]
    pub dir_host: Option<PathBuf>,
    /// Scale the operation counts (1 = SQLite 2,000 inserts, RocksDB 500 synced writes,
    /// Redis 5,000 SETs)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub scale: u64,
    /// Measure each application on each system N times (the systems take turns) and
    /// report the median
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub runs: u64,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct AppResult {
    pub app: String,
    pub system: String,
    pub metric: String,
    /// The median of `runs`.
    pub value: f64,
    pub higher_is_better: bool,
    /// Every measurement, in the order taken.
    pub runs: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<AppResult>,
    host_fs: String,
    store: String,
}

/// Where a run happens: a directory, and the environment its programs get (the shim's
/// for `cairn-shim`, whose directory exists only through it).
struct System {
    name: String,
    dir: PathBuf,
    env: Vec<(&'static str, OsString)>,
    /// The store holds `dir` (below the prefix): made and removed through the API.
    in_store: Option<(cairn::Fs, PathBuf)>,
}

impl System {
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.envs(self.env.iter().cloned());
        c
    }

    fn mkdir(&self, sub: &str) -> CliResult<PathBuf> {
        let d = self.dir.join(sub);
        match &self.in_store {
            Some((fs, inner)) => fs.create_dir_all(inner.join(sub))?,
            None => std::fs::create_dir_all(&d)?,
        }
        Ok(d)
    }

    fn remove(&self) -> CliResult {
        match &self.in_store {
            Some((fs, inner)) => fs.remove_dir_all(inner)?,
            None => std::fs::remove_dir_all(&self.dir)?,
        }
        Ok(())
    }
}

fn run_ok(cmd: &mut Command, what: &str) -> CliResult<String> {
    let out = cmd
        .output()
        .map_err(|e| CliError::new(format!("{what}: cannot run it ({e}); see scripts/setup.sh")))?;
    if !out.status.success() {
        return Err(CliError::new(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `sqlite3` on `db` reading its statements from a pipe (stopping at the first error).
fn sqlite_fed(sys: &System, db: &Path) -> CliResult<std::process::Child> {
    sys.cmd("sqlite3")
        .arg("-bail")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(crate::error::ctx_msg("sqlite3"))
}

/// SQLite: `n` single-insert transactions with `synchronous=FULL`; inserts per second.
fn sqlite(sys: &System, sub: &str, n: u64) -> CliResult<f64> {
    let db = sys.mkdir(sub)?.join("bench.sqlite");
    run_ok(
        sys.cmd("sqlite3")
            .arg(&db)
            .arg("PRAGMA journal_mode=DELETE; CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);"),
        "sqlite3",
    )?;
    let mut sql = String::from("PRAGMA synchronous=FULL;\n");
    for i in 0..n {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'value {i}');\n"));
    }
    let mut child = sqlite_fed(sys, &db)?;
    let t = Instant::now();
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(sql.as_bytes())?;
    let out = child.wait_with_output()?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(CliError::new(format!(
            "sqlite3 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let check = run_ok(
        sys.cmd("sqlite3")
            .arg(&db)
            .arg("PRAGMA integrity_check; SELECT count(*) FROM t;"),
        "sqlite3",
    )?;
    if check != format!("ok\n{n}\n") {
        return Err(CliError::new(format!(
            "sqlite3 check after the run: {check:?}"
        )));
    }
    Ok(n as f64 / secs)
}

/// SQLite in WAL mode shared by two processes: each commits `n / 2` single-insert
/// transactions (`BEGIN IMMEDIATE`, `synchronous=FULL`) into one database at the same
/// time, so every commit goes through the other's wal-index (the `-shm` file, a shared
/// mapping); inserts per second of both together.
fn sqlite_wal2(sys: &System, sub: &str, n: u64) -> CliResult<f64> {
    let db = sys.mkdir(sub)?.join("bench-wal.sqlite");
    run_ok(
        sys.cmd("sqlite3")
            .arg(&db)
            .arg("PRAGMA journal_mode=WAL; CREATE TABLE t(w INTEGER, i INTEGER);"),
        "sqlite3",
    )?;
    let script = |w: u64| {
        let mut sql = String::from(".timeout 120000\nPRAGMA synchronous=FULL;\n");
        for i in 0..n / 2 {
            sql.push_str(&format!(
                "BEGIN IMMEDIATE; INSERT INTO t VALUES({w}, {i}); COMMIT;\n"
            ));
        }
        sql
    };
    let scripts = [script(0), script(1)];
    let t = Instant::now();
    let mut kids = Vec::new();
    for sql in &scripts {
        let mut child = sqlite_fed(sys, &db)?;
        let mut stdin = child.stdin.take().expect("piped");
        let sql = sql.clone();
        // Fed from threads, so that both start at once.
        let feed = std::thread::spawn(move || stdin.write_all(sql.as_bytes()));
        kids.push((child, feed));
    }
    for (child, feed) in kids {
        let _ = feed.join();
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(CliError::new(format!(
                "sqlite3 (WAL, two processes) failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let check = run_ok(
        sys.cmd("sqlite3")
            .arg(&db)
            .arg("PRAGMA integrity_check; SELECT count(DISTINCT w * 1000000000 + i) FROM t;"),
        "sqlite3",
    )?;
    if check != format!("ok\n{}\n", n / 2 * 2) {
        return Err(CliError::new(format!(
            "sqlite3 check after the two-process WAL run: {check:?}"
        )));
    }
    Ok((n / 2 * 2) as f64 / secs)
}

/// RocksDB: `db_bench fillsync` with `ops` synced writes; µs per operation.
fn rocksdb(sys: &System, sub: &str, ops: u64) -> CliResult<f64> {
    let out = run_ok(
        sys.cmd("db_bench")
            .arg("--benchmarks=fillsync")
            .arg(format!(
                "--db={}",
                sys.mkdir(sub)?.join("rocksdb").display()
            ))
            // fillsync writes num/1000 values, each synced.
            .arg(format!("--num={}", ops * 1000))
            .args(["--value_size=100", "--threads=1", "--sync=1"]),
        "db_bench",
    )?;
    out.lines()
        .find(|l| l.starts_with("fillsync"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| CliError::new(format!("db_bench output without fillsync: {out}")))
}

/// Redis: `n` SETs (`redis-benchmark`, one client) with `appendfsync always`; per second.
fn redis(sys: &System, sub: &str, n: u64) -> CliResult<f64> {
    let rd = sys.mkdir(&format!("{sub}/redis"))?;
    // The socket lives on the host (a FUSE file system holds no sockets).
    let sock_dir = tempfile_dir("cairn-bench-redis")?;
    let sock = sock_dir.join("redis.sock");
    let mut server = sys
        .cmd("redis-server")
        .args(["--port", "0", "--unixsocket"])
        .arg(&sock)
        .arg("--dir")
        .arg(&rd)
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CliError::new(format!("redis-server: cannot run it ({e})")))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        if Instant::now() >= deadline || server.try_wait()?.is_some() {
            let _ = server.kill();
            let _ = std::fs::remove_dir_all(&sock_dir);
            return Err(CliError::new("redis-server did not start"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = run_ok(
        Command::new("redis-benchmark").arg("-s").arg(&sock).args([
            "-t",
            "set",
            "-c",
            "1",
            "-q",
            "-n",
            &n.to_string(),
        ]),
        "redis-benchmark",
    );
    let _ = Command::new("redis-cli")
        .arg("-s")
        .arg(&sock)
        .args(["shutdown", "nosave"])
        .output();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&sock_dir);
    let out = r?;
    // "SET: 59171.60 requests per second, p50=0.447 msec" (after progress lines).
    out.rsplit("SET: ")
        .next()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| CliError::new(format!("redis-benchmark output without SET: {out}")))
}

/// The median of `v` (not empty).
/// A directory of the host's temporary directory for this run (`prefix-pid`).
pub(super) fn tempfile_dir(prefix: &str) -> CliResult<PathBuf> {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// `cairn bench apps`. Long (about 170 lines) on purpose: the benchmark's script, each
/// program's phases in the order they run and print.
pub fn run(store: Option<&Path>, args: &AppsArgs) -> CliResult {
    let fs = crate::commands::open_fs(store)?;
    let store_dir = fs.store_dir().to_path_buf();
    drop(fs);
    let host_dir = args.dir_host.clone().unwrap_or_else(|| store_dir.clone());
    let host_fs = hostfs::fs_type(&host_dir)?;
    let host_name = host_system_name(&host_fs);
    let pid = std::process::id();
    // The shim: programs see the store's root at PREFIX.
    let prefix = Path::new("/cairn");
    let shim_env = crate::commands::run::environment(&store_dir, prefix)?;
    let shim_inner = PathBuf::from(format!("/bench-apps-{pid}"));
    // The mount, on a fresh mount point.
    let mp = tempfile_dir("cairn-bench-mnt")?;
    crate::commands::mount::mount(Some(&store_dir), &mp, false, Default::default(), true)?;
    let plain = |name: &str, dir: PathBuf| System {
        name: name.to_string(),
        dir,
        env: Vec::new(),
        in_store: None,
    };
    let systems = [
        System {
            name: "cairn-shim".into(),
            dir: prefix.join(shim_inner.strip_prefix("/").expect("absolute")),
            env: shim_env,
            in_store: Some((crate::commands::open_fs(Some(&store_dir))?, shim_inner)),
        },
        plain("cairn-fuse", mp.join(format!("bench-apps-{pid}"))),
        plain(
            &host_name,
            host_dir.join(format!(".cairn-bench-apps-{pid}")),
        ),
        plain(
            "tmpfs",
            Path::new("/dev/shm").join(format!("cairn-bench-apps-{pid}")),
        ),
    ];
    let s = args.scale;
    type Measure = fn(&System, &str, u64) -> CliResult<f64>;
    let apps: [(&str, &str, &str, bool, Measure, u64); 4] = [
        ("sqlite", "SQLite", "inserts_per_s", true, sqlite, 2000 * s),
        (
            "sqlite-wal2",
            "SQLite WAL, 2 processes",
            "inserts_per_s",
            true,
            sqlite_wal2,
            2000 * s,
        ),
        (
            "rocksdb",
            "RocksDB fillsync",
            "fillsync_us_per_op",
            false,
            rocksdb,
            500 * s,
        ),
        ("redis", "Redis SET", "set_per_s", true, redis, 5000 * s),
    ];
    // (app, system) -> measurements; the systems take turns, run after run.
    let mut taken: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); systems.len()]; apps.len()];
    let r = (|| -> CliResult {
        for run in 0..args.runs {
            let sub = format!("run{run}");
            for (si, sys) in systems.iter().enumerate() {
                sys.mkdir("")?;
                for (ai, (_, label, _, _, measure, n)) in apps.iter().enumerate() {
                    progress(format_args!(
                        "bench apps: run {}/{}: {label} on {}\n",
                        run + 1,
                        args.runs,
                        sys.name
                    ));
                    taken[ai][si].push(measure(sys, &sub, *n)?);
                }
                sys.remove()?;
            }
        }
        Ok(())
    })();
    let mut results = Vec::new();
    for (si, sys) in systems.iter().enumerate() {
        for (ai, (app, _, metric, higher, _, _)) in apps.iter().enumerate() {
            let runs = std::mem::take(&mut taken[ai][si]);
            if runs.is_empty() {
                continue;
            }
            results.push(AppResult {
                app: app.to_string(),
                system: sys.name.clone(),
                metric: metric.to_string(),
                value: median(&runs),
                higher_is_better: *higher,
                runs,
            });
        }
    }
    for sys in &systems {
        let _ = sys.remove();
    }
    let _ = crate::commands::mount::umount(&mp);
    let _ = std::fs::remove_dir(&mp);
    r?;
    let report = Report {
        results,
        host_fs,
        store: store_dir.display().to_string(),
    };
    if args.json {
        print!("{}", crate::util::json_text(&report, "the results")?);
        return Ok(());
    }
    println!(
        "Applications on Cairn (LD_PRELOAD shim, FUSE mount), {host_name} and tmpfs (not \
         durable); median of {} run(s)",
        args.runs
    );
    println!(
        "{:<12} {:<20} {:<12} {:>14}",
        "app", "metric", "system", "value"
    );
    for r in &report.results {
        println!(
            "{:<12} {:<20} {:<12} {:>14.1}",
            r.app, r.metric, r.system, r.value
        );
    }
    // The targets: the shim at least 10x better than the host file system, and within
    // 1.5x of tmpfs; the mount at least as good as the host file system ("better" as
    // each metric means it).
    let get = |app: &str, sys: &str| {
        report
            .results
            .iter()
            .find(|r| r.app == app && r.system == sys)
    };
    // How many times `a` is better than `b` (NaN when either is missing).
    let better = |a: Option<&AppResult>, b: Option<&AppResult>| match (a, b) {
        (Some(a), Some(b)) if a.higher_is_better => a.value / b.value,
        (Some(a), Some(b)) => b.value / a.value,
        _ => f64::NAN,
    };
    let apps = ["sqlite", "sqlite-wal2", "rocksdb", "redis"];
    println!("\ncairn-shim against the others (x better; target: >= 10 vs {host_name}, >= 0.67 vs tmpfs)");
    for app in apps {
        let shim = get(app, "cairn-shim");
        if shim.is_none() {
            continue;
        }
        println!(
            "{app:<12} vs {host_name}: {:>8.2}x   vs tmpfs: {:>6.2}x   vs cairn-fuse: {:>8.2}x",
            better(shim, get(app, &host_name)),
            better(shim, get(app, "tmpfs")),
            better(shim, get(app, "cairn-fuse"))
        );
    }
    println!("\ncairn-fuse against {host_name} (x better; target: >= 1)");
    for app in apps {
        let fuse = get(app, "cairn-fuse");
        if fuse.is_some() {
            println!("{app:<12} {:>8.2}x", better(fuse, get(app, &host_name)));
        }
    }
    Ok(())
}
