//! `cairn bench mail`: the flow of Filebench's *varmail* as Strata's evaluation ran it (a
//! mail server: per mail, a write-ahead log file is created, written and `fsync`ed, the
//! mail appended to a mailbox and `fsync`ed, the log file deleted, and a mailbox read
//! whole) by unmodified code through the `LD_PRELOAD` shim, on the host file system and
//! on tmpfs, in one run; for Cairn also what the digest did with the run's log (records
//! skipped because later ones superseded them, bytes written into the shared area
//! against bytes logged).
//!
//! Each system's run has two worker processes (`cairn bench mail-worker`, plain `std::fs`
//! code, under the shim for Cairn): the first creates `--files` mailboxes of 16 KiB in
//! one directory and exits, so its log is digested before the second starts; the second
//! runs `--threads` threads for `--seconds`, each repeating the flow's 12 operations
//! (create, write 16 KiB, `fsync`, close the log file; open a random mailbox, append 16
//! KiB, `fsync`, close; delete the log file; open a random mailbox, read it whole, close).
//! The digest counters are read before the second worker starts and after it exited (a
//! client's log is digested when it leaves), so they cover exactly what the timed run
//! logged.

use super::hostfs;
use super::latency::host_system_name;
use super::median;
use crate::error::{CliError, CliResult};
use crate::progress::note as progress;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bytes of each write and append, and of each mailbox at the start.
const APPEND: usize = 16 << 10;
/// The fewest mails a run's space must allow for a run to be worth making.
const MIN_MAILS: u64 = 4096;

/// `cairn bench mail` options.
#[derive(Debug, Args)]
pub struct MailArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Threads running the flow
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub threads: u64,
    /// Mailboxes (16 KiB each at the start)
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub files: u64,
    /// Seconds each system runs the flow
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,
    /// Measure each system N times (the systems take turns) and report the median
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub runs: u64,
    /// Directory for the host file system's runs [default: the store directory]
    #[arg(long, value_name = "DIR")]
    pub dir_host: Option<PathBuf>,
}

/// `cairn bench mail-worker` options (run by `bench mail`, not by people).
#[derive(Debug, Args)]
pub struct MailWorkerArgs {
    /// The mailboxes' directory
    #[arg(long)]
    pub dir: PathBuf,
    /// `populate` (create the mailboxes) or `run` (the timed flow)
    #[arg(long)]
    pub phase: String,
    #[arg(long)]
    pub threads: u64,
    #[arg(long)]
    pub files: u64,
    #[arg(long)]
    pub seconds: u64,
    /// The most mails the run appends in all (the mailboxes grow by 16 KiB a mail and are
    /// never emptied: the store's free space bounds the run); 0: no bound
    #[arg(long, default_value_t = 0)]
    pub max_mails: u64,
}

/// What a `run` worker reports (one JSON line on stdout).
#[derive(Debug, Serialize, Deserialize)]
struct Counted {
    ops: u64,
    secs: f64,
    /// The run stopped at `--max-mails`, before its seconds were up.
    #[serde(default)]
    capped: bool,
}

/// xorshift64: the mailbox picks (no need for a good generator).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn mailbox(dir: &Path, i: u64) -> PathBuf {
    dir.join(format!("m{i:07}"))
}

/// One pass of varmail's flow by thread `t` (its `n`th); returns the operations done
/// (each create, open, append, `fsync`, close, delete and read counts one, as
/// Filebench counts flow operations).
fn flow(
    a: &MailWorkerArgs,
    t: u64,
    n: u64,
    rng: &mut Rng,
    data: &[u8],
    buf: &mut Vec<u8>,
) -> std::io::Result<u64> {
    // The write-ahead log file: create, write, fsync, close.
    let wal = a.dir.join(format!("wal-{t}-{n}"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&wal)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    // The mail into a mailbox: open, append, fsync, close.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(mailbox(&a.dir, rng.below(a.files)))?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    // The log file goes.
    std::fs::remove_file(&wal)?;
    // A mailbox read whole: open, read, close.
    let mut f = std::fs::File::open(mailbox(&a.dir, rng.below(a.files)))?;
    buf.clear();
    f.read_to_end(buf)?;
    drop(f);
    Ok(12)
}

/// `cairn bench mail-worker`.
pub fn worker(a: &MailWorkerArgs) -> CliResult {
    let data: Vec<u8> = (0..APPEND).map(|i| (i % 251) as u8).collect();
    match a.phase.as_str() {
        "populate" => {
            std::fs::create_dir_all(&a.dir)?;
            for i in 0..a.files {
                std::fs::File::create(mailbox(&a.dir, i))?.write_all(&data)?;
            }
            Ok(())
        }
        "run" => {
            let stop = AtomicBool::new(false);
            let ops = AtomicU64::new(0);
            let (mails, capped) = (AtomicU64::new(0), AtomicBool::new(false));
            let start = Instant::now();
            let failed: Mutex<Option<std::io::Error>> = Mutex::new(None);
            std::thread::scope(|s| {
                for t in 0..a.threads {
                    let (data, stop, ops, failed) = (&data, &stop, &ops, &failed);
                    let (mails, capped) = (&mails, &capped);
                    s.spawn(move || {
                        let mut rng =
                            Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x2545_F491));
                        let mut buf = Vec::with_capacity(1 << 20);
                        let mut n = 0;
                        while !stop.load(Ordering::Relaxed) {
                            if a.max_mails > 0
                                && mails.fetch_add(1, Ordering::Relaxed) >= a.max_mails
                            {
                                capped.store(true, Ordering::Relaxed);
                                stop.store(true, Ordering::Relaxed);
                                break;
                            }
                            match flow(a, t, n, &mut rng, data, &mut buf) {
                                Ok(k) => ops.fetch_add(k, Ordering::Relaxed),
                                Err(e) => {
                                    *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                                    stop.store(true, Ordering::Relaxed);
                                    break;
                                }
                            };
                            n += 1;
                        }
                    });
                }
                let deadline = start + Duration::from_secs(a.seconds);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                stop.store(true, Ordering::Relaxed);
            });
            if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(CliError::new(format!("mail worker: {e}")));
            }
            let c = Counted {
                ops: ops.load(Ordering::Relaxed),
                secs: start.elapsed().as_secs_f64(),
                capped: capped.load(Ordering::Relaxed),
            };
            println!(
                "{}",
                serde_json::to_string(&c).map_err(|e| CliError::new(e.to_string()))?
            );
            Ok(())
        }
        p => Err(CliError::new(format!(
            "mail worker: unknown phase {p:?} (populate or run)"
        ))),
    }
}

/// One system: where its mailboxes go and the environment its worker gets.
struct System {
    name: String,
    dir: PathBuf,
    env: Vec<(&'static str, OsString)>,
}

/// Run a worker phase on `sys` (at most `max_mails` mails); the `run` phase's count.
fn phase(sys: &System, a: &MailArgs, phase: &str, max_mails: u64) -> CliResult<Option<Counted>> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe)
        .args(["bench", "mail-worker", "--phase", phase, "--dir"])
        .arg(&sys.dir)
        .args(["--threads", &a.threads.to_string()])
        .args(["--files", &a.files.to_string()])
        .args(["--seconds", &a.seconds.to_string()])
        .args(["--max-mails", &max_mails.to_string()])
        .envs(sys.env.iter().cloned())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(CliError::new(format!(
            "bench mail: the {phase} worker on {} failed ({})",
            sys.name, out.status
        )));
    }
    if phase != "run" {
        return Ok(None);
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim())
        .map(Some)
        .map_err(|e| CliError::new(format!("bench mail: the run worker's report: {e}")))
}

/// One system's result.
#[derive(Debug, Serialize)]
struct MailResult {
    system: String,
    /// Median operations per second.
    ops_per_s: f64,
    runs: Vec<f64>,
    /// Cairn only: what the digest did with the timed runs' logs (all runs together).
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<DigestFigures>,
}

/// The digest counters' change over the timed runs.
#[derive(Debug, Default, Serialize)]
struct DigestFigures {
    records: u64,
    records_skipped: u64,
    /// `records_skipped / records`.
    skipped_fraction: f64,
    log_bytes: u64,
    shared_bytes: u64,
    /// `shared_bytes / log_bytes`.
    shared_per_log_byte: f64,
    digests: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    threads: u64,
    files: u64,
    seconds: u64,
    /// The most mails a run may append (the store's free space).
    max_mails: u64,
    /// Runs that stopped there, before their seconds were up.
    capped_runs: u64,
    results: Vec<MailResult>,
}

/// `cairn bench mail`.
pub fn run(store: Option<&Path>, a: &MailArgs) -> CliResult {
    let fs = crate::commands::open_fs(store)?;
    let store_dir = fs.store_dir().to_path_buf();
    let host_dir = a.dir_host.clone().unwrap_or_else(|| store_dir.clone());
    let host_name = host_system_name(&hostfs::fs_type(&host_dir)?);
    let pid = std::process::id();
    let prefix = Path::new("/cairn");
    let inner = PathBuf::from(format!("/bench-mail-{pid}"));
    let systems = [
        System {
            name: "cairn-shim".into(),
            dir: prefix.join(inner.strip_prefix("/").expect("absolute")),
            env: crate::commands::run::environment(&store_dir, prefix)?,
        },
        System {
            name: host_name.clone(),
            dir: host_dir.join(format!(".cairn-bench-mail-{pid}")),
            env: Vec::new(),
        },
        System {
            name: "tmpfs".into(),
            dir: Path::new("/dev/shm").join(format!("cairn-bench-mail-{pid}")),
            env: Vec::new(),
        },
    ];
    let remove = |sys: &System| -> CliResult {
        if sys.env.is_empty() {
            match std::fs::remove_dir_all(&sys.dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        } else {
            match fs.remove_dir_all(&inner) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    };
    // The mailboxes grow by 16 KiB a mail and are never emptied (about 190 MB/s here):
    // every system's run stops after as many mails as seven eighths of the store's free
    // space holds beyond the mailboxes (the same bound for each, so they do the same work
    // at most), rather than fail with ENOSPC half-way; a store too small for a useful
    // run is refused.
    let free: u64 = fs
        .status()?
        .tiers
        .iter()
        .map(|t| t.capacity_bytes.saturating_sub(t.used_bytes))
        .sum();
    let room = (free - free / 8).saturating_sub(a.files * APPEND as u64);
    let max_mails = room / APPEND as u64;
    if max_mails < MIN_MAILS {
        return Err(CliError::new(format!(
            "bench mail: the store {} has {} MiB free; {} mailboxes of 16 KiB and {} mails \
             need about {} MiB (the mailboxes grow by 16 KiB a mail): use a larger store \
             (`cairn mkfs --nvm-size`), or fewer --files",
            store_dir.display(),
            free >> 20,
            a.files,
            MIN_MAILS,
            ((a.files + MIN_MAILS) * APPEND as u64 * 8 / 7) >> 20
        )));
    }
    let mut capped = 0u64;
    let mut taken: Vec<Vec<f64>> = vec![Vec::new(); systems.len()];
    let mut digest = DigestFigures::default();
    let r = (|| -> CliResult {
        for run in 0..a.runs {
            for (si, sys) in systems.iter().enumerate() {
                progress(format_args!(
                    "bench mail: run {}/{}: {} ({} files, {} threads, {} s)\n",
                    run + 1,
                    a.runs,
                    sys.name,
                    a.files,
                    a.threads,
                    a.seconds
                ));
                phase(sys, a, "populate", max_mails)?;
                let before = fs.status()?.digest;
                let c = phase(sys, a, "run", max_mails)?.expect("the run phase reports");
                capped += u64::from(c.capped);
                if !sys.env.is_empty() {
                    let after = fs.status()?.digest;
                    digest.records += after.records_digested - before.records_digested;
                    digest.records_skipped += after.records_skipped - before.records_skipped;
                    digest.log_bytes += after.log_bytes_written - before.log_bytes_written;
                    digest.shared_bytes += after.shared_bytes_written - before.shared_bytes_written;
                    digest.digests += after.digests - before.digests;
                }
                taken[si].push(c.ops as f64 / c.secs);
                remove(sys)?;
            }
        }
        Ok(())
    })();
    for sys in &systems {
        let _ = remove(sys);
    }
    r?;
    digest.skipped_fraction = digest.records_skipped as f64 / digest.records.max(1) as f64;
    digest.shared_per_log_byte = digest.shared_bytes as f64 / digest.log_bytes.max(1) as f64;
    let mut digest = Some(digest);
    let results: Vec<MailResult> = systems
        .iter()
        .zip(taken)
        .map(|(sys, runs)| MailResult {
            system: sys.name.clone(),
            ops_per_s: median(&runs),
            runs,
            digest: if sys.env.is_empty() {
                None
            } else {
                digest.take()
            },
        })
        .collect();
    let report = Report {
        threads: a.threads,
        files: a.files,
        seconds: a.seconds,
        max_mails,
        capped_runs: capped,
        results,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| CliError::new(e.to_string()))?
        );
        return Ok(());
    }
    println!(
        "varmail flow: {} threads, {} files of 16 KiB, {} s per run, median of {}",
        a.threads, a.files, a.seconds, a.runs
    );
    if capped > 0 {
        println!(
            "({capped} of the runs stopped early, at {max_mails} mails: the store's free \
             space bounds how far the mailboxes grow; ops/s are over the time they ran)"
        );
    }
    println!("{:<12} {:>12} {:>10}", "system", "ops/s", "vs tmpfs");
    let tmpfs = report.results[2].ops_per_s;
    for r in &report.results {
        println!(
            "{:<12} {:>12.0} {:>9.2}x",
            r.system,
            r.ops_per_s,
            r.ops_per_s / tmpfs
        );
    }
    if let Some(d) = &report.results[0].digest {
        println!(
            "\ndigest of cairn-shim's runs: {} digests, {} records, {} skipped ({:.1}%); \
             {} bytes logged, {} written to the shared area ({:.2}x)",
            d.digests,
            d.records,
            d.records_skipped,
            100.0 * d.skipped_fraction,
            d.log_bytes,
            d.shared_bytes,
            d.shared_per_log_byte
        );
    }
    Ok(())
}
