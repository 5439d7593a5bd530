//! `cairn bench spacejmp`: SpaceJMP on Cairn against what a user would use instead, in
//! one run (docs/BENCHMARKS.md, "SpaceJMP").
//!
//! * `switch`: the cost of `vas_switch` with 1 to 64 address spaces attached (segments at
//!   distinct addresses: locks only), lockable read-only, lockable writable, lock-free.
//! * `attach`: attaching a resident segment of 1 GiB and more, against mapping a tmpfs
//!   file of 4 KiB pages.
//! * `commit`: small explicit-mode commits, and commits of 1 to 4096 pages in page mode
//!   (no declarations) and in explicit mode (each page declared, as PMDK's
//!   `TX_ADD_RANGE` does), against PMDK transactions on the same tmpfs.
//! * `pointer`: a linked list and a B-tree walked through plain pointers in a segment,
//!   in `malloc`'d memory, PMDK (`pmemobj_direct`) and Boost.Interprocess (`offset_ptr`).
//! * `crash`: writers killed with SIGKILL at random points of commit/abort cycles; lost
//!   and torn commits and deadlocks counted, and Boost.Interprocess's mutex after a kill.
//! * `gups`: random updates over windows of 1 GiB (the dissertation's Figure 48) with
//!   overlapping segments switched per window change, against a process per window, a
//!   `munmap` + `mmap` per window change, and every window at its own address.
//!
//! Every row has `experiment`, `mode` or `system`, its parameters and its figure; with
//! `--runs N` each figure is the median of N runs.

mod kv;
mod sam;
pub use kv::{worker as kv_shared_worker, KvSharedArgs, KvSharedWorkerArgs};
pub use sam::SamBenchArgs;

use super::{median, BenchStore, Rng};
use crate::error::{CliError, CliResult};
use cairn_sj::{flags, prot, CommitMode, SegPtr, SpaceJmp, Target, Vh};
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const POINTERS_CPP: &str = include_str!("spacejmp/pointers.cpp");
const SJ_H: &str = include_str!("../../../sj-capi/include/cairn/sj.h");

/// `cairn bench spacejmp` options.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SpacejmpArgs {
    /// An application instead of the experiments
    #[command(subcommand)]
    pub app: Option<SpacejmpApp>,
    /// Print the results as JSON on stdout (progress goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Runs of each measurement: each figure is the median
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
    /// The experiments to run
    #[arg(long, value_delimiter = ',', default_value = "switch,attach,commit,pointer,crash,gups",
          value_parser = ["switch", "attach", "commit", "pointer", "crash", "gups"])]
    pub parts: Vec<String>,
    /// Windows of 1 GiB in the GUPS experiment (each system holds them in /dev/shm while
    /// it runs); also the most address spaces of 1 GiB the overlapping switch rows use
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(2..=16))]
    pub windows: u32,
    /// Sizes of the attached segments, in GiB (each is resident in /dev/shm meanwhile)
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub attach_gib: Vec<u64>,
    /// Writers killed in the crash experiment
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub kills: u32,
    /// Nodes of the list and the B-tree in the pointer experiment (also run with 4096,
    /// which fit in the caches)
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub nodes: u64,
}

/// `cairn bench spacejmp` applications.
#[derive(Debug, clap::Subcommand)]
pub enum SpacejmpApp {
    /// Genomics tools (flagstat, sorts, index, region query) on a data set in a segment,
    /// against the same code on decoded BAM and against samtools
    Sam(SamBenchArgs),
    /// The key-value store shared through memory by client processes, against
    /// redis-server and `cairn kv serve` under redis-benchmark
    Kv(KvSharedArgs),
}

/// The hidden worker of the crash experiment (started by it).
#[derive(Debug, Args)]
pub struct SpacejmpWorkerArgs {
    /// The store
    #[arg(long, value_name = "DIR")]
    pub bench_store: PathBuf,
}

fn progress(msg: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().write_fmt(msg);
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

/// Per-call times of `n` batches of `per` calls of `op`, after `warm` batches not
/// counted: p50 and p99 over the batches, in ns.
fn batches(
    n: usize,
    per: usize,
    warm: usize,
    mut op: impl FnMut() -> CliResult,
) -> CliResult<(f64, f64)> {
    let mut times = Vec::with_capacity(n);
    for b in 0..warm + n {
        let t = Instant::now();
        for _ in 0..per {
            op()?;
        }
        if b >= warm {
            times.push(t.elapsed().as_nanos() as f64 / per as f64);
        }
    }
    Ok((pct(&mut times, 0.5), pct(&mut times, 0.99)))
}

pub fn run(args: &SpacejmpArgs) -> CliResult {
    match &args.app {
        Some(SpacejmpApp::Sam(a)) => return sam::run(a),
        Some(SpacejmpApp::Kv(a)) => return kv::run(a),
        None => {}
    }
    let root = tempfile_dir()?;
    let store_dir = root.join("store");
    let nvm = PathBuf::from(format!(
        "/dev/shm/cairn-bench-sj-{}.nvm",
        std::process::id()
    ));
    let bs = BenchStore {
        root: root.clone(),
        nvm: nvm.clone(),
    };
    let mut opts = cairn_daemon::MkfsOptions::new(&store_dir);
    opts.nvm_path = Some(nvm.clone());
    opts.nvm_size = 2 << 30;
    cairn_daemon::mkfs(&opts)
        .map_err(|e| CliError::new(format!("creating the benchmark store: {e}")))?;
    let sj = SpaceJmp::with_fs(cairn::Fs::open(&store_dir)?)?;
    let mut rows: Vec<Value> = Vec::new();
    let want = |p: &str| args.parts.iter().any(|x| x == p);
    if want("switch") {
        switch(&sj, args, &mut rows)?;
    }
    if want("attach") {
        attach(&sj, args, &mut rows)?;
    }
    let tools = if want("pointer") || want("commit") || want("crash") || want("gups") {
        compile_tools(&root)
    } else {
        Err("not needed".into())
    };
    if want("commit") {
        commit(&sj, args, &tools, &mut rows)?;
    }
    if want("pointer") {
        pointer(args, &tools, &store_dir, &mut rows)?;
    }
    if want("crash") {
        crash(&sj, args, &tools, &store_dir, &mut rows)?;
    }
    if want("gups") {
        gups(args, &tools, &store_dir, &mut rows)?;
    }
    let text = if args.json {
        crate::util::json_text(
            &json!({ "runs": args.runs, "results": rows }),
            "the results",
        )?
    } else {
        table(&rows)
    };
    drop(sj);
    drop(bs);
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

fn tempfile_dir() -> CliResult<PathBuf> {
    let d = std::env::temp_dir().join(format!("cairn-bench-sj-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(crate::error::ctx_msg(d.display()))?;
    Ok(d)
}

/// A segment (`len` bytes, `f` flags) in a new address space granting `p`, attached.
fn space(
    sj: &Arc<SpaceJmp>,
    name: &str,
    len: u64,
    f: u32,
    p: u32,
    mode: CommitMode,
) -> CliResult<(cairn_sj::SegId, Vh)> {
    let seg = sj.seg_alloc(name, None, len, prot::RW, f, 0o600)?;
    let vid = sj.vas_create(name, 0o600)?;
    sj.seg_attach(Target::Vas(vid), seg, p)?;
    let vh = sj.vas_attach(vid, mode)?;
    Ok((seg, vh))
}

/// Switches between 1 to 64 attached address spaces, in batches of 1000: the per-switch
/// time of each batch, p50 and p99 over batches.
fn switch(sj: &Arc<SpaceJmp>, args: &SpacejmpArgs, rows: &mut Vec<Value>) -> CliResult {
    for (mode, f, p) in [
        ("distinct", flags::LOCKABLE, prot::READ),
        ("distinct-writable", flags::LOCKABLE, prot::RW),
        ("distinct-unlocked", 0, prot::READ),
    ] {
        let mut handles = Vec::new();
        for i in 0..64 {
            handles.push(
                space(
                    sj,
                    &format!("sw-{mode}-{i}"),
                    cairn_format::sj::MIN_LEN,
                    f,
                    p,
                    CommitMode::Snapshot,
                )?
                .1,
            );
        }
        // `k` attached; switching between two of them, and round-robin through all.
        for (k, round_robin) in [1usize, 2, 4, 8, 16, 32, 64]
            .into_iter()
            .map(|k| (k, false))
            .chain([8, 64].into_iter().map(|k| (k, true)))
        {
            let mut p50 = Vec::new();
            let mut p99 = Vec::new();
            for _ in 0..args.runs {
                let cycle: Vec<Vh> = match (k, round_robin) {
                    // With one attached, switch between it and the primary.
                    (1, _) => vec![handles[0], Vh::PRIMARY],
                    (_, false) => vec![handles[0], handles[k - 1]],
                    (_, true) => handles[..k].to_vec(),
                };
                let mut at = 0;
                let (a, b) = batches(300, 1000, 20, || {
                    at = (at + 1) % cycle.len();
                    Ok(sj.switch_to(cycle[at], true, true)?)
                })?;
                sj.switch_to(Vh::PRIMARY, true, true)?;
                p50.push(a);
                p99.push(b);
            }
            let row = json!({"experiment": "switch", "mode": mode, "attached": k,
                             "between": if round_robin { k } else { 2.min(k + 1) },
                             "p50_ns": median(&p50), "p99_ns": median(&p99)});
            progress(format_args!("{row}\n"));
            rows.push(row);
        }
        for (i, vh) in handles.into_iter().enumerate() {
            sj.vas_detach(vh)?;
            sj.vas_remove(&format!("sw-{mode}-{i}"))?;
            sj.seg_free(&format!("sw-{mode}-{i}"))?;
        }
    }
    switch_overlapping(sj, args, rows)?;
    switch_helper(sj, args, rows)
}

/// A helper call that does nothing (the round trip to the helper process).
fn call_nothing(_: &cairn_sj::InHelper, _: &mut [u8]) -> i64 {
    0
}

/// A helper call that switches the helper into the address space (taking the writer
/// lock of its lockable segment) and back.
fn call_switched(h: &cairn_sj::InHelper, _: &mut [u8]) -> i64 {
    match h.enter() {
        Ok(_) => 0,
        Err(e) => -i64::from(cairn_area::errno_of(&e)),
    }
}

/// Calls through a handle's helper process (`vas_call`), one per sample: the round trip
/// alone, and with the helper's switch into the address space and back.
fn switch_helper(sj: &Arc<SpaceJmp>, args: &SpacejmpArgs, rows: &mut Vec<Value>) -> CliResult {
    let (_, vh) = space(
        sj,
        "sw-helper",
        cairn_format::sj::MIN_LEN,
        flags::LOCKABLE,
        prot::RW,
        CommitMode::Snapshot,
    )?;
    for (mode, f) in [
        (
            "helper-call",
            call_nothing as fn(&cairn_sj::InHelper, &mut [u8]) -> i64,
        ),
        ("helper-call-switched", call_switched),
    ] {
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            let (a, b) = batches(2000, 1, 200, || {
                let r = sj.vas_call(vh, f, &mut [0u8; 8])?;
                if r != 0 {
                    return Err(crate::error::CliError::from(
                        std::io::Error::from_raw_os_error(-r as i32),
                    ));
                }
                Ok(())
            })?;
            p50.push(a);
            p99.push(b);
        }
        push(
            rows,
            json!({"experiment": "switch", "mode": mode, "attached": 1, "between": 1,
                   "p50_ns": median(&p50), "p99_ns": median(&p99)}),
        );
    }
    sj.vas_detach(vh)?;
    sj.vas_remove("sw-helper")?;
    sj.seg_free("sw-helper")?;
    Ok(())
}

/// Switches round-robin between 2 to `--windows` address spaces of one 1 GiB segment
/// each, all at one base (every page mapped: a read-only grant populates at attach), in
/// batches of 100: each switch parks one segment and places the next.
fn switch_overlapping(sj: &Arc<SpaceJmp>, args: &SpacejmpArgs, rows: &mut Vec<Value>) -> CliResult {
    let n = u64::from(args.windows);
    let free = cairn_media::sys::free_space(Path::new("/dev/shm")).unwrap_or(0);
    if free < (n + 2) << 30 {
        rows.push(
            json!({"experiment": "switch", "mode": "overlapping", "skipped": format!(
            "{n} segments of 1 GiB need {} GiB free in /dev/shm, {} GiB are", n + 2, free >> 30)}),
        );
        return Ok(());
    }
    let base = cairn_format::sj::WINDOW_BASE + (1 << 40);
    let mut handles = Vec::new();
    for i in 0..n {
        progress(format_args!(
            "switch: overlapping segment {} of {n}\n",
            i + 1
        ));
        let name = format!("sw-overlap-{i}");
        let seg = sj.seg_alloc(&name, Some(base), 1 << 30, prot::RW, flags::OVERLAP, 0o600)?;
        let vid = sj.vas_create(&name, 0o600)?;
        sj.seg_attach(Target::Vas(vid), seg, prot::READ)?;
        handles.push(sj.vas_attach(vid, CommitMode::Snapshot)?);
    }
    let mut k = 2;
    while k <= handles.len() {
        let (mut p50, mut p99) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            let mut at = 0;
            let (a, b) = batches(60, 100, 10, || {
                at = (at + 1) % k;
                Ok(sj.switch_to(handles[at], true, true)?)
            })?;
            sj.switch_to(Vh::PRIMARY, true, true)?;
            p50.push(a);
            p99.push(b);
        }
        push(
            rows,
            json!({"experiment": "switch", "mode": "overlapping", "attached": k, "between": k,
                   "segment_gib": 1, "p50_ns": median(&p50), "p99_ns": median(&p99)}),
        );
        k *= 2;
    }
    let floor = swap_floor(sj, args.runs);
    for (i, vh) in handles.into_iter().enumerate() {
        sj.vas_detach(vh)?;
        sj.vas_remove(&format!("sw-overlap-{i}"))?;
        sj.seg_free(&format!("sw-overlap-{i}"))?;
    }
    let (p50, p99) = floor?;
    push(
        rows,
        json!({"experiment": "switch", "mode": "mremap-floor", "attached": 2, "between": 2,
               "segment_gib": 1, "p50_ns": p50, "p99_ns": p99}),
    );
    Ok(())
}

/// The kernel's floor under the overlapping switch: the resident copies of the first two
/// overlapping segments mapped at one home outside Cairn's segment window, one placed
/// and one parked, traded with the same two `mremap`s (`Region::swap`) and nothing else;
/// per swap, p50 and p99 over batches of 100, medians over `runs`.
/// A read-only descriptor of segment `name`'s resident copy, from the daemon.
fn resident_copy(sj: &SpaceJmp, name: &str) -> std::io::Result<std::fs::File> {
    let info = sj.seg_info(name)?;
    let file = cairn::File::open(sj.fs(), info.path.as_str())?;
    Ok(file.segment_object(false, false)?.0)
}

fn swap_floor(sj: &Arc<SpaceJmp>, runs: u32) -> CliResult<(f64, f64)> {
    const HOME: usize = 0x6000_0000_0000;
    let window = cairn_media::fixed::Window::reserve(HOME, 1 << 30)?;
    let mut regions = Vec::new();
    for i in 0..2 {
        let f = resident_copy(sj, &format!("sw-overlap-{i}"))?;
        use cairn_media::fixed::{Access, Place};
        let place = if i == 0 { Place::Home } else { Place::Parked };
        let r = window.map(HOME, 1 << 30, (&f, 0), Access::Read, place)?;
        r.populate(0, 1 << 30)?;
        regions.push(r);
    }
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let [a, c] = &mut regions[..] else {
            unreachable!("two regions")
        };
        let mut j = 0;
        let (x, y) = batches(60, 100, 10, || {
            j += 1;
            Ok(if j % 2 == 1 { a.swap(c) } else { c.swap(a) }?)
        })?;
        p50.push(x);
        p99.push(y);
    }
    Ok((median(&p50), median(&p99)))
}

/// Attaching resident segments, and mapping a tmpfs file of 4 KiB pages of the same size.
fn attach(sj: &Arc<SpaceJmp>, args: &SpacejmpArgs, rows: &mut Vec<Value>) -> CliResult {
    for &gib in &args.attach_gib {
        let len = gib << 30;
        let free = cairn_media::sys::free_space(Path::new("/dev/shm")).unwrap_or(0);
        if free < 2 * len + (1 << 30) {
            progress(format_args!(
                "attach: {gib} GiB skipped: /dev/shm has {} MiB free\n",
                free >> 20
            ));
            rows.push(
                json!({"experiment": "attach", "system": "segment", "gib": gib,
                             "skipped": "not enough free memory in /dev/shm"}),
            );
            continue;
        }
        let name = format!("attach-{gib}g");
        let seg = sj.seg_alloc(&name, None, len, prot::RW, 0, 0o600)?;
        let vid = sj.vas_create(&name, 0o600)?;
        sj.seg_attach(Target::Vas(vid), seg, prot::READ)?;
        let t = Instant::now();
        let vh = sj.vas_attach(vid, CommitMode::Snapshot)?;
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let base = sj.seg_info(&name)?.base as usize;
        let pmd = cairn_media::huge::pmd_mapped_kib(std::process::id(), base, base + len as usize)
            .unwrap_or(0);
        sj.vas_detach(vh)?;
        let mut ms = Vec::new();
        for _ in 0..args.runs.max(3) {
            let t = Instant::now();
            let vh = sj.vas_attach(vid, CommitMode::Snapshot)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            sj.vas_detach(vh)?;
        }
        let resident = median(&ms);
        // The kernel's floor: the same resident copy mapped read-only and populated
        // (`MAP_POPULATE`, 2 MiB aligned), nothing else.
        let obj = resident_copy(sj, &name)?;
        let floor_ms = populated_map_ms(&obj, len, args.runs)?;
        drop(obj);
        sj.vas_remove(&name)?;
        sj.seg_free(&name)?;
        let row = json!({"experiment": "attach", "system": "segment", "gib": gib,
                         "ms_per_gib": resident / gib as f64, "first_attach_ms": first_ms,
                         "pmd_mapped_mib": pmd / 1024});
        progress(format_args!("{row}\n"));
        rows.push(row);
        let row = json!({"experiment": "attach", "system": "mmap-populate", "gib": gib,
                         "ms_per_gib": floor_ms / gib as f64});
        progress(format_args!("{row}\n"));
        rows.push(row);
        // The same size of 4 KiB tmpfs pages, mapped and populated.
        let path = PathBuf::from(format!("/dev/shm/cairn-bench-sj-4k-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let _ = std::fs::remove_file(&path);
        cairn_media::sys::fallocate(&f, len)?;
        let row = json!({"experiment": "attach", "system": "tmpfs-4k", "gib": gib,
                         "ms_per_gib": populated_map_ms(&f, len, args.runs)? / gib as f64});
        progress(format_args!("{row}\n"));
        rows.push(row);
    }
    Ok(())
}

/// Median milliseconds (of `runs`, at least 3) to map the first `len` bytes of `f`
/// read-only and populate them (`MAP_POPULATE`, 2 MiB aligned: `cairn_media::Mapping`).
fn populated_map_ms(f: &std::fs::File, len: u64, runs: u32) -> CliResult<f64> {
    let mut ms = Vec::new();
    for _ in 0..runs.max(3) {
        let t = Instant::now();
        let m = cairn_media::Mapping::new(f, 0, len as usize, false, true)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(m);
    }
    Ok(median(&ms))
}

/// The C++ tools (PMDK, Boost, the segment's C interface), or why they are missing.
fn compile_tools(root: &Path) -> Result<PathBuf, String> {
    let src = root.join("pointers.cpp");
    std::fs::write(&src, POINTERS_CPP).map_err(|e| e.to_string())?;
    let exe = root.join("pointers");
    let lib_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .ok_or("no executable path")?;
    let include = root.join("include");
    std::fs::create_dir_all(include.join("cairn")).map_err(|e| e.to_string())?;
    std::fs::write(include.join("cairn/sj.h"), SJ_H).map_err(|e| e.to_string())?;
    let out = Command::new("g++")
        .args(["-O2", "-std=c++17", "-I"])
        .arg(&include)
        .arg(&src)
        .arg("-L")
        .arg(&lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-lcairn_sj", "-lpmemobj", "-lpthread", "-lrt", "-o"])
        .arg(&exe)
        .output()
        .map_err(|e| format!("g++: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "compiling the PMDK/Boost programs failed (scripts/setup.sh installs libpmemobj-dev \
             and libboost-dev; libcairn_sj.so comes with cargo build): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    Ok(exe)
}

/// Run the C++ tool; its output's `key value` pairs.
fn tool(exe: &Path, args: &[&str], store: Option<&Path>) -> CliResult<Vec<(String, f64)>> {
    let mut c = Command::new(exe);
    c.args(args).env("PMEM_IS_PMEM_FORCE", "1");
    if let Some(s) = store {
        c.env("CAIRN_STORE", s);
    }
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(crate::error::ctx_msg(exe.display()))?;
    let pid = child.id();
    let out = child.wait_with_output();
    // The GUPS windows it made in /dev/shm, if it died before removing them.
    if let Ok(d) = std::fs::read_dir("/dev/shm") {
        let prefix = format!("cairn-bench-gups-{pid}-");
        for e in d.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let out = out.map_err(crate::error::ctx_msg(exe.display()))?;
    if !out.status.success() {
        return Err(CliError::new(format!(
            "{} {}: {}",
            exe.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<&str> = text.split_whitespace().collect();
    Ok(f.chunks(2)
        .filter_map(|c| Some((c[0].to_string(), c.get(1)?.parse().ok()?)))
        .collect())
}

fn field(v: &[(String, f64)], k: &str) -> f64 {
    v.iter().find(|x| x.0 == k).map_or(0.0, |x| x.1)
}

/// Commits: explicit mode with 1-4 updates of 8-64 bytes; 1-4096 dirty pages in page
/// mode and in explicit mode; PMDK transactions of the same shapes.
fn commit(
    sj: &Arc<SpaceJmp>,
    args: &SpacejmpArgs,
    tools: &Result<PathBuf, String>,
    rows: &mut Vec<Value>,
) -> CliResult {
    let area = 64u64 << 20;
    let (_, xvh) = space(
        sj,
        "commit-explicit",
        area + (1 << 20),
        flags::LOCKABLE,
        prot::RW,
        CommitMode::Explicit,
    )?;
    let (_, svh) = space(
        sj,
        "commit-snapshot",
        area + (1 << 20),
        flags::LOCKABLE,
        prot::RW,
        CommitMode::Snapshot,
    )?;
    // The heap's chunks start 1 MiB in: the updates go after.
    let xbase = sj.seg_info("commit-explicit")?.base + (1 << 20);
    let sbase = sj.seg_info("commit-snapshot")?.base + (1 << 20);
    let mut rng = Rng(0x5eed);
    let pmdk_dir = PathBuf::from("/dev/shm");
    for (updates, bytes) in [(1u64, 8u64), (1, 64), (2, 8), (2, 64), (4, 8), (4, 64)] {
        let txs = 100_000;
        let data = vec![7u8; bytes as usize];
        let (rate, p50) = timed_commits(sj, xvh, args.runs, txs, |g, _| {
            for _ in 0..updates {
                g.write(SegPtr(xbase + rng.next() % (area / bytes) * bytes), &data)?;
            }
            Ok(())
        })?;
        push(
            rows,
            json!({"experiment": "commit", "system": "cairn", "mode": "explicit", "updates": updates,
                          "bytes": bytes, "tx_per_s": rate, "p50_ns": p50}),
        );
        if let Ok(exe) = tools {
            pmdk_rows(exe, args, rows, updates, bytes, 0, txs, &pmdk_dir)?;
        }
    }
    // 4096 pages (16 MiB) are more than a quarter of the bench store's 32 MiB logs: a
    // staged commit.
    for pages in [1u64, 4, 16, 64, 256, 1024, 4096] {
        let txs = (20_000 / pages).max(50) as usize;
        let (rate, p50) = timed_commits(sj, svh, args.runs, txs, |g, i| {
            let first = rng.next() % (area / 4096 - pages);
            for p in 0..pages {
                g.write(
                    SegPtr(sbase + (first + p) * 4096),
                    &(i as u64).to_le_bytes(),
                )?;
            }
            Ok(())
        })?;
        push(
            rows,
            json!({"experiment": "commit", "system": "cairn", "mode": "page", "pages": pages,
                          "tx_per_s": rate, "p50_ns": p50}),
        );
        // The same pages declared first (`tx_add`, as PMDK's transactions do), at
        // random places as PMDK's are: explicit mode, no scan for the stores.
        let (rate, p50) = timed_commits(sj, xvh, args.runs, txs, |g, i| {
            for _ in 0..pages {
                let page = SegPtr(xbase + rng.next() % (area / 4096) * 4096);
                g.tx_add(page, 4096)?;
                g.write(page, &(i as u64).to_le_bytes())?;
            }
            Ok(())
        })?;
        push(
            rows,
            json!({"experiment": "commit", "system": "cairn", "mode": "explicit", "pages": pages,
                          "tx_per_s": rate, "p50_ns": p50}),
        );
        if let Ok(exe) = tools {
            pmdk_rows(exe, args, rows, 0, 0, pages, txs, &pmdk_dir)?;
        }
    }
    if let Err(why) = tools {
        rows.push(json!({"experiment": "commit", "system": "pmdk", "skipped": why}));
    }
    sj.vas_detach(xvh)?;
    sj.vas_detach(svh)?;
    for name in ["commit-explicit", "commit-snapshot"] {
        sj.vas_remove(name)?;
        sj.seg_free(name)?;
    }
    Ok(())
}

/// `runs` runs of `txs` transactions in `vh`, each `tx(guard, i)` then a commit, after
/// one run not counted (PMDK's pool is zeroed, so resident, before its loop; here the
/// segment's pages, the log and the daemon's first digest of it are warmed the same
/// way): the medians of the transactions per second and of the p50 latency in ns.
fn timed_commits(
    sj: &Arc<SpaceJmp>,
    vh: Vh,
    runs: u32,
    txs: usize,
    mut tx: impl FnMut(&cairn_sj::Switched<'_>, usize) -> CliResult,
) -> CliResult<(f64, f64)> {
    {
        let g = sj.enter(vh)?;
        for i in 0..txs {
            tx(&g, i)?;
            g.commit()?;
        }
    }
    let (mut rate, mut p50) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let g = sj.enter(vh)?;
        let mut lat = Vec::with_capacity(txs);
        let t0 = Instant::now();
        for i in 0..txs {
            let t = Instant::now();
            tx(&g, i)?;
            g.commit()?;
            lat.push(t.elapsed().as_nanos() as f64);
        }
        rate.push(txs as f64 / t0.elapsed().as_secs_f64());
        p50.push(pct(&mut lat, 0.5));
    }
    Ok((median(&rate), median(&p50)))
}

#[allow(clippy::too_many_arguments)]
fn pmdk_rows(
    exe: &Path,
    args: &SpacejmpArgs,
    rows: &mut Vec<Value>,
    updates: u64,
    bytes: u64,
    pages: u64,
    txs: usize,
    dir: &Path,
) -> CliResult {
    let (mut rate, mut p50) = (Vec::new(), Vec::new());
    for _ in 0..args.runs {
        let dir_s = dir.display().to_string();
        let r = tool(
            exe,
            &[
                "pmdk-commit",
                &updates.to_string(),
                &bytes.to_string(),
                &pages.to_string(),
                &txs.to_string(),
                &dir_s,
            ],
            None,
        );
        let _ = std::fs::remove_file(dir.join("pool.pmdk"));
        let r = r?;
        rate.push(field(&r, "tx_per_s"));
        p50.push(field(&r, "p50_ns"));
    }
    let mut row = json!({"experiment": "commit", "system": "pmdk", "tx_per_s": median(&rate), "p50_ns": median(&p50)});
    if pages > 0 {
        row["mode"] = json!("page");
        row["pages"] = json!(pages);
    } else {
        row["mode"] = json!("explicit");
        row["updates"] = json!(updates);
        row["bytes"] = json!(bytes);
    }
    push(rows, row);
    Ok(())
}

/// The compiled comparison programs, or a row saying why `experiment` is skipped.
fn tool_or_skip<'a>(
    tools: &'a Result<PathBuf, String>,
    experiment: &str,
    rows: &mut Vec<Value>,
) -> Option<&'a PathBuf> {
    match tools {
        Ok(e) => Some(e),
        Err(why) => {
            rows.push(json!({"experiment": experiment, "skipped": why}));
            None
        }
    }
}

fn push(rows: &mut Vec<Value>, row: Value) {
    progress(format_args!("{row}\n"));
    rows.push(row);
}

/// Pointer chasing through the same C++ code on each system.
fn pointer(
    args: &SpacejmpArgs,
    tools: &Result<PathBuf, String>,
    store: &Path,
    rows: &mut Vec<Value>,
) -> CliResult {
    let Some(exe) = tool_or_skip(tools, "pointer", rows) else {
        return Ok(());
    };
    let dir = PathBuf::from("/dev/shm");
    const SYSTEMS: [&str; 4] = ["dram", "segment", "pmdk", "boost"];
    for nodes in [4096, args.nodes] {
        for what in ["list", "btree"] {
            let ops = (20_000_000 / nodes.max(1)).clamp(1, 100) * nodes.min(1_000_000);
            // The systems take turns run by run, so that a drift of the machine (this
            // VM's figures move by a quarter from one minute to the next) reaches all.
            let mut ns: [Vec<f64>; SYSTEMS.len()] = Default::default();
            for _ in 0..args.runs {
                for (i, system) in SYSTEMS.iter().enumerate() {
                    let r = tool(
                        exe,
                        &[
                            system,
                            what,
                            &nodes.to_string(),
                            &ops.to_string(),
                            &dir.display().to_string(),
                        ],
                        Some(store),
                    );
                    let _ = std::fs::remove_file(dir.join("pool.pmdk"));
                    let _ = std::fs::remove_file(dir.join("pool.boost"));
                    ns[i].push(field(&r?, "ns_per_op"));
                }
            }
            for (system, ns) in SYSTEMS.iter().zip(ns) {
                push(
                    rows,
                    json!({"experiment": "pointer", "system": system, "structure": what,
                                  "nodes": nodes, "ns_per_op": median(&ns)}),
                );
            }
        }
    }
    Ok(())
}

/// GUPS over `--windows` windows of 1 GiB, update sets of 16 and 64: each system in its
/// own process, the systems taking turns run by run; every system must arrive at the same
/// check sum (the same updates, read back through its own way of reaching the windows).
fn gups(
    args: &SpacejmpArgs,
    tools: &Result<PathBuf, String>,
    store: &Path,
    rows: &mut Vec<Value>,
) -> CliResult {
    let Some(exe) = tool_or_skip(tools, "gups", rows) else {
        return Ok(());
    };
    let w = u64::from(args.windows);
    let free = cairn_media::sys::free_space(Path::new("/dev/shm")).unwrap_or(0);
    if free < (w + 2) << 30 {
        rows.push(json!({"experiment": "gups", "skipped": format!(
            "{w} windows of 1 GiB need {} GiB free in /dev/shm, {} GiB are", w + 2, free >> 30)}));
        return Ok(());
    }
    const SYSTEMS: [&str; 4] = ["switch", "mp", "map", "flat"];
    const SETS: [u32; 2] = [16, 64];
    let mut mups: [[Vec<f64>; SETS.len()]; SYSTEMS.len()] = Default::default();
    let mut changes: [[Vec<f64>; SETS.len()]; SYSTEMS.len()] = Default::default();
    let mut reference: [Option<(&str, f64)>; SETS.len()] = [None; SETS.len()];
    for run in 0..args.runs {
        for (i, system) in SYSTEMS.iter().enumerate() {
            progress(format_args!(
                "gups: {system}, {w} windows, run {} of {}\n",
                run + 1,
                args.runs
            ));
            let r = tool(
                exe,
                &["gups", system, &w.to_string(), "16,64", "1", "/dev/shm"],
                Some(store),
            )?;
            for (k, u) in SETS.iter().enumerate() {
                let check = field(&r, &format!("check_{u}"));
                match reference[k] {
                    None => reference[k] = Some((system, check)),
                    Some((other, want)) if want != check => {
                        return Err(CliError::new(format!(
                            "gups: {system} arrives at check sum {check} with update sets of \
                             {u}, {other} at {want}: one of them did not update the windows"
                        )))
                    }
                    Some(_) => {}
                }
                mups[i][k].push(field(&r, &format!("mups_{u}")));
                changes[i][k].push(field(&r, &format!("changes_per_s_{u}")));
            }
        }
    }
    for (i, system) in SYSTEMS.iter().enumerate() {
        for (k, u) in SETS.iter().enumerate() {
            push(
                rows,
                json!({"experiment": "gups", "system": system, "windows": w, "updates": u,
                       "mups": median(&mups[i][k]),
                       "window_changes_per_s": median(&changes[i][k])}),
            );
        }
    }
    Ok(())
}

/// Writers killed at random points of commit/abort cycles (this binary's hidden
/// `bench spacejmp-worker`), each kill followed by a check: the list must be whole
/// (values n..1), hold every acknowledged commit, and its lock must be free again.
fn crash(
    sj: &Arc<SpaceJmp>,
    args: &SpacejmpArgs,
    tools: &Result<PathBuf, String>,
    store: &Path,
    rows: &mut Vec<Value>,
) -> CliResult {
    let (seg, vh) = space(
        sj,
        "crash",
        16 << 20,
        flags::LOCKABLE,
        prot::RW,
        CommitMode::Snapshot,
    )?;
    let me = std::env::current_exe()?;
    let mut rng = Rng(0xc0ffee);
    let (mut lost, mut torn, mut deadlocks, mut acked_total) = (0u64, 0u64, 0u64, 0u64);
    let t0 = Instant::now();
    for k in 0..args.kills {
        let mut child = Command::new(&me)
            .args(["bench", "spacejmp-worker", "--bench-store"])
            .arg(store)
            .env("CAIRN_STORE", store)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let out = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(n) = l.trim().parse() {
                    last = n;
                }
            }
            last
        });
        std::thread::sleep(Duration::from_millis(30 + rng.next() % 60));
        let _ = child.kill();
        let _ = child.wait();
        let acked = reader.join().unwrap_or(0);
        // Check: switch in within 10 s (else a deadlock), then walk the list.
        let deadline = Instant::now() + Duration::from_secs(10);
        let g = loop {
            match sj.try_enter(vh) {
                Ok(g) => break Some(g),
                Err(e)
                    if cairn_area::errno_of(&e) == libc::EWOULDBLOCK
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => break None,
            }
        };
        let Some(g) = g else {
            deadlocks += 1;
            continue;
        };
        let mut p = g.root(seg, "list")?.unwrap_or(SegPtr::NULL);
        let mut n = 0u64;
        let mut expect = None;
        let mut whole = true;
        while !p.is_null() {
            let v: [u64; 2] = g.get(p)?;
            if expect.is_some_and(|e| e != v[0]) {
                whole = false;
                break;
            }
            expect = Some(v[0].wrapping_sub(1));
            n += 1;
            p = SegPtr(v[1]);
        }
        if expect.is_some_and(|e| e != 0) {
            whole = false;
        }
        drop(g);
        torn += u64::from(!whole);
        lost += u64::from(n < acked);
        acked_total = acked_total.max(acked);
        if k % 50 == 49 {
            progress(format_args!("crash: {} kills, {n} commits in the list, {lost} lost, {torn} torn, {deadlocks} deadlocks\n", k + 1));
        }
    }
    push(
        rows,
        json!({"experiment": "crash", "system": "cairn", "kills": args.kills, "commits": acked_total,
                      "lost": lost, "torn": torn, "deadlocks": deadlocks, "secs": t0.elapsed().as_secs_f64()}),
    );
    sj.vas_detach(vh)?;
    sj.vas_remove("crash")?;
    sj.seg_free("crash")?;
    // Boost.Interprocess: a process killed holding a named mutex.
    if let Ok(exe) = tools {
        let name = format!("{}", std::process::id());
        let mut holder = Command::new(exe)
            .args(["boost-lock", &name, "hold"])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().expect("piped")).read_line(&mut line)?;
        let _ = holder.kill();
        let _ = holder.wait();
        let out = Command::new(exe)
            .args(["boost-lock", &name, "try"])
            .output()?;
        let dead = String::from_utf8_lossy(&out.stdout).contains("deadlock");
        push(
            rows,
            json!({"experiment": "crash", "system": "boost", "kills": 1, "deadlocks": u64::from(dead),
                          "note": "a named_mutex held by a process killed with SIGKILL, then timed_lock for 2 s"}),
        );
    }
    Ok(())
}

/// `cairn bench spacejmp-worker`: append to the crash experiment's list in commit/abort
/// cycles until killed, printing each acknowledged commit's count.
pub fn worker(args: &SpacejmpWorkerArgs) -> CliResult {
    let sj = SpaceJmp::with_fs(cairn::Fs::open(&args.bench_store)?)?;
    let vh = sj.vas_attach(sj.vas_find("crash")?, CommitMode::Snapshot)?;
    let seg = sj.seg_find("crash")?;
    let mut rng = Rng(std::process::id() as u64 | 1);
    let mut out = std::io::stdout().lock();
    loop {
        let g = sj.enter(vh)?;
        let head = g.root(seg, "list")?.unwrap_or(SegPtr::NULL);
        let n = if head.is_null() {
            0
        } else {
            g.get::<[u64; 2]>(head)?[0]
        };
        let p = g.alloc(seg, [n + 1, head.0])?;
        g.set_root(seg, "list", p)?;
        if rng.next().is_multiple_of(4) {
            g.abort()?;
            continue;
        }
        g.commit()?;
        writeln!(out, "{}", n + 1)?;
        out.flush()?;
    }
}

/// The rows for people: one line each, the experiment first, then its fields as
/// `name=value` (fractions to one decimal).
fn table(rows: &[Value]) -> String {
    let mut s = String::new();
    for r in rows {
        let Some(o) = r.as_object() else { continue };
        let what = o.get("experiment").and_then(Value::as_str).unwrap_or("-");
        let fields: Vec<String> = o
            .iter()
            .filter(|(k, _)| *k != "experiment")
            .map(|(k, v)| match v {
                Value::String(t) => format!("{k}={t}"),
                Value::Number(n) if n.is_f64() => format!("{k}={:.1}", n.as_f64().unwrap_or(0.0)),
                other => format!("{k}={other}"),
            })
            .collect();
        s.push_str(&format!("{what:<8} {}\n", fields.join("  ")));
    }
    s
}
