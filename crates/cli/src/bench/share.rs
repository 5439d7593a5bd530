//! `cairn bench share`: Strata's worst case for sharing. Two processes coordinate 4 KiB
//! updates of one data file through a lock file: create the lock file with `O_EXCL`; the
//! winner reads the data file's 4 KiB block, writes it back with the update counter
//! incremented, then unlinks the lock file. At the end the block's counter must equal the
//! number of updates both processes report (a lost update means the lock did not
//! exclude), and its contents must match its counter. The same run on the host file
//! system and on tmpfs; two processes appending 1 KiB records to one shared log file
//! with `O_APPEND` (every record must be intact, and each writer's records in order);
//! and the 1–2 client scaling of 4 KiB durable writes to private files.
//!
//! Each measurement runs in two child processes (`cairn bench share-worker`, hidden) that
//! start together and stop at a common deadline.

use super::hostfs;
use super::latency::host_system_name;
use super::targets::pattern;
use crate::error::{CliError, CliResult};
use crate::progress::note as progress;
use clap::Args;
use serde::Serialize;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BLOCK: usize = 4096;
/// Record size of the shared-append measurement.
const REC: usize = 1024;
/// Appends per process at most (128 MiB), so that the store does not fill up.
const MAX_APPENDS: u64 = 128 << 10;
const TMPFS_DIR: &str = "/dev/shm";

/// `cairn bench share` options.
#[derive(Debug, Args)]
pub struct ShareArgs {
    /// Print the results as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Seconds per measurement
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Directory for the host file system's files [default: the store directory]
    #[arg(long, value_name = "DIR")]
    pub dir_host: Option<PathBuf>,
}

/// `cairn bench share-worker` (run by `bench share`, not by people).
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// `lockfile`, `append` or `private`
    #[arg(long)]
    pub mode: String,
    /// `cairn`, or a host directory
    #[arg(long)]
    pub system: String,
    /// Directory of the files (inside the store for cairn)
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long)]
    pub id: u32,
    /// Start and stop times, ns since the Unix epoch
    #[arg(long)]
    pub start_ns: u128,
    #[arg(long)]
    pub stop_ns: u128,
    /// fdatasync after each private write or append (host file system)
    #[arg(long)]
    pub sync: bool,
}

/// One system's lock-file result.
#[derive(Debug, Clone, Serialize)]
pub struct ShareResult {
    pub system: String,
    pub updates_per_s: f64,
    pub verified: bool,
    pub updates: u64,
    /// Updates per process.
    pub per_process: Vec<u64>,
    pub seconds: f64,
}

/// One system's shared-append result.
#[derive(Debug, Clone, Serialize)]
pub struct AppendResult {
    pub system: String,
    pub appends_per_s: f64,
    pub verified: bool,
    pub appends: u64,
    /// Appends per process.
    pub per_process: Vec<u64>,
}

/// Private-file write throughput with 1 or 2 clients.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingResult {
    pub system: String,
    pub clients: u32,
    pub writes_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    results: Vec<ShareResult>,
    appends: Vec<AppendResult>,
    scaling: Vec<ScalingResult>,
    host_fs: String,
    store: String,
}

/// Now, in nanoseconds since the Unix epoch (as the records carry it).
fn now_ns() -> u128 {
    cairn_area::time::now_ns() as u128
}

fn sleep_until(t: u128) {
    let now = now_ns();
    if t > now {
        std::thread::sleep(Duration::from_nanos((t - now) as u64));
    }
}

/// The file operations a worker needs, for Cairn and for a host directory.
enum Sys {
    Cairn(cairn::Fs),
    Host,
}

impl Sys {
    fn create_excl(&self, p: &Path) -> io::Result<()> {
        match self {
            Sys::Cairn(fs) => cairn::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(fs, p)
                .map(drop),
            Sys::Host => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .map(drop),
        }
    }
    fn remove(&self, p: &Path) -> io::Result<()> {
        match self {
            Sys::Cairn(fs) => fs.remove_file(p),
            Sys::Host => std::fs::remove_file(p),
        }
    }
}

/// An open data file.
enum Data {
    Cairn(cairn::File),
    Host(std::fs::File),
}

impl Data {
    /// Open (creating) `p` for appending.
    fn append(sys: &Sys, p: &Path) -> io::Result<Data> {
        Ok(match sys {
            Sys::Cairn(fs) => Data::Cairn(
                cairn::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(fs, p)?,
            ),
            Sys::Host => Data::Host(
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(p)?,
            ),
        })
    }
    /// Append `buf` in one write call (as a log writer does).
    fn append_record(&mut self, buf: &[u8], sync: bool) -> io::Result<()> {
        use std::io::Write as _;
        let n = match self {
            Data::Cairn(f) => f.write(buf)?,
            Data::Host(f) => {
                let n = f.write(buf)?;
                if sync {
                    f.sync_data()?;
                }
                n
            }
        };
        if n != buf.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short append"));
        }
        Ok(())
    }
    fn open(sys: &Sys, p: &Path, create: bool) -> io::Result<Data> {
        Ok(match sys {
            Sys::Cairn(fs) => Data::Cairn(
                cairn::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .open(fs, p)?,
            ),
            Sys::Host => Data::Host(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(create)
                    .truncate(false)
                    .open(p)?,
            ),
        })
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        match self {
            Data::Cairn(f) => read_exact_at(|b, o| f.read_at(b, o), buf, off),
            Data::Host(f) => f.read_exact_at(buf, off),
        }
    }
    fn write_at(&self, buf: &[u8], off: u64, sync: bool) -> io::Result<()> {
        match self {
            Data::Cairn(f) => {
                let mut n = 0;
                while n < buf.len() {
                    n += f.write_at(&buf[n..], off + n as u64)?;
                }
                Ok(())
            }
            Data::Host(f) => {
                f.write_all_at(buf, off)?;
                if sync {
                    f.sync_data()?;
                }
                Ok(())
            }
        }
    }
}

fn read_exact_at(
    mut f: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
    buf: &mut [u8],
    off: u64,
) -> io::Result<()> {
    let mut n = 0;
    while n < buf.len() {
        let r = f(&mut buf[n..], off + n as u64)?;
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        n += r;
    }
    Ok(())
}

/// The block an update with counter `c` writes: counter, writer, then a pattern of `c`.
fn update_block(c: u64, id: u32) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    pattern(&mut b[16..], c + 1);
    b[..8].copy_from_slice(&c.to_le_bytes());
    b[8..16].copy_from_slice(&(id as u64).to_le_bytes());
    b
}

/// Record `seq` of writer `id` in the shared-append measurement.
fn append_record(id: u32, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; REC];
    pattern(&mut b[16..], ((id as u64) << 40) ^ seq);
    b[..8].copy_from_slice(&seq.to_le_bytes());
    b[8..16].copy_from_slice(&(id as u64).to_le_bytes());
    b
}

/// Check a shared-append log: whole records, each intact, each writer's in order from
/// 0, as many as each counted.
fn verify_appends(log: &[u8], counts: &[u64]) -> bool {
    if log.len() as u64 != counts.iter().sum::<u64>() * REC as u64 {
        return false;
    }
    let mut next = [0u64; 2];
    log.chunks(REC).all(|r| {
        let seq = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        let id = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
        let ok = id < 2 && seq == next[id as usize] && r == append_record(id as u32, seq);
        if ok {
            next[id as usize] += 1;
        }
        ok
    }) && next[..] == counts[..]
}

/// Run one worker; print the number of operations it completed.
pub fn worker(store: Option<&Path>, a: &WorkerArgs) -> CliResult {
    let sys = if a.system == "cairn" {
        Sys::Cairn(cairn::Fs::open_store(store)?)
    } else {
        Sys::Host
    };
    let mut count = 0u64;
    match a.mode.as_str() {
        "lockfile" => {
            let lock = a.dir.join("lock");
            let data = Data::open(&sys, &a.dir.join("data"), false)?;
            let mut buf = vec![0u8; BLOCK];
            sleep_until(a.start_ns);
            while now_ns() < a.stop_ns {
                match sys.create_excl(&lock) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        std::thread::yield_now();
                        continue;
                    }
                    Err(e) => return Err(CliError::new(format!("create the lock file: {e}"))),
                }
                data.read_at(&mut buf, 0)?;
                let c = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                data.write_at(&update_block(c + 1, a.id), 0, false)?;
                sys.remove(&lock)?;
                count += 1;
            }
        }
        "append" => {
            let mut log = Data::append(&sys, &a.dir.join("log"))?;
            sleep_until(a.start_ns);
            while now_ns() < a.stop_ns && count < MAX_APPENDS {
                log.append_record(&append_record(a.id, count), a.sync)?;
                count += 1;
            }
        }
        "private" => {
            let data = Data::open(&sys, &a.dir.join(format!("private-{}", a.id)), true)?;
            let mut buf = vec![0u8; BLOCK];
            pattern(&mut buf, a.id as u64 + 7);
            sleep_until(a.start_ns);
            while now_ns() < a.stop_ns {
                data.write_at(&buf, (count % 4096) * BLOCK as u64, a.sync)?;
                count += 1;
            }
        }
        m => return Err(CliError::new(format!("unknown worker mode {m}"))),
    }
    println!("{count} {}", now_ns().min(a.stop_ns));
    Ok(())
}

/// Spawn `n` workers of `mode` on `system`/`dir`; return the total count and the seconds.
fn run_workers(
    store: &Path,
    mode: &str,
    system: &str,
    dir: &Path,
    n: u32,
    seconds: u64,
    sync: bool,
) -> CliResult<(Vec<u64>, f64)> {
    let exe = std::env::current_exe()?;
    let start = now_ns() + 300_000_000;
    let stop = start + seconds as u128 * 1_000_000_000;
    let children: Vec<_> = (0..n)
        .map(|id| {
            let mut c = std::process::Command::new(&exe);
            c.arg("--store").arg(store).args([
                "bench",
                "share-worker",
                "--mode",
                mode,
                "--system",
                system,
            ]);
            c.arg("--dir").arg(dir).args(["--id", &id.to_string()]);
            c.args([
                "--start-ns",
                &start.to_string(),
                "--stop-ns",
                &stop.to_string(),
            ]);
            if sync {
                c.arg("--sync");
            }
            c.stdout(std::process::Stdio::piped()).spawn()
        })
        .collect::<io::Result<_>>()?;
    let mut counts = Vec::new();
    let mut end = start;
    for c in children {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            return Err(CliError::new(format!(
                "a {mode} worker on {system} failed ({})",
                out.status
            )));
        }
        // "<count> <ns when it stopped>".
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace();
        let (Some(n), Some(t)) = (
            it.next().and_then(|n| n.parse::<u64>().ok()),
            it.next().and_then(|t| t.parse::<u128>().ok()),
        ) else {
            return Err(CliError::new(format!("worker output: {text:?}")));
        };
        counts.push(n);
        end = end.max(t);
    }
    Ok((counts, (end - start) as f64 / 1e9))
}

/// A table of verified counts: system, rate, count, verified, count per process.
fn print_counts<'a>(
    what: &str,
    rows: impl Iterator<Item = (&'a String, f64, u64, bool, &'a Vec<u64>)>,
) {
    println!(
        "{:<12} {:>14} {:>10} {:>9}  per process",
        "system",
        format!("{what}/s"),
        what,
        "verified"
    );
    for (system, rate, n, verified, per) in rows {
        println!("{system:<12} {rate:>14.0} {n:>10} {verified:>9}  {per:?}");
    }
}

/// `cairn bench share`. Long (about 160 lines) on purpose: the benchmark's script, its
/// three experiments in the order they run and print.
pub fn run(store: Option<&Path>, args: &ShareArgs) -> CliResult {
    let fs = cairn::Fs::open_store(store)?;
    let store_dir = fs.store_dir().to_path_buf();
    let host_dir = args.dir_host.clone().unwrap_or_else(|| store_dir.clone());
    let host_fs = hostfs::fs_type(&host_dir)?;
    let host_name = host_system_name(&host_fs);
    let pid = std::process::id();
    let cairn_dir = PathBuf::from(format!("/.cairn-share-{pid}"));
    let host_work = host_dir.join(format!(".cairn-share-{pid}"));
    let shm_work = Path::new(TMPFS_DIR).join(format!("cairn-share-{pid}"));
    fs.create_dir(&cairn_dir)?;
    fs.write(cairn_dir.join("data"), update_block(0, 0))?;
    drop(fs);
    for d in [&host_work, &shm_work] {
        std::fs::create_dir_all(d)?;
        std::fs::write(d.join("data"), update_block(0, 0))?;
    }
    let systems: [(&str, String, &Path, bool); 3] = [
        ("cairn", "cairn".into(), &cairn_dir, false),
        (
            &host_name,
            host_work.display().to_string(),
            &host_work,
            true,
        ),
        ("tmpfs", shm_work.display().to_string(), &shm_work, false),
    ];
    let mut results = Vec::new();
    let mut appends = Vec::new();
    let mut scaling = Vec::new();
    // Measure; the work directories go whatever happens.
    let measured = (|| -> CliResult {
        for (name, system, dir, sync) in &systems {
            progress(format_args!(
                "bench share: lock-file updates on {name} ({}s)\n",
                args.seconds
            ));
            let (per_process, secs) =
                run_workers(&store_dir, "lockfile", system, dir, 2, args.seconds, false)?;
            let updates = per_process.iter().sum();
            // Verify: the block's counter is the number of updates, and its contents match.
            let block = if *name == "cairn" {
                cairn::Fs::open_store(Some(&store_dir))?.read(dir.join("data"))?
            } else {
                std::fs::read(dir.join("data"))?
            };
            let c = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
            let id = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes")) as u32;
            let verified = block.len() == BLOCK && c == updates && block == update_block(c, id);
            results.push(ShareResult {
                system: name.to_string(),
                updates_per_s: updates as f64 / secs,
                verified,
                updates,
                per_process,
                seconds: secs,
            });
            progress(format_args!(
                "bench share: two processes appending to one file on {name} ({}s)\n",
                args.seconds
            ));
            let (per_process, secs) =
                run_workers(&store_dir, "append", system, dir, 2, args.seconds, *sync)?;
            let n = per_process.iter().sum();
            let log = if *name == "cairn" {
                cairn::Fs::open_store(Some(&store_dir))?.read(dir.join("log"))?
            } else {
                std::fs::read(dir.join("log"))?
            };
            if *name == "cairn" {
                cairn::Fs::open_store(Some(&store_dir))?.remove_file(dir.join("log"))?;
            } else {
                std::fs::remove_file(dir.join("log"))?;
            }
            appends.push(AppendResult {
                system: name.to_string(),
                appends_per_s: n as f64 / secs,
                verified: verify_appends(&log, &per_process),
                appends: n,
                per_process,
            });
            for clients in [1u32, 2] {
                progress(format_args!(
                    "bench share: 4 KiB durable private writes on {name}, {clients} client(s)\n"
                ));
                let (per, secs) = run_workers(
                    &store_dir,
                    "private",
                    system,
                    dir,
                    clients,
                    args.seconds,
                    *sync,
                )?;
                scaling.push(ScalingResult {
                    system: name.to_string(),
                    clients,
                    writes_per_s: per.iter().sum::<u64>() as f64 / secs,
                });
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&host_work);
    let _ = std::fs::remove_dir_all(&shm_work);
    if let Ok(fs) = cairn::Fs::open_store(Some(&store_dir)) {
        let _ = fs.remove_dir_all(&cairn_dir);
    }
    measured?;
    let report = Report {
        results,
        appends,
        scaling,
        host_fs,
        store: store_dir.display().to_string(),
    };
    if args.json {
        print!("{}", crate::util::json_text(&report, "the results")?);
    } else {
        println!(
            "Cairn sharing benchmark (two processes, lock file + 4 KiB update; {} s each)",
            args.seconds
        );
        print_counts(
            "updates",
            report.results.iter().map(|r| {
                (
                    &r.system,
                    r.updates_per_s,
                    r.updates,
                    r.verified,
                    &r.per_process,
                )
            }),
        );
        println!();
        println!("Two processes appending 1 KiB records to one file with O_APPEND ({host_name}: + fdatasync; tmpfs: no sync)");
        print_counts(
            "appends",
            report.appends.iter().map(|r| {
                (
                    &r.system,
                    r.appends_per_s,
                    r.appends,
                    r.verified,
                    &r.per_process,
                )
            }),
        );
        println!();
        println!("4 KiB durable writes to private files ({host_name}: pwrite + fdatasync; tmpfs: no sync)");
        println!("{:<12} {:>8} {:>14}", "system", "clients", "writes/s");
        for s in &report.scaling {
            println!("{:<12} {:>8} {:>14.0}", s.system, s.clients, s.writes_per_s);
        }
    }
    if report.results.iter().any(|r| !r.verified) || report.appends.iter().any(|r| !r.verified) {
        return Err(CliError::new(
            "verification failed: lost or corrupted updates (see the table)",
        ));
    }
    Ok(())
}
