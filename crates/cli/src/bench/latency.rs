//! `cairn bench latency`: in one run (or `--runs N`, the systems taking turns run after
//! run, each figure the median), durable writes and reads of 1 KiB, 4 KiB, 64 KiB and
//! 1 MiB on these systems:
//!
//! * `cairn`: `cairn::File::write_at` (durable on return) and `read_at` on the store;
//! * the host file system holding the store directory (or `--dir-host`), named by its type
//!   (`ext4`, `xfs`, `btrfs`, `overlay`, …): `pwrite` + `fdatasync` per write, `pread`;
//! * `tmpfs` (`/dev/shm`): `pwrite` without sync, `pread`;
//! * `cairn-fuse`: the store mounted with `cairn mount` on a temporary mount point:
//!   `pwrite` + `fdatasync` per write, `pread` (skipped, with a note, if it cannot mount).
//!
//! Each system writes a 64 MiB file first (the region); operations of size S go to
//! offsets rotating through the region in steps of S. A warm-up (a tenth of the run, at
//! most 1000 operations) precedes each measured run; every operation is timed with
//! `Instant` and recorded in an HDR histogram (ns, 3 significant digits).

use super::hostfs;
use super::report::{self, Measurement, Report};
use super::targets::{pattern, preallocate, CairnTarget, HostTarget, Target};
use super::LatencyArgs;
use crate::commands::open_fs;
use crate::error::{ctx, ctx_msg, CliError, CliResult};
use crate::progress::note as progress;
use crate::util::{human_bytes, human_ns};
use hdrhistogram::Histogram;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bytes of the file each system reads and writes in.
pub const REGION: u64 = 64 << 20;
/// Operation sizes.
pub const SIZES: [u64; 4] = [1 << 10, 4 << 10, 64 << 10, 1 << 20];
/// Where the tmpfs system's file goes.
const TMPFS_DIR: &str = "/dev/shm";

/// Default measured operations for a size.
pub fn default_iterations(size: u64) -> u64 {
    match size {
        s if s <= 4 << 10 => 20_000,
        s if s <= 64 << 10 => 5_000,
        _ => 500,
    }
}

/// Cap on fsync'd host-file-system writes for a size (each costs a device flush).
pub fn host_write_cap(size: u64) -> u64 {
    match size {
        s if s <= 4 << 10 => 2_000,
        s if s <= 64 << 10 => 500,
        _ => 200,
    }
}

/// Unmeasured operations before a run of `n`.
pub fn warmup(n: u64) -> u64 {
    (n / 10).clamp(1, 1_000)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Write,
    Read,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
        }
    }
}

/// Time `n` operations (after `warm` unmeasured ones) of `size` bytes on `target`.
pub fn measure(
    target: &dyn Target,
    system: &str,
    op: Op,
    size: u64,
    n: u64,
    warm: u64,
) -> io::Result<Measurement> {
    let mut buf = vec![0u8; size as usize];
    pattern(&mut buf, size ^ 0x5eed);
    let slots = REGION / size;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| io::Error::other(format!("histogram: {e}")))?;
    target.settle()?;
    let mut sum: u128 = 0;
    for i in 0..warm + n {
        let off = (i % slots) * size;
        let ns = match op {
            Op::Write => {
                buf[0] = i as u8;
                let t = Instant::now();
                target.write(&buf, off)?;
                t.elapsed().as_nanos()
            }
            Op::Read => {
                let t = Instant::now();
                target.read(&mut buf, off)?;
                t.elapsed().as_nanos()
            }
        };
        if i >= warm {
            let ns = u64::try_from(ns).unwrap_or(u64::MAX).max(1);
            hist.saturating_record(ns);
            sum += ns as u128;
        }
    }
    Ok(Measurement {
        system: system.to_string(),
        op: op.name(),
        size,
        p50_ns: hist.value_at_quantile(0.5),
        p99_ns: hist.value_at_quantile(0.99),
        p999_ns: hist.value_at_quantile(0.999),
        mean_ns: (sum / n.max(1) as u128) as u64,
        iterations: n,
    })
}

/// The name the host file system goes by in the results: its type, except that a host
/// tmpfs is called `host-tmpfs` so that it cannot be confused with the `tmpfs` system.
pub fn host_system_name(fs_type: &str) -> String {
    if fs_type == "tmpfs" {
        "host-tmpfs".to_string()
    } else {
        fs_type.to_string()
    }
}

/// `cairn bench latency`. Long (about 140 lines) on purpose: the benchmark's script, the
/// systems and sizes in the order they run and print.
pub fn run(store: Option<&Path>, args: &LatencyArgs) -> CliResult {
    let fs = open_fs(store)?;
    let store_dir = fs.store_dir().to_path_buf();
    let host_dir = args.dir_host.clone().unwrap_or_else(|| store_dir.clone());
    if !host_dir.is_dir() {
        return Err(CliError::new(format!(
            "--dir-host {}: not a directory",
            host_dir.display()
        )));
    }
    let host_fs = hostfs::fs_type(&host_dir).map_err(ctx("file system type of", &host_dir))?;
    let host_name = host_system_name(&host_fs);
    let shm = Path::new(TMPFS_DIR);
    match hostfs::fs_type(shm) {
        Ok(t) if t == "tmpfs" => {}
        Ok(t) => {
            return Err(CliError::new(format!(
                "{TMPFS_DIR} is {t}, not tmpfs: the tmpfs baseline needs a tmpfs there"
            )))
        }
        Err(e) => return Err(ctx("file system type of", shm)(e)),
    }
    if let Ok(st) = fs.status() {
        if let Some(t) = st.tiers.first() {
            let free = t.capacity_bytes.saturating_sub(t.used_bytes);
            if free < 2 * REGION {
                return Err(CliError::new(format!(
                    "store {} has {} free; the benchmark needs at least {} \
                     (make a larger store with `cairn mkfs --nvm-size`)",
                    store_dir.display(),
                    human_bytes(free),
                    human_bytes(2 * REGION)
                )));
            }
        }
    }

    let pid = std::process::id();
    let cairn_t = CairnTarget::create(&fs, PathBuf::from(format!("/.cairn-bench-{pid}")))
        .map_err(ctx_msg("creating the Cairn test file"))?;
    let host_path = host_dir.join(format!(".cairn-bench-{pid}.tmp"));
    let host_t = HostTarget::create(host_path.clone(), true).map_err(ctx("create", &host_path))?;
    let shm_path = shm.join(format!("cairn-bench-{pid}.tmp"));
    let shm_t = HostTarget::create(shm_path.clone(), false).map_err(ctx("create", &shm_path))?;

    progress(format_args!(
        "bench latency: writing the {} region on cairn ({}), {host_name} ({}) and tmpfs ({TMPFS_DIR})\n",
        human_bytes(REGION),
        store_dir.display(),
        host_dir.display()
    ));
    preallocate(&cairn_t, REGION).map_err(ctx_msg("preallocating the Cairn test file"))?;
    preallocate(&host_t, REGION).map_err(ctx("preallocate", &host_path))?;
    preallocate(&shm_t, REGION).map_err(ctx("preallocate", &shm_path))?;

    let mp = super::apps::tempfile_dir("cairn-bench-latency-mnt")?;
    let fuse_t =
        match crate::commands::mount::mount(Some(&store_dir), &mp, false, Default::default(), true)
        {
            Ok(()) => {
                let p = mp.join(format!(".cairn-bench-fuse-{pid}"));
                let t = HostTarget::create(p.clone(), true).map_err(ctx("create", &p))?;
                preallocate(&t, REGION).map_err(ctx("preallocate", &p))?;
                Some(t)
            }
            Err(e) => {
                progress(format_args!(
                    "bench latency: no cairn-fuse row: {}\n",
                    e.message
                ));
                None
            }
        };
    // (name, target, pwrite + fdatasync, capped like the host's device flushes)
    let mut systems: Vec<(&str, &dyn Target, bool, bool)> = vec![
        ("cairn", &cairn_t, false, false),
        (&host_name, &host_t, true, true),
        ("tmpfs", &shm_t, false, false),
    ];
    if let Some(t) = &fuse_t {
        systems.push(("cairn-fuse", t, true, false));
    }
    // Every (size, system, op) measured, with its operation count; the same list each run.
    let mut cells = Vec::new();
    for &size in &SIZES {
        let base = args.iterations.unwrap_or_else(|| default_iterations(size));
        for &(name, target, _, capped) in &systems {
            for op in [Op::Write, Op::Read] {
                let n = if capped && op == Op::Write {
                    base.min(host_write_cap(size))
                } else {
                    base
                };
                cells.push((name, target, op, size, n));
            }
        }
    }
    let total = cells.len() * args.runs as usize;
    let mut k = 0;
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        let mut results = Vec::with_capacity(cells.len());
        for &(name, target, op, size, n) in &cells {
            k += 1;
            let warm = warmup(n);
            progress(format_args!(
                "[{k:>2}/{total}] {name} {} {}: {n} ops (+{warm} warm-up) ... ",
                op.name(),
                human_bytes(size)
            ));
            let t = Instant::now();
            let m = measure(target, name, op, size, n, warm).map_err(|e| {
                progress(format_args!("failed\n"));
                ctx_msg(format!("{name} {} {}", op.name(), human_bytes(size)))(e)
            })?;
            progress(format_args!(
                "p50 {} ({:.1} s)\n",
                human_ns(m.p50_ns as f64),
                t.elapsed().as_secs_f64()
            ));
            results.push(m);
        }
        runs.push(results);
    }
    let results = report::medians(&runs);
    drop(cells);
    drop(systems);
    drop(shm_t);
    drop(host_t);
    drop(cairn_t);
    if let Some(t) = fuse_t {
        let _ = std::fs::remove_file(&t.path);
        drop(t);
        let _ = crate::commands::mount::umount(&mp);
    }
    let _ = std::fs::remove_dir(&mp);

    let report = Report {
        results,
        runs: args.runs,
        host_fs,
        store: store_dir.display().to_string(),
    };
    let text = if args.json {
        crate::util::json_text(&report, "the results")?
    } else {
        report::human(&report, &host_name, &host_dir)
    };
    io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_plan() {
        assert_eq!(default_iterations(1 << 10), 20_000);
        assert_eq!(default_iterations(4 << 10), 20_000);
        assert_eq!(default_iterations(64 << 10), 5_000);
        assert_eq!(default_iterations(1 << 20), 500);
        assert_eq!(host_write_cap(4 << 10), 2_000);
        assert_eq!(host_write_cap(64 << 10), 500);
        assert_eq!(host_write_cap(1 << 20), 200);
        assert_eq!(warmup(20_000), 1_000);
        assert_eq!(warmup(500), 50);
        assert_eq!(warmup(3), 1);
        assert_eq!(host_system_name("ext4"), "ext4");
        assert_eq!(host_system_name("tmpfs"), "host-tmpfs");
        for s in SIZES {
            assert_eq!(REGION % s, 0);
        }
    }

    #[test]
    fn measure_a_host_file() {
        let d = tempfile::tempdir().unwrap();
        let t = HostTarget::create(d.path().join("f"), false).unwrap();
        preallocate(&t, REGION).unwrap();
        let m = measure(&t, "x", Op::Write, 4096, 100, 10).unwrap();
        assert_eq!(m.iterations, 100);
        assert!(m.p50_ns > 0 && m.p50_ns <= m.p99_ns && m.p99_ns <= m.p999_ns);
        let m = measure(&t, "x", Op::Read, 1 << 20, 20, 2).unwrap();
        assert_eq!((m.op, m.size), ("read", 1 << 20));
        assert!(m.mean_ns > 0);
    }
}
