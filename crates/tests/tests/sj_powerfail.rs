//! Power failure and process kills in SpaceJMP segments (crate `cairn-sj`): a workload of
//! random commits, aborts and writers killed before, during and after their commits, in
//! both commit modes, traced with the power-failure simulator (`cairn_tests::powerfail`).
//! About one step in eight commits more than a quarter of the log (staged, then copied
//! into the file: two more points to die at); an image's committed state is its
//! segment file with a pending staged commit laid over it (`committed_tree`). With the
//! commit point moved before the staging (a planted bug), the check reports violations.
//!
//! Invariants:
//! * every crash image, recovered by the daemon's own code and checked by `fsck`, holds
//!   the segment's file as after exactly the acknowledged commits (or the one in flight
//!   too): a commit is all or nothing, and nothing aborted or uncommitted reaches it;
//! * every writer, when it starts, finds the resident copy equal to the last committed
//!   state, whoever died before it and wherever (the publish repaired from its journal).
//!
//! Each process is this test binary again in a role (`sj_pf_child`).
//!
//! `CAIRN_SJ_PF_OPS`: steps of the workload (default 60); `CAIRN_SJ_PF_IMAGES`: distinct
//! images to check at most (default 2000; 0: no limit); `CAIRN_SJ_PF_SEED` (default 1).

use cairn_format::sj::StageHeader;
use cairn_sj::{flags, prot, CommitMode, SegPtr, SpaceJmp, Target};
use cairn_tests::harness::{self, TestStore};
use cairn_tests::ops::CairnFs;
use cairn_tests::powerfail::{
    check_states, fence_after, small_store, trace_run, CheckOptions, CheckReport, Expected, Traced,
    MARK_BEGIN, MARK_END,
};
use cairn_tests::snapshot::{snapshot, Snapshot};
use rand::{Rng, SeedableRng};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

const SEG: &str = "pf";
const SEG_FILE: &str = "/.sj/seg/pf";
const SEG_LEN: u64 = 256 << 10;
/// The workload writes past the header and heap-state pages (they change only by the
/// commit sequence).
const DATA_OFF: u64 = 2 * cairn_format::sj::PAGE;
const SEQ_OFF: usize = cairn_format::sj::COMMIT_SEQ_OFF as usize;

fn env_or(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// How a step ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Commit,
    Abort,
    /// The writer is killed (SIGKILL) with its stores uncommitted.
    Die,
    /// The writer is killed at this planted point of its commit (`CAIRN_SJ_CRASH`; in
    /// checked builds only).
    Crash(&'static str),
}

impl End {
    /// Whether the step's stores are committed.
    fn lands(self) -> bool {
        matches!(
            self,
            End::Commit | End::Crash("after-log" | "applying" | "publishing")
        )
    }

    fn kills(self) -> bool {
        matches!(self, End::Die | End::Crash(_))
    }
}

#[derive(Debug, Clone)]
struct Step {
    /// Offset, length, fill byte.
    writes: Vec<(u64, u64, u8)>,
    end: End,
}

/// The steps, and the writers that run them: a range of steps each, in a commit mode
/// (a writer killed at a planted point runs that one step: the point would fire at its
/// first commit).
struct Workload {
    steps: Vec<Step>,
    writers: Vec<(std::ops::Range<usize>, CommitMode)>,
}

fn workload(seed: u64, n: usize) -> Workload {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // A large step's commit (more than a quarter of the small store's 512 KiB log) is
    // staged: it has two more points to die at.
    let crashes = ["before-log", "after-log", "publishing"];
    let staged_crashes = ["staged", "after-log", "applying", "publishing"];
    let steps: Vec<Step> = (0..n)
        .map(|i| {
            let large = rng.gen_range(0..100) < 12;
            let writes = if large {
                let len = rng.gen_range(140u64 << 10..=200 << 10);
                vec![(
                    rng.gen_range(DATA_OFF..SEG_LEN - len),
                    len,
                    (i % 251) as u8 + 1,
                )]
            } else {
                (0..rng.gen_range(1..=4))
                    .map(|_| {
                        let len = rng.gen_range(1..=1500u64);
                        let off = rng.gen_range(DATA_OFF..SEG_LEN - len);
                        (off, len, (i % 251) as u8 + 1)
                    })
                    .collect()
            };
            let points: &[&'static str] = if large { &staged_crashes } else { &crashes };
            let end = match rng.gen_range(0..100) {
                0..=59 => End::Commit,
                60..=74 => End::Abort,
                75..=82 => End::Die,
                // Planted points exist in checked builds only.
                _ if !cfg!(debug_assertions) => End::Die,
                _ => End::Crash(points[rng.gen_range(0..points.len())]),
            };
            Step { writes, end }
        })
        .collect();
    let mut writers = Vec::new();
    let mut from = 0;
    for (i, s) in steps.iter().enumerate() {
        let crash = matches!(s.end, End::Crash(_));
        if crash && from < i {
            writers.push(from..i);
            from = i;
        }
        if s.end.kills() || i + 1 - from == 8 || i + 1 == n {
            writers.push(from..i + 1);
            from = i + 1;
        }
    }
    let writers = writers
        .into_iter()
        .enumerate()
        .map(|(w, r)| {
            let mode = if w % 2 == 0 {
                CommitMode::Snapshot
            } else {
                CommitMode::Explicit
            };
            (r, mode)
        })
        .collect();
    Workload { steps, writers }
}

/// Step `st` applied to the segment's bytes `s`: a landed step's writes, and the commit
/// sequence one more.
fn apply(s: &mut [u8], st: &Step) {
    if st.end.lands() {
        for &(off, len, fill) in &st.writes {
            s[off as usize..(off + len) as usize].fill(fill);
        }
        let seq = u64::from_le_bytes(s[SEQ_OFF..SEQ_OFF + 8].try_into().unwrap()) + 1;
        s[SEQ_OFF..SEQ_OFF + 8].copy_from_slice(&seq.to_le_bytes());
    }
}

/// The segment's bytes after each number of steps, `0..=n`, from `base` (the bytes after
/// `seg_alloc`).
fn states(base: &[u8], steps: &[Step]) -> Vec<Vec<u8>> {
    let mut s = base.to_vec();
    let mut v = vec![s.clone()];
    for st in steps {
        apply(&mut s, st);
        v.push(s.clone());
    }
    v
}

fn mode_name(m: CommitMode) -> &'static str {
    match m {
        CommitMode::Snapshot => "snapshot",
        CommitMode::Explicit => "explicit",
    }
}

fn seed() -> u64 {
    env_or("CAIRN_SJ_PF_SEED", 1)
}

fn n_steps() -> usize {
    env_or("CAIRN_SJ_PF_OPS", 60) as usize
}

/// A process of the workload: `setup` makes the segment and its address space; `work
/// FROM TO MODE [ACK]` checks the resident copy against the state after steps `..FROM`
/// (whoever died before), acknowledges step `ACK` (killed in flight: it is settled now),
/// then runs steps `FROM..TO`. The base image of the segment is `CAIRN_SJ_PF_BASE` (a
/// file).
#[test]
fn sj_pf_child() {
    let Ok(role) = std::env::var("CAIRN_SJ_PF_ROLE") else {
        return;
    };
    let sj = SpaceJmp::open(None).expect("open the store's segments");
    if role == "setup" {
        let sid = sj
            .seg_alloc(SEG, None, SEG_LEN, prot::RW, flags::LOCKABLE, 0o600)
            .expect("seg_alloc");
        let vid = sj.vas_create(SEG, 0o600).expect("vas_create");
        sj.seg_attach(Target::Vas(vid), sid, prot::RW)
            .expect("seg_attach");
        return;
    }
    let args: Vec<String> = std::env::var("CAIRN_SJ_PF_ARGS")
        .unwrap()
        .split(' ')
        .map(String::from)
        .collect();
    let (from, to): (usize, usize) = (args[0].parse().unwrap(), args[1].parse().unwrap());
    let mode = if args[2] == "explicit" {
        CommitMode::Explicit
    } else {
        CommitMode::Snapshot
    };
    let w = workload(seed(), n_steps());
    let base = std::fs::read(std::env::var("CAIRN_SJ_PF_BASE").unwrap()).unwrap();
    let mut want = base;
    for st in &w.steps[..from] {
        apply(&mut want, st);
    }
    let seg = sj.seg_info(SEG).expect("seg_info").base;
    let vh = sj
        .vas_attach(sj.vas_find(SEG).expect("vas_find"), mode)
        .expect("vas_attach");
    let g = sj.enter(vh).expect("switch in");
    let mut got = vec![0u8; SEG_LEN as usize];
    g.read(SegPtr(seg), &mut got).expect("read the segment");
    if let Some(at) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "writer of steps {from}..{to}: the resident copy differs from the state after \
             step {from} at offset {at} ({} there, {} expected)",
            got[at], want[at]
        );
    }
    if let Some(k) = args.get(3) {
        cairn_media::trace::mark(MARK_END, k.parse().unwrap());
    }
    for (i, step) in w.steps.iter().enumerate().take(to).skip(from) {
        cairn_media::trace::mark(MARK_BEGIN, i as u64);
        for &(off, len, fill) in &step.writes {
            g.write(SegPtr(seg + off), &vec![fill; len as usize])
                .expect("write");
        }
        match step.end {
            End::Commit | End::Crash(_) => {
                g.commit().expect("commit");
            }
            End::Abort => g.abort().expect("abort"),
            End::Die => {
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
        }
        assert!(
            !step.end.kills(),
            "step {i}: {:?} should have killed",
            step.end
        );
        cairn_media::trace::mark(MARK_END, i as u64);
    }
}

fn child(store: &Path, role: &str, args: &str, trace: Option<&Path>, base: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "sj_pf_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("CAIRN_SJ_PF_ROLE", role)
    .env("CAIRN_SJ_PF_ARGS", args)
    .env("CAIRN_SJ_PF_BASE", base)
    .env("CAIRN_STORE", store)
    .env("CAIRN_BIN", harness::cairn_bin())
    .env_remove("CAIRN_SJ_CRASH")
    .env_remove("CAIRN_PM_TRACE")
    .stdin(Stdio::null());
    if let Some(t) = trace {
        c.env("CAIRN_PM_TRACE", t);
    }
    c
}

/// The recorded workload and what its images must hold.
struct Recorded {
    traced: Traced,
    /// The tree of the segment directory after each number of steps.
    states: Vec<Snapshot>,
    steps: Vec<Step>,
}

fn record() -> Recorded {
    let store: TestStore = small_store();
    let tmp = tempfile::tempdir().unwrap();
    let base_file = tmp.path().join("base");
    let out = child(store.path(), "setup", "", None, &base_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "setup: {out:?}");
    let tree = snapshot(&CairnFs { fs: &store.fs() }, "/.sj/seg").expect("snapshot");
    let base = tree[SEG_FILE].content.clone();
    assert_eq!(base.len() as u64, SEG_LEN);
    assert!(base[DATA_OFF as usize..].iter().all(|&b| b == 0));
    std::fs::write(&base_file, &base).unwrap();
    let w = workload(seed(), n_steps());
    let traced = trace_run(store, |store, trace| {
        let mut pending: Option<usize> = None;
        for (r, mode) in &w.writers {
            let last = &w.steps[r.end - 1];
            let mut args = format!("{} {} {}", r.start, r.end, mode_name(*mode));
            if let Some(k) = pending.take() {
                args += &format!(" {k}");
            }
            let mut c = child(store.path(), "work", &args, Some(trace), &base_file);
            if let End::Crash(point) = last.end {
                c.env("CAIRN_SJ_CRASH", point);
            }
            let out = c.output().unwrap();
            if last.end.kills() {
                assert_eq!(
                    out.status.signal(),
                    Some(libc::SIGKILL),
                    "writer {args} should have been killed at its last step: {out:?}"
                );
                pending = Some(r.end - 1);
            } else {
                assert!(out.status.success(), "writer {args}: {out:?}");
            }
        }
        // The last writer's state checked, and a kill at the end settled.
        let n = w.steps.len();
        let args = match pending {
            Some(k) => format!("{n} {n} snapshot {k}"),
            None => format!("{n} {n} snapshot"),
        };
        let out = child(store.path(), "work", &args, Some(trace), &base_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "final check: {out:?}");
    });
    let states = states(&base, &w.steps)
        .into_iter()
        .map(|bytes| {
            let mut t = tree.clone();
            t.get_mut(SEG_FILE).unwrap().content = bytes;
            t
        })
        .collect();
    Recorded {
        traced,
        states,
        steps: w.steps,
    }
}

/// The committed state of a recovered `/.sj` tree: the segment's file with a pending
/// staged commit laid over it (a marker whose stage file does not hold that commit
/// empties the file: a violation), and only the segment directory.
fn committed_tree(t: &mut Snapshot) {
    let stage = t
        .iter()
        .find(|(k, _)| k.starts_with("/.sj/stage/"))
        .map(|(_, n)| n.content.clone());
    t.retain(|k, _| k.starts_with("/.sj/seg"));
    let Some(seg) = t.get_mut(SEG_FILE) else {
        return;
    };
    let c = &mut seg.content;
    let m = cairn_format::sj::REDO_SEQ_OFF as usize;
    if c.len() < m + 8 {
        return;
    }
    let redo = u64::from_le_bytes(c[m..m + 8].try_into().unwrap());
    if redo == 0 {
        return;
    }
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let head = stage.as_ref().filter(|b| b.len() >= 64).and_then(|b| {
        let h = StageHeader::decode(b, u64_at(b, 16), u64_at(b, 24), SEG_LEN).ok()?;
        (h.seq == redo).then_some(h)
    });
    let (Some(h), Some(b)) = (head, stage) else {
        c.clear();
        return;
    };
    let mut at = h.data_off() as usize;
    for (o, l) in h.runs.iter().map(|&(o, l)| (o as usize, l as usize)) {
        if b.len() < at + l {
            c.clear();
            return;
        }
        c[o..o + l].copy_from_slice(&b[at..at + l]);
        at += l;
    }
    c[m..m + 8].fill(0);
}

fn check(r: &Recorded, opts: &CheckOptions) -> CheckReport {
    let call = |k: usize| format!("step #{k} {:?}", r.steps[k]);
    let expected = Expected {
        normalize: Some(&committed_tree),
        prefix: "/.sj",
        states: r.states.clone(),
        call: &call,
    };
    let t = &r.traced;
    check_states(&t.store, &t.files, &t.trace, &expected, opts)
}

/// Every crash image recovers to the committed state; and the simulator sees a commit
/// that skips its fence (the one that makes the commit's transaction durable before
/// `commit` returns): a power failure can then lose an acknowledged commit.
#[test]
fn every_crash_image_of_segment_commits_recovers() {
    let r = record();
    let kills = r.steps.iter().filter(|s| s.end.kills()).count();
    let large: Vec<End> = r
        .steps
        .iter()
        .filter(|s| s.writes.iter().any(|w| w.1 > 64 << 10))
        .map(|s| s.end)
        .collect();
    let rep = check(
        &r,
        &CheckOptions {
            max_distinct: env_or("CAIRN_SJ_PF_IMAGES", 2000) as usize,
            ..Default::default()
        },
    );
    println!(
        "segment commits, seed {}, {} steps ({kills} writers killed; staged commits: {large:?}): {rep}",
        seed(),
        r.steps.len()
    );
    for v in rep.violations.iter().take(3) {
        println!("  violation before event {}: {}", v.event, v.what);
    }
    assert!(kills > 0, "the workload kills no writer");
    assert!(
        large.iter().any(|e| e.lands()),
        "the workload stages no commit"
    );
    assert!(rep.distinct > 100, "too few images: {rep}");
    assert!(rep.violations.is_empty());

    let site = fence_after(
        "crates/libfs/src/fs/logwriter.rs",
        "st.log.ring().put_txn(lsn, buf)",
    );
    let rep = check(
        &r,
        &CheckOptions {
            max_distinct: 600,
            drop_sites: vec![site.clone()],
            ..Default::default()
        },
    );
    println!(
        "without the fence at {site}: {rep}{}",
        rep.violations
            .first()
            .map_or(String::new(), |v| format!("; the first:\n{}", v.what))
    );
    assert!(rep.dropped_hits > 0, "the fence at {site} was never traced");
    assert!(
        rep.violations
            .iter()
            .any(|v| v.what.contains("not the state after")),
        "removing the fence at {site} went unnoticed"
    );
}
