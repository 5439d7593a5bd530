//! `cairn bench remote`: the remote tier and backups on Ceph clusters started on this
//! machine for the run (`scripts/ceph-dev-cluster.sh`: one, then three OSDs in RAM),
//! stopped after it:
//!
//! * migration throughput into RADOS (`cairn migrate`, background migration off) at 1
//!   and 3 replicas, against `rados bench` write on the same cluster in the same run,
//!   at its defaults (4 MiB objects, 16 in flight) and at Cairn's shape (16 MiB objects,
//!   4 in flight);
//! * cold 4 KiB reads at random offsets: raw librados reads of the store's objects,
//!   Cairn with both caches off (a miss: client → daemon → RADOS), and Cairn with the
//!   daemon's cache warm (a hit in it);
//! * backups every second under a sustained write load: their age (the lag a machine
//!   loss would lose), the time the store was held, and the restore time of the store;
//! * one OSD of three killed while data migrates: the longest write of the client, and
//!   the time until the cluster is clean (every placement group active+clean) after
//!   the OSD came back.

use super::Rng;
use crate::error::{ctx_msg, CliError, CliResult};
use crate::progress::note as progress;
use crate::util::human_ns;
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `cairn bench remote` options.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// The script that starts and stops the clusters
    #[arg(
        long,
        value_name = "PATH",
        default_value = "scripts/ceph-dev-cluster.sh"
    )]
    pub script: PathBuf,
    /// NVM tier of the benchmark stores
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = crate::util::parse_size)]
    pub nvm_size: u64,
    /// Bytes migrated in each throughput run (as much as `rados bench` writes)
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = crate::util::parse_size)]
    pub migrate: u64,
    /// Throughput runs at each replication (`rados bench` and Cairn take turns): the
    /// medians are reported
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub runs: u32,
    /// Cold reads per kind
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub reads: u64,
    /// Seconds of the write load under periodic backups
    #[arg(long, value_name = "SECS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub backup_seconds: u64,
    /// Data of the store backed up whole and restored (0: none), in 1 MiB files in NVM
    #[arg(long, value_name = "SIZE", default_value = "4G", value_parser = crate::util::parse_size)]
    pub restore_size: u64,
}

/// Throughput of one way of writing into a pool.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub replicas: u32,
    pub what: String,
    /// MiB per second: the median of the runs, and each run's.
    pub mib_per_sec: f64,
    pub runs: Vec<f64>,
}

/// Latencies of one kind of 4 KiB read.
#[derive(Debug, Clone, Serialize)]
pub struct Reads {
    pub what: String,
    pub n: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub mean_ns: u64,
}

/// Backups under a write load.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Backups {
    pub seconds: u64,
    /// Bytes the load wrote.
    pub written: u64,
    pub backups: u64,
    /// The newest backup's age, sampled every 100 ms: median and largest (seconds).
    pub lag_p50_s: f64,
    pub lag_max_s: f64,
    /// Per backup: time the store was held, and in all (ms, means and largest).
    pub snapshot_ms_mean: f64,
    pub snapshot_ms_max: u64,
    pub total_ms_mean: f64,
    /// The restore of the store from the last backup.
    pub restore_bytes: u64,
    pub restore_ms: u64,
}

/// A store of `--restore-size` of data backed up whole, then restored.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Restore {
    /// Bytes of file data, and of the store's objects the restore read.
    pub data_bytes: u64,
    pub restore_bytes: u64,
    /// The first (whole) backup, and the restore (ms).
    pub backup_ms: u64,
    pub restore_ms: u64,
}

/// One OSD of three killed while data migrates.
#[derive(Debug, Clone, Serialize, Default)]
pub struct OsdKill {
    /// The longest 2 MiB write of the client, and the median one.
    pub write_max_ms: u64,
    pub write_p50_ms: u64,
    /// From the OSD's restart until every placement group is active+clean.
    pub clean_after_restart_ms: u64,
}

/// Everything `cairn bench remote` measured.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    pub throughput: Vec<Throughput>,
    pub reads: Vec<Reads>,
    pub backups: Backups,
    pub restore: Option<Restore>,
    pub osd_kill: OsdKill,
}

/// A cluster started for the run, stopped (by pid) when dropped.
struct Cluster {
    script: PathBuf,
    dir: PathBuf,
    conf: PathBuf,
}

impl Cluster {
    /// `osd_gb` GiB of RAM per OSD.
    fn start(script: &Path, osds: u32, osd_gb: u64) -> CliResult<Cluster> {
        let dir =
            std::env::temp_dir().join(format!("cairn-bench-ceph-{}-{osds}", std::process::id()));
        // Two free ports in a row (the monitor's v1 and v2), below the ephemeral range.
        let port = (20000 + (std::process::id() % 6000) as u16 * 2..32000)
            .step_by(2)
            .find(|&p| {
                std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
                    && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
            })
            .ok_or_else(|| CliError::new("no two free ports in a row below 32000"))?;
        progress(format_args!(
            "starting a Ceph cluster with {osds} OSD(s)...\n"
        ));
        let out = Command::new(script)
            .args(["start", "--dir"])
            .arg(&dir)
            .args(["--osds", &osds.to_string(), "--port", &port.to_string()])
            // The manager knows the placement groups' states (`ceph pg stat`).
            .arg("--mgr")
            // RAM per OSD: rados bench's objects, the stores' and the backups' fit.
            .args(["--osd-gb", &osd_gb.to_string()])
            .output()
            .map_err(|e| {
                CliError::new(format!(
                    "running {} (run from the repository, or give --script): {e}",
                    script.display()
                ))
            })?;
        if !out.status.success() {
            return Err(CliError::new(format!(
                "starting a Ceph cluster: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(Cluster {
            script: script.to_path_buf(),
            conf: dir.join("ceph.conf"),
            dir,
        })
    }

    fn script(&self, args: &[&str]) -> CliResult {
        let out = Command::new(&self.script)
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .map_err(ctx_msg("ceph-dev-cluster.sh"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(CliError::new(format!(
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Remove every object of the pool.
    fn purge(&self) -> CliResult {
        let out = Command::new("rados")
            .arg("-c")
            .arg(&self.conf)
            .args(["purge", "cairn", "--yes-i-really-really-mean-it"])
            .output()
            .map_err(ctx_msg("rados purge"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(CliError::new(format!(
                "rados purge: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// `rados bench` writing `bytes` in objects of `object` bytes, `threads` in flight
    /// (at most 10 s): its bandwidth in MiB/s.
    fn rados_bench(&self, object: u64, threads: &str, bytes: u64) -> CliResult<f64> {
        let most = bytes.div_ceil(object).max(1).to_string();
        let out = Command::new("rados")
            .arg("-c")
            .arg(&self.conf)
            .args(["-p", "cairn", "bench", "10", "write", "-t", threads])
            .args(["-b", &object.to_string(), "--max-objects", &most])
            .output()
            .map_err(ctx_msg("rados bench"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let _ = Command::new("rados")
            .arg("-c")
            .arg(&self.conf)
            .args(["-p", "cairn", "cleanup"])
            .output();
        text.lines()
            .find_map(|l| l.strip_prefix("Bandwidth (MB/sec):"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| CliError::new(format!("rados bench printed no bandwidth: {text}")))
    }

    /// Wait until every placement group is active+clean; the time it took.
    fn wait_clean(&self) -> CliResult<Duration> {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(300) {
            let out = Command::new("timeout")
                .args(["10", "ceph", "-c"])
                .arg(&self.conf)
                .args(["pg", "stat"])
                .output()
                .map_err(ctx_msg("ceph pg stat"))?;
            let s = String::from_utf8_lossy(&out.stdout);
            // "N pgs: N active+clean; 300 MiB data, ..." (other states listed with ", "
            // before the ';').
            let (total, states) = s.split_once(" pgs: ").unwrap_or(("", ""));
            let states = states.split(';').next().unwrap_or("");
            if !total.trim().is_empty() && states.trim() == format!("{} active+clean", total.trim())
            {
                return Ok(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(CliError::new("the cluster was not clean after 5 minutes"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.script(&["stop"]);
    }
}

/// A store with a remote tier in the cluster's pool, removed when dropped.
struct Store {
    bs: super::BenchStore,
    dir: PathBuf,
}

impl Store {
    fn make(c: &Cluster, tag: &str, nvm_size: u64, set: &[(&str, &str)]) -> CliResult<Store> {
        let pid = std::process::id();
        let root = std::env::temp_dir().join(format!("cairn-bench-remote-{pid}-{tag}"));
        std::fs::create_dir_all(&root).map_err(ctx_msg("creating the store's directory"))?;
        let bs = super::BenchStore {
            root: root.clone(),
            nvm: PathBuf::from(format!("/dev/shm/cairn-bench-remote-{pid}-{tag}.nvm")),
        };
        let dir = root.join("store");
        cairn_daemon::mkfs(&cairn_daemon::MkfsOptions {
            store: dir.clone(),
            nvm_path: Some(bs.nvm.clone()),
            nvm_size,
            log_size: (nvm_size / 32).clamp(1 << 20, 16 << 20),
            max_clients: 4,
            remote: Some(cairn_daemon::RemoteOptions {
                url: "ceph:cairn".into(),
                conf: Some(c.conf.clone()),
                user: None,
                size: Some(16 << 30),
            }),
            ..Default::default()
        })
        .map_err(ctx_msg("creating the benchmark store"))?;
        let s = Store { bs, dir };
        s.set(set)?;
        Ok(s)
    }

    /// Set keys of `cairn.toml` (the next daemon takes them: the running one stops).
    fn set(&self, kv: &[(&str, &str)]) -> CliResult {
        let sd = cairn_area::StoreDir::new(&self.dir);
        let _ = cairn::daemon_shutdown(Some(&self.dir));
        let mut text = std::fs::read_to_string(sd.config_path())?;
        for (k, v) in kv {
            text = text
                .lines()
                .filter(|l| l.split('=').next().map(str::trim) != Some(k))
                .map(|l| format!("{l}\n"))
                .collect();
            text.push_str(&format!("{k} = {v}\n"));
        }
        std::fs::write(sd.config_path(), text)?;
        Ok(())
    }

    fn fs(&self) -> CliResult<cairn::Fs> {
        cairn::Fs::open(&self.dir).map_err(ctx_msg("opening the benchmark store"))
    }
}

fn file_bytes(i: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(i * 2 + 1);
    (0..len).map(|_| r.next() as u8).collect()
}

/// Write `total` bytes in files of `each` bytes named `/f<i>`, digested when it returns
/// (a migration timed next does not share the machine with the digest).
fn fill(fs: &cairn::Fs, total: u64, each: usize) -> CliResult<u64> {
    let n = total.div_ceil(each as u64);
    for i in 0..n {
        fs.write(format!("/f{i}"), file_bytes(i, each))
            .map_err(ctx_msg("writing the benchmark files"))?;
    }
    fs.digest()
        .map_err(ctx_msg("digesting the benchmark files"))?;
    Ok(n)
}

/// Move `bytes` of NVM into the remote tier with `cairn migrate`'s request: MiB/s.
fn migrate(s: &Store, bytes: u64) -> CliResult<f64> {
    let t = Instant::now();
    let mut moved = 0;
    while moved < bytes {
        let (n, _) = cairn::daemon_migrate(Some(&s.dir), 0, 3, bytes - moved)
            .map_err(ctx_msg("migrating"))?;
        if n == 0 {
            break;
        }
        moved += n;
    }
    Ok(moved as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64())
}

fn reads_of(what: &str, h: &Histogram<u64>) -> Reads {
    Reads {
        what: what.into(),
        n: h.len(),
        p50_ns: h.value_at_quantile(0.5),
        p99_ns: h.value_at_quantile(0.99),
        mean_ns: h.mean() as u64,
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).expect("histogram bounds")
}

/// Cold 4 KiB reads: raw librados, Cairn missing both caches, Cairn hitting the
/// daemon's.
fn cold_reads(c: &Cluster, s: &Store, files: u64, n: u64) -> CliResult<Vec<Reads>> {
    let each = 1u64 << 20;
    // Raw: 4 KiB at random offsets of the store's data objects.
    let spec = cairn_remote::Spec::parse("ceph:cairn", Some(&c.conf), None)?;
    let pool = cairn_remote::Pool::connect(&spec, Duration::from_secs(30))?;
    let objects: Vec<String> = pool
        .list("cairn.")?
        .into_iter()
        .filter(|o| o.split('.').count() == 6 && o.split('.').nth(2) == Some("3"))
        .collect();
    let mut sizes = Vec::new();
    for o in &objects {
        sizes.push(pool.size(o)?.unwrap_or(0));
    }
    let mut rng = Rng(7);
    let mut raw = histogram();
    let mut buf = vec![0u8; 4096];
    for _ in 0..n {
        let i = (rng.next() % objects.len() as u64) as usize;
        let off = rng.next() % (sizes[i].max(8192) / 4096 - 1) * 4096;
        let t = Instant::now();
        pool.read(&objects[i], off, &mut buf)?;
        raw.record(t.elapsed().as_nanos() as u64).ok();
    }
    drop(pool);
    // Cairn: the files that went to the remote tier first (the first ones written).
    let mut cairn_reads = |s: &Store, seed: u64| -> CliResult<Histogram<u64>> {
        let fs = s.fs()?;
        let mut rng = Rng(seed);
        let mut h = histogram();
        for _ in 0..n {
            let f = rng.next() % (files / 2).max(1);
            let off = rng.next() % (each / 4096) * 4096;
            let file = cairn::File::open(&fs, format!("/f{f}")).map_err(ctx_msg("open"))?;
            let t = Instant::now();
            file.read_at(&mut buf, off).map_err(ctx_msg("read"))?;
            h.record(t.elapsed().as_nanos() as u64).ok();
        }
        Ok(h)
    };
    s.set(&[("read_cache_mib", "0"), ("remote_cache_mib", "0")])?;
    let miss = cairn_reads(s, 11)?;
    s.set(&[("read_cache_mib", "0"), ("remote_cache_mib", "256")])?;
    cairn_reads(s, 13)?; // warms the daemon's cache with these blocks
    let hit = cairn_reads(s, 13)?;
    Ok(vec![
        reads_of("librados, raw", &raw),
        reads_of("cairn, no cache (miss)", &miss),
        reads_of("cairn, daemon cache hit", &hit),
    ])
}

/// Backups every second under a write load of `secs` seconds; then the restore.
fn backups(c: &Cluster, s: &Store, secs: u64) -> CliResult<Backups> {
    s.set(&[("backup_interval_s", "1"), ("read_cache_mib", "64")])?;
    let fs = s.fs()?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (dir, stop) = (s.dir.clone(), stop.clone());
        std::thread::spawn(move || -> u64 {
            let Ok(fs) = cairn::Fs::open(&dir) else {
                return 0;
            };
            let mut written = 0;
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if fs
                    .write(format!("/load{}", i % 64), file_bytes(i, 1 << 20))
                    .is_ok()
                {
                    written += 1 << 20;
                }
                i += 1;
            }
            written
        })
    };
    let t = Instant::now();
    let mut lags = Vec::new();
    let mut seen = std::collections::BTreeMap::new();
    while t.elapsed() < Duration::from_secs(secs) {
        let r = fs.status().map_err(ctx_msg("status"))?;
        if let Some(b) = r.backup {
            lags.push((cairn_area::time::now_ns() - b.taken_ns) as f64 / 1e9);
            seen.insert(b.seq, (b.snapshot_ms, b.total_ms));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap_or(0);
    drop(fs);
    lags.sort_by(f64::total_cmp);
    let mean = |f: fn(&(u64, u64)) -> u64| {
        seen.values().map(|v| f(v) as f64).sum::<f64>() / seen.len().max(1) as f64
    };
    let mut out = Backups {
        seconds: secs,
        written,
        backups: seen.len() as u64,
        lag_p50_s: lags.get(lags.len() / 2).copied().unwrap_or(f64::NAN),
        lag_max_s: lags.last().copied().unwrap_or(f64::NAN),
        snapshot_ms_mean: mean(|v| v.0),
        snapshot_ms_max: seen.values().map(|v| v.0).max().unwrap_or(0),
        total_ms_mean: mean(|v| v.1),
        ..Default::default()
    };
    // The machine lost: restore into a new directory.
    cairn::daemon_backup(Some(&s.dir), None).map_err(ctx_msg("backup"))?;
    (out.restore_bytes, out.restore_ms) = restore_of(c, s)?;
    Ok(out)
}

/// Restore `s` (its daemon stopped) from its newest backup into a new directory and
/// NVM file, removed afterwards: the bytes read and the time (ms).
fn restore_of(c: &Cluster, s: &Store) -> CliResult<(u64, u64)> {
    let _ = cairn::daemon_shutdown(Some(&s.dir));
    let root = s.bs.root.join("restored");
    let nvm = PathBuf::from(format!("{}-restored", s.bs.nvm.display()));
    let t = Instant::now();
    let r = cairn_daemon::restore(
        &cairn_daemon::RestoreOptions {
            url: "ceph:cairn".into(),
            conf: Some(c.conf.clone()),
            store: root.clone(),
            id: Some(store_id(s)?),
            nvm_path: Some(nvm.clone()),
            force: true,
            ..Default::default()
        },
        &|_, _| {},
    );
    let ms = t.elapsed().as_millis() as u64;
    let _ = cairn_area::store::remove_nvm_files(&nvm);
    let _ = std::fs::remove_dir_all(&root);
    Ok((r.map_err(ctx_msg("restore"))?.bytes(), ms))
}

/// A store holding `size` of 1 MiB files in NVM, backed up whole, then restored.
fn restore_large(c: &Cluster, size: u64) -> CliResult<Restore> {
    let s = Store::make(
        c,
        "big",
        size / 4 * 5 + (256 << 20),
        &[("background_migration", "false")],
    )?;
    fill(&s.fs()?, size, 1 << 20)?;
    let t = Instant::now();
    cairn::daemon_backup(Some(&s.dir), None).map_err(ctx_msg("backup"))?;
    let backup_ms = t.elapsed().as_millis() as u64;
    let (restore_bytes, restore_ms) = restore_of(c, &s)?;
    Ok(Restore {
        data_bytes: size,
        restore_bytes,
        backup_ms,
        restore_ms,
    })
}

/// The store's id (its superblock's uuid, in hex: its objects are named by it).
fn store_id(s: &Store) -> CliResult<String> {
    let f = std::fs::File::open(&s.bs.nvm)?;
    let area = cairn_area::Area::open(&f, false)?;
    Ok(cairn_remote::backup::uuid_hex(&area.superblock().uuid))
}

/// One OSD of three killed while 2 MiB writes keep migration busy.
fn osd_kill(c: &Cluster, nvm_size: u64) -> CliResult<OsdKill> {
    let s = Store::make(c, "kill", nvm_size, &[])?;
    let fs = s.fs()?;
    let mut times = Vec::new();
    let t = Instant::now();
    let mut killed = false;
    let mut i = 0u64;
    while t.elapsed() < Duration::from_secs(12) {
        if !killed && t.elapsed() > Duration::from_secs(3) {
            c.script(&["kill-osd", "1"])?;
            killed = true;
        }
        let w = Instant::now();
        fs.write(format!("/k{}", i % 256), file_bytes(i, 2 << 20))
            .map_err(ctx_msg("writing while an OSD is down"))?;
        times.push(w.elapsed().as_millis() as u64);
        i += 1;
    }
    times.sort_unstable();
    c.script(&["start-osd", "1"])?;
    let clean = c.wait_clean()?;
    Ok(OsdKill {
        write_max_ms: times.last().copied().unwrap_or(0),
        write_p50_ms: times[times.len() / 2],
        clean_after_restart_ms: clean.as_millis() as u64,
    })
}

/// `rados bench` at its defaults and at Cairn's shape, then `cairn migrate` into the
/// pool of `c` (`replicas` copies), taking turns for `args.runs` runs (the pool emptied
/// before each); the last run's store is returned for more.
fn throughput(
    c: &Cluster,
    replicas: u32,
    args: &RemoteArgs,
    rep: &mut Report,
) -> CliResult<(Store, u64)> {
    const KINDS: [(&str, u64, &str); 2] = [
        ("rados bench (4M, 16 in flight)", 4 << 20, "16"),
        ("rados bench (16M, 4 in flight)", 16 << 20, "4"),
    ];
    let mut runs = vec![Vec::new(); KINDS.len() + 1];
    let mut kept = None;
    // NVM holds what migrates, and room to spare.
    let nvm_size = args.nvm_size.max(args.migrate / 2 * 3);
    for run in 1..=args.runs {
        drop(kept.take());
        c.purge()?;
        progress(format_args!(
            "rados bench write, {replicas} replica(s), run {run} of {}...\n",
            args.runs
        ));
        for (i, (_, object, threads)) in KINDS.iter().enumerate() {
            runs[i].push(c.rados_bench(*object, threads, args.migrate)?);
        }
        let tag = format!("r{replicas}");
        let s = Store::make(c, &tag, nvm_size, &[("background_migration", "false")])?;
        let files = fill(&s.fs()?, args.migrate, 1 << 20)?;
        progress(format_args!(
            "migrating {} MiB into RADOS...\n",
            args.migrate >> 20
        ));
        runs[KINDS.len()].push(migrate(&s, args.migrate)?);
        kept = Some((s, files));
    }
    let names = KINDS.iter().map(|k| k.0).chain(["cairn migrate"]);
    for (what, mut r) in names.zip(runs) {
        let all = r.clone();
        r.sort_by(f64::total_cmp);
        rep.throughput.push(Throughput {
            replicas,
            what: what.into(),
            mib_per_sec: r[r.len() / 2],
            runs: all,
        });
    }
    Ok(kept.expect("at least one run"))
}

pub fn run(args: &RemoteArgs) -> CliResult {
    let mut rep = Report::default();
    {
        // RAM for the runs' objects, the stores' and the backups', and the large store's
        // backup.
        let gb = 3 + (args.restore_size / 4 * 5).div_ceil(1 << 30);
        let c = Cluster::start(&args.script, 1, gb)?;
        let (s, files) = throughput(&c, 1, args, &mut rep)?;
        progress(format_args!("cold 4 KiB reads...\n"));
        rep.reads = cold_reads(&c, &s, files, args.reads)?;
        progress(format_args!(
            "backups every second under writes for {} s...\n",
            args.backup_seconds
        ));
        rep.backups = backups(&c, &s, args.backup_seconds)?;
        drop(s);
        if args.restore_size > 0 {
            progress(format_args!(
                "a store of {} MiB backed up and restored...\n",
                args.restore_size >> 20
            ));
            c.purge()?;
            rep.restore = Some(restore_large(&c, args.restore_size)?);
        }
    }
    {
        let c = Cluster::start(&args.script, 3, 3)?;
        drop(throughput(&c, 3, args, &mut rep)?);
        progress(format_args!(
            "one OSD of three killed during migration...\n"
        ));
        rep.osd_kill = osd_kill(&c, 64 << 20)?;
    }
    let mut out = std::io::stdout().lock();
    let text = if args.json {
        crate::util::json_text(&rep, "the report")?
    } else {
        format_report(&rep)
    };
    out.write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

fn format_report(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "migration into RADOS (MiB/s)");
    for t in &r.throughput {
        let _ = writeln!(
            s,
            "  {} replica(s)  {:<32} {:>8.1}",
            t.replicas, t.what, t.mib_per_sec
        );
    }
    let _ = writeln!(s, "\ncold 4 KiB reads");
    for x in &r.reads {
        let _ = writeln!(
            s,
            "  {:<26} p50 {:>9}  p99 {:>9}  mean {:>9}  ({} reads)",
            x.what,
            human_ns(x.p50_ns as f64),
            human_ns(x.p99_ns as f64),
            human_ns(x.mean_ns as f64),
            x.n
        );
    }
    let b = &r.backups;
    let _ = writeln!(
        s,
        "\nbackups every second under writes ({} s, {} MiB written)",
        b.seconds,
        b.written >> 20
    );
    let _ = writeln!(
        s,
        "  {} backups; age of the newest p50 {:.1} s, max {:.1} s",
        b.backups, b.lag_p50_s, b.lag_max_s
    );
    let _ = writeln!(
        s,
        "  store held {:.0} ms on average (max {} ms); {:.0} ms per backup",
        b.snapshot_ms_mean, b.snapshot_ms_max, b.total_ms_mean
    );
    let _ = writeln!(
        s,
        "  restore: {} MiB in {} ms",
        b.restore_bytes >> 20,
        b.restore_ms
    );
    if let Some(x) = &r.restore {
        let _ = writeln!(
            s,
            "\na store of {} MiB of files: backed up whole in {} ms, restored ({} MiB read) in {} ms",
            x.data_bytes >> 20,
            x.backup_ms,
            x.restore_bytes >> 20,
            x.restore_ms
        );
    }
    let k = &r.osd_kill;
    let _ = writeln!(s, "\none OSD of three killed during migration");
    let _ = writeln!(
        s,
        "  2 MiB writes: p50 {} ms, max {} ms; clean {} ms after the OSD restarted",
        k.write_p50_ms, k.write_max_ms, k.clean_after_restart_ms
    );
    s
}
