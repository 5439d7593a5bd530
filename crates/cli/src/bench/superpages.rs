//! `cairn bench superpages`: what superpage extents buy, in one run, over a file of each
//! size (512 MiB and 4 GiB by default) on three systems:
//!
//! * `cairn`, pages `2M`: a store made for the run with superpages on; the file written
//!   whole lands in 2 MiB extents (at its digests, or promoted), collapsed into huge
//!   folios, and `File::map` maps them with PMDs;
//! * `cairn`, pages `4K`: the same with `superpages = false`: 4 KiB blocks, mapped in
//!   place with 4 KiB pages;
//! * `tmpfs`, pages `4K`: the same bytes in a file on `/dev/shm`, `mmap`ed (4 KiB pages,
//!   as the default mount gives).
//!
//! Workloads, each at random offsets over the whole file, run three times (the median
//! counts): dependent 8-byte loads (each
//! load's value picks the next address: latency), 4 KiB and 256 B copies out of the
//! mapping, 4 KiB `read_at` (`pread` for tmpfs); and the minor page faults and time to
//! map the whole file and touch every page (for tmpfs also through a writable mapping,
//! written on every page: no fault-around there). Then the promotion of a 1 GiB file written
//! in 64 KiB pieces (4 KiB blocks): how long it takes at the configured rate, and the
//! latency of 4 KiB writes into that file meanwhile against the same writes after.

use super::BenchStore;
use super::Rng;
use crate::error::{ctx, ctx_msg, CliError, CliResult};
use crate::progress::note as progress;
use crate::util::{human_bytes, human_ns};
use cairn_media::huge::{minor_faults, pmd_mapped_kib};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `cairn bench superpages` options.
#[derive(Debug, Args)]
pub struct SuperpagesArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// File sizes (comma-separated)
    #[arg(long, value_name = "SIZES", value_delimiter = ',', default_value = "512M,4G",
          value_parser = crate::util::parse_size)]
    pub sizes: Vec<u64>,
    /// Operations per (system, workload, size)
    #[arg(long, value_name = "N", default_value_t = 2_000_000,
          value_parser = clap::value_parser!(u64).range(1000..=1_000_000_000))]
    pub ops: u64,
    /// Size of the file whose promotion is timed (0: skip)
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = crate::util::parse_size)]
    pub promote_size: u64,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    /// "2M" or "4K".
    pub pages: String,
    pub workload: String,
    pub size: u64,
    pub ns_per_op: f64,
    /// Minor page faults during the workload (the mapping's first touches show here).
    pub page_faults: u64,
}

/// The promotion of a file written in 4 KiB blocks.
#[derive(Debug, Clone, Serialize)]
pub struct Promotion {
    pub size: u64,
    pub rate_mib: u64,
    pub seconds: f64,
    /// 4 KiB overwrites of the file while it was promoted, and after.
    pub during_p50_ns: u64,
    pub during_p99_ns: u64,
    pub during_max_ns: u64,
    pub after_p50_ns: u64,
    pub after_p99_ns: u64,
    pub after_max_ns: u64,
}

#[derive(Debug, Serialize)]
struct Output {
    rows: Vec<Row>,
    /// KiB of each `2M` mapping the kernel mapped with PMDs, by size.
    pmd_mapped_kib: Vec<(u64, u64)>,
    promotion: Option<Promotion>,
}

impl BenchStore {
    /// A one-client store of `nvm_size` in `/dev/shm` for the superpage runs, with
    /// superpages on or off.
    fn superpages(
        tag: &str,
        nvm_size: u64,
        superpages: bool,
    ) -> CliResult<(BenchStore, cairn::Fs)> {
        let pid = std::process::id();
        let root = std::env::temp_dir().join(format!("cairn-bench-sp-{tag}-{pid}"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(ctx("create", &root))?;
        let bs = BenchStore {
            root,
            nvm: PathBuf::from(format!("/dev/shm/cairn-bench-sp-{tag}-{pid}.nvm")),
        };
        let store = bs.root.join("store");
        cairn_daemon::mkfs(&cairn_daemon::MkfsOptions {
            store: store.clone(),
            nvm_path: Some(bs.nvm.clone()),
            nvm_size,
            log_size: 64 << 20,
            max_clients: 2,
            ..Default::default()
        })
        .map_err(ctx_msg("creating the benchmark store"))?;
        let sd = cairn_area::StoreDir::new(&store);
        let mut cfg = sd.load_config()?;
        cfg.superpages = superpages;
        cfg.superpage_rate_mib = 4096;
        sd.save_config(&cfg)?;
        let fs = cairn::Fs::open(&store).map_err(ctx_msg("opening the benchmark store"))?;
        Ok((bs, fs))
    }
}

/// The file's bytes from offset `off`: a pseudo-random stream.
fn fill(buf: &mut [u8], off: u64) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let x = (off / 8 + i as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// What the workloads read through: a mapping and positioned reads.
trait Subject {
    fn load(&self, off: usize) -> u64;
    fn copy(&self, off: usize, buf: &mut [u8]);
    fn read_at(&self, off: u64, buf: &mut [u8]);
    fn ptr(&self) -> usize;
}

struct CairnSubject {
    map: cairn::Map,
    file: cairn::File,
}

impl Subject for CairnSubject {
    fn load(&self, off: usize) -> u64 {
        self.map.load_u64(off).unwrap_or(0)
    }
    fn copy(&self, off: usize, buf: &mut [u8]) {
        let _ = self.map.read(off, buf);
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) {
        let _ = self.file.read_at(buf, off);
    }
    fn ptr(&self) -> usize {
        self.map.as_ptr() as usize
    }
}

struct ShmSubject {
    map: cairn_media::Mapping,
    file: std::fs::File,
}

impl Subject for ShmSubject {
    fn load(&self, off: usize) -> u64 {
        self.map.load_u64(off).unwrap_or(0)
    }
    fn copy(&self, off: usize, buf: &mut [u8]) {
        let _ = self.map.read(off, buf);
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) {
        let _ = self.file.read_at(buf, off);
    }
    fn ptr(&self) -> usize {
        self.map.as_ptr() as usize
    }
}

/// Touch every page of a freshly made mapping: (faults, seconds).
fn touch_all(s: &dyn Subject, size: u64) -> (u64, f64) {
    let f0 = minor_faults();
    let t = Instant::now();
    let mut acc = 0u64;
    for off in (0..size as usize).step_by(4096) {
        acc = acc.wrapping_add(s.load(off));
    }
    std::hint::black_box(acc);
    (minor_faults() - f0, t.elapsed().as_secs_f64())
}

/// Runs of each workload (the median is reported).
const RUNS: usize = 3;

/// The random workloads on a mapped subject: (workload, median ns/op, faults).
fn workloads(s: &dyn Subject, size: u64, ops: u64) -> Vec<(&'static str, f64, u64)> {
    let mut out = Vec::new();
    let slots = size / 8;
    // Each workload runs `RUNS` times (the same offsets); the median counts, and the
    // faults of the first run.
    let mut run = |name: &'static str, f: &mut dyn FnMut(&mut Rng) -> u64| {
        let mut times = Vec::new();
        let mut faults = 0;
        for k in 0..RUNS {
            let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ size);
            let f0 = minor_faults();
            let t = Instant::now();
            let mut acc = 0u64;
            for _ in 0..ops {
                acc = acc.wrapping_add(f(&mut rng));
            }
            std::hint::black_box(acc);
            times.push(t.elapsed().as_nanos() as f64 / ops as f64);
            if k == 0 {
                faults = minor_faults() - f0;
            }
        }
        times.sort_by(f64::total_cmp);
        out.push((name, times[RUNS / 2], faults));
    };
    let mut cur = 1u64;
    run("chase8B", &mut |_| {
        // The next slot depends on the value loaded: a chain of dependent loads.
        let v = s.load(((cur % slots) * 8) as usize);
        cur = (v ^ cur).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 7;
        v
    });
    let mut b4 = vec![0u8; 4096];
    run("copy4KB", &mut |r| {
        let off = (r.next() % (size / 4096)) * 4096;
        s.copy(off as usize, &mut b4);
        b4[0] as u64
    });
    let mut b256 = [0u8; 256];
    run("copy256B", &mut |r| {
        let off = (r.next() % (size / 256)) * 256;
        s.copy(off as usize, &mut b256);
        b256[0] as u64
    });
    run("read4KB", &mut |r| {
        let off = (r.next() % (size / 4096)) * 4096;
        s.read_at(off, &mut b4);
        b4[0] as u64
    });
    out
}

/// Write `size` bytes of the pattern to `f` in `piece`-byte writes.
fn write_file(f: &cairn::File, size: u64, piece: usize, digest: Option<&cairn::Fs>) -> CliResult {
    let mut buf = vec![0u8; piece];
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(piece as u64) as usize;
        fill(&mut buf[..n], off);
        let mut done = 0;
        while done < n {
            done += f
                .write_at(&buf[done..n], off + done as u64)
                .map_err(ctx_msg("writing the benchmark file"))?;
        }
        if let Some(fs) = digest {
            fs.digest()?;
        }
        off += n as u64;
    }
    Ok(())
}

/// Wait until the store has nothing left to promote or collapse (a collapse after the
/// file is mapped would unmap its pages and count their faults in a workload).
fn settle(fs: &cairn::Fs) -> CliResult {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s = fs
            .status()?
            .superpages
            .map(|s| s.candidates + s.collapse_pending)
            .unwrap_or(0);
        if s == 0 || Instant::now() > deadline {
            std::thread::sleep(Duration::from_millis(300));
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn row(system: &str, pages: &str, workload: &str, size: u64, ns: f64, faults: u64) -> Row {
    Row {
        system: system.into(),
        pages: pages.into(),
        workload: workload.into(),
        size,
        ns_per_op: ns,
        page_faults: faults,
    }
}

/// The runs of one size on one Cairn store.
fn cairn_runs(size: u64, ops: u64, on: bool, rows: &mut Vec<Row>) -> CliResult<Option<u64>> {
    let pages = if on { "2M" } else { "4K" };
    progress(format_args!(
        "bench superpages: cairn, {pages} pages, a {} file\n",
        human_bytes(size)
    ));
    let (_bs, fs) = BenchStore::superpages(pages, size + size / 8 + (256 << 20), on)?;
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "/f")
        .map_err(ctx_msg("creating the benchmark file"))?;
    write_file(&f, size, 8 << 20, None)?;
    fs.digest()?;
    settle(&fs)?;
    let map = f.map(0, size as usize).map_err(ctx_msg("File::map"))?;
    let s = CairnSubject { map, file: f };
    let (faults, secs) = touch_all(&s, size);
    rows.push(row(
        "cairn",
        pages,
        "map+touch",
        size,
        secs * 1e9 / (size / 4096) as f64,
        faults,
    ));
    let pmd = pmd_mapped_kib(0, s.ptr(), s.ptr() + size as usize).unwrap_or(0);
    for (w, ns, pf) in workloads(&s, size, ops) {
        rows.push(row("cairn", pages, w, size, ns, pf));
    }
    Ok(on.then_some(pmd))
}

/// The runs of one size on a tmpfs file.
fn shm_runs(size: u64, ops: u64, rows: &mut Vec<Row>) -> CliResult {
    progress(format_args!(
        "bench superpages: tmpfs, 4K pages, a {} file\n",
        human_bytes(size)
    ));
    let path = PathBuf::from(format!(
        "/dev/shm/cairn-bench-sp-{}.tmpfs",
        std::process::id()
    ));
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(path.clone());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(ctx("create", &path))?;
    let mut buf = vec![0u8; 8 << 20];
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(buf.len() as u64) as usize;
        fill(&mut buf[..n], off);
        file.write_all_at(&buf[..n], off)
            .map_err(ctx("write", &path))?;
        off += n as u64;
    }
    let map = cairn_media::Mapping::new(&file, 0, size as usize, false, false)
        .map_err(ctx("mmap", &path))?;
    let s = ShmSubject { map, file };
    let (faults, secs) = touch_all(&s, size);
    rows.push(row(
        "tmpfs",
        "4K",
        "map+touch",
        size,
        secs * 1e9 / (size / 4096) as f64,
        faults,
    ));
    for (w, ns, pf) in workloads(&s, size, ops) {
        rows.push(row("tmpfs", "4K", w, size, ns, pf));
    }
    // A writable mapping, written on every page: one fault per page (the kernel maps 16
    // pages per read fault, none around a write fault), the case of a 512× reduction.
    let map = cairn_media::Mapping::new(&s.file, 0, size as usize, true, false)
        .map_err(ctx("mmap", &path))?;
    let f0 = minor_faults();
    let t = Instant::now();
    for off in (0..size as usize).step_by(4096) {
        // A store first (a load would fault the page in for reading, with its
        // neighbours); the file is not read again.
        let _ = map.store_u64(off, off as u64);
    }
    let secs = t.elapsed().as_secs_f64();
    rows.push(row(
        "tmpfs",
        "4K",
        "map+write",
        size,
        secs * 1e9 / (size / 4096) as f64,
        minor_faults() - f0,
    ));
    Ok(())
}

/// The promotion of a `size` file written in 64 KiB pieces on a store whose daemon
/// starts with superpages off, then restarts with them on: the time until every range
/// is in an extent, and the latency of 4 KiB overwrites meanwhile and after.
fn promotion(size: u64) -> CliResult<Promotion> {
    progress(format_args!(
        "bench superpages: promotion of a {} file written in 64 KiB pieces\n",
        human_bytes(size)
    ));
    let (bs, fs) = BenchStore::superpages("promote", size + size / 4 + (256 << 20), false)?;
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "/f")
        .map_err(ctx_msg("creating the benchmark file"))?;
    write_file(&f, size, 64 << 10, None)?;
    drop(f);
    drop(fs);
    let store = bs.root.join("store");
    cairn::daemon_shutdown(Some(&store))?;
    let sd = cairn_area::StoreDir::new(&store);
    let mut cfg = sd.load_config()?;
    cfg.superpages = true;
    cfg.superpage_rate_mib = cairn_area::store::DEFAULT_SUPERPAGE_RATE_MIB;
    let rate = cfg.superpage_rate_mib;
    sd.save_config(&cfg)?;
    let t = Instant::now();
    let fs = cairn::Fs::open(&store)?;
    let f = cairn::OpenOptions::new().write(true).open(&fs, "/f")?;
    let mut rng = Rng(7);
    let buf = vec![0x5au8; 4096];
    let mut during = Histogram::<u64>::new(3).map_err(|e| CliError::new(e.to_string()))?;
    let mut seconds = 0.0;
    let done = |fs: &cairn::Fs| -> CliResult<bool> {
        let s = fs.status()?.superpages.unwrap_or_default();
        Ok(s.extent_bytes >= size / (2 << 20) * (2 << 20))
    };
    let mut k = 0u64;
    loop {
        // One overwrite every millisecond, the file's content kept (same bytes).
        let off = (rng.next() % (size / 4096)) * 4096;
        let mut b = buf.clone();
        fill(&mut b, off);
        let w = Instant::now();
        f.write_at(&b, off)?;
        let _ = during.record(w.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_millis(1));
        k += 1;
        if k.is_multiple_of(100) && done(&fs)? {
            seconds = t.elapsed().as_secs_f64();
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            break;
        }
    }
    let mut after = Histogram::<u64>::new(3).map_err(|e| CliError::new(e.to_string()))?;
    for _ in 0..k.clamp(100, 5000) {
        let off = (rng.next() % (size / 4096)) * 4096;
        let mut b = buf.clone();
        fill(&mut b, off);
        let w = Instant::now();
        f.write_at(&b, off)?;
        let _ = after.record(w.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Promotion {
        size,
        rate_mib: rate,
        seconds,
        during_p50_ns: during.value_at_quantile(0.5),
        during_p99_ns: during.value_at_quantile(0.99),
        during_max_ns: during.max(),
        after_p50_ns: after.value_at_quantile(0.5),
        after_p99_ns: after.value_at_quantile(0.99),
        after_max_ns: after.max(),
    })
}

/// `cairn bench superpages`.
pub fn run(args: &SuperpagesArgs) -> CliResult {
    if let Some(why) = cairn_media::huge::refusal() {
        progress(format_args!(
            "bench superpages: {why}: the 2M runs will use 4 KiB pages\n"
        ));
    }
    let mut rows = Vec::new();
    let mut pmd = Vec::new();
    for &size in &args.sizes {
        if size < (4 << 20) || size % 4096 != 0 {
            return Err(CliError::new(format!(
                "--sizes: {size} is not a multiple of 4 KiB of at least 4 MiB"
            )));
        }
        if let Some(k) = cairn_runs(size, args.ops, true, &mut rows)? {
            pmd.push((size, k));
        }
        cairn_runs(size, args.ops, false, &mut rows)?;
        shm_runs(size, args.ops, &mut rows)?;
    }
    let promotion = if args.promote_size > 0 {
        Some(promotion(args.promote_size)?)
    } else {
        None
    };
    let out = Output {
        rows,
        pmd_mapped_kib: pmd,
        promotion,
    };
    let text = if args.json {
        serde_json::to_string_pretty(&out).map_err(|e| CliError::new(e.to_string()))? + "\n"
    } else {
        human(&out)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

fn human(o: &Output) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:<5} {:<10} {:>8} {:>12} {:>10} {:>9}",
        "system", "pages", "workload", "size", "ns/op", "faults", "vs 4K"
    );
    for r in &o.rows {
        let base = o.rows.iter().find(|b| {
            b.system == "cairn" && b.pages == "4K" && b.workload == r.workload && b.size == r.size
        });
        let vs = match base {
            Some(b) if r.pages == "2M" && b.ns_per_op > 0.0 => {
                format!("{:+.0}%", (r.ns_per_op / b.ns_per_op - 1.0) * 100.0)
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "{:<8} {:<5} {:<10} {:>8} {:>12} {:>10} {:>9}",
            r.system,
            r.pages,
            r.workload,
            human_bytes(r.size),
            format!("{:.1}", r.ns_per_op),
            r.page_faults,
            vs
        );
    }
    for (size, k) in &o.pmd_mapped_kib {
        let _ = writeln!(
            s,
            "PMD-mapped: {} of the {} file's 2M mapping",
            human_bytes(k << 10),
            human_bytes(*size)
        );
    }
    if let Some(p) = &o.promotion {
        let _ = writeln!(
            s,
            "promotion of a {} file at {} MiB/s: {:.1} s; 4 KiB overwrites meanwhile p50 {} p99 {} max {}, after p50 {} p99 {} max {}",
            human_bytes(p.size),
            p.rate_mib,
            p.seconds,
            human_ns(p.during_p50_ns as f64),
            human_ns(p.during_p99_ns as f64),
            human_ns(p.during_max_ns as f64),
            human_ns(p.after_p50_ns as f64),
            human_ns(p.after_p99_ns as f64),
            human_ns(p.after_max_ns as f64),
        );
    }
    s
}
