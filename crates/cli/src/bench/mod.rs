//! `cairn bench`: benchmarks.
//!
//! * [`latency`](latency::run): durable write and read latency of Cairn, the host file
//!   system holding the store (pwrite + fdatasync) and tmpfs (pwrite, no sync).
//! * [`share`](share::run): two processes passing 4 KiB updates through a lock file, and
//!   1–2 client scaling of private durable writes.
//! * [`apps`](apps::run): SQLite, RocksDB and Redis on the FUSE mount, the host file
//!   system and tmpfs.
//! * [`tiers`](tiers::run): NVM, SSD and HDD tiers against the host file system.
//! * [`remote`](remote::run): the remote tier and backups on Ceph clusters started for
//!   the run, against `rados bench` and raw librados reads.
//! * [`superpages`](superpages::run): 2 MiB extents against 4 KiB blocks and tmpfs.
//! * [`mail`](mail::run): Filebench's varmail flow through the shim, the host file
//!   system and tmpfs, with the digest's counters.

mod apps;
mod hostfs;
mod hugepage;
mod hugepage_worker;
mod kv;
mod kv_churn;
mod latency;
mod mail;
mod remote;
mod report;
mod share;
mod spacejmp;
mod superpages;
mod targets;
mod tiers;

use crate::error::{CliError, CliResult};
use clap::Args;
use std::path::PathBuf;

pub use apps::{run as apps, AppsArgs};
pub use hugepage::{run as hugepage, HugepageArgs};
pub use hugepage_worker::{worker as hugepage_worker, WorkerArgs as HugepageWorkerArgs};
pub use kv::{run as kv, KvArgs};
pub use kv_churn::{worker as kv_churn_worker, WorkerArgs as KvChurnWorkerArgs};
pub use latency::run as latency;
pub use mail::{run as mail, worker as mail_worker, MailArgs, MailWorkerArgs};
pub use remote::{run as remote, RemoteArgs};
pub use share::{run as share, worker as share_worker, ShareArgs, WorkerArgs as ShareWorkerArgs};
pub use spacejmp::{
    kv_shared_worker, run as spacejmp, worker as spacejmp_worker, KvSharedWorkerArgs, SpacejmpArgs,
    SpacejmpWorkerArgs,
};
pub use superpages::{run as superpages, SuperpagesArgs};
pub use tiers::{run as tiers, TiersArgs};

/// A store made for a benchmark run: its directory `root` (the store is `root/store`)
/// and its NVM file; at drop its daemon is stopped and both are removed.
struct BenchStore {
    root: PathBuf,
    nvm: PathBuf,
}

impl Drop for BenchStore {
    fn drop(&mut self) {
        let store = self.root.join("store");
        let _ = cairn::daemon_shutdown(Some(&store));
        // Its host objects in /dev/shm (resident segments, lock tables, map objects).
        cairn_area::host::remove_all(&store);
        let _ = std::fs::remove_dir_all(&self.root);
        let _ = cairn_area::store::remove_nvm_files(&self.nvm);
    }
}

/// `cairn bench latency` options.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Measured operations per (system, op, size) [default: 20000 for 1 KiB and 4 KiB,
    /// 5000 for 64 KiB, 500 for 1 MiB]; fsync'd host writes are capped at 2000/2000/500/200
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub iterations: Option<u64>,
    /// Directory for the host file system's test file [default: the store directory]
    #[arg(long, value_name = "DIR")]
    pub dir_host: Option<PathBuf>,
    /// Measure everything N times (the systems take turns, run after run) and report
    /// the median of each figure
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub runs: u64,
}

/// A figure in kB of `/proc/PID/FILE` (`status`, `smaps_rollup`), for example
/// `RssAnon` or `AnonHugePages`, in bytes; `pid` 0 is this process.
pub(crate) fn proc_kb(pid: u32, file: &str, key: &str) -> CliResult<u64> {
    let path = if pid == 0 {
        format!("/proc/self/{file}")
    } else {
        format!("/proc/{pid}/{file}")
    };
    let s = std::fs::read_to_string(&path).map_err(crate::error::ctx_msg(&path))?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| CliError::new(format!("{path}: no {key}")))
}

/// A small fast PRNG (xorshift64*), enough for workload generation.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The median of `v` (the mean of the middle two for an even count; 0 for none).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[m],
        _ => (s[m - 1] + s[m]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
