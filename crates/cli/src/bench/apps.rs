//! `cairn bench apps`: real applications on Cairn and on what a user would use instead,
//! in one run: SQLite inserts per second (`synchronous=FULL`, one transaction per
//! insert), RocksDB `db_bench fillsync` µs per operation, Redis `SET`s per second with
//! `appendonly yes` and `appendfsync always`. Systems: Cairn through the FUSE mount
//! (`cairn-fuse`), the host file system holding the store, and tmpfs (not durable).
//! Cairn through the `LD_PRELOAD` shim is not built yet.

use super::hostfs;
use super::latency::host_system_name;
use crate::error::{CliError, CliResult};
use clap::Args;
use serde::Serialize;
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
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct AppResult {
    pub app: String,
    pub system: String,
    pub metric: String,
    pub value: f64,
    pub higher_is_better: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    results: Vec<AppResult>,
    host_fs: String,
    store: String,
}

fn progress(msg: std::fmt::Arguments) {
    let _ = std::io::stderr().write_fmt(msg);
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

/// SQLite: `n` single-insert transactions with `synchronous=FULL`; inserts per second.
fn sqlite(dir: &Path, n: u64) -> CliResult<f64> {
    let db = dir.join("bench.sqlite");
    run_ok(
        Command::new("sqlite3")
            .arg(&db)
            .arg("PRAGMA journal_mode=DELETE; CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);"),
        "sqlite3",
    )?;
    let mut sql = String::from("PRAGMA synchronous=FULL;\n");
    for i in 0..n {
        sql.push_str(&format!("INSERT INTO t VALUES({i}, 'value {i}');\n"));
    }
    let mut child = Command::new("sqlite3")
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CliError::new(format!("sqlite3: {e}")))?;
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
        Command::new("sqlite3")
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

/// RocksDB: `db_bench fillsync` with `ops` synced writes; µs per operation.
fn rocksdb(dir: &Path, ops: u64) -> CliResult<f64> {
    let out = run_ok(
        Command::new("db_bench")
            .arg("--benchmarks=fillsync")
            .arg(format!("--db={}", dir.join("rocksdb").display()))
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
fn redis(dir: &Path, n: u64) -> CliResult<f64> {
    let rd = dir.join("redis");
    std::fs::create_dir_all(&rd)?;
    // The socket lives on the host (a FUSE file system holds no sockets).
    let sock_dir = tempfile_dir("cairn-bench-redis")?;
    let sock = sock_dir.join("redis.sock");
    let mut server = Command::new("redis-server")
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

fn tempfile_dir(prefix: &str) -> CliResult<PathBuf> {
    let d = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// `cairn bench apps`.
pub fn run(store: Option<&Path>, args: &AppsArgs) -> CliResult {
    let fs = crate::commands::open_fs(store)?;
    let store_dir = fs.store_dir().to_path_buf();
    drop(fs);
    let host_dir = args.dir_host.clone().unwrap_or_else(|| store_dir.clone());
    let host_fs = hostfs::fs_type(&host_dir)?;
    let host_name = host_system_name(&host_fs);
    let pid = std::process::id();
    // The mount, on a fresh mount point.
    let mp = tempfile_dir("cairn-bench-mnt")?;
    crate::commands::mount::mount(Some(&store_dir), &mp, false, 0.0, true)?;
    let fuse_work = mp.join(format!("bench-apps-{pid}"));
    let host_work = host_dir.join(format!(".cairn-bench-apps-{pid}"));
    let shm_work = Path::new("/dev/shm").join(format!("cairn-bench-apps-{pid}"));
    let systems: [(&str, &Path); 3] = [
        ("cairn-fuse", &fuse_work),
        (&host_name, &host_work),
        ("tmpfs", &shm_work),
    ];
    let s = args.scale;
    let mut results = Vec::new();
    let r = (|| -> CliResult {
        for (name, dir) in &systems {
            std::fs::create_dir_all(dir)?;
            progress(format_args!("bench apps: SQLite on {name}\n"));
            results.push(AppResult {
                app: "sqlite".into(),
                system: name.to_string(),
                metric: "inserts_per_s".into(),
                value: sqlite(dir, 2000 * s)?,
                higher_is_better: true,
            });
            progress(format_args!("bench apps: RocksDB fillsync on {name}\n"));
            results.push(AppResult {
                app: "rocksdb".into(),
                system: name.to_string(),
                metric: "fillsync_us_per_op".into(),
                value: rocksdb(dir, 500 * s)?,
                higher_is_better: false,
            });
            progress(format_args!("bench apps: Redis SET on {name}\n"));
            results.push(AppResult {
                app: "redis".into(),
                system: name.to_string(),
                metric: "set_per_s".into(),
                value: redis(dir, 5000 * s)?,
                higher_is_better: true,
            });
            std::fs::remove_dir_all(dir)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&fuse_work);
    let _ = crate::commands::mount::umount(&mp);
    let _ = std::fs::remove_dir_all(&host_work);
    let _ = std::fs::remove_dir_all(&shm_work);
    let _ = std::fs::remove_dir(&mp);
    r?;
    let report = Report {
        results,
        host_fs,
        store: store_dir.display().to_string(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| CliError::new(e.to_string()))?
        );
        return Ok(());
    }
    println!("Applications on Cairn (FUSE mount), {host_name} and tmpfs (not durable)");
    println!(
        "{:<8} {:<20} {:<12} {:>14}",
        "app", "metric", "system", "value"
    );
    for r in &report.results {
        println!(
            "{:<8} {:<20} {:<12} {:>14.1}",
            r.app, r.metric, r.system, r.value
        );
    }
    Ok(())
}
