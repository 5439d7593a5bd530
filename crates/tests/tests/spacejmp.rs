//! SpaceJMP on Cairn (crate `cairn-sj`), across processes: the dissertation's
//! Alice/Bob example (Figures 42-43) across processes and a `cairn stop`, commits that are
//! all or nothing when writers (or the daemon) are killed before, during and after them,
//! locks that a killed holder never leaves held, permissions for another user, and bad
//! input.
//!
//! Each test runs its processes as this test binary again (`child`), in the role named by
//! `CAIRN_SJ_ROLE` (`sj_child` does the work); they print `sj: ...` lines the test reads.

use cairn_sj::{flags, prot, CommitMode, SegId, SegPtr, SpaceJmp, Switched, Target, Vh};
use cairn_tests::harness::{self, StoreSize, TestStore};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// Where Alice puts her data (Figure 42's `BASE`, inside Cairn's segment window).
const BASE: u64 = cairn_format::sj::WINDOW_BASE + (4 << 30);
const SEG_LEN: u64 = 8 << 20;
/// Where the overlapping segments live (all three at once).
const OVERLAP_BASE: u64 = cairn_format::sj::WINDOW_BASE + (8 << 30);
/// The segments of the large-commit test, and the bytes one commit writes into them
/// (half in each: six times a quarter of the test store's 4 MiB log).
const BIG_SEG: u64 = 4 << 20;
const BIG_FILL: u64 = 6 << 20;
/// Where the permission test keeps its values (past the header and the heap's state).
const DATA: u64 = 64 << 10;

fn store() -> TestStore {
    TestStore::with_size(StoreSize {
        nvm: "256M",
        log: "4M",
        clients: 8,
        ..Default::default()
    })
}

/// This test binary in role `role` with `args`, on `store`.
fn child(store: &Path, role: &str, args: &[&str]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "sj_child", "--nocapture", "--test-threads", "1"])
        .env("CAIRN_SJ_ROLE", role)
        .env("CAIRN_SJ_ARGS", args.join("\u{1f}"))
        .env("CAIRN_STORE", store)
        .env("CAIRN_BIN", harness::cairn_bin())
        .env_remove("CAIRN_SJ_CRASH")
        .env_remove("CAIRN_SJ_PLANT")
        .stdin(Stdio::null());
    c
}

/// Run a role to its end; its `sj:` lines. Fails the test unless it succeeds.
fn run(store: &Path, role: &str, args: &[&str]) -> Vec<String> {
    let out = child(store, role, args).output().unwrap();
    check(role, &out);
    lines(&out)
}

fn check(role: &str, out: &Output) {
    assert!(
        out.status.success(),
        "role {role} failed ({:?}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the bytes at `at` read back as `old` after an abort or a repair.
fn read_back(g: &Switched<'_>, at: SegPtr, old: &[u8]) -> &'static str {
    let mut got = vec![0u8; old.len()];
    g.read(at, &mut got).unwrap();
    if got == old {
        "rolled back"
    } else {
        "torn"
    }
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once("sj: ").map(|(_, r)| r.to_string()))
        .collect()
}

/// A node of the list Alice builds: a value and the address of the next node.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Node {
    value: u64,
    next: SegPtr,
}

/// Sum and length of the list rooted at `list` in segment `seg`.
fn walk(g: &Switched<'_>, seg: SegId) -> (u64, u64) {
    let mut p = g.root(seg, "list").unwrap().unwrap_or(SegPtr::NULL);
    let (mut sum, mut n) = (0, 0);
    while !p.is_null() {
        let node: Node = g.get(p).unwrap();
        sum += node.value;
        n += 1;
        p = node.next;
    }
    (sum, n)
}

/// Push `value` onto the front of the list rooted at `list` in segment `seg`.
fn push(g: &Switched<'_>, seg: SegId, value: u64) {
    try_push(g, seg, value).unwrap()
}

fn try_push(g: &Switched<'_>, seg: SegId, value: u64) -> std::io::Result<()> {
    let next = g.root(seg, "list")?.unwrap_or(SegPtr::NULL);
    let p = g.alloc(seg, Node { value, next })?;
    g.set_root(seg, "list", p)
}

/// Helper calls of the "helper" role: store the buffer's value at `DATA` of the helper's
/// address space (committing it, or not), return the value found there, and leave the
/// helper's process id in the buffer.
fn hp_store(h: &cairn_sj::InHelper, buf: &mut [u8]) -> i64 {
    hp_store_with(h, buf, true)
}

fn hp_store_uncommitted(h: &cairn_sj::InHelper, buf: &mut [u8]) -> i64 {
    hp_store_with(h, buf, false)
}

fn hp_store_with(h: &cairn_sj::InHelper, buf: &mut [u8], commit: bool) -> i64 {
    let g = h.enter().unwrap();
    let i = h.sj().seg_info("hp-b").unwrap();
    let slot = h.sj().control().slot(i.id.0, i.gen).unwrap();
    assert!(slot.held_by_me(), "the helper holds hp-b's writer lock");
    let p = SegPtr(OVERLAP_BASE + DATA);
    let old: u64 = g.get(p).unwrap();
    g.set(p, u64::from_le_bytes(buf[..8].try_into().unwrap()))
        .unwrap();
    if commit {
        g.commit().unwrap();
    }
    buf[..8].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
    old as i64
}

/// The helper's process id, in the buffer.
fn hp_pid(_: &cairn_sj::InHelper, buf: &mut [u8]) -> i64 {
    buf[..8].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
    0
}

/// Store, then die before committing (holding the writer lock).
fn hp_die(h: &cairn_sj::InHelper, _: &mut [u8]) -> i64 {
    let g = h.enter().unwrap();
    g.set(SegPtr(OVERLAP_BASE + DATA), 666u64).unwrap();
    // As a crash would: SIGKILL of this very process.
    let _ = std::process::Command::new("kill")
        .args(["-9", &std::process::id().to_string()])
        .status();
    unreachable!("killed")
}

#[test]
fn sj_child() {
    let Ok(role) = std::env::var("CAIRN_SJ_ROLE") else {
        return;
    };
    let args: Vec<String> = std::env::var("CAIRN_SJ_ARGS")
        .unwrap_or_default()
        .split('\u{1f}')
        .map(String::from)
        .collect();
    let sj = SpaceJmp::open(None).expect("open the store's segments");
    match role.as_str() {
        // Figure 42: Alice makes "data" at BASE, fills it in her own address space,
        // then gives it to the new address space "shared".
        "alice" => {
            let n: u64 = args[0].parse().unwrap();
            let sid = sj
                .seg_alloc(
                    "data",
                    Some(BASE),
                    SEG_LEN,
                    prot::RW,
                    flags::LOCKABLE,
                    0o640,
                )
                .unwrap();
            sj.seg_attach(Target::Current, sid, prot::RW).unwrap();
            // The primary address space: plain reads and writes through the API.
            let mut head = SegPtr::NULL;
            for v in 1..=n {
                let p = SegPtr(sj.alloc(sid, 16).unwrap());
                sj.write(
                    p.0,
                    bytemuck::bytes_of(&Node {
                        value: v,
                        next: head,
                    }),
                )
                .unwrap();
                head = p;
            }
            sj.set_root(sid, "list", head.0).unwrap();
            let st = sj.commit().unwrap();
            println!("sj: committed {} pages", st.pages);
            sj.seg_detach(Target::Current, sid).unwrap();
            let vid = sj.vas_create("shared", 0o640).unwrap();
            sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
            println!("sj: alice done");
        }
        // Figure 43: Bob finds "shared", attaches it, switches in, uses the data at BASE,
        // switches back: then BASE no longer reaches it.
        "bob" => {
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Snapshot).unwrap();
            let sid = sj.seg_find("data").unwrap();
            let (sum, n) = {
                let g = sj.enter(vh).unwrap();
                let mut b = [0u8; 8];
                g.read(SegPtr(BASE), &mut b).unwrap();
                assert_eq!(&b, cairn_format::sj::SEG_MAGIC);
                walk(&g, sid)
            };
            println!("sj: sum {sum} n {n}");
            let mut b = [0u8; 8];
            let e = sj.read(BASE, &mut b).unwrap_err();
            assert_eq!(cairn_area::errno_of(&e), libc::EFAULT, "{e}");
            println!("sj: primary cannot reach it");
            sj.vas_detach(vh).unwrap();
        }
        // Append to Alice's list and commit (or not), maybe killed on the way.
        "append" => {
            let (v, commit) = (args[0].parse::<u64>().unwrap(), args[1] == "commit");
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, mode(&args)).unwrap();
            let sid = sj.seg_find("data").unwrap();
            let g = sj.enter(vh).unwrap();
            push(&g, sid, v);
            if commit {
                g.commit().unwrap();
                println!("sj: committed");
            } else {
                // Die with the stores uncommitted (no clean-up runs).
                println!("sj: dying");
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
        }
        // Commits larger than a quarter of the log: two segments of "big" filled with one
        // value in one commit; `check` reads them back (through "big-r", read-only, or
        // "big", writable) and prints the value if it is uniform.
        "big" => {
            let half = BIG_FILL / 2;
            match args[0].as_str() {
                "make" => {
                    let vid = sj.vas_create("big", 0o600).unwrap();
                    let rid = sj.vas_create("big-r", 0o600).unwrap();
                    for (n, f) in [("big-a", flags::LOCKABLE), ("big-b", 0)] {
                        let sid = sj.seg_alloc(n, None, BIG_SEG, prot::RW, f, 0o640).unwrap();
                        sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
                        sj.seg_attach(Target::Vas(rid), sid, prot::READ).unwrap();
                    }
                }
                "fill" => {
                    // A narrow umask does not narrow who may read the staged commit.
                    sj.fs().set_umask(0o077);
                    let v: u64 = args[2].parse().unwrap();
                    let vh = sj
                        .vas_attach(sj.vas_find("big").unwrap(), mode(&args[1..]))
                        .unwrap();
                    let g = sj.enter(vh).unwrap();
                    let words: Vec<u8> = (0..half / 8).flat_map(|_| v.to_le_bytes()).collect();
                    for n in ["big-a", "big-b"] {
                        let base = sj.seg_info(n).unwrap().base;
                        g.write(SegPtr(base + DATA), &words).unwrap();
                        // The header page too (the staged commit's marker lives there).
                        g.set_root(sj.seg_find(n).unwrap(), "fill", SegPtr(v))
                            .unwrap();
                    }
                    let st = g.commit().unwrap();
                    println!("sj: committed {} bytes", st.bytes);
                    drop(g);
                    for n in ["big-a", "big-b"] {
                        let i = sj.seg_info(n).unwrap();
                        let stage = cairn::File::open(
                            sj.fs(),
                            cairn_sj::segment::stage_path(i.id.0, i.gen).as_str(),
                        )
                        .unwrap();
                        let m = stage.metadata().unwrap();
                        assert_eq!(m.len(), 0, "{n}: stage left");
                        assert_eq!(m.mode() & 0o777, 0o640, "{n}: the stage file's mode");
                    }
                }
                "evict" => {
                    for n in ["big-a", "big-b"] {
                        sj.seg_evict(n).unwrap();
                    }
                }
                "check" => {
                    let vas = if args[1] == "read" { "big-r" } else { "big" };
                    let vh = sj
                        .vas_attach(sj.vas_find(vas).unwrap(), CommitMode::Snapshot)
                        .unwrap();
                    let g = sj.enter(vh).unwrap();
                    let mut seen = std::collections::BTreeSet::new();
                    for n in ["big-a", "big-b"] {
                        let base = sj.seg_info(n).unwrap().base;
                        let mut b = vec![0u8; half as usize];
                        g.read(SegPtr(base + DATA), &mut b).unwrap();
                        seen.extend(
                            b.chunks(8)
                                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
                        );
                        let root = g.root(sj.seg_find(n).unwrap(), "fill").unwrap();
                        seen.insert(root.unwrap_or(SegPtr::NULL).0);
                    }
                    println!("sj: values {seen:?}");
                }
                other => panic!("big {other}?"),
            }
        }
        // Hold the reader lock until stdin closes (or be killed).
        "hold-read" | "hold-write" => {
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Snapshot).unwrap();
            if role == "hold-read" {
                let sid = sj.seg_find("data").unwrap();
                sj.seg_detach(Target::Handle(vh), sid).unwrap();
                sj.seg_attach(Target::Handle(vh), sid, prot::READ).unwrap();
            }
            let _g = sj.enter(vh).unwrap();
            println!("sj: holding");
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        // Try to switch in without waiting: prints the errno (0: switched).
        // A segment's host objects through its life: made by the daemon at attach (the
        // undo log for an explicit-mode writer), kept while attached, dropped by an
        // eviction (and built again, with the committed bytes), gone with the segment.
        "objects" => {
            let errno = |r: std::io::Result<u64>| r.err().map_or(0, |e| cairn_area::errno_of(&e));
            let uuid = sj.fs().uuid();
            let sid = sj
                .seg_alloc("objs", None, SEG_LEN, prot::RW, flags::LOCKABLE, 0o600)
                .unwrap();
            let i = sj.seg_info("objs").unwrap();
            let has =
                |kind: &str| cairn_area::host::object_path(&uuid, kind, i.id.0, i.gen).exists();
            let vid = sj.vas_create("objs", 0o600).unwrap();
            sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Explicit).unwrap();
            {
                let g = sj.enter(vh).unwrap();
                g.set(SegPtr(i.base + DATA), 5u64).unwrap();
                g.commit().unwrap();
            }
            assert!(has("sj") && has("sj-undo"), "made at attach");
            assert_eq!(
                errno(sj.seg_evict("objs")),
                libc::EBUSY,
                "evicting an attached segment"
            );
            sj.vas_detach(vh).unwrap();
            assert!(sj.seg_evict("objs").unwrap() > 0);
            assert!(!has("sj"), "evicted");
            let vh = sj.vas_attach(vid, CommitMode::Snapshot).unwrap();
            {
                let g = sj.enter(vh).unwrap();
                assert_eq!(g.get::<u64>(SegPtr(i.base + DATA)).unwrap(), 5);
            }
            assert!(has("sj"), "built again");
            sj.vas_detach(vh).unwrap();
            sj.seg_free("objs").unwrap();
            assert!(!has("sj") && !has("sj-undo"), "removed with the segment");
            println!("sj: objects ok");
        }
        "try" => {
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Snapshot).unwrap();
            let sid = sj.seg_find("data").unwrap();
            match sj.try_enter(vh) {
                Ok(g) => {
                    let (sum, n) = walk(&g, sid);
                    println!("sj: errno 0 sum {sum} n {n}");
                }
                Err(e) => println!("sj: errno {}", cairn_area::errno_of(&e)),
            }
        }
        // Every kind of bad input gets a clear error; nothing crashes.
        "bad-input" => {
            let errno = |r: std::io::Result<()>| match r {
                Ok(()) => 0,
                Err(e) => {
                    println!("sj: message {e}");
                    cairn_area::errno_of(&e)
                }
            };
            let w = cairn_format::sj::WINDOW_BASE;
            let cases: Vec<(&str, i32, std::io::Result<()>)> = vec![
                (
                    "base outside the window",
                    libc::EINVAL,
                    sj.seg_alloc("b1", Some(0x1000), SEG_LEN, prot::RW, 0, 0o640)
                        .map(|_| ()),
                ),
                (
                    "base misaligned",
                    libc::EINVAL,
                    sj.seg_alloc("b2", Some(w + 4096), SEG_LEN, prot::RW, 0, 0o640)
                        .map(|_| ()),
                ),
                (
                    "overlapping another segment",
                    libc::EEXIST,
                    sj.seg_alloc("b3", Some(BASE), SEG_LEN, prot::RW, 0, 0o640)
                        .map(|_| ()),
                ),
                (
                    "length 0",
                    libc::EINVAL,
                    sj.seg_alloc("b4", None, 0, prot::RW, 0, 0o640).map(|_| ()),
                ),
                (
                    "past the window",
                    libc::EINVAL,
                    sj.seg_alloc("b5", None, 1 << 50, prot::RW, 0, 0o640)
                        .map(|_| ()),
                ),
                (
                    "a name that exists",
                    libc::EEXIST,
                    sj.seg_alloc("data", None, SEG_LEN, prot::RW, 0, 0o640)
                        .map(|_| ()),
                ),
            ];
            for (what, want, r) in cases {
                let got = errno(r);
                println!("sj: {what}: {got}");
                assert_eq!(got, want, "{what}");
            }
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Snapshot).unwrap();
            let again = sj.vas_attach(vid, CommitMode::Snapshot).map(|_| ());
            assert_eq!(errno(again), libc::EBUSY, "attaching twice");
            sj.vas_detach(vh).unwrap();
            let e = sj.enter(vh).map(|_| ());
            assert_eq!(errno(e), libc::EBADF, "switching to a detached handle");
            assert_eq!(errno(sj.vas_detach(vh)), libc::EBADF, "detaching twice");
            // A read-only grant refuses writes.
            let sid = sj.seg_find("data").unwrap();
            let ro = sj.vas_create("ro", 0o640).unwrap();
            sj.seg_attach(Target::Vas(ro), sid, prot::READ).unwrap();
            let rh = sj.vas_attach(ro, CommitMode::Snapshot).unwrap();
            {
                let g = sj.enter(rh).unwrap();
                assert_eq!(errno(g.write(SegPtr(BASE + 65536), &[1])), libc::EACCES);
                assert_eq!(errno(g.alloc(sid, 8u64).map(|_| ())), libc::EACCES);
                assert_eq!(errno(g.write(SegPtr(0x1000), &[1])), libc::EFAULT);
            }
            sj.vas_detach(rh).unwrap();
            // Removing a segment attached elsewhere: EBUSY (the test holds it).
            if args.first().is_some_and(|a| a == "busy") {
                assert_eq!(errno(sj.seg_free("data")), libc::EBUSY);
            }
            println!("sj: bad input done");
        }
        // Append to the list in a full store: the commit fails as a whole; room is made
        // (the filler file goes) and the same stores commit.
        "big-commit" => {
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Snapshot).unwrap();
            let sid = sj.seg_find("data").unwrap();
            let g = sj.enter(vh).unwrap();
            push(&g, sid, 1000);
            // Enough pages that the store has no room for them.
            for i in 0..128u64 {
                g.write(SegPtr(BASE + (4 << 20) + i * 4096), &i.to_le_bytes())
                    .unwrap();
            }
            let seq = sj.seg_info("data").unwrap().commit_seq;
            let e = g.commit().unwrap_err();
            println!("sj: errno {}", cairn_area::errno_of(&e));
            // Nothing of it reached the segment's file.
            assert_eq!(sj.seg_info("data").unwrap().commit_seq, seq);
            sj.fs().remove_file("/filler").unwrap();
            g.commit().unwrap();
            println!("sj: committed after room was made");
        }
        // Segments of three modes, each holding a value at DATA, in address spaces of two.
        "perm-setup" => {
            // The modes as given (they are `open(2)`'s: the umask applies).
            sj.fs().set_umask(0);
            for (name, mode, v) in [
                ("private", 0o600, 11u64),
                ("groupro", 0o640, 22),
                ("grouprw", 0o660, 33),
            ] {
                let sid = sj
                    .seg_alloc(name, None, SEG_LEN, prot::RW, flags::LOCKABLE, mode)
                    .unwrap();
                sj.seg_attach(Target::Current, sid, prot::RW).unwrap();
                let base = sj.seg_info(name).unwrap().base;
                sj.write(base + DATA, &v.to_le_bytes()).unwrap();
                sj.commit().unwrap();
                sj.seg_detach(Target::Current, sid).unwrap();
            }
            let ours = sj.vas_create("ours", 0o640).unwrap();
            let seg = |n: &str| sj.seg_find(n).unwrap();
            sj.seg_attach(Target::Vas(ours), seg("grouprw"), prot::RW)
                .unwrap();
            sj.seg_attach(Target::Vas(ours), seg("groupro"), prot::READ)
                .unwrap();
            let mine = sj.vas_create("mine", 0o600).unwrap();
            sj.seg_attach(Target::Vas(mine), seg("private"), prot::RW)
                .unwrap();
        }
        // The owner commits `args[0]` to `groupro` in mode `args[1]`, to die at the
        // crash point its environment names.
        "perm-crash" => {
            let sid = sj.seg_find("groupro").unwrap();
            let vid = sj.vas_create(&format!("crash-{}", args[0]), 0o600).unwrap();
            sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
            let vh = sj.vas_attach(vid, mode(&args)).unwrap();
            let g = sj.enter(vh).unwrap();
            let v: u64 = args[0].parse().unwrap();
            g.set(SegPtr(sj.seg_info("groupro").unwrap().base + DATA), v)
                .unwrap();
            g.commit().unwrap();
            println!("sj: survived");
        }
        // A member of the store's group, not the owner: what the modes allow and no more.
        "perm-member" => {
            let errno = |r: std::io::Result<()>| r.err().map_or(0, |e| cairn_area::errno_of(&e));
            let base = |n: &str| sj.seg_info(n).unwrap().base;
            // The resident copy of a segment it may only read: not by name, and the
            // daemon's descriptor is read-only (no write, no writable mapping), nor may
            // it have the copy dropped. Its root-owned writer died publishing: reading
            // repairs the copy through the daemon (below, 55).
            let info = sj.seg_info("groupro").unwrap();
            let copy = cairn_sj::segment::object_path(&sj.fs().uuid(), info.id.0, info.gen);
            for write in [false, true] {
                let r = std::fs::OpenOptions::new()
                    .read(true)
                    .write(write)
                    .open(&copy);
                assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EACCES), "{write}");
            }
            let file = cairn::File::open(sj.fs(), info.path.as_str()).unwrap();
            let (fd, writable) = file.segment_object(false, true).unwrap();
            assert!(!writable, "a read-only grant of the copy");
            use std::os::unix::fs::FileExt;
            let r = fd.write_at(&1u64.to_le_bytes(), DATA);
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EBADF));
            let r = cairn_media::Mapping::new(&fd, 0, 4096, true, false).map(|_| ());
            assert_eq!(errno(r), libc::EACCES, "a writable mapping of the copy");
            let r = file.segment_object(true, true).map(|_| ());
            assert!(
                matches!(errno(r), libc::ENOENT | 0),
                "its undo log, read-only if any"
            );
            let r = sj.fs().sj_drop(info.id.0, info.gen, true);
            assert_eq!(
                errno(r),
                libc::EACCES,
                "dropping the copy of another's segment"
            );
            let r = file.segment_refresh(&[(4096, 4096), (SEG_LEN - 4096, 8192)]);
            assert_eq!(errno(r), libc::EINVAL, "a refresh past the segment's end");
            let r = sj.vas_find("mine").map(|_| ());
            assert_eq!(errno(r), libc::EACCES, "an address space of mode 0600");
            let ours = sj.vas_find("ours").unwrap();
            let vh = sj.vas_attach(ours, CommitMode::Snapshot).unwrap();
            {
                let g = sj.enter(vh).unwrap();
                let at = |n: &str| SegPtr(base(n) + DATA);
                assert_eq!(g.get::<u64>(at("groupro")).unwrap(), 55);
                assert_eq!(g.get::<u64>(at("grouprw")).unwrap(), 33);
                let r = g.write(at("groupro"), &1u64.to_le_bytes());
                assert_eq!(errno(r), libc::EACCES, "writing a read-only grant");
                g.set(at("grouprw"), 44u64).unwrap();
                g.commit().unwrap();
            }
            sj.vas_detach(vh).unwrap();
            // Its own address space may not grant more than the segments' modes give it.
            let own = sj.vas_create("member", 0o600).unwrap();
            let grant = |n: &str, p: u32| {
                errno(
                    sj.seg_find(n)
                        .and_then(|id| sj.seg_attach(Target::Vas(own), id, p)),
                )
            };
            assert_eq!(grant("private", prot::READ), libc::EACCES, "private, read");
            assert_eq!(
                grant("groupro", prot::RW),
                libc::EACCES,
                "groupro, read-write"
            );
            assert_eq!(grant("groupro", prot::READ), 0, "groupro, read");
            // Its own segment, yes; removing root's, no (the directory is sticky).
            sj.seg_alloc("member", None, SEG_LEN, prot::RW, 0, 0o600)
                .unwrap();
            let r = sj.seg_free("grouprw");
            assert!(
                matches!(errno(r), libc::EPERM | libc::EACCES),
                "removing another user's segment"
            );
            println!("sj: member done");
        }
        // Plant a stage file of mode 0666 for segment `args[0]` (a member may create
        // names in the shared stage directory).
        "perm-plant" => {
            let i = sj.seg_info(&args[0]).unwrap();
            let _ = sj.fs().create_dir_mode("/.sj/stage", 0o3777);
            let path = cairn_sj::segment::stage_path(i.id.0, i.gen);
            let f = cairn::OpenOptions::new()
                .write(true)
                .create(true)
                .mode(0o666)
                .open(sj.fs(), path.as_str())
                .unwrap();
            sj.fs()
                .set_permissions(path.as_str(), cairn::Permissions::from_mode(0o666))
                .unwrap();
            f.write_at(&[0xee; 4096], 0).unwrap();
        }
        // A commit of segment `args[0]` too large for one transaction (staged): the
        // values at DATA, then what the stage file is now.
        "perm-big" => {
            let sid = sj.seg_find(&args[0]).unwrap();
            sj.seg_attach(Target::Current, sid, prot::RW).unwrap();
            let i = sj.seg_info(&args[0]).unwrap();
            let v: u64 = args[1].parse().unwrap();
            let words: Vec<u8> = (0..(512 << 10) / 8).flat_map(|_| v.to_le_bytes()).collect();
            sj.write(i.base + DATA, &words).unwrap();
            let path = cairn_sj::segment::stage_path(i.id.0, i.gen);
            match sj.commit() {
                Ok(_) => {
                    let m = sj.fs().metadata(path.as_str()).unwrap();
                    println!("sj: big ok uid {} mode {:o}", m.uid(), m.mode() & 0o777);
                }
                Err(e) => println!("sj: big errno {}", cairn_area::errno_of(&e)),
            }
        }
        // The owner of the shared stage directory (uid 1001 here) replaces the stage file
        // a writer of segment `args[0]` left pending with its own, of the same head,
        // whose run holds 2989 at DATA; prints the directory's owner.
        "perm-swap" => {
            let i = sj.seg_info(&args[0]).unwrap();
            let seg = cairn::OpenOptions::new()
                .read(true)
                .open(sj.fs(), i.path.as_str())
                .unwrap();
            let mut m = [0u8; 8];
            seg.read_at(&mut m, cairn_format::sj::REDO_SEQ_OFF).unwrap();
            let redo = u64::from_le_bytes(m);
            assert_ne!(redo, 0, "a staged commit is pending");
            let path = cairn_sj::segment::stage_path(i.id.0, i.gen);
            let mode = sj.fs().metadata(path.as_str()).unwrap().mode() & 0o777;
            sj.fs().remove_file(path.as_str()).unwrap();
            let f = cairn::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(sj.fs(), path.as_str())
                .unwrap();
            let head = cairn_format::sj::StageHeader {
                seq: redo,
                ino: i.id.0,
                gen: i.gen,
                runs: vec![(DATA, 8)],
            };
            f.write_at(&2989u64.to_le_bytes(), head.data_off()).unwrap();
            f.write_at(&head.encode(), 0).unwrap();
            let d = sj.fs().metadata("/.sj/stage").unwrap();
            println!("sj: swapped in a directory of uid {}", d.uid());
        }
        // What a reader of segment `args[0]` sees at DATA, or the error it gets.
        "perm-read" => {
            let r = sj.seg_find(&args[0]).and_then(|sid| {
                sj.seg_attach(Target::Current, sid, prot::READ)?;
                let mut b = [0u8; 8];
                sj.read(sj.seg_info(&args[0])?.base + DATA, &mut b)?;
                Ok(u64::from_le_bytes(b))
            });
            match r {
                Ok(v) => println!("sj: read {v}"),
                Err(e) => println!("sj: read errno {} {e}", cairn_area::errno_of(&e)),
            }
        }
        "perm-check" => {
            let sid = sj.seg_find("grouprw").unwrap();
            sj.seg_attach(Target::Current, sid, prot::READ).unwrap();
            let mut b = [0u8; 8];
            sj.read(sj.seg_info("grouprw").unwrap().base + DATA, &mut b)
                .unwrap();
            println!("sj: grouprw {}", u64::from_le_bytes(b));
        }
        // Append the next values to Alice's list (one commit each) for `args[0]` seconds
        // (in `args[1]` mode), whatever happens to the daemon meanwhile: a failed commit
        // is aborted and tried again after reading where the list is. Prints each
        // acknowledged value.
        "append-for" => {
            let secs: u64 = args[0].parse().unwrap();
            let vid = sj.vas_find("shared").unwrap();
            let vh = sj.vas_attach(vid, mode(&args)).unwrap();
            let sid = sj.seg_find("data").unwrap();
            let g = sj.enter(vh).unwrap();
            let t = std::time::Instant::now();
            let mut failures = 0;
            while t.elapsed().as_secs() < secs {
                let head = g.root(sid, "list").unwrap().unwrap_or(SegPtr::NULL);
                let next = if head.is_null() {
                    1
                } else {
                    g.get::<Node>(head).unwrap().value + 1
                };
                // A fast writer fills the segment's heap (8 MiB: about half a million
                // nodes) before its time is up: it stops there, its stores aborted.
                if let Err(e) = try_push(&g, sid, next) {
                    assert_eq!(cairn_area::errno_of(&e), libc::ENOMEM, "{e}");
                    g.abort().unwrap();
                    println!("sj: full at {next}");
                    break;
                }
                match g.commit() {
                    Ok(_) => println!("sj: acked {next}"),
                    Err(e) => {
                        failures += 1;
                        eprintln!("commit of {next}: {e}");
                        g.abort().unwrap();
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
            }
            println!("sj: failures {failures}");
        }
        // Overlapping address spaces (Mode B): three segments at one base, each in an
        // address space of its own, take turns at it; another thread in one of them
        // keeps the others out; a second pass (`args[0] == "again"`) reads what the
        // first committed.
        "overlap" => {
            let again = args[0] == "again";
            let names = ["ov-a", "ov-b", "ov-c"];
            let mut vhs = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let vid = if again {
                    sj.vas_find(n).unwrap()
                } else {
                    let f = flags::OVERLAP | if i == 0 { flags::LOCKABLE } else { 0 };
                    let sid = sj
                        .seg_alloc(n, Some(OVERLAP_BASE), SEG_LEN, prot::RW, f, 0o600)
                        .unwrap();
                    let vid = sj.vas_create(n, 0o600).unwrap();
                    sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
                    vid
                };
                vhs.push(sj.vas_attach(vid, CommitMode::Snapshot).unwrap());
            }
            // Which segment's resident copy is mapped at the base now.
            let at_base = || -> String {
                let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
                let l = maps
                    .lines()
                    .find(|l| l.starts_with(&format!("{OVERLAP_BASE:x}-")))
                    .unwrap_or("nothing");
                names
                    .iter()
                    .find(|n| {
                        let i = sj.seg_info(n).unwrap();
                        l.ends_with(&format!(".sj-{}-{}", i.id.0, i.gen))
                    })
                    .map_or(format!("none ({l})"), |n| n.to_string())
            };
            let word = |addr: u64| -> u64 {
                let mut b = [0u8; 8];
                sj.read(addr, &mut b).unwrap();
                u64::from_le_bytes(b)
            };
            let at = OVERLAP_BASE + DATA;
            if again {
                for (i, vh) in vhs.iter().enumerate() {
                    sj.switch_to(*vh, true, true).unwrap();
                    println!("sj: {} {} {}", names[i], at_base(), word(at));
                }
                sj.switch_to(Vh::PRIMARY, true, true).unwrap();
                return;
            }
            for round in 1..=3u64 {
                for (i, vh) in vhs.iter().enumerate() {
                    sj.switch_to(*vh, true, true).unwrap();
                    assert_eq!(at_base(), names[i]);
                    let v = word(at);
                    assert_eq!(
                        v,
                        if round == 1 {
                            0
                        } else {
                            (round - 1) * 10 + i as u64
                        }
                    );
                    sj.write(at, &(round * 10 + i as u64).to_le_bytes())
                        .unwrap();
                    // ov-b and ov-c are not lockable: their stores stay uncommitted when
                    // the thread leaves, and travel with the parked pages.
                    if i == 0 || round == 3 {
                        sj.commit().unwrap();
                    }
                }
            }
            // Another thread in ov-a: this one may not park it.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
            let sj2 = sj.clone();
            let vh_a = vhs[0];
            sj.switch_to(Vh::PRIMARY, true, true).unwrap();
            let t = std::thread::spawn(move || {
                sj2.switch_to(vh_a, true, true).unwrap();
                ready_tx.send(()).unwrap();
                rx.recv().unwrap();
                sj2.switch_to(Vh::PRIMARY, true, true).unwrap();
            });
            ready_rx.recv().unwrap();
            let e = sj.switch_to(vhs[1], true, true).unwrap_err();
            println!("sj: busy errno {}", cairn_area::errno_of(&e));
            assert!(e.to_string().contains("another thread"), "{e}");
            let e = sj.vas_detach(vh_a).unwrap_err();
            assert_eq!(cairn_area::errno_of(&e), libc::EBUSY, "{e}");
            tx.send(()).unwrap();
            t.join().unwrap();
            sj.switch_to(vhs[1], true, true).unwrap();
            assert_eq!(at_base(), "ov-b");
            // Two overlapping segments in one address space: refused.
            let sid_c = sj.seg_find("ov-c").unwrap();
            let e = sj.seg_attach(Target::Current, sid_c, prot::RW).unwrap_err();
            println!("sj: same-space errno {}", cairn_area::errno_of(&e));
            // The primary address space's segments are placed at once (every thread
            // that never switched is in it): not while this thread is in ov-b's.
            let e = sj
                .seg_attach(Target::Handle(Vh::PRIMARY), sid_c, prot::READ)
                .unwrap_err();
            println!("sj: primary errno {}", cairn_area::errno_of(&e));
            sj.switch_to(Vh::PRIMARY, true, true).unwrap();
            sj.seg_attach(Target::Current, sid_c, prot::READ).unwrap();
            assert_eq!(at_base(), "ov-c");
            println!("sj: primary has {}", word(at));
            // And ov-b can no longer be entered: the primary's ov-c is never parked.
            let e = sj.switch_to(vhs[1], true, true).unwrap_err();
            assert_eq!(cairn_area::errno_of(&e), libc::EBUSY, "{e}");
            assert!(e.to_string().contains("primary"), "{e}");
            for vh in vhs {
                sj.vas_detach(vh).unwrap();
            }
        }
        // Helper processes (the third way): while a thread of this process is in
        // hp-a, another runs calls in hp-b (at the same address) through its helper.
        "helper" => {
            let vid_of = |n: &str, f: u32| {
                if args[0] == "again" {
                    return sj.vas_find(n).unwrap();
                }
                let sid = sj
                    .seg_alloc(
                        n,
                        Some(OVERLAP_BASE),
                        SEG_LEN,
                        prot::RW,
                        flags::OVERLAP | f,
                        0o600,
                    )
                    .unwrap();
                let vid = sj.vas_create(n, 0o600).unwrap();
                sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
                vid
            };
            let vid_a = vid_of("hp-a", flags::LOCKABLE);
            let vid_b = vid_of("hp-b", flags::LOCKABLE);
            let vh_a = sj.vas_attach(vid_a, CommitMode::Snapshot).unwrap();
            let vh_b = sj.vas_attach(vid_b, CommitMode::Snapshot).unwrap();
            if args[0] == "again" {
                sj.switch_to(vh_b, true, true).unwrap();
                let mut b = [0u8; 8];
                sj.read(OVERLAP_BASE + DATA, &mut b).unwrap();
                println!("sj: hp-b has {}", u64::from_le_bytes(b));
                sj.switch_to(Vh::PRIMARY, true, true).unwrap();
                return;
            }
            // A thread sits in hp-a.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
            let sj2 = sj.clone();
            let t = std::thread::spawn(move || {
                sj2.switch_to(vh_a, true, true).unwrap();
                sj2.write(OVERLAP_BASE + DATA, &5u64.to_le_bytes()).unwrap();
                sj2.commit().unwrap();
                // In hp-a, holding its writer lock, this thread works in hp-b too.
                let mut b = 40u64.to_le_bytes();
                assert_eq!(sj2.vas_call(vh_b, hp_store, &mut b).unwrap(), 0);
                ready_tx.send(()).unwrap();
                rx.recv().unwrap();
                // It never saw any of what the helper did at the same address.
                let mut b = [0u8; 8];
                sj2.read(OVERLAP_BASE + DATA, &mut b).unwrap();
                assert_eq!(u64::from_le_bytes(b), 5);
                sj2.switch_to(Vh::PRIMARY, true, true).unwrap();
            });
            ready_rx.recv().unwrap();
            let e = sj.switch_to(vh_b, true, true).unwrap_err();
            assert_eq!(cairn_area::errno_of(&e), libc::EBUSY, "{e}");
            // hp-b through its helper: a store that is committed, and one that is not.
            let call = |f: fn(&cairn_sj::InHelper, &mut [u8]) -> i64, v: u64| {
                let mut b = v.to_le_bytes();
                let r = sj.vas_call(vh_b, f, &mut b);
                r.map(|r| (r, u64::from_le_bytes(b)))
            };
            let (old, pid) = call(hp_store, 41).unwrap();
            println!("sj: first call saw {old}");
            assert_ne!(
                pid,
                std::process::id() as u64,
                "the call ran in another process"
            );
            assert_eq!(sj.helper_pid(vh_b), Some(pid as u32));
            let (old, _) = call(hp_store_uncommitted, 999).unwrap();
            assert_eq!(old, 41);
            let e = sj.switch_to(vh_a, false, true).unwrap_err();
            assert_eq!(
                cairn_area::errno_of(&e),
                libc::EWOULDBLOCK,
                "the thread in hp-a keeps its writer lock: {e}"
            );
            let (old, _) = call(hp_store, 42).unwrap();
            assert_eq!(old, 41, "the uncommitted store was dropped");
            // A helper killed in a call holding hp-b's writer lock: the call fails, the
            // next one starts another helper, which recovers the lock.
            let e = call(hp_die, 0).unwrap_err();
            println!("sj: died errno {}", cairn_area::errno_of(&e));
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "helper {pid} left"
            );
            let (old, pid2) = call(hp_store, 43).unwrap();
            assert_eq!(old, 42, "the dead helper's uncommitted store is gone");
            assert_ne!(pid2, pid);
            // Bad calls.
            let e = sj
                .vas_call(Vh::PRIMARY, hp_store, &mut [0u8; 8])
                .unwrap_err();
            assert_eq!(cairn_area::errno_of(&e), libc::EINVAL, "{e}");
            let mut big = vec![0u8; cairn_sj::helper::CALL_MAX + 1];
            let e = sj.vas_call(vh_b, hp_store, &mut big).unwrap_err();
            assert_eq!(cairn_area::errno_of(&e), libc::EMSGSIZE, "{e}");
            // The thread leaves hp-a: this one enters hp-b and reads the helper's commit.
            tx.send(()).unwrap();
            t.join().unwrap();
            sj.switch_to(vh_b, true, true).unwrap();
            let mut b = [0u8; 8];
            sj.read(OVERLAP_BASE + DATA, &mut b).unwrap();
            println!("sj: hp-b has {}", u64::from_le_bytes(b));
            sj.switch_to(Vh::PRIMARY, true, true).unwrap();
            // Detaching ends the helper.
            sj.vas_detach(vh_b).unwrap();
            assert!(
                !Path::new(&format!("/proc/{pid2}")).exists(),
                "helper {pid2} left"
            );
            // A process that ends without detaching: its helper notices and ends too.
            let mut b = 0u64.to_le_bytes();
            sj.vas_call(vh_a, hp_pid, &mut b).unwrap();
            println!("sj: left helper {}", u64::from_le_bytes(b));
        }
        // A segment mapped read-only, then attached writable through a second address
        // space: remapped in place, it is writable there and readable in the first.
        "upgrade" => {
            let sid = sj
                .seg_alloc("up", None, SEG_LEN, prot::RW, 0, 0o600)
                .unwrap();
            let base = sj.seg_info("up").unwrap().base;
            let mut vhs = Vec::new();
            for (n, p) in [("up-r", prot::READ), ("up-w", prot::RW)] {
                let vid = sj.vas_create(n, 0o600).unwrap();
                sj.seg_attach(Target::Vas(vid), sid, p).unwrap();
                vhs.push(sj.vas_attach(vid, mode(&args)).unwrap());
            }
            let g = sj.enter(vhs[1]).unwrap();
            let p = SegPtr(base + DATA);
            g.set(p, 77u64).unwrap();
            g.commit().unwrap();
            drop(g);
            let g = sj.enter(vhs[0]).unwrap();
            println!("sj: read {}", g.get::<u64>(p).unwrap());
            drop(g);
            for vh in vhs {
                sj.vas_detach(vh).unwrap();
            }
            for n in ["up-r", "up-w"] {
                sj.vas_remove(n).unwrap();
            }
            sj.seg_free("up").unwrap();
        }
        // A writer killed with a declaration of three pages and a bit open (kept in
        // the undo log as a range, its bytes restored from the file), and the next
        // writer, whose lock repairs it: "write" commits a pattern, declares the range,
        // overwrites it and dies; "check" takes the writer lock and reads it back.
        "pagedie" => {
            let len = 3 * 4096 + 100;
            if args[0] == "write" {
                let sid = sj
                    .seg_alloc("pagedie", None, SEG_LEN, prot::RW, 0, 0o600)
                    .unwrap();
                let vid = sj.vas_create("pagedie", 0o600).unwrap();
                sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
            }
            let base = sj.seg_info("pagedie").unwrap().base;
            let vid = sj.vas_find("pagedie").unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Explicit).unwrap();
            let g = sj.enter(vh).unwrap();
            let at = SegPtr(base + DATA + 8);
            let old: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            if args[0] == "write" {
                g.write(at, &old).unwrap();
                g.commit().unwrap();
                g.tx_add(at, len).unwrap();
                g.write(at, &vec![0xee; len as usize]).unwrap();
                println!("sj: dying");
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
            g.tx_add(SegPtr(base + DATA), 8).unwrap();
            g.abort().unwrap();
            println!("sj: pages {}", read_back(&g, at, &old));
        }
        // An explicit transaction declares 40 fields, stores into each, declares them all
        // again and stores again, then aborts: every field is back at its committed
        // value; committed the same way, every field holds the last store.
        "redeclare" => {
            let sid = sj
                .seg_alloc("redecl", None, SEG_LEN, prot::RW, 0, 0o600)
                .unwrap();
            let base = sj.seg_info("redecl").unwrap().base;
            let vid = sj.vas_create("redecl", 0o600).unwrap();
            sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
            let vh = sj.vas_attach(vid, CommitMode::Explicit).unwrap();
            let g = sj.enter(vh).unwrap();
            let field = |i: u64| SegPtr(base + DATA + i * 64);
            for i in 0..40 {
                g.set(field(i), 1000 + i).unwrap();
            }
            g.commit().unwrap();
            for end in ["abort", "commit"] {
                for round in 0..2u64 {
                    for i in 0..40 {
                        g.set(field(i), round * 100 + i).unwrap();
                    }
                }
                match end {
                    "abort" => g.abort().unwrap(),
                    _ => drop(g.commit().unwrap()),
                }
                let got: Vec<u64> = (0..40).map(|i| g.get::<u64>(field(i)).unwrap()).collect();
                let all_committed = got.iter().enumerate().all(|(i, &v)| v == 1000 + i as u64);
                let all_last = got.iter().enumerate().all(|(i, &v)| v == 100 + i as u64);
                println!(
                    "sj: {end} {}",
                    if all_committed {
                        "committed"
                    } else if all_last {
                        "last"
                    } else {
                        "torn"
                    }
                );
            }
            // Larger declarations: 300 bytes (kept in the undo log), and three pages
            // and a bit at an odd offset (kept as a range, restored from the file),
            // each rolled back whole by an abort.
            for len in [300u64, 3 * 4096 + 100] {
                let at = SegPtr(base + DATA + 4096 + 8);
                let old: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                g.write(at, &old).unwrap();
                g.commit().unwrap();
                g.tx_add(at, len).unwrap();
                g.write(at, &vec![0xee; len as usize]).unwrap();
                g.abort().unwrap();
                println!("sj: {len} bytes {}", read_back(&g, at, &old));
            }
            drop(g);
            sj.vas_detach(vh).unwrap();
            sj.vas_remove("redecl").unwrap();
            sj.seg_free("redecl").unwrap();
        }
        // A segment and an address space holding it, for programs that map its file.
        "mseg" => {
            let sid = sj
                .seg_alloc("mseg", None, SEG_LEN, prot::RW, 0, 0o600)
                .unwrap();
            let vid = sj.vas_create("mvas", 0o600).unwrap();
            sj.seg_attach(Target::Vas(vid), sid, prot::RW).unwrap();
            println!("sj: base {:#x}", sj.seg_info("mseg").unwrap().base);
        }
        // One call on segment args[1]: "alloc" (4 MiB, anywhere), "find" or "free";
        // prints "ok" or the error's errno and message.
        "seg" => {
            let name = args[1].as_str();
            let r = match args[0].as_str() {
                "alloc" => sj
                    .seg_alloc(name, None, 4 << 20, prot::RW, flags::LOCKABLE, 0o600)
                    .map(|_| ()),
                "find" => sj.seg_find(name).map(|_| ()),
                "free" => sj.seg_free(name),
                op => panic!("unknown seg op {op}"),
            };
            match r {
                Ok(()) => println!("sj: ok"),
                Err(e) => println!("sj: {} {e}", cairn_area::errno_of(&e)),
            }
        }
        // The lock table's figures of "data".
        "locks" => {
            let info = sj.seg_info("data").unwrap();
            let slot = sj.control().slot(info.id.0, info.gen).unwrap();
            println!(
                "sj: recoveries {} commits {}",
                slot.recoveries(),
                slot.commits()
            );
        }
        _ => panic!("unknown role {role}"),
    }
}

fn mode(args: &[String]) -> CommitMode {
    if args.iter().any(|a| a == "explicit") {
        CommitMode::Explicit
    } else {
        CommitMode::Snapshot
    }
}

/// `(sum, n)` of the `... sum S n N` line.
fn sum_of(lines: &[String]) -> (u64, u64) {
    let l = lines
        .iter()
        .find(|l| l.contains("sum "))
        .unwrap_or_else(|| panic!("no sum line in {lines:?}"));
    let f: Vec<&str> = l.split_whitespace().collect();
    let at = |k: &str| -> u64 {
        let i = f.iter().position(|x| *x == k).unwrap();
        f[i + 1].parse().unwrap()
    };
    (at("sum"), at("n"))
}

/// The dissertation's worked example, across processes, then across `cairn stop` and
/// the loss of the resident copy (as after a reboot): Bob reads Alice's list at the
/// address she put it, with no serialization.
#[test]
fn alice_and_bob_share_a_list_across_processes_and_restarts() {
    let s = store();
    let out = run(s.path(), "alice", &["100"]);
    assert!(out.contains(&"alice done".to_string()), "{out:?}");
    let bob = run(s.path(), "bob", &[]);
    assert_eq!(sum_of(&bob), (5050, 100));
    assert!(bob.contains(&"primary cannot reach it".to_string()));
    // The daemon stops (digesting everything) and restarts on demand.
    s.stop();
    assert_eq!(sum_of(&run(s.path(), "bob", &[])), (5050, 100));
    // Without its resident copy (RAM, gone at a reboot) it is rebuilt from the store.
    for p in cairn_area::host::list(&cairn_area::host::store_uuid(s.path()).unwrap()) {
        if p.to_string_lossy().contains(".sj-") {
            std::fs::remove_file(p).unwrap();
        }
    }
    s.stop();
    assert_eq!(sum_of(&run(s.path(), "bob", &[])), (5050, 100));
}

/// A writer killed before its commit leaves no trace; one that commits is seen by the
/// next reader; in both commit modes.
#[test]
fn uncommitted_stores_die_with_their_writer() {
    let s = store();
    // Pages declared whole (their old bytes restored from the file, not kept).
    let out = child(s.path(), "pagedie", &["write"]).output().unwrap();
    assert!(!out.status.success(), "the page writer should have died");
    assert_eq!(
        run(s.path(), "pagedie", &["check"]),
        vec!["pages rolled back"]
    );
    run(s.path(), "alice", &["10"]);
    for m in ["snapshot", "explicit"] {
        let before = sum_of(&run(s.path(), "try", &[]));
        let out = child(s.path(), "append", &["1000", "die", m])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{m}: the writer should have died");
        assert_eq!(sum_of(&run(s.path(), "try", &[])), before, "{m}");
        run(s.path(), "append", &["7", "commit", m]);
        assert_eq!(
            sum_of(&run(s.path(), "try", &[])),
            (before.0 + 7, before.1 + 1),
            "{m}"
        );
    }
}

/// A writer killed at each point of a commit: before its transaction is logged (the
/// commit never happened), after (it happened), and half-way through publishing it (it
/// happened, and the next process repairs the resident copy from the journal).
#[test]
fn a_writer_killed_during_a_commit_is_all_or_nothing() {
    let s = store();
    run(s.path(), "alice", &["10"]);
    let mut expect = sum_of(&run(s.path(), "try", &[]));
    for (point, lands) in [
        ("before-log", false),
        ("after-log", true),
        ("publishing", true),
    ] {
        for m in ["snapshot", "explicit"] {
            let out = child(s.path(), "append", &["100", "commit", m])
                .env("CAIRN_SJ_CRASH", point)
                .output()
                .unwrap();
            assert!(!out.status.success(), "{point}/{m}: should have died");
            if lands {
                expect = (expect.0 + 100, expect.1 + 1);
            }
            assert_eq!(sum_of(&run(s.path(), "try", &[])), expect, "{point}/{m}");
            // Durable too: the store has it (or not) after a stop and a rebuild.
            s.stop();
            assert_eq!(
                sum_of(&run(s.path(), "try", &[])),
                expect,
                "{point}/{m} after a stop"
            );
        }
    }
    let locks = run(s.path(), "locks", &[]);
    let recoveries: u64 = locks[0].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(recoveries >= 4, "{locks:?}");
}

/// A commit larger than a quarter of the log (6 MiB across two segments, one lockable
/// and one not, with a 4 MiB log) is all or nothing: a writer killed after staging it
/// and before its commit point leaves nothing; killed after the commit point, while
/// copying it into the files or while publishing it, the next process (a reader, which
/// lays the staged commit over the file; a writer, which finishes it; a process whose
/// resident copy was evicted, which builds it anew) sees all of it, also after a stop.
#[test]
fn commits_larger_than_a_quarter_of_the_log_are_all_or_nothing() {
    let s = store();
    run(s.path(), "big", &["make"]);
    let values = |how: &str| run(s.path(), "big", &["check", how]);
    let mut expect;
    let mut v = 0u64;
    for m in ["snapshot", "explicit"] {
        v += 1;
        let out = run(s.path(), "big", &["fill", m, &v.to_string()]);
        let bytes: u64 = out[0].split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(bytes > BIG_FILL, "{m}: {out:?}");
        expect = v;
        assert_eq!(values("read"), vec![format!("values {{{expect}}}")]);
        for (point, lands) in [
            ("staged", false),
            ("after-log", true),
            ("applying", true),
            ("publishing", true),
        ] {
            v += 1;
            let out = child(s.path(), "big", &["fill", m, &v.to_string()])
                .env("CAIRN_SJ_CRASH", point)
                .output()
                .unwrap();
            assert!(!out.status.success(), "{point}/{m}: should have died");
            if lands {
                expect = v;
            }
            if point == "after-log" {
                // Nobody finished it yet: a resident copy built from the file now
                // must lay the staged commit over it.
                run(s.path(), "big", &["evict"]);
            }
            let want = vec![format!("values {{{expect}}}")];
            assert_eq!(values("read"), want, "{point}/{m}: a reader");
            assert_eq!(values("write"), want, "{point}/{m}: a writer");
            s.stop();
            run(s.path(), "big", &["evict"]);
            assert_eq!(values("read"), want, "{point}/{m}: after a stop");
        }
    }
}

/// The kill test can fail: with the publish's journal left out (a planted bug, checked
/// builds only), a writer killed half-way through publishing its commit leaves the
/// resident copy half published, nobody repairs it, and the next process sees a list
/// that is neither the old one nor the committed one.
#[test]
fn a_publish_without_its_journal_is_caught() {
    if !cfg!(debug_assertions) {
        return;
    }
    let s = store();
    run(s.path(), "alice", &["10"]);
    let (sum, n) = sum_of(&run(s.path(), "try", &[]));
    let out = child(s.path(), "append", &["100", "commit", "snapshot"])
        .env("CAIRN_SJ_CRASH", "publishing")
        .env("CAIRN_SJ_PLANT", "no-journal")
        .output()
        .unwrap();
    assert!(!out.status.success(), "should have died");
    let out = child(s.path(), "try", &[]).output().unwrap();
    let seen = out.status.success().then(|| sum_of(&lines(&out)));
    assert_ne!(
        seen,
        Some((sum + 100, n + 1)),
        "a publish without its journal went unnoticed"
    );
}

/// Names and permissions are the store's: a member of the store's group (uid 1000, gid
/// 4242; not the owner) attaches what the files' modes let it read, writes and commits
/// what they let it write, and nothing more (`EACCES`), in address spaces of others and
/// of its own; it makes segments of its own and cannot remove root's. It cannot write
/// the resident copy of a segment it may only read (not by name, not through the
/// daemon's read-only descriptor), and repairs one that root's writer left half
/// published through the daemon. The lock table has the store's group and no access for
/// others; resident copies and undo logs are the daemon's alone (mode 0600). Needs root
/// (skipped otherwise).
#[test]
fn permissions_are_checked_at_attach_for_another_user() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    const USER: u32 = 1000;
    const GROUP: u32 = 4242;
    if cairn_media::sys::ids().0 != 0 {
        eprintln!("skipped: needs root to run processes as another uid");
        return;
    }
    let s = TestStore::with_trusted_group(GROUP);
    run(s.path(), "perm-setup", &[]);
    // Root's writers die: one publishing 55 (committed), then one storing 66 in place
    // (explicit mode) before its commit (not committed: its undo log must be rolled
    // back, here by the member, which may not write the copy: through the daemon).
    for (v, mode, point) in [
        ("55", "snapshot", "publishing"),
        ("66", "explicit", "before-log"),
    ] {
        let out = child(s.path(), "perm-crash", &[v, mode])
            .env("CAIRN_SJ_CRASH", point)
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "perm-crash {v}: {out:?}"
        );
    }
    let out = child(s.path(), "perm-member", &[])
        .uid(USER)
        .gid(GROUP)
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    check("perm-member", &out);
    assert_eq!(lines(&out), ["member done"]);
    assert_eq!(run(s.path(), "perm-check", &[]), ["grouprw 44"]);
    // A stage file planted by another member (uid 1001): root's staged commit removes it
    // and makes its own; the member, which cannot remove it, refuses to write into it.
    let as_user = |uid: u32, role: &str, args: &[&str]| {
        let out = child(s.path(), role, args)
            .uid(uid)
            .gid(GROUP)
            .env("HOME", "/nonexistent")
            .output()
            .unwrap();
        check(role, &out);
        lines(&out)
    };
    as_user(USER + 1, "perm-plant", &["groupro"]);
    as_user(USER + 1, "perm-plant", &["grouprw"]);
    assert_eq!(
        run(s.path(), "perm-big", &["groupro", "7"]),
        ["big ok uid 0 mode 640"]
    );
    assert_eq!(
        as_user(USER, "perm-big", &["grouprw", "8"]),
        [format!("big errno {}", libc::EACCES)]
    );
    // The member that made the shared stage directory first owns it, so it may remove
    // any stage file in it: a staged commit left pending by a writer killed after its
    // commit point is replaced by the member's bytes. The reader refuses the stage file
    // (it is not the work of anyone who may write the segment) instead of reading them.
    let out = child(s.path(), "perm-big", &["groupro", "9"])
        .env("CAIRN_SJ_CRASH", "applying")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
    assert_eq!(
        as_user(USER + 1, "perm-swap", &["groupro"]),
        [format!("swapped in a directory of uid {}", USER + 1)]
    );
    let read = run(s.path(), "perm-read", &["groupro"]);
    assert!(
        read.len() == 1 && read[0].starts_with(&format!("read errno {} ", libc::EINVAL)),
        "{read:?}"
    );
    assert!(
        read[0].contains("is not trusted") && read[0].contains("uid 1001"),
        "{read:?}"
    );
    let uuid = cairn_area::host::store_uuid(s.path()).unwrap();
    let objects: Vec<_> = cairn_area::host::list(&uuid)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".sj"))
        .collect();
    // Three resident copies and the lock table at least.
    assert!(objects.len() >= 4, "{objects:?}");
    for p in objects {
        let m = std::fs::metadata(&p).unwrap();
        if p.to_string_lossy().ends_with(".sj-ctl") {
            assert_eq!(m.gid(), GROUP, "{}", p.display());
            assert_eq!(m.mode() & 0o007, 0, "{}: {:o}", p.display(), m.mode());
        } else {
            assert_eq!(m.uid(), 0, "{}: the daemon's", p.display());
            assert_eq!(m.mode() & 0o077, 0, "{}: {:o}", p.display(), m.mode());
        }
    }
}

/// The daemon killed with SIGKILL, again and again, while a writer commits in a loop (in
/// each commit mode): the writer goes on with the next daemon, every acknowledged commit
/// is in the list, and the list is whole (values n down to 1), read by another process
/// and again after a clean stop.
#[test]
fn the_daemon_killed_during_commits_loses_nothing() {
    let s = store();
    run(s.path(), "alice", &["10"]);
    for m in ["snapshot", "explicit"] {
        let w = child(s.path(), "append-for", &["3", m])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Three kills, each of a daemon serving for 300 ms, and a new daemon started
        // 100 ms later (by this process: the writer would start one only when it needs
        // it, its log full or a lease to ask for).
        let mut kills = 0;
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(300));
            if let Some(pid) = s.daemon_pid() {
                harness::kill9(pid);
                kills += 1;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(s.fs());
        }
        let out = w.wait_with_output().unwrap();
        check("append-for", &out);
        let acked: Vec<u64> = lines(&out)
            .iter()
            .filter_map(|l| l.strip_prefix("acked ")?.parse().ok())
            .collect();
        assert_eq!(kills, 3, "{m}: the daemon was killed {kills} times");
        assert!(
            acked.len() > 10,
            "{m}: {} commits acknowledged",
            acked.len()
        );
        let top = *acked.last().unwrap();
        for when in ["after the kills", "after a stop"] {
            let (sum, n) = sum_of(&run(s.path(), "try", &[]));
            // Whole: n, n-1, ..., 1; and every acknowledged value is in it.
            assert_eq!(sum, n * (n + 1) / 2, "{m}, {when}: a torn list");
            assert!(
                n >= top,
                "{m}, {when}: acknowledged {top}, the list has {n}"
            );
            s.stop();
        }
    }
}

/// A segment's resident copy and undo log are made at attach, dropped by an eviction and
/// removed with the segment; objects of segments that are gone (left by a process that
/// died, say) go at the daemon's clean stop, and those of live segments stay.
#[test]
fn segment_host_objects_come_and_go_with_their_segment() {
    let s = store();
    assert_eq!(run(s.path(), "objects", &[]), ["objects ok"]);
    run(s.path(), "alice", &["3"]);
    let uuid = cairn_area::host::store_uuid(s.path()).unwrap();
    let copies = || -> Vec<std::path::PathBuf> {
        cairn_area::host::list(&uuid)
            .into_iter()
            .filter(|p| {
                p.to_string_lossy().contains(".sj-") && !p.to_string_lossy().ends_with("sj-ctl")
            })
            .collect()
    };
    let live = copies();
    assert!(!live.is_empty(), "alice's segment has a resident copy");
    let stale: Vec<_> = ["sj", "sj-undo"]
        .iter()
        .map(|k| cairn_area::host::object_path(&uuid, k, 999_999, 7))
        .collect();
    for p in &stale {
        std::fs::write(p, b"left behind").unwrap();
    }
    s.stop();
    assert_eq!(copies(), live, "only the live segment's objects stay");
    assert_eq!(sum_of(&run(s.path(), "try", &[])), (6, 3));
}

/// A reader holds the lock: a writer's `try_switch` fails with `EWOULDBLOCK`, another
/// reader gets in. Killed with SIGKILL, neither leaves the lock held.
#[test]
fn locks_exclude_and_a_killed_holder_never_keeps_one() {
    let s = store();
    run(s.path(), "alice", &["3"]);
    let hold = |role: &str| -> Child {
        let mut c = child(s.path(), role, &[])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = c.stdout.take().unwrap();
        let mut buf = Vec::new();
        let mut b = [0u8; 1];
        use std::io::Read;
        while !String::from_utf8_lossy(&buf).contains("sj: holding") {
            assert_eq!(out.read(&mut b).unwrap(), 1, "the holder died");
            buf.push(b[0]);
        }
        c
    };
    // A writer in: nobody else gets in (the writer lock excludes readers and writers).
    let mut w = hold("hold-write");
    let t = run(s.path(), "try", &[]);
    assert_eq!(t, vec![format!("errno {}", libc::EWOULDBLOCK)]);
    w.kill().unwrap();
    w.wait().unwrap();
    assert_eq!(sum_of(&run(s.path(), "try", &[])), (6, 3));
    // A reader in: a writer is refused, a reader is not.
    let mut r = hold("hold-read");
    let t = run(s.path(), "try", &[]);
    assert_eq!(t, vec![format!("errno {}", libc::EWOULDBLOCK)]);
    r.kill().unwrap();
    r.wait().unwrap();
    run(s.path(), "append", &["4", "commit"]);
    assert_eq!(sum_of(&run(s.path(), "try", &[])), (10, 4));
}

/// Bad input: each case is refused with the errno it names, nothing crashes, and the
/// committed data is intact afterwards; a damaged segment file is refused at attach.
#[test]
fn bad_input_gets_clear_errors_and_loses_nothing() {
    let s = store();
    run(s.path(), "alice", &["20"]);
    let out = run(s.path(), "bad-input", &[]);
    assert!(out.contains(&"bad input done".to_string()), "{out:?}");
    assert_eq!(sum_of(&run(s.path(), "try", &[])), (210, 20));
    // Damage the segment's header in the store: attaching it fails, and says why.
    let fs = s.fs();
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/.sj/seg/data")
        .unwrap();
    let mut h = [0u8; 64];
    f.read_at(&mut h, 0).unwrap();
    f.write_at(&[h[20] ^ 0xff], 20).unwrap();
    drop(f);
    drop(fs);
    let out = child(s.path(), "try", &[]).output().unwrap();
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("checksum mismatch"), "{err}");
}

/// A `seg_alloc` killed after it made the segment's file and reserved its range, before
/// it wrote the header, leaves a file that is no segment: finding it says so and how to
/// remove it, `seg_free` removes it (its range too), and the name can be used again.
#[test]
fn a_segment_creation_cut_short_can_be_removed() {
    let s = store();
    let out = child(s.path(), "seg", &["alloc", "half"])
        .env("CAIRN_SJ_CRASH", "creating")
        .output()
        .unwrap();
    assert!(!out.status.success(), "should have died");
    let found = run(s.path(), "seg", &["find", "half"]);
    assert!(
        found[0].starts_with(&format!("{} ", libc::EINVAL)) && found[0].contains("seg rm"),
        "{found:?}"
    );
    // `cairn sj seg rm` (seg_free) removes it, and says what it was.
    let rm = Command::new(harness::cairn_bin())
        .args(["sj", "seg", "rm", "half"])
        .env("CAIRN_STORE", s.path())
        .output()
        .unwrap();
    check("cairn sj seg rm", &rm);
    let said = String::from_utf8_lossy(&rm.stdout);
    assert!(said.contains("not a whole segment"), "{said}");
    assert_eq!(run(s.path(), "seg", &["alloc", "half"]), ["ok"]);
    assert_eq!(run(s.path(), "seg", &["find", "half"]), ["ok"]);
    assert_eq!(run(s.path(), "seg", &["free", "half"]), ["ok"]);
    assert!(run(s.path(), "seg", &["find", "half"])[0].starts_with(&format!("{} ", libc::ENOENT)));
}

/// The worked examples of docs/SPACEJMP.md, in Rust and in C: one process builds a
/// linked list in a segment, another walks it, also after `cairn stop`.
#[test]
fn the_worked_examples_run_across_processes() {
    let s = store();
    let bin_dir = harness::cairn_bin().parent().unwrap().to_path_buf();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = compile_c(
        &root.join("crates/sj-capi/examples/list.c"),
        &s.path().join("clist"),
    );
    let rust = bin_dir.join("examples/list");
    assert!(
        rust.is_file(),
        "{} missing: cargo test builds the examples",
        rust.display()
    );
    for prog in [exe, rust] {
        let go = |args: &[&str]| {
            let out = Command::new(&prog)
                .args(args)
                .env("CAIRN_STORE", s.path())
                .env("CAIRN_BIN", harness::cairn_bin())
                .output()
                .unwrap();
            check(&prog.display().to_string(), &out);
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert!(go(&["build", "1000"]).contains("built 1000 nodes"));
        assert_eq!(go(&["read"]), "sum 500500 n 1000\n");
        s.stop();
        assert_eq!(go(&["read"]), "sum 500500 n 1000\n");
    }
}

/// `sj_vas_call` from C: a thread in one address space runs a function in another at
/// the same address through the helper; the function commits there with `sj_commit`.
#[test]
fn c_programs_call_into_a_conflicting_address_space() {
    let s = store();
    let src = s.path().join("call.c");
    std::fs::write(
        &src,
        r#"#include <cairn/sj.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#define BASE ((char *)0x100000000000 + (16L << 30))
static void die(const char *what) {
    fprintf(stderr, "call: %s: %s (errno %d)\n", what, sj_strerror(), errno);
    exit(1);
}
static sj_vh_t space(const char *name) {
    sj_sid_t sid = sj_seg_alloc(name, BASE, 4 << 20, SJ_PROT_RW, SJ_OVERLAP | SJ_LOCKABLE);
    if (!sid) die("sj_seg_alloc");
    sj_vid_t vid = sj_vas_create(name, 0600);
    if (!vid) die("sj_vas_create");
    if (sj_vas_ctl(SJ_VAS_ADD, vid, sid, SJ_PROT_RW) < 0) die("sj_vas_ctl");
    sj_vh_t vh = sj_vas_attach(vid, 0);
    if (vh < 0) die("sj_vas_attach");
    return vh;
}
/* In the helper: store the caller's number in the segment at BASE (c-b's), commit. */
static int64_t put(void *buf, size_t len) {
    volatile uint64_t *w = (uint64_t *)(BASE + 65536);
    uint64_t old = *w;
    *w = *(uint64_t *)buf;
    if (sj_commit() < 0) return -1;
    *(uint64_t *)buf = old;
    return getpid();
}
int main(void) {
    sj_vh_t a = space("c-a"), b = space("c-b");
    volatile uint64_t *w = (uint64_t *)(BASE + 65536);
    if (sj_vas_switch(a) < 0) die("switch a");
    *w = 7;
    if (sj_commit() < 0) die("commit a");
    uint64_t v = 9;
    int64_t pid;
    if (sj_vas_call(b, put, &v, sizeof v, &pid) < 0) die("sj_vas_call");
    printf("helper %s, old %lu, here %lu\n", pid != getpid() ? "elsewhere" : "HERE",
           (unsigned long)v, (unsigned long)*w);
    if (sj_vas_call(SJ_PRIMARY, put, &v, sizeof v, &pid) == 0 || errno != EINVAL)
        die("a call in the primary");
    if (sj_vas_switch(SJ_PRIMARY) < 0) die("switch back");
    if (sj_vas_switch(b) < 0) die("switch b");
    printf("c-b has %lu\n", (unsigned long)*w);
    if (sj_vas_switch(SJ_PRIMARY) < 0) die("switch back");
    return 0;
}
"#,
    )
    .unwrap();
    let exe = compile_c(&src, &s.path().join("call"));
    let out = Command::new(&exe)
        .env("CAIRN_STORE", s.path())
        .env("CAIRN_BIN", harness::cairn_bin())
        .output()
        .unwrap();
    check("call", &out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "helper elsewhere, old 0, here 7\nc-b has 9\n"
    );
}

/// `src` compiled against `libcairn_sj.so` (next to the `cairn` under test) into `exe`.
fn compile_c(src: &Path, exe: &Path) -> std::path::PathBuf {
    harness::compile_c_against(src, exe, "sj-capi", "cairn_sj")
}

/// A child after `fork` cannot use its parent's segments (their mappings are not
/// inherited): every call fails with `ENOTSUP`, and the parent goes on.
#[test]
fn a_child_after_fork_is_refused() {
    let s = store();
    run(s.path(), "alice", &["5"]);
    let src = s.path().join("fork.c");
    std::fs::write(
        &src,
        r#"#include <cairn/sj.h>
#include <errno.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    sj_vid_t vid = sj_vas_find("shared");
    if (!vid) return 10;
    pid_t pid = fork();
    if (pid == 0) {
        sj_vid_t again = sj_vas_find("shared");
        return again == 0 && errno == ENOTSUP ? 0 : 11;
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 12;
    return sj_vas_attach(vid, 0) >= 0 ? 0 : 13;
}
"#,
    )
    .unwrap();
    let exe = compile_c(&src, &s.path().join("fork"));
    let out = Command::new(&exe)
        .env("CAIRN_STORE", s.path())
        .env("CAIRN_BIN", harness::cairn_bin())
        .output()
        .unwrap();
    check("fork", &out);
}

/// A commit into a full store fails as a whole: nothing of it is visible or durable, the
/// stores stay uncommitted, and the same commit succeeds once there is room.
#[test]
fn a_commit_into_a_full_store_fails_as_a_whole() {
    let s = store();
    run(s.path(), "alice", &["10"]);
    let before = sum_of(&run(s.path(), "try", &[]));
    // Fill the store with a file, until it is full: 1 MiB at a time, then smaller
    // pieces down to a block, so that what is left does not depend on the layout.
    let fs = s.fs();
    let f = cairn::File::create(&fs, "/filler").unwrap();
    let mut chunk = 1usize << 20;
    let mut off = 0u64;
    while chunk >= 4096 {
        match f.write_at(&vec![1u8; chunk], off) {
            Ok(_) => off += chunk as u64,
            Err(e) => {
                assert_eq!(cairn_area::errno_of(&e), libc::ENOSPC, "{e}");
                chunk /= 2;
            }
        }
    }
    drop(f);
    drop(fs);
    let out = run(s.path(), "big-commit", &[]);
    assert!(
        out.iter().any(|l| l == &format!("errno {}", libc::ENOSPC)),
        "{out:?}"
    );
    assert!(
        out.iter().any(|l| l == "committed after room was made"),
        "{out:?}"
    );
    assert_eq!(
        sum_of(&run(s.path(), "try", &[])),
        (before.0 + 1000, before.1 + 1)
    );
    s.stop();
    assert_eq!(
        sum_of(&run(s.path(), "try", &[])),
        (before.0 + 1000, before.1 + 1)
    );
}

/// Overlapping address spaces (segments made with `OVERLAP` at one base) take turns at
/// the address: switching places one and parks the others with their pages (uncommitted
/// stores included); another thread inside one keeps the others out (`EBUSY`); two
/// overlapping segments in one address space are refused (`EINVAL`); what was committed
/// is there for the next process.
#[test]
fn overlapping_address_spaces_take_turns_at_one_address() {
    let s = store();
    let out = run(s.path(), "overlap", &["first"]);
    assert!(
        out.contains(&format!("busy errno {}", libc::EBUSY)),
        "{out:?}"
    );
    assert!(
        out.contains(&format!("same-space errno {}", libc::EINVAL)),
        "{out:?}"
    );
    assert!(
        out.contains(&format!("primary errno {}", libc::EBUSY)),
        "{out:?}"
    );
    assert!(out.contains(&"primary has 32".to_string()), "{out:?}");
    let out = run(s.path(), "overlap", &["again"]);
    assert_eq!(out, vec!["ov-a ov-a 30", "ov-b ov-b 31", "ov-c ov-c 32"]);
}

/// Helper processes: a thread of a process is in one address space while calls of
/// another thread run in an address space at the same addresses, through the handle's
/// helper process; a helper killed in a call holding the writer lock fails that call
/// only (the next helper recovers the lock, the uncommitted store is gone); detaching
/// ends the helper, and so does the end of its process; another process reads what the
/// helper committed.
#[test]
fn a_helper_process_is_in_a_conflicting_address_space_at_the_same_time() {
    let s = store();
    let mut out = run(s.path(), "helper", &["first"]);
    let left: u32 = out
        .pop()
        .and_then(|l| l.strip_prefix("left helper ").map(|p| p.parse().unwrap()))
        .expect("the helper left running");
    assert_eq!(
        out,
        vec![
            "first call saw 40".to_string(),
            format!("died errno {}", libc::EIO),
            "hp-b has 43".to_string(),
        ]
    );
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        !Path::new(&format!("/proc/{left}")).exists()
    });
    assert!(gone, "the helper {left} outlived its process by 2 s");
    let out = run(s.path(), "helper", &["again"]);
    assert_eq!(out, vec!["hp-b has 43"]);
}

/// A segment attached read-only and then writable in one process is remapped in place
/// (it used to be left unmapped: the old mapping's release reserved the range again).
#[test]
fn fields_declared_again_roll_back_and_commit_whole() {
    let s = store();
    let out = run(s.path(), "redeclare", &[]);
    assert_eq!(
        out,
        vec![
            "abort committed",
            "commit last",
            "300 bytes rolled back",
            "12388 bytes rolled back"
        ]
    );
}

#[test]
fn a_segment_attached_read_only_then_writable_is_writable() {
    let s = store();
    for m in ["snapshot", "explicit"] {
        let out = run(s.path(), "upgrade", &[m]);
        assert_eq!(out, vec!["read 77"]);
    }
}

/// An unmodified C program through the shim (`cairn run`): `mmap` of a segment's file is
/// the segment at its base, `msync` commits (a kill afterwards loses nothing committed
/// and nothing uncommitted survives it), and with `--vas` the exit commits, or drops the
/// stores with `--vas-abort-on-exit`; a `--vas` that does not exist is a clear error.
#[test]
fn programs_map_segment_files_and_msync_commits() {
    let s = store();
    let base = run(s.path(), "mseg", &[]);
    let base = base[0].strip_prefix("base ").unwrap().to_string();
    let src = s.path().join("segmap.c");
    std::fs::write(
        &src,
        r#"
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t len = strtoul(argv[2], 0, 0);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 1; }
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    volatile uint64_t *w = (uint64_t *)(p + 65536);
    printf("base %p value %lu\n", (void *)p, (unsigned long)*w);
    fflush(stdout);
    if (!strcmp(argv[3], "sync-then-die")) {
        *w = strtoul(argv[4], 0, 0);
        if (msync(p, len, MS_SYNC)) { perror("msync"); return 1; }
        *w = 999;
        kill(getpid(), SIGKILL);
    }
    if (!strcmp(argv[3], "store-and-exit")) *w = strtoul(argv[4], 0, 0);
    if (munmap(p, len)) { perror("munmap"); return 1; }
    return 0;
}
"#,
    )
    .unwrap();
    let exe = s.path().join("segmap");
    let cc = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    check("cc", &cc);
    let go = |vas: &[&str], args: &[&str]| -> Output {
        Command::new(harness::cairn_bin())
            .arg("run")
            .args(vas)
            .arg("--")
            .arg(&exe)
            .arg("/cairn/.sj/seg/mseg")
            .arg(SEG_LEN.to_string())
            .args(args)
            .env("CAIRN_STORE", s.path())
            .output()
            .unwrap()
    };
    let value = |out: &Output| -> String {
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            text.starts_with(&format!("base {base} ")),
            "not mapped at the segment's base {base}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text.trim().rsplit(' ').next().unwrap().to_string()
    };
    let out = go(&[], &["sync-then-die", "41"]);
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
    let out = go(&[], &["read"]);
    check("segmap read", &out);
    assert_eq!(value(&out), "41", "the msync'd store, not the one after it");
    // With --vas the exit commits; with --vas-abort-on-exit it does not.
    check(
        "store-and-exit",
        &go(&["--vas", "mvas"], &["store-and-exit", "42"]),
    );
    assert_eq!(value(&go(&[], &["read"])), "42");
    let out = go(
        &["--vas", "mvas", "--vas-abort-on-exit"],
        &["store-and-exit", "43"],
    );
    check("store-and-exit, abort", &out);
    assert_eq!(value(&go(&["--vas", "mvas"], &["read"])), "42");
    let out = go(&["--vas", "nosuch"], &["read"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--vas nosuch"), "{e}");
}
