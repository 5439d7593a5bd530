//! Power failure in the key-value store: every crash image of a traced workload (puts
//! small and large, overwrites, deletes, compaction, in both update policies) recovers
//! to the store after exactly the acknowledged calls, or after the call in flight too
//! (issue 17 on issue 14's simulator, `cairn_crashsim`).
//!
//! The workload runs in a child process (this test binary again, `record_child`) with
//! persistence tracing on; the parent follows the trace with the simulator and, at every
//! fence and after every acknowledged call, builds the images a power failure could
//! leave. Each distinct image is opened by `Store::open` (recovery: journal redo, scan,
//! index), read whole (every value must be one that was written: a torn value fails),
//! compacted completely and read again.
//!
//! A second workload runs in two processes at once on one pool opened shared
//! (`Store::open_shared`), both traced into one trace in one global order: every image
//! must hold each process's keys as its acknowledged calls left them (or with its call
//! in flight).
//!
//! `CAIRN_KV_PF_OPS`: calls per workload (default 300; per process in the shared one,
//! half); `CAIRN_KV_PF_IMAGES`: distinct images per policy at most (default 4000; 0: no
//! limit).

use cairn_crashsim::{Event, Sim, Trace};
use cairn_kv::{Options, Store, UpdatePolicy};
use cairn_tests::powerfail::{fence_after, follow_marks, is_crash_point, MARK_BEGIN, MARK_END};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The mark a workload starts with (value: the policy's index in [`POLICIES`]).
const MARK_WORKLOAD: u32 = 10;
const POLICIES: [UpdatePolicy; 2] = [UpdatePolicy::Append, UpdatePolicy::InPlace];
const RECORD_ENV: &str = "CAIRN_KV_PF_RECORD";

fn env_or(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

#[derive(Debug, Clone)]
enum Op {
    /// Key, value length, fill byte.
    Put(Vec<u8>, usize, u8),
    Del(Vec<u8>),
    /// Puts committed together (`Store::batch`): key, value length, fill byte each.
    Batch(Vec<(Vec<u8>, usize, u8)>),
    /// A compaction round and a reclaim.
    Compact,
}

/// A key's value in the model: length and fill byte.
type State = BTreeMap<Vec<u8>, (usize, u8)>;

fn gen_ops(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let key = format!("key-{}", rng.gen_range(0..12)).into_bytes();
            let fill = (i % 251) as u8 + 1;
            match rng.gen_range(0..100) {
                0..=39 => Op::Put(key, rng.gen_range(1..200), fill),
                40..=69 => Op::Put(key, rng.gen_range(200..8192), fill),
                70..=77 => Op::Put(key, rng.gen_range(64 << 10..160 << 10), fill),
                78..=89 => Op::Del(key),
                90..=95 => {
                    // A few puts, the same key again right after itself with a value of
                    // the same size now and then (it takes the last record's room).
                    let mut puts: Vec<(Vec<u8>, usize, u8)> = Vec::new();
                    for j in 0..rng.gen_range(2..7) {
                        let fill = ((i + j) % 251) as u8 + 1;
                        match puts.last() {
                            Some((k, len, _)) if rng.gen_range(0..3) == 0 => {
                                puts.push((k.clone(), *len, fill));
                            }
                            _ => {
                                let k = format!("key-{}", rng.gen_range(0..12)).into_bytes();
                                puts.push((k, rng.gen_range(1..3000), fill));
                            }
                        }
                    }
                    Op::Batch(puts)
                }
                _ => Op::Compact,
            }
        })
        .collect()
}

fn states(ops: &[Op]) -> Vec<State> {
    let mut s = State::new();
    let mut v = vec![s.clone()];
    for op in ops {
        match op {
            Op::Put(k, len, fill) => {
                s.insert(k.clone(), (*len, *fill));
            }
            Op::Del(k) => {
                s.remove(k);
            }
            Op::Batch(puts) => {
                for (k, len, fill) in puts {
                    s.insert(k.clone(), (*len, *fill));
                }
            }
            Op::Compact => {}
        }
        v.push(s.clone());
    }
    v
}

/// The states a crash in the middle of `op` may leave from `before` (besides `before`
/// and the state after it): a batch's commit keeps a prefix of its puts.
fn partial(op: &Op, before: &State) -> Vec<State> {
    let mut v = Vec::new();
    if let Op::Batch(puts) = op {
        let mut s = before.clone();
        for (k, len, fill) in puts {
            s.insert(k.clone(), (*len, *fill));
            v.push(s.clone());
        }
    }
    v
}

/// A pool of four segments (the smallest: every image is a copy of it), one head, no
/// background threads (the trace is one thread's).
fn options(policy: UpdatePolicy) -> Options {
    Options {
        size: 8 << 20,
        expected_keys: Some(64),
        heads: Some(1),
        policy,
        background_compaction: false,
        huge_pages: false,
        ..Options::default()
    }
}

fn seed() -> u64 {
    env_or("CAIRN_KV_PF_SEED", 7)
}

fn n_ops() -> usize {
    env_or("CAIRN_KV_PF_OPS", 300) as usize
}

/// The child: both workloads on fresh pools in the directory `RECORD_ENV` names, traced
/// into `trace` there (the pools' images before the trace: `<pool>.base`).
#[test]
fn record_child() {
    let Some(dir) = std::env::var_os(RECORD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let ops = gen_ops(seed(), n_ops());
    let pools: Vec<PathBuf> = (0..POLICIES.len())
        .map(|i| dir.join(format!("pool{i}")))
        .collect();
    for (p, &policy) in pools.iter().zip(&POLICIES) {
        drop(Store::open(p, &options(policy)).expect("create the pool"));
        std::fs::copy(p, p.with_extension("base")).expect("base image");
    }
    let trace = dir.join("trace");
    cairn_media::trace::create(&trace, 1 << 30).expect("trace file");
    cairn_media::trace::start(&trace).expect("start tracing");
    for (w, (p, &policy)) in pools.iter().zip(&POLICIES).enumerate() {
        cairn_media::trace::mark(MARK_WORKLOAD, w as u64);
        let store = Store::open(p, &options(policy)).expect("open the pool");
        for (i, op) in ops.iter().enumerate() {
            cairn_media::trace::mark(MARK_BEGIN, i as u64);
            apply(&store, op);
            cairn_media::trace::mark(MARK_END, i as u64);
        }
        drop(store);
    }
}

/// Make call `op` on `store`.
fn apply(store: &Store, op: &Op) {
    match op {
        Op::Put(k, len, fill) => store.put(k, &vec![*fill; *len]).expect("put"),
        Op::Del(k) => {
            store.delete(k).expect("delete");
        }
        Op::Batch(puts) => {
            let mut b = store.batch();
            for (k, len, fill) in puts {
                b.put(k, &vec![*fill; *len]);
            }
            b.commit(|r| r.expect("batched put"));
        }
        Op::Compact => {
            store.compact(2).expect("compact");
            store.reclaim();
        }
    }
}

/// The recorded trace, the base images, and the files' identities (read into memory:
/// the recording's directory is gone).
struct Recorded {
    trace: Trace,
    /// Per policy: (dev, ino) of the pool and its image before the trace.
    pools: Vec<((u64, u64), Vec<u8>)>,
}

fn recorded() -> &'static Recorded {
    static R: OnceLock<Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("cairn-pf-kv-")
            .tempdir_in("/dev/shm")
            .expect("tempdir");
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "record_child", "--nocapture", "--test-threads=1"])
            .env(RECORD_ENV, dir.path())
            .output()
            .expect("run the recording child");
        assert!(
            out.status.success(),
            "recording failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let trace = Trace::read(&dir.path().join("trace")).expect("read the trace");
        let pools = (0..POLICIES.len())
            .map(|i| {
                let p = dir.path().join(format!("pool{i}"));
                let m = std::fs::metadata(&p).expect("pool");
                let base = std::fs::read(p.with_extension("base")).expect("base image");
                ((m.dev(), m.ino()), base)
            })
            .collect();
        drop(dir);
        Recorded { trace, pools }
    })
}

#[derive(Debug, Default)]
struct Report {
    crash_points: usize,
    images: usize,
    distinct: usize,
    dropped_hits: u64,
    /// Calls of two processes were in flight at once (the shared workload).
    overlapped: bool,
    /// Violations found, and the first 20 described.
    violation_count: usize,
    violations: Vec<String>,
}

/// What one image recovered to (opened with `opts`): the state, or why it did not.
fn recover(path: &Path, image: &[u8], opts: &Options) -> Result<State, String> {
    std::fs::write(path, image).map_err(|e| format!("write the image: {e}"))?;
    let r = std::panic::catch_unwind(|| -> Result<State, String> {
        let store = Store::open(path, opts).map_err(|e| format!("open: {e}"))?;
        let first = read_all(&store)?;
        // Everything compacted: the recovered accounting must hold up (the checked
        // build asserts that no segment's live bytes go below zero).
        let mut rounds = 0;
        while store.compact(8).map_err(|e| format!("compact: {e}"))? > 0 {
            store.reclaim();
            rounds += 1;
            if rounds > 64 {
                return Err(
                    "compaction never settles (64 rounds that each emptied a segment)".into(),
                );
            }
        }
        let second = read_all(&store)?;
        if first != second {
            return Err(format!(
                "compaction after recovery changed the data: {first:?} → {second:?}"
            ));
        }
        drop(store);
        let again = Store::open(path, opts).map_err(|e| format!("reopen: {e}"))?;
        let third = read_all(&again)?;
        if third != first {
            return Err(format!(
                "reopening after compaction changed the data: {first:?} → {third:?}"
            ));
        }
        Ok(first)
    });
    match r {
        Ok(r) => r,
        Err(p) => Err(format!(
            "panic: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// Every key and value of a store, each value one that was written (one fill byte).
fn read_all(store: &Store) -> Result<State, String> {
    let mut keys = Vec::new();
    let mut cursor = 0;
    loop {
        cursor = store.scan(cursor, 64, |k| keys.push(k.to_vec()));
        if cursor == 0 {
            break;
        }
    }
    let mut st = State::new();
    let mut buf = Vec::new();
    for k in keys {
        buf.clear();
        match store.get(&k, &mut buf) {
            Ok(Some(len)) => {
                let fill = buf.first().copied().unwrap_or(0);
                if buf.iter().any(|&b| b != fill) {
                    return Err(format!(
                        "{}: a torn value ({len} bytes, not all {fill})",
                        String::from_utf8_lossy(&k)
                    ));
                }
                st.insert(k, (len, fill));
            }
            Ok(None) => {
                return Err(format!(
                    "{}: scanned, not found",
                    String::from_utf8_lossy(&k)
                ))
            }
            Err(e) => return Err(format!("get: {e}")),
        }
    }
    if st.len() as u64 != store.len() {
        return Err(format!(
            "{} keys read, len() says {}",
            st.len(),
            store.len()
        ));
    }
    Ok(st)
}

fn show(st: &State) -> String {
    let v: Vec<String> = st
        .iter()
        .map(|(k, (l, f))| format!("{}={l}×{f}", String::from_utf8_lossy(k)))
        .collect();
    v.join(" ")
}

/// A trace's crash images: the simulator over a pool, each distinct image built and
/// recovered once, the images of each crash point judged, the report.
struct Images<'t> {
    trace: &'t Trace,
    sim: Sim,
    opts: Options,
    _dir: tempfile::TempDir,
    scratch: PathBuf,
    rng: rand::rngs::StdRng,
    seen: HashMap<u64, Result<State, String>>,
    imgs: Vec<Vec<u8>>,
    /// Distinct images at most (0: 24 per crash point), over `points` crash points.
    max_distinct: usize,
    points: usize,
    rep: Report,
}

impl<'t> Images<'t> {
    /// The images of `events` (of `trace`), from the pool `file` whose image before the
    /// trace is `base`, recovered with `opts`; `drop_sites`: fault injection.
    fn new(
        trace: &'t Trace,
        events: &[Event],
        (file, base): ((u64, u64), Vec<u8>),
        opts: Options,
        max_distinct: usize,
        drop_sites: &[String],
    ) -> Images<'t> {
        let mut sim = Sim::new(file, base);
        let dropped: Vec<u32> = trace
            .sites
            .iter()
            .filter(|(_, name)| drop_sites.iter().any(|d| name.contains(d.as_str())))
            .map(|(&id, _)| id)
            .collect();
        assert!(
            drop_sites.is_empty() || !dropped.is_empty(),
            "no traced site matches {drop_sites:?}"
        );
        sim.drop_sites(dropped);
        let dir = tempfile::Builder::new()
            .prefix("cairn-pf-kv-img-")
            .tempdir_in("/dev/shm")
            .expect("tempdir");
        Images {
            trace,
            sim,
            opts,
            scratch: dir.path().join("image"),
            _dir: dir,
            rng: rand::rngs::StdRng::seed_from_u64(1),
            seen: HashMap::new(),
            imgs: Vec::new(),
            max_distinct,
            points: events.iter().filter(|e| is_crash_point(e)).count(),
            rep: Report::default(),
        }
    }

    /// A crash point: its images, each judged by `verdict` (`None`: allowed, else
    /// what is wrong).
    fn at_point(&mut self, verdict: impl Fn(&Result<State, String>) -> Option<String>) {
        let per = if self.max_distinct == 0 {
            24
        } else {
            let left = self.max_distinct.saturating_sub(self.seen.len());
            (left / (self.points - self.rep.crash_points).max(1)).clamp(2, 24)
        };
        self.rep.crash_points += 1;
        for c in self.sim.choices(per as u64, per, &mut self.rng) {
            self.rep.images += 1;
            let h = self.sim.image_hash(&c);
            if !self.seen.contains_key(&h) {
                self.sim.build(&c, &mut self.imgs);
                let r = recover(&self.scratch, &self.imgs[0], &self.opts);
                self.seen.insert(h, r);
            }
            let Some(wrong) = verdict(&self.seen[&h]) else {
                continue;
            };
            self.rep.violation_count += 1;
            if self.rep.violations.len() < 20 {
                let mut lost: Vec<String> = self
                    .sim
                    .lost_sites(&c)
                    .into_iter()
                    .map(|(s, n)| format!("{n} words at {}", self.trace.site_name(s)))
                    .collect();
                lost.sort();
                self.rep
                    .violations
                    .push(format!("{wrong}\n  lost: {}", lost.join(", ")));
            }
        }
    }

    fn step(&mut self, e: &Event) {
        self.sim.step(e);
    }

    fn report(mut self) -> Report {
        self.rep.distinct = self.seen.len();
        self.rep.dropped_hits = self.sim.dropped_hits;
        self.rep
    }
}

/// What a key's values in an image say against the state expected (`None`: allowed):
/// after the acknowledged calls, or with the call in flight (whole, or for a batch a
/// prefix of it).
fn judge(
    got: &Result<State, String>,
    ops: &[Op],
    states: &[State],
    acked: usize,
    in_flight: Option<usize>,
    mine: impl Fn(&State) -> State,
) -> Option<String> {
    let st = match got {
        Ok(st) => mine(st),
        Err(e) => return Some(e.clone()),
    };
    let ok = st == states[acked]
        || (in_flight.is_some()
            && (st == states[acked + 1] || partial(&ops[acked], &states[acked]).contains(&st)));
    (!ok).then(|| {
        format!(
            "after {acked} acknowledged calls (in flight: {}): recovered {}\n  expected {}",
            in_flight.map_or("none".into(), |k| format!("#{k} {:?}", ops[k])),
            show(&st),
            show(&states[acked])
        )
    })
}

/// Check the crash images of policy `w`'s workload; `drop_sites`: fault injection.
fn check(w: usize, max_distinct: usize, drop_sites: &[String]) -> Report {
    let r = recorded();
    let ops = gen_ops(seed(), n_ops());
    let states = states(&ops);
    let events = &r.trace.events;
    let start = events
        .iter()
        .position(
            |e| matches!(e, Event::Mark { label: MARK_WORKLOAD, value, .. } if *value == w as u64),
        )
        .expect("the workload's start");
    let end = events[start + 1..]
        .iter()
        .position(|e| {
            matches!(
                e,
                Event::Mark {
                    label: MARK_WORKLOAD,
                    ..
                }
            )
        })
        .map_or(events.len(), |p| start + 1 + p);
    let mut images = Images::new(
        &r.trace,
        &events[start..end],
        r.pools[w].clone(),
        options(POLICIES[w]),
        max_distinct,
        drop_sites,
    );
    let (mut acked, mut in_flight) = (0usize, None::<usize>);
    for e in &events[start..end] {
        if follow_marks(e, &mut acked, &mut in_flight) {
            images.at_point(|got| {
                judge(got, &ops, &states, acked, in_flight, State::clone)
                    .map(|v| format!("{:?}: {v}", POLICIES[w]))
            });
        }
        images.step(e);
    }
    images.report()
}

#[test]
fn every_crash_image_of_the_store_recovers() {
    let max = env_or("CAIRN_KV_PF_IMAGES", 4000) as usize;
    for (w, policy) in POLICIES.iter().enumerate() {
        let t = std::time::Instant::now();
        let rep = check(w, max, &[]);
        passes(&format!("{policy:?}"), &rep, 500, t);
    }
}

/// Print what `rep` checked (since `t`), and fail on a violation or on fewer than
/// `min_distinct` distinct images.
fn passes(what: &str, rep: &Report, min_distinct: usize, t: std::time::Instant) {
    eprintln!(
        "kv power failure, {what}: {} crash points, {} images checked, {} distinct, {} violations, {:.1} s",
        rep.crash_points,
        rep.images,
        rep.distinct,
        rep.violation_count,
        t.elapsed().as_secs_f64()
    );
    assert!(rep.distinct > min_distinct, "too few images: {rep:?}");
    assert!(
        rep.violations.is_empty(),
        "{} violations; the first:\n{}",
        rep.violation_count,
        rep.violations.join("\n")
    );
}

/// The simulator sees a missing persistence point of the store: without the fence that
/// makes an appended record durable before the call returns, an acknowledged put can be
/// lost; without the fence between the in-place journal entry and the overwrite, an
/// overwrite can be torn with nothing to redo it from; without a batch's fence, its
/// acknowledged puts can be lost.
#[test]
fn removing_a_store_fence_is_caught() {
    let faults = [
        (
            0,
            fence_after("crates/kv/src/log.rs", "self.put_bytes(loc, &rec)?;"),
        ),
        (
            1,
            fence_after(
                "crates/kv/src/log.rs",
                "let entry = encode_journal(loc, seq, &rec);",
            ),
        ),
        (
            0,
            fence_after(
                "crates/kv/src/batch.rs",
                "core.put_bytes(self.start, &self.records)",
            ),
        ),
    ];
    for (w, site) in faults {
        let rep = check(w, 1500, std::slice::from_ref(&site));
        eprintln!(
            "without the fence at {site}: {} images, {} violations{}",
            rep.distinct,
            rep.violation_count,
            rep.violations
                .first()
                .map_or(String::new(), |v| format!("; the first:\n{v}"))
        );
        assert!(rep.dropped_hits > 0, "the fence at {site} was never traced");
        assert!(
            !rep.violations.is_empty(),
            "removing the fence at {site} went unnoticed"
        );
    }
}

// ---- Two processes on one shared pool ----

const SHARED_ENV: &str = "CAIRN_KV_PF_SHARED";
const SHARED_WORKER_ENV: &str = "CAIRN_KV_PF_SHARED_WORKER";
/// Processes of the shared workload, and the marks' value: `w << 32 | call`.
const WORKERS: u64 = 2;

/// A pool of eight segments (each process's head, their compaction heads, the reserve
/// and room for data), no background threads (a process's trace is its calls).
fn shared_options() -> Options {
    Options {
        size: 16 << 20,
        expected_keys: Some(128),
        heads: Some(1),
        background_compaction: false,
        huge_pages: false,
        ..Options::default()
    }
}

/// Process `w`'s calls: its own keys (`w<w>-key-…`).
fn worker_ops(w: u64) -> Vec<Op> {
    let prefix = |k: &Vec<u8>| [format!("w{w}-").into_bytes(), k.clone()].concat();
    gen_ops(seed() + 1 + w, n_ops() / 2)
        .into_iter()
        .map(|op| match op {
            Op::Put(k, len, fill) => Op::Put(prefix(&k), len, fill),
            Op::Del(k) => Op::Del(prefix(&k)),
            Op::Batch(puts) => Op::Batch(
                puts.into_iter()
                    .map(|(k, len, fill)| (prefix(&k), len, fill))
                    .collect(),
            ),
            Op::Compact => Op::Compact,
        })
        .collect()
}

/// A worker process of the shared workload: its calls on the pool opened shared,
/// traced (the trace file its parent made).
#[test]
fn shared_worker_child() {
    let (Some(dir), Some(w)) = (
        std::env::var_os(SHARED_ENV),
        std::env::var(SHARED_WORKER_ENV).ok(),
    ) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let w: u64 = w.parse().expect("worker number");
    cairn_media::trace::start(&dir.join("trace")).expect("start tracing");
    let store = Store::open_shared(&dir.join("pool"), &shared_options()).expect("open shared");
    // Lock step: each process's call `i` begins, then waits until the other's has
    // begun too, so that calls of the two are in flight at once (a loaded machine
    // would otherwise run one process after the other).
    let begun = cairn_media::words::Words::file(&dir.join("begun"), WORKERS as usize)
        .expect("the lock-step words");
    let other = &begun.get()[(1 - w) as usize];
    let ops = worker_ops(w);
    for (i, op) in ops.iter().enumerate() {
        let mark = w << 32 | i as u64;
        cairn_media::trace::mark(MARK_BEGIN, mark);
        begun.get()[w as usize].store(i as u64 + 1, std::sync::atomic::Ordering::SeqCst);
        let since = std::time::Instant::now();
        while other.load(std::sync::atomic::Ordering::SeqCst) < i as u64 + 1 {
            assert!(since.elapsed().as_secs() < 60, "the other process stopped");
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        apply(&store, op);
        cairn_media::trace::mark(MARK_END, mark);
    }
}

/// The shared workload's trace and the pool's image before it.
fn recorded_shared() -> &'static (Trace, (u64, u64), Vec<u8>) {
    static R: OnceLock<(Trace, (u64, u64), Vec<u8>)> = OnceLock::new();
    R.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("cairn-pf-kv-shared-")
            .tempdir_in("/dev/shm")
            .expect("tempdir");
        let pool = dir.path().join("pool");
        drop(Store::open(&pool, &shared_options()).expect("create the pool"));
        let base = std::fs::read(&pool).expect("base image");
        cairn_media::trace::create(&dir.path().join("trace"), 1 << 30).expect("trace file");
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                std::process::Command::new(std::env::current_exe().expect("test binary"))
                    .args(["--exact", "shared_worker_child", "--nocapture"])
                    .args(["--test-threads=1"])
                    .env(SHARED_ENV, dir.path())
                    .env(SHARED_WORKER_ENV, w.to_string())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("a worker")
            })
            .collect();
        for c in workers {
            let out = c.wait_with_output().expect("a worker");
            assert!(
                out.status.success(),
                "a worker failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let trace = Trace::read(&dir.path().join("trace")).expect("read the trace");
        let m = std::fs::metadata(&pool).expect("pool");
        (trace, (m.dev(), m.ino()), base)
    })
}

/// Check the shared workload's crash images (at most `max_distinct`); `drop_sites`:
/// fault injection.
fn check_shared(max_distinct: usize, drop_sites: &[String]) -> Report {
    let (trace, file, base) = recorded_shared();
    let ops: Vec<Vec<Op>> = (0..WORKERS).map(worker_ops).collect();
    let states: Vec<Vec<State>> = ops.iter().map(|o| states(o)).collect();
    let mut images = Images::new(
        trace,
        &trace.events,
        (*file, base.clone()),
        shared_options(),
        max_distinct,
        drop_sites,
    );
    images.rng = rand::rngs::StdRng::seed_from_u64(2);
    // Per process: calls acknowledged, and the one in flight.
    let mut acked = vec![0usize; WORKERS as usize];
    let mut in_flight: Vec<Option<usize>> = vec![None; WORKERS as usize];
    let mut overlapped = false;
    for e in &trace.events {
        if let Event::Mark { label, value, .. } = e {
            let (w, i) = ((value >> 32) as usize, (value & 0xffff_ffff) as usize);
            match *label {
                MARK_BEGIN => {
                    overlapped |= in_flight.iter().any(Option::is_some);
                    in_flight[w] = Some(i);
                }
                MARK_END => {
                    acked[w] = i + 1;
                    in_flight[w] = None;
                }
                _ => {}
            }
        }
        if is_crash_point(e) {
            images.at_point(|got| {
                (0..WORKERS as usize).find_map(|w| {
                    let prefix = format!("w{w}-").into_bytes();
                    let mine = |st: &State| -> State {
                        st.iter()
                            .filter(|(k, _)| k.starts_with(&prefix))
                            .map(|(k, v)| (k.clone(), *v))
                            .collect()
                    };
                    judge(got, &ops[w], &states[w], acked[w], in_flight[w], mine)
                        .map(|v| format!("process {w}: {v}"))
                })
            });
        }
        images.step(e);
    }
    let mut rep = images.report();
    rep.overlapped = overlapped;
    rep
}

/// Two processes writing their own keys into one shared pool at once (compacting it
/// too, each other's records included): every crash image recovers to each process's
/// acknowledged calls (or with its call in flight).
#[test]
fn every_crash_image_of_a_shared_store_recovers() {
    let max = env_or("CAIRN_KV_PF_IMAGES", 4000) as usize / 4;
    let t = std::time::Instant::now();
    let rep = check_shared(max, &[]);
    assert!(
        rep.overlapped,
        "the two processes never had calls in flight at once"
    );
    let (trace, _, _) = recorded_shared();
    for w in 0..WORKERS {
        let last = (w << 32) | (worker_ops(w).len() as u64 - 1);
        assert!(
            trace
                .events
                .iter()
                .any(|e| matches!(e, Event::Mark { label: MARK_END, value, .. } if *value == last)),
            "process {w} did not finish"
        );
    }
    passes("two processes", &rep, 300, t);
}

/// The shared workload's simulation catches a missing fence too: without the one after
/// an appended record, an acknowledged put of one of the processes can be lost.
#[test]
fn removing_a_store_fence_is_caught_with_two_processes() {
    let site = fence_after("crates/kv/src/log.rs", "self.put_bytes(loc, &rec)?;");
    let rep = check_shared(400, std::slice::from_ref(&site));
    assert!(rep.dropped_hits > 0, "the fence at {site} was never traced");
    assert!(
        !rep.violations.is_empty(),
        "removing the fence at {site} went unnoticed"
    );
}
