//! The power-failure simulator's workloads and checks (issue 14).
//!
//! [`record`] runs a workload on a fresh store with persistence tracing on in every
//! process (the worker and the daemon it starts), from a clean base image to a clean
//! stop. [`check`] then follows the trace with `cairn_crashsim::Sim` and, at every fence
//! and after every acknowledged call, builds the crash images a power failure could
//! leave there; each distinct image is copied into a scratch store, recovered by the
//! daemon's own code (`cairn_daemon::recover`: rebuild and log replay, as a start after
//! a crash), checked by `fsck`, and its tree compared with the reference states: the
//! tree after exactly the acknowledged calls, or, with a call in flight, after it too.

use crate::harness::{StoreSize, TestStore};
use crate::ops::{apply, gen_ops_with, Extras, HostFs, Kind, Meta};
use crate::snapshot::{diff, snapshot, Node, Snapshot};
use cairn_area::{Area, StoreDir};
use cairn_crashsim::{Choice, Event, Sim, Target, Trace};
use cairn_format::inode::{Inode, Kind as IKind};
use cairn_format::ROOT_INO;
use rand::SeedableRng;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Mark labels the worker puts around each call.
pub const MARK_BEGIN: u32 = 1;
pub const MARK_END: u32 = 2;

/// A file of the store the simulator follows: the NVM tier, a lower tier, a client log
/// (format version 7), or the extended-attribute journal.
#[derive(Debug, Clone)]
pub struct TracedFile {
    pub path: PathBuf,
    pub target: Target,
    /// Named in `cairn.toml` (the tiers), or found in the store directory (the journal).
    pub configured: bool,
    /// The log file of this slot, named after the NVM file.
    pub slot: Option<u32>,
}

/// A recorded workload: the base images, the trace and the calls.
pub struct Recorded {
    pub store: TestStore,
    /// The NVM tier first, then the lower tiers.
    pub files: Vec<TracedFile>,
    pub trace: Trace,
    pub seed: u64,
    pub n: usize,
    pub prefix: String,
    pub extras: Extras,
    /// With workers taking turns: the daemon's shared-write counters at the end (times
    /// an inode entered the mode, transactions it sealed).
    pub sharing: Option<(u64, u64)>,
}

impl Recorded {
    /// The recorded calls.
    pub fn ops(&self) -> Vec<crate::Op> {
        gen_ops_with(self.seed, self.n, &self.prefix, self.extras)
    }
}

/// Sizes of the stores the simulator uses: a small NVM tier (every image is a copy of it)
/// and logs large enough for the generated writes to be single transactions.
pub fn small_store() -> TestStore {
    TestStore::with_size(StoreSize {
        nvm: "8M",
        log: "512K",
        clients: 2,
        inodes: Some(1024),
        tiers: None,
    })
}

/// A small store with three tiers: 8 MiB of NVM, 8 MiB of SSD and 8 MiB of HDD in
/// 256 KiB segments (lower tiers as files, every image copies them too).
pub fn small_three_tier_store() -> TestStore {
    TestStore::with_size(StoreSize {
        nvm: "8M",
        log: "512K",
        clients: 2,
        inodes: Some(1024),
        tiers: Some(crate::harness::Tiers {
            ssd: "8M",
            ssd_device: None,
            hdd: Some("8M"),
            segment: "256K",
        }),
    })
}

/// A workload to record: `n` generated calls (`gen_ops_with(seed, n, prefix, extras)`).
#[derive(Debug, Clone)]
pub struct Workload {
    pub seed: u64,
    pub n: usize,
    pub prefix: String,
    /// A digest after every that many calls (0: only when the log fills).
    pub digest_every: usize,
    /// The calls split among this many processes that run one after the other on the
    /// same files: each stays alive, holding its leases, while the next one works, so
    /// every lease passes from one client to the next (revoked, the holder's log
    /// digested) in the middle of the trace.
    pub clients: usize,
    /// After every that many calls, the client asks the daemon to move the data down
    /// one tier: NVM → SSD each time, SSD → HDD every other time (0: never).
    pub migrate_every: usize,
    /// After each migration, also a cleaning round on the SSD and the HDD.
    pub clean: bool,
    /// Optional calls in the sequence (stores through shared mappings).
    pub extras: Extras,
    /// The `clients` take turns call by call (call `i` by client `i % clients`, each
    /// acknowledged before the next starts), rather than one after the other: every
    /// access then conflicts with the other client's lease, and with `shared_write` on
    /// the files enter shared-write mode.
    pub take_turns: bool,
}

impl Workload {
    /// One client, no digests but those a full log forces, no migration.
    pub fn new(seed: u64, n: usize) -> Workload {
        Workload {
            seed,
            n,
            prefix: "/p".into(),
            digest_every: 0,
            clients: 1,
            migrate_every: 0,
            clean: false,
            extras: Extras::default(),
            take_turns: false,
        }
    }
}

/// Record `n` generated calls by one client (`worker`: the `cairn-test-worker` binary)
/// on a [`small_store`], with a digest after every `digest_every` calls.
pub fn record(worker: &Path, seed: u64, n: usize, digest_every: usize) -> Recorded {
    let w = Workload {
        digest_every,
        ..Workload::new(seed, n)
    };
    record_with(worker, small_store(), &w)
}

/// Record workload `w` on `store`.
pub fn record_with(worker: &Path, store: TestStore, w: &Workload) -> Recorded {
    let (seed, n, prefix) = (w.seed, w.n, w.prefix.as_str());
    {
        let fs = store.fs();
        fs.create_dir(prefix).expect("make the prefix");
    }
    let mut sharing = None;
    let t = trace_run(store, |store, trace_path| {
        let worker_cmd = || {
            let mut c = Command::new(worker);
            c.arg(store.path())
                .args([seed.to_string(), n.to_string(), prefix.to_string()])
                .env("CAIRN_PM_TRACE", trace_path)
                .env("CAIRN_WORKER_DIGEST_EVERY", w.digest_every.to_string())
                .env("CAIRN_WORKER_MIGRATE_EVERY", w.migrate_every.to_string())
                .env("CAIRN_WORKER_CLEAN", if w.clean { "1" } else { "0" })
                .env(
                    "CAIRN_WORKER_MAPPED",
                    if w.extras.mapped { "1" } else { "0" },
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            c
        };
        let clients = w.clients.max(1);
        if w.take_turns {
            sharing = Some(take_turns(&worker_cmd, clients, n));
        } else {
            one_after_another(&worker_cmd, clients, n);
        }
    });
    Recorded {
        store: t.store,
        files: t.files,
        trace: t.trace,
        seed,
        n,
        prefix: prefix.to_string(),
        extras: w.extras,
        sharing,
    }
}

/// A traced run of some workload on a store.
pub struct Traced {
    pub store: TestStore,
    /// The NVM tier first, then the lower tiers, with their images before the run.
    pub files: Vec<TracedFile>,
    pub trace: Trace,
}

/// Trace whatever `run` does to `store`: the store's daemon is stopped and the base
/// images of its files taken, then `run` is called with the trace file, which every
/// process it starts must name in `CAIRN_PM_TRACE` (the daemon a traced client starts
/// inherits it); at the end the daemon stops cleanly (its shutdown is traced too).
pub fn trace_run(store: TestStore, run: impl FnOnce(&TestStore, &Path)) -> Traced {
    store.stop();
    wait_no_daemon(&store);
    let cfg = StoreDir::new(store.path()).load_config().expect("config");
    let mut files = Vec::new();
    let logs = cairn_area::store::nvm_files(&cfg.nvm_path)
        .into_iter()
        .skip(1);
    let logs = logs
        .enumerate()
        .map(|(s, p)| (Some(p), false, false, Some(s as u32)));
    for (path, disk, configured, slot) in [
        (Some(cfg.nvm_path.clone()), false, true, None),
        (cfg.ssd_path.clone(), true, true, None),
        (cfg.hdd_path.clone(), true, true, None),
        (
            Some(StoreDir::new(store.path()).xattr_path()),
            true,
            false,
            None,
        ),
    ]
    .into_iter()
    .chain(logs)
    {
        let Some(path) = path else { continue };
        let meta = std::fs::metadata(&path).expect("store file");
        files.push(TracedFile {
            target: Target {
                file: (meta.dev(), meta.ino()),
                base: std::fs::read(&path).expect("read the base image"),
                disk,
            },
            path,
            configured,
            slot,
        });
    }
    // On tmpfs, like the NVM tier (sparse: only what is traced takes memory), removed
    // even if the recording fails.
    let trace_file = tempfile::Builder::new()
        .prefix("cairn-pm-")
        .suffix(".trace")
        .tempfile_in("/dev/shm")
        .expect("make the trace file");
    let trace_path = trace_file.path().to_path_buf();
    cairn_media::trace::create(&trace_path, 2 << 30).expect("make the trace file");
    run(&store, &trace_path);
    store.stop();
    wait_no_daemon(&store);
    let trace = Trace::read(&trace_path).expect("read the trace");
    for f in &files {
        let m = std::fs::metadata(&f.path).expect("store file");
        assert_eq!(
            (m.dev(), m.ino()),
            f.target.file,
            "{} was replaced during the run (an extended-attribute journal compaction, \
             which the simulator does not model)",
            f.path.display()
        );
    }
    drop(trace_file);
    Traced {
        store,
        files,
        trace,
    }
}

/// Run calls `0..n` split among `clients` workers that run one after the other, each
/// staying alive (holding its leases) until all are done.
fn one_after_another(worker_cmd: &dyn Fn() -> Command, clients: usize, n: usize) {
    let mut held = Vec::new();
    for c in 0..clients {
        let (from, to) = (n * c / clients, n * (c + 1) / clients);
        let mut child = worker_cmd()
            .env("CAIRN_WORKER_RANGE", format!("{from}:{to}"))
            .env("CAIRN_WORKER_HOLD", "1")
            .spawn()
            .expect("run the worker");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let done = lines.any(|l| l.is_ok_and(|l| l == "DONE"));
        assert!(done, "worker {c} failed: {:?}", child.wait());
        held.push(child);
    }
    for mut child in held {
        drop(child.stdin.take());
        let st = child.wait().expect("wait for the worker");
        assert!(st.success(), "worker exited with {st}");
    }
}

/// Run calls `0..n` with `clients` workers in step mode taking turns (call `i` by worker
/// `i % clients`); the largest shared-write counters they print at the end.
fn take_turns(worker_cmd: &dyn Fn() -> Command, clients: usize, n: usize) -> (u64, u64) {
    let mut workers = Vec::new();
    for c in 0..clients {
        // One at a time, so that the first starts the daemon.
        let mut child = worker_cmd()
            .env("CAIRN_WORKER_STEP", "1")
            .spawn()
            .expect("run the worker");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = lines.next().and_then(Result::ok);
        assert_eq!(
            ready.as_deref(),
            Some("READY"),
            "worker {c}: {:?}",
            child.wait()
        );
        workers.push((child, stdin, lines));
    }
    for i in 0..n {
        let (child, stdin, lines) = &mut workers[i % clients];
        writeln!(stdin, "{i}")
            .and_then(|()| stdin.flush())
            .expect("ask the worker");
        let ack = lines.next().and_then(Result::ok);
        assert_eq!(
            ack,
            Some(format!("ACK {i}")),
            "worker: {:?}",
            child.try_wait()
        );
    }
    let mut sharing = (0, 0);
    for (mut child, stdin, lines) in workers {
        drop(stdin);
        for l in lines.map_while(Result::ok) {
            let v: Vec<u64> = l
                .strip_prefix("SHARING ")
                .map(|r| r.split(' ').filter_map(|x| x.parse().ok()).collect())
                .unwrap_or_default();
            if let [entries, commits] = v[..] {
                sharing = sharing.max((entries, commits));
            }
        }
        let st = child.wait().expect("wait for the worker");
        assert!(st.success(), "worker exited with {st}");
    }
    sharing
}

fn wait_no_daemon(store: &TestStore) {
    let t = Instant::now();
    while store.daemon_pid().is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the daemon does not stop"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How hard to look.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Enumerate every combination at a crash point when there are at most this many.
    pub exhaustive: u64,
    /// Otherwise, this many sampled images per crash point.
    pub samples: usize,
    /// Stop after this many distinct images (0: no limit).
    pub max_distinct: usize,
    /// Fault injection: ignore write-backs and fences at sites whose `file:line`
    /// contains one of these.
    pub drop_sites: Vec<String>,
    pub rng_seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            exhaustive: 64,
            samples: 24,
            max_distinct: 0,
            drop_sites: Vec::new(),
            rng_seed: 1,
        }
    }
}

/// One violation: a crash image that does not recover to an allowed state.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Index of the trace event before which the power failed.
    pub event: usize,
    /// Calls acknowledged then, and the call in flight.
    pub acked: usize,
    pub in_flight: Option<usize>,
    /// What went wrong.
    pub what: String,
}

/// What a check found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub crash_points: usize,
    pub images: usize,
    pub distinct: usize,
    pub violations: Vec<Violation>,
    pub dropped_hits: u64,
    pub elapsed: Duration,
    /// Stopped early at `max_distinct`.
    pub truncated: bool,
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} crash points, {} images checked, {} distinct, {} violations, {:.1} s{}",
            self.crash_points,
            self.images,
            self.distinct,
            self.violations.len(),
            self.elapsed.as_secs_f64(),
            if self.truncated {
                " (stopped at the distinct-image limit)"
            } else {
                ""
            }
        )
    }
}

/// What recovering one image gave.
#[derive(Clone)]
enum Outcome {
    /// The tree under the prefix.
    Tree(Snapshot),
    Failed(String),
}

/// The reference states: the tree after each number of calls, 0..=n.
pub fn reference_states(r: &Recorded) -> Vec<Snapshot> {
    let dir = tempfile::Builder::new()
        .prefix("cairn-pf-ref-")
        .tempdir_in("/dev/shm")
        .expect("tempdir");
    let host = HostFs {
        root: dir.path().to_path_buf(),
    };
    crate::FsOps::mkdir(&host, &r.prefix).expect("prefix");
    let mut v = vec![snapshot(&host, &r.prefix).expect("snapshot")];
    for op in r.ops() {
        apply(&host, &op);
        v.push(snapshot(&host, &r.prefix).expect("snapshot"));
    }
    v
}

/// A scratch store whose files receive each image.
struct Scratch {
    dir: tempfile::TempDir,
    /// Where each traced file's image goes (the order of `Recorded::files`).
    paths: Vec<PathBuf>,
    /// Each file open, with a read-only view of it once it has the image's size.
    files: std::cell::RefCell<Vec<Option<(std::fs::File, cairn_media::Mapping)>>>,
}

impl Scratch {
    fn new(store: &TestStore, files: &[TracedFile]) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("cairn-pf-img-")
            .tempdir()
            .expect("tempdir");
        let name = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut cfg = std::fs::read_to_string(store.path().join("cairn.toml")).expect("config");
        let mut paths: Vec<PathBuf> = Vec::new();
        for (i, f) in files.iter().enumerate() {
            if let Some(s) = f.slot {
                // Beside the scratch NVM file (the first), as the store finds it.
                let log = cairn_area::store::slot_log_path(&paths[0], s);
                paths.push(log);
                continue;
            }
            if !f.configured {
                paths.push(dir.path().join(f.path.file_name().expect("a file name")));
                continue;
            }
            let old = f.path.to_string_lossy().into_owned();
            let new = Path::new("/dev/shm").join(format!("{name}.{i}"));
            assert!(cfg.contains(&old), "the configuration names {old}");
            cfg = cfg.replace(&old, &new.to_string_lossy());
            paths.push(new);
        }
        std::fs::write(dir.path().join("cairn.toml"), cfg).expect("write config");
        let files = std::cell::RefCell::new(paths.iter().map(|_| None).collect());
        Scratch { dir, paths, files }
    }

    /// Recover the image `choice` describes and read the tree.
    fn recover(&self, sim: &Sim, choice: &Choice, prefix: &str) -> Outcome {
        if let Err(e) = self.write(sim, choice) {
            return Outcome::Failed(format!("cannot write the image: {e}"));
        }
        let store = self.dir.path().to_path_buf();
        let nvm = self.paths[0].clone();
        let r = std::panic::catch_unwind(move || -> Result<Snapshot, String> {
            fresh_slot_locks(&store);
            unless_busy(|| cairn_daemon::recover(&store))
                .map_err(|e| format!("recovery failed: {e}"))?;
            let rep = unless_busy(|| cairn_daemon::fsck(&store, &Default::default()))
                .map_err(|e| format!("fsck could not run: {e}"))?;
            if !rep.problems.is_empty() {
                return Err(format!("fsck: {}", rep.problems.join("; ")));
            }
            let cfg = StoreDir::new(&store)
                .load_config()
                .map_err(|e| e.to_string())?;
            let f = std::fs::File::open(&nvm).map_err(|e| e.to_string())?;
            let mut area = Area::open(&f, false).map_err(|e| format!("open: {e}"))?;
            area.attach_tiers(
                [cfg.ssd_path.as_deref(), cfg.hdd_path.as_deref()],
                None,
                false,
            )
            .map_err(|e| format!("attach the tiers: {e}"))?;
            let xattrs = unless_busy(|| cairn_daemon::stored_xattrs(&store))
                .map_err(|e| format!("reading the extended attributes: {e}"))?;
            area_snapshot(&area, prefix, &xattrs).map_err(|e| format!("reading the tree: {e}"))
        });
        match r {
            Ok(Ok(s)) => Outcome::Tree(s),
            Ok(Err(e)) => Outcome::Failed(e),
            Err(p) => Outcome::Failed(format!(
                "panic: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        }
    }

    /// Make the scratch files hold the image `choice` describes: each file's durable
    /// image with the pending words the image keeps. Only the pages that differ from
    /// what the file holds (the last image, as its recovery left it) are written: most
    /// of an image is the same as the last one, and rewriting all of it was a fifth of
    /// the check's time.
    fn write(&self, sim: &Sim, choice: &Choice) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        const PAGE: usize = 4096;
        // The kept pending words, by file and page.
        type Words = BTreeMap<usize, Vec<(usize, [u8; 8])>>;
        let mut words: Vec<Words> = vec![BTreeMap::new(); self.paths.len()];
        for (t, off, w) in sim.overlay(choice) {
            let off = off as usize;
            words[t].entry(off / PAGE).or_default().push((off, w));
        }
        let mut files = self.files.borrow_mut();
        let mut page = [0u8; PAGE];
        for (((p, slot), base), words) in self
            .paths
            .iter()
            .zip(files.iter_mut())
            .zip(sim.bases())
            .zip(&words)
        {
            let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
            if slot
                .as_ref()
                .is_none_or(|(_, view)| view.len() != base.len())
            {
                *slot = None;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(p)
                    .map_err(ctx)?;
                f.write_all_at(base, 0).map_err(ctx)?;
                f.set_len(base.len() as u64).map_err(ctx)?;
                if !base.is_empty() {
                    let view =
                        cairn_media::Mapping::new(&f, 0, base.len(), false, false).map_err(ctx)?;
                    *slot = Some((f, view));
                }
            }
            let Some((f, view)) = slot.as_ref() else {
                continue;
            };
            // The recovery may have resized the file (a view past its end would fault).
            if f.metadata().map_err(ctx)?.len() != base.len() as u64 {
                f.set_len(base.len() as u64).map_err(ctx)?;
            }
            for (i, at) in (0..base.len()).step_by(PAGE).enumerate() {
                let end = (at + PAGE).min(base.len());
                let want = match words.get(&i) {
                    None => &base[at..end],
                    Some(ws) => {
                        let page = &mut page[..end - at];
                        page.copy_from_slice(&base[at..end]);
                        for &(off, w) in ws {
                            page[off - at..off - at + 8].copy_from_slice(&w);
                        }
                        page
                    }
                };
                if view.bytes(at, end - at)? != want {
                    f.write_all_at(want, at as u64).map_err(ctx)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Remove the slot lock files of the scratch store at `store` (the recovery makes them
/// again). No client of an image lives, but a process another thread of this test
/// binary forks (a worker, `cairn mkfs`, a daemon a client starts) holds a copy of
/// every descriptor open at that moment until it runs its program, among them the
/// lock of the last image's recovery: the next recovery would then take that slot's
/// client for a live one, keep its unlinked files and leave its log undigested (a
/// false violation, seen once in CI). A new file is locked by nobody.
fn fresh_slot_locks(store: &Path) {
    let Ok(entries) = std::fs::read_dir(StoreDir::new(store).slots_dir()) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(".lock") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// `f`, tried again while it fails with `EBUSY` (for up to 2 s). Recovery, `fsck` and
/// the reading of the extended-attribute journal take the scratch store's daemon lock
/// (`flock`), and a child this process spawns on another thread (the next seed's
/// recording) holds a copy of every open file description from its fork until its exec
/// closes them, the lock included: the store then looks served by a daemon for a moment.
fn unless_busy<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match f() {
            Err(e) if cairn_area::errno_of(&e) == libc::EBUSY && tries < 200 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Longest a recovery, fsck and tree read of one image may take before the check calls
/// it a hang.
const HANG: Duration = Duration::from_secs(60);

/// Aborts the process (failing the test with a message) when one image's check runs
/// longer than [`HANG`]: recovery runs in this process, so a hang cannot be interrupted.
/// When the current image's check started and the trace event it crashes before (`None`:
/// idle).
type Busy = Option<(Instant, usize)>;

struct Watchdog {
    /// What is being checked, and whether the watchdog should stop.
    state: std::sync::Arc<std::sync::Mutex<(Busy, bool)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new() -> Watchdog {
        let state = std::sync::Arc::new(std::sync::Mutex::new((Busy::None, false)));
        let st = state.clone();
        let thread = std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            let (busy, stop) = *st.lock().unwrap_or_else(|e| e.into_inner());
            if stop {
                return;
            }
            if let Some((since, event)) = busy.filter(|(since, _)| since.elapsed() > HANG) {
                // Straight to the process's stderr: the test harness's capture of
                // `eprintln!` would be lost with the abort.
                let _ = writeln!(
                    std::io::stderr(),
                    "power failure: the recovery of the image before trace event {event} ran for {} s: a hang",
                    since.elapsed().as_secs()
                );
                std::process::abort();
            }
        });
        Watchdog {
            state,
            thread: Some(thread),
        }
    }

    fn set(&self, busy: Busy) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0 = busy;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether a crash is simulated before `e`: a fence, or the end of a call.
pub fn is_crash_point(e: &Event) -> bool {
    matches!(
        e,
        Event::Fence { .. }
            | Event::Mark {
                label: MARK_END,
                ..
            }
    )
}

/// Follow a workload's marks: `MARK_BEGIN` puts call `value` in flight, `MARK_END`
/// acknowledges it. Whether `e` is a crash point.
pub fn follow_marks(e: &Event, acked: &mut usize, in_flight: &mut Option<usize>) -> bool {
    match e {
        Event::Mark {
            label: MARK_BEGIN,
            value,
            ..
        } => *in_flight = Some(*value as usize),
        Event::Mark {
            label: MARK_END,
            value,
            ..
        } => {
            *acked = *value as usize + 1;
            *in_flight = None;
        }
        _ => {}
    }
    is_crash_point(e)
}

/// Check every crash image of a recorded workload.
pub fn check(r: &Recorded, opts: &CheckOptions) -> CheckReport {
    let ops = r.ops();
    let expected = Expected {
        normalize: None,
        prefix: &r.prefix,
        states: reference_states(r),
        call: &|k| format!("#{k} {:?}", ops[k]),
    };
    check_states(&r.store, &r.files, &r.trace, &expected, opts)
}

/// What the images of a traced run must recover to.
pub struct Expected<'a> {
    /// The tree read from each image (a directory of the store).
    pub prefix: &'a str,
    /// The tree after each number of acknowledged calls, `0..=n`.
    pub states: Vec<Snapshot>,
    /// Call `k` described, for the violations.
    pub call: &'a dyn Fn(usize) -> String,
    /// What a recovered tree means, before it is compared (for layers that keep their own
    /// journals in files: their committed state); `None`: the tree as it is.
    pub normalize: Option<&'a (dyn Fn(&mut Snapshot) + Sync)>,
}

/// Check every crash image of a traced run of `store` (its `files`, the `trace`) against
/// the `expected` states: at every fence and after every acknowledged call (the marks
/// [`MARK_BEGIN`] and [`MARK_END`]), the images a power failure could leave are
/// recovered and the tree under the prefix compared with the state after exactly the
/// acknowledged calls, or, with a call in flight, after it too.
pub fn check_states(
    store: &TestStore,
    files: &[TracedFile],
    trace: &Trace,
    expected: &Expected<'_>,
    opts: &CheckOptions,
) -> CheckReport {
    let start = Instant::now();
    let scratch = Scratch::new(store, files);
    let watchdog = Watchdog::new();
    let mut sim = Sim::with_targets(files.iter().map(|f| f.target.clone()).collect());
    let dropped: Vec<u32> = trace
        .sites
        .iter()
        .filter(|(_, name)| opts.drop_sites.iter().any(|d| name.contains(d.as_str())))
        .map(|(&id, _)| id)
        .collect();
    assert!(
        opts.drop_sites.is_empty() || !dropped.is_empty(),
        "no traced site matches {:?}",
        opts.drop_sites
    );
    sim.drop_sites(dropped);
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.rng_seed);
    let mut seen: HashMap<u64, Outcome> = HashMap::new();
    let mut rep = CheckReport::default();
    let (mut acked, mut in_flight) = (0usize, None::<usize>);
    let points = trace.events.iter().filter(|e| is_crash_point(e)).count();
    for (i, e) in trace.events.iter().enumerate() {
        let point = follow_marks(e, &mut acked, &mut in_flight);
        if point && !rep.truncated {
            // Spread what is left of the budget over the crash points still ahead.
            let per = if opts.max_distinct == 0 {
                opts.samples
            } else {
                let left = opts.max_distinct.saturating_sub(seen.len());
                (left / (points - rep.crash_points).max(1)).clamp(2, opts.samples)
            };
            rep.crash_points += 1;
            for c in sim.choices(opts.exhaustive.min(per as u64), per, &mut rng) {
                rep.images += 1;
                let h = sim.image_hash(&c);
                if !seen.contains_key(&h) {
                    if opts.max_distinct > 0 && seen.len() >= opts.max_distinct {
                        rep.truncated = true;
                        break;
                    }
                    watchdog.set(Some((Instant::now(), i)));
                    let mut o = scratch.recover(&sim, &c, expected.prefix);
                    if let (Outcome::Tree(t), Some(n)) = (&mut o, expected.normalize) {
                        n(t);
                    }
                    seen.insert(h, o);
                    watchdog.set(None);
                }
                if let Some(what) = judge(&seen[&h], expected, acked, in_flight) {
                    if rep.violations.is_empty() {
                        keep_image(&sim, &c);
                    }
                    rep.violations.push(Violation {
                        event: i,
                        acked,
                        in_flight,
                        what: format!("{what}\n  lost: {}", lost(trace, &sim, &c)),
                    });
                }
            }
        }
        sim.step(e);
    }
    rep.distinct = seen.len();
    rep.dropped_hits = sim.dropped_hits;
    rep.elapsed = start.elapsed();
    rep
}

/// With `CAIRN_PF_KEEP=<file>`, save the first violating image there: `<file>.0` the NVM
/// tier, `.1` and `.2` the lower tiers (for `cairn fsck` or a daemon started on a copy
/// of the store's configuration naming them).
fn keep_image(sim: &Sim, c: &Choice) {
    if let Some(p) = std::env::var_os("CAIRN_PF_KEEP") {
        let mut imgs = Vec::new();
        sim.build(c, &mut imgs);
        for (i, img) in imgs.iter().enumerate() {
            let p = format!("{}.{i}", Path::new(&p).display());
            match std::fs::write(&p, img) {
                Ok(()) => eprintln!("first violating image saved to {p}"),
                Err(e) => eprintln!("cannot save the image: {e}"),
            }
        }
    }
}

/// `None` if the outcome is an allowed state, else why not.
fn judge(
    o: &Outcome,
    expected: &Expected<'_>,
    acked: usize,
    in_flight: Option<usize>,
) -> Option<String> {
    let tree = match o {
        Outcome::Failed(e) => return Some(e.clone()),
        Outcome::Tree(t) => t,
    };
    let states = &expected.states;
    if *tree == states[acked] {
        return None;
    }
    if in_flight.is_some() && acked + 1 < states.len() && *tree == states[acked + 1] {
        return None;
    }
    let last = match acked {
        0 => "none".to_string(),
        k => (expected.call)(k - 1),
    };
    let flying = in_flight.map_or("none".to_string(), expected.call);
    Some(format!(
        "the tree is not the state after the {acked} acknowledged calls (last acknowledged: {last}; in flight: {flying}):\n{}",
        diff(tree, &states[acked])
    ))
}

/// Which pending stores an image left out, by site.
fn lost(trace: &Trace, sim: &Sim, c: &Choice) -> String {
    let mut by_site: BTreeMap<String, usize> = BTreeMap::new();
    for (site, n) in sim.lost_sites(c) {
        *by_site.entry(trace.site_name(site)).or_default() += n;
    }
    if by_site.is_empty() {
        return "nothing".into();
    }
    by_site
        .iter()
        .map(|(s, n)| format!("{n} words stored at {s}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The tree under `root` of a recovered area with the extended attributes of its
/// journal, as [`snapshot`] reads a live one (`user.` attributes only).
pub fn area_snapshot(
    area: &Area,
    root: &str,
    xattrs: &cairn_daemon::StoredXattrs,
) -> io::Result<Snapshot> {
    let mut ino = ROOT_INO;
    for c in root.split('/').filter(|c| !c.is_empty()) {
        let d = area.read_inode(ino)?;
        ino = area
            .dir_lookup(&d, c.as_bytes())?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?
            .0;
    }
    let mut s = Snapshot::new();
    let mut stack = vec![(root.to_string(), ino)];
    while let Some((path, ino)) = stack.pop() {
        let inode = area.read_inode(ino)?;
        let kind = match inode.attrs.kind {
            IKind::Dir => Kind::Dir,
            IKind::Symlink => Kind::Symlink,
            IKind::File => Kind::File,
            k => return Err(io::Error::other(format!("{path}: unexpected kind {k:?}"))),
        };
        let content = if kind == Kind::Dir {
            Vec::new()
        } else {
            read_whole(area, &inode)?
        };
        s.insert(
            path.clone(),
            Node {
                meta: Meta {
                    kind,
                    perm: inode.attrs.perm & 0o7777,
                    size: if kind == Kind::Dir {
                        0
                    } else {
                        inode.attrs.size
                    },
                    nlink: inode.attrs.nlink,
                },
                content,
                xattrs: xattrs
                    .get(&(ino, inode.generation))
                    .into_iter()
                    .flatten()
                    .filter(|(k, _)| k.starts_with(b"user."))
                    .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
                    .collect(),
            },
        );
        if kind == Kind::Dir {
            for e in area.dir_list(&inode)? {
                let name = String::from_utf8_lossy(&e.name).into_owned();
                let p = if path.ends_with('/') {
                    format!("{path}{name}")
                } else {
                    format!("{path}/{name}")
                };
                stack.push((p, e.ino));
            }
        }
    }
    Ok(s)
}

fn read_whole(area: &Area, inode: &Inode) -> io::Result<Vec<u8>> {
    let mut v = vec![0u8; inode.attrs.size as usize];
    let mut at = 0;
    while at < v.len() {
        let n = area.read_file(inode, at as u64, &mut v[at..])?;
        if n == 0 {
            break;
        }
        at += n;
    }
    v.truncate(at);
    Ok(v)
}

/// The line of `file` (from the workspace's root) holding the first `fence()` at or
/// after the line containing `anchor`, as a trace site name (`file:line`): a persistence
/// point for fault injection that moves with the code.
pub fn fence_after(file: &str, anchor: &str) -> String {
    call_after(file, anchor, "fence()")
}

/// The line of `file` holding the first `call` at or after the line containing
/// `anchor`, as a trace site name (`file:line`).
pub fn call_after(file: &str, anchor: &str, call: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join(file)).expect("source file");
    let lines: Vec<&str> = text.lines().collect();
    let a = lines
        .iter()
        .position(|l| l.contains(anchor))
        .unwrap_or_else(|| panic!("{anchor:?} not in {file}"));
    let f = (a..lines.len())
        .find(|&i| lines[i].contains(call))
        .expect("the call after the anchor");
    format!("{file}:{}", f + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// The page-wise write leaves each scratch file holding exactly the image the
    /// simulator describes, whatever the last recovery did to the file (pages
    /// scribbled on, the file shortened or grown).
    #[test]
    fn scratch_files_hold_exactly_each_image() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvm");
        // Three pages and a bit: a short last page.
        let base: Vec<u8> = (0..3 * 4096 + 8).map(|i| (i % 251) as u8).collect();
        let mut sim = Sim::new((1, 2), base.clone());
        for (off, v) in [
            (8u64, 1u8),
            (4096 + 64, 2),
            (2 * 4096 + 128, 3),
            (3 * 4096, 4),
        ] {
            sim.step(&Event::Store {
                tid: 1,
                site: 0,
                file: (1, 2),
                off,
                data: vec![v; 8],
                nt: false,
            });
        }
        let scratch = Scratch {
            files: std::cell::RefCell::new(vec![None]),
            paths: vec![path.clone()],
            dir,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let choices = sim.choices(1 << 10, 0, &mut rng);
        assert_eq!(choices.len(), 16);
        let mut want = Vec::new();
        for (i, c) in choices.iter().enumerate() {
            scratch.write(&sim, c).unwrap();
            sim.build(c, &mut want);
            assert_eq!(std::fs::read(&path).unwrap(), want[0], "image {i}");
            // What a recovery might do to the file before the next image.
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0xee; 100], (i as u64 % 4) * 4096 + 7)
                .unwrap();
            match i % 3 {
                0 => f.set_len(4096 + 16).unwrap(),
                1 => f.set_len(5 * 4096).unwrap(),
                _ => {}
            }
        }
    }
}
