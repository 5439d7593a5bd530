//! The daemon through its socket: registration, digest, status, credits, goodbye,
//! dead clients, malformed logs, shutdown, a second daemon.

use super::*;
use crate::server::{run_daemon, DaemonOptions};
use cairn_area::Area;
use cairn_media::{sys, Mapping};
use cairn_proto::{recv, send, Registration, Request, Response};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

struct Client {
    s: UnixStream,
    reg: Registration,
    ring: Mapping,
    ring_bytes: u64,
    tail: u64,
    seq: u64,
    _lock: std::fs::File,
}

fn connect(ts: &TestStore) -> UnixStream {
    let t = Instant::now();
    loop {
        match UnixStream::connect(ts.store.socket_path()) {
            Ok(s) => return s,
            Err(_) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("cannot connect: {e}"),
        }
    }
}

fn call(s: &mut UnixStream, r: &Request) -> Response {
    send(s, r).unwrap();
    recv(s).unwrap()
}

impl Client {
    fn register(ts: &TestStore) -> Client {
        let mut s = connect(ts);
        let reg = match call(
            &mut s,
            &Request::Register {
                pid: std::process::id(),
            },
        ) {
            Response::Registered(r) => r,
            other => panic!("{other:?}"),
        };
        let lock = crate::core::try_lock_slot(&ts.store, reg.slot)
            .unwrap()
            .unwrap();
        // The daemon sends the NVM file (read-only) and the slot's log file.
        assert!(reg.log_fds);
        let mut fds = cairn_proto::recv_fds(&s, cairn_proto::REGISTRATION_FDS)
            .unwrap()
            .into_iter();
        let f = std::fs::File::from(fds.next().unwrap());
        let log = std::fs::File::from(fds.next().unwrap());
        let area = Area::open(&f, false).unwrap();
        let l = *area.layout();
        let ring = Mapping::new(
            &log,
            l.ring_off(reg.slot),
            l.ring_bytes() as usize,
            true,
            true,
        )
        .unwrap();
        Client {
            s,
            tail: reg.head_lsn,
            seq: reg.head_seq,
            reg,
            ring,
            ring_bytes: l.ring_bytes(),
            _lock: lock,
        }
    }

    fn append(&mut self, recs: &[Record<'_>]) {
        let t = log::build_txn(self.seq, recs);
        let off = (self.tail % self.ring_bytes) as usize;
        assert!(off + t.len() <= self.ring_bytes as usize);
        self.ring.write(off, &t).unwrap();
        self.ring.persist(off, t.len()).unwrap();
        self.tail += t.len() as u64;
        self.seq += 1;
    }
}

fn start(ts: &TestStore) -> std::thread::JoinHandle<std::io::Result<()>> {
    let opts = DaemonOptions::new(&ts.store.path);
    let h = std::thread::spawn(move || run_daemon(&opts));
    drop(connect(ts));
    h
}

fn status(ts: &TestStore) -> cairn_proto::StatusReport {
    let mut s = connect(ts);
    match call(&mut s, &Request::Status) {
        Response::Status(r) => r,
        other => panic!("{other:?}"),
    }
}

fn open_area(ts: &TestStore) -> Area {
    let f = std::fs::File::open(&ts.nvm).unwrap();
    Area::open(&f, false).unwrap()
}

fn lookup(a: &Area, name: &str) -> Option<u64> {
    let root = a.read_inode(ROOT_INO).unwrap();
    a.dir_lookup(&root, name.as_bytes()).unwrap().map(|x| x.0)
}

#[test]
fn full_session_over_the_socket() {
    let ts = TestStore::small();
    let daemon = start(&ts);
    // A second daemon on the same store is refused.
    let e = run_daemon(&DaemonOptions::new(&ts.store.path)).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EBUSY);

    let mut c = Client::register(&ts);
    assert_eq!(c.reg.inodes.len(), 64);
    assert!(c.reg.credits > 0);
    let ino = c.reg.inodes[0];
    c.append(&create_file(ino, ROOT_INO, b"hello"));
    c.append(&[Record::Write {
        ino,
        offset: 0,
        size: 5,
        mtime: 1,
        data: b"world",
    }]);
    let st = status(&ts);
    assert_eq!(st.clients.len(), 1);
    assert_eq!(st.clients[0].log_used_bytes, c.tail - c.reg.head_lsn);
    match call(
        &mut c.s,
        &Request::Digest {
            upto_lsn: c.tail,
            wait: true,
        },
    ) {
        Response::Digested { head_lsn, head_seq } => {
            assert_eq!((head_lsn, head_seq), (c.tail, c.seq))
        }
        other => panic!("{other:?}"),
    }
    let a = open_area(&ts);
    assert_eq!(lookup(&a, "hello"), Some(ino));
    assert_eq!(a.published_head(c.reg.slot).unwrap(), c.tail);
    match call(&mut c.s, &Request::Inodes { count: 10 }) {
        Response::Inodes(v) => {
            assert_eq!(v.len(), 10);
            assert!(v.iter().all(|i| !c.reg.inodes.contains(i)));
        }
        other => panic!("{other:?}"),
    }
    match call(&mut c.s, &Request::Credits { blocks: u64::MAX }) {
        Response::Credits { granted } => assert!(granted < 1 << 20),
        other => panic!("{other:?}"),
    }
    let st = status(&ts);
    assert_eq!(st.digest.digests, 1);
    assert_eq!(st.inodes.used, 2);
    assert_eq!(st.tiers[0].name, "nvm");
    assert!(st.tiers[0].used_bytes >= 2 * 4096);
    // Async digest gets no answer; the next request's answer comes next.
    c.append(&[Record::Write {
        ino,
        offset: 5,
        size: 6,
        mtime: 1,
        data: b"!",
    }]);
    send(
        &mut c.s,
        &Request::Digest {
            upto_lsn: c.tail,
            wait: false,
        },
    )
    .unwrap();
    c.append(&[Record::Write {
        ino,
        offset: 6,
        size: 7,
        mtime: 1,
        data: b"?",
    }]);
    match call(&mut c.s, &Request::Goodbye { tail_lsn: c.tail }) {
        Response::Ok => {}
        other => panic!("{other:?}"),
    }
    let i = a.read_inode(ino).unwrap();
    let mut b = vec![0u8; 7];
    a.read_file(&i, 0, &mut b).unwrap();
    assert_eq!(&b, b"world!?");
    assert!(!a.slot_head(c.reg.slot).unwrap().unwrap().0.active);
    // Shutdown.
    let mut s = connect(&ts);
    assert_eq!(call(&mut s, &Request::Shutdown), Response::Ok);
    daemon.join().unwrap().unwrap();
    assert_eq!(
        a.state_field(cairn_format::superblock::state::CLEAN)
            .unwrap(),
        1
    );
    assert!(!ts.store.socket_path().exists());
    let log = std::fs::read_to_string(ts.store.daemon_log_path()).unwrap();
    assert!(
        log.contains("client registered") && log.contains("client left"),
        "{log}"
    );
}

#[test]
fn dead_client_and_malformed_client() {
    let ts = TestStore::small();
    let daemon = start(&ts);
    // A client that dies (connection and lock dropped) without goodbye.
    let mut c = Client::register(&ts);
    let ino = c.reg.inodes[0];
    c.append(&create_file(ino, ROOT_INO, b"orphaned-writer"));
    let slot = c.reg.slot;
    drop(c);
    let a = open_area(&ts);
    let t = Instant::now();
    while a.slot_head(slot).unwrap().unwrap().0.active {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "dead client not recovered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lookup(&a, "orphaned-writer"), Some(ino));
    // A client whose log is malformed is refused and its slot released.
    let mut c = Client::register(&ts);
    let ino = c.reg.inodes[0];
    c.append(&create_file(ino, 77_777_777, b"bad"));
    match call(
        &mut c.s,
        &Request::Digest {
            upto_lsn: c.tail,
            wait: true,
        },
    ) {
        Response::Error { errno, message } => {
            assert_eq!(errno, libc::EBADMSG);
            assert!(message.contains("out of range"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(recv::<Response>(&mut c.s).is_err(), "connection closed");
    let (h, _) = SlotHeadOf(&a, c.reg.slot);
    assert!(!h.active);
    assert_eq!(h.head_lsn, c.tail);
    drop(c);
    // Too many clients.
    let _c1 = Client::register(&ts);
    let _c2 = Client::register(&ts);
    let mut s = connect(&ts);
    match call(&mut s, &Request::Register { pid: 1 }) {
        Response::Error { errno, .. } => assert_eq!(errno, libc::EMFILE),
        other => panic!("{other:?}"),
    }
    let mut s = connect(&ts);
    assert_eq!(call(&mut s, &Request::Shutdown), Response::Ok);
    daemon.join().unwrap().unwrap();
    // Live clients' slots stay active across a clean stop, for Reattach.
    assert!(a.slot_head(_c1.reg.slot).unwrap().unwrap().0.active);
    let _ = sys::pid_alive(1);
}

#[allow(non_snake_case)]
fn SlotHeadOf(a: &Area, slot: u32) -> (cairn_format::slot::SlotHead, usize) {
    a.slot_head(slot).unwrap().unwrap()
}

#[test]
fn create_flag_makes_a_store_and_missing_store_is_enoent() {
    let d = tempfile::tempdir().unwrap();
    let e = run_daemon(&DaemonOptions::new(d.path().join("none"))).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::ENOENT);
    let e = crate::offline::mkfs::mkfs(&crate::MkfsOptions {
        log_size: 1000,
        ..crate::MkfsOptions::new(d.path().join("x"))
    })
    .unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EINVAL);
    let ts = TestStore::small();
    let e = crate::offline::mkfs::mkfs(&crate::MkfsOptions::new(&ts.store.path)).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::EEXIST);
    assert!(e.to_string().contains("already exists"));
    // force replaces it and removes the old NVM file.
    let cfg = crate::offline::mkfs::mkfs(&crate::MkfsOptions {
        nvm_size: 32 << 20,
        log_size: 1 << 20,
        force: true,
        ..crate::MkfsOptions::new(&ts.store.path)
    })
    .unwrap();
    assert!(!ts.nvm.exists());
    assert!(cfg.nvm_path.starts_with("/dev/shm"));
    assert_eq!(cfg.inodes, (32 << 20) / 8192);
    let _ = cairn_area::store::remove_nvm_files(&cfg.nvm_path);
}

/// A request of another build of Cairn (here: a variant this daemon does not know) is
/// answered with `EPROTO` and what to do, and the connection stays in step.
#[test]
fn a_request_of_another_build_is_answered_with_eproto() {
    use std::io::Write;
    let ts = TestStore::small();
    let daemon = start(&ts);
    let mut s = connect(&ts);
    // A frame of one byte: variant 100, which no `Request` has.
    s.write_all(&1u32.to_le_bytes()).unwrap();
    s.write_all(&[100]).unwrap();
    match recv(&mut s).unwrap() {
        Response::Error { errno, message } => {
            assert_eq!(errno, libc::EPROTO);
            assert!(message.contains("different builds of Cairn"), "{message}");
            assert!(message.contains("cairn stop"), "{message}");
        }
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        call(&mut s, &Request::Status),
        Response::Status(_)
    ));
    assert_eq!(call(&mut s, &Request::Shutdown), Response::Ok);
    daemon.join().unwrap().unwrap();
}
