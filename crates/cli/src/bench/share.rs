//! `cairn bench share`: Strata's worst case for sharing. Two processes coordinate 4 KiB
//! updates of one data file through a lock file: create the lock file with `O_EXCL`; the
//! winner reads the data file's 4 KiB block, writes it back with the update counter
//! incremented, then unlinks the lock file. At the end the block's counter must equal the
//! number of updates both processes report (a lost update means the lock did not
//! exclude), and its contents must match its counter. The same run on the host file
//! system and on tmpfs, and the 1–2 client scaling of 4 KiB durable writes to private
//! files.
//!
//! Each measurement runs in two child processes (`cairn bench share-worker`, hidden) that
//! start together and stop at a common deadline.

use super::hostfs;
use super::latency::host_system_name;
use super::targets::pattern;
use crate::error::{CliError, CliResult};
use clap::Args;
use serde::Serialize;
use std::io::{self, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const BLOCK: usize = 4096;
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
    /// `lockfile` or `private`
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
    /// fdatasync after each private write (host file system)
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
    pub seconds: f64,
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
    scaling: Vec<ScalingResult>,
    host_fs: String,
    store: String,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
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
    println!("{count}");
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
) -> CliResult<(u64, f64)> {
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
    let mut total = 0u64;
    for c in children {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            return Err(CliError::new(format!(
                "a {mode} worker on {system} failed ({})",
                out.status
            )));
        }
        total += String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .map_err(|e| CliError::new(format!("worker output: {e}")))?;
    }
    Ok((total, (stop - start) as f64 / 1e9))
}

fn progress(msg: std::fmt::Arguments) {
    let _ = std::io::stderr().write_fmt(msg);
}

/// `cairn bench share`.
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
    let mut scaling = Vec::new();
    for (name, system, dir, sync) in &systems {
        progress(format_args!(
            "bench share: lock-file updates on {name} ({}s)\n",
            args.seconds
        ));
        let (updates, secs) =
            run_workers(&store_dir, "lockfile", system, dir, 2, args.seconds, false)?;
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
            seconds: secs,
        });
        for clients in [1u32, 2] {
            progress(format_args!(
                "bench share: 4 KiB durable private writes on {name}, {clients} client(s)\n"
            ));
            let (n, secs) = run_workers(
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
                writes_per_s: n as f64 / secs,
            });
        }
    }
    let fs = cairn::Fs::open_store(Some(&store_dir))?;
    let _ = fs.remove_dir_all(&cairn_dir);
    let _ = std::fs::remove_dir_all(&host_work);
    let _ = std::fs::remove_dir_all(&shm_work);
    let report = Report {
        results,
        scaling,
        host_fs,
        store: store_dir.display().to_string(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| CliError::new(e.to_string()))?
        );
    } else {
        println!(
            "Cairn sharing benchmark (two processes, lock file + 4 KiB update; {} s each)",
            args.seconds
        );
        println!(
            "{:<12} {:>14} {:>10} {:>9}",
            "system", "updates/s", "updates", "verified"
        );
        for r in &report.results {
            println!(
                "{:<12} {:>14.0} {:>10} {:>9}",
                r.system, r.updates_per_s, r.updates, r.verified
            );
        }
        println!();
        println!("4 KiB durable writes to private files ({host_name}: pwrite + fdatasync; tmpfs: no sync)");
        println!("{:<12} {:>8} {:>14}", "system", "clients", "writes/s");
        for s in &report.scaling {
            println!("{:<12} {:>8} {:>14.0}", s.system, s.clients, s.writes_per_s);
        }
    }
    if report.results.iter().any(|r| !r.verified) {
        return Err(CliError::new(
            "verification failed: lost or corrupted updates (see the table)",
        ));
    }
    Ok(())
}
