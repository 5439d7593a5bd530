//! Bad input never panics the daemon and never loses a committed write: a client that
//! logs garbage is refused and the shared area is untouched; a corrupted image is
//! refused with a clear error; a full tier gives ENOSPC and recovers when space is freed.

use cairn_format::log::{self, Record};
use cairn_format::BLOCK_SIZE;
use cairn_proto::Response;
use cairn_tests::harness::StoreSize;
use cairn_tests::raw::RawClient;
use cairn_tests::TestStore;

fn attrs(kind: cairn_format::inode::Kind) -> cairn_format::inode::Attrs {
    cairn_format::inode::Attrs {
        kind,
        perm: 0o644,
        nlink: 1,
        ..Default::default()
    }
}

/// Builds the bytes a malicious client logs.
type MakeLog = Box<dyn Fn(&RawClient) -> Vec<u8>>;

#[test]
fn garbage_logs_are_refused_and_leave_the_shared_area_untouched() {
    let store = TestStore::new();
    {
        let fs = store.fs();
        fs.write("/keep", b"committed before the attack").unwrap();
    }
    let seq = |c: &RawClient| c.reg.head_seq;
    let cases: Vec<(&str, MakeLog)> = vec![
        (
            "random bytes",
            Box::new(|_| {
                (0..4096u32)
                    .map(|i| (i.wrapping_mul(2654435761u32) >> 13) as u8)
                    .collect()
            }),
        ),
        (
            "wrong sequence",
            Box::new(move |c| log::build_txn(seq(c) + 5, &[])),
        ),
        (
            "bad crc",
            Box::new(move |c| {
                let mut t = log::build_txn(
                    seq(c),
                    &[Record::InodeSet {
                        ino: 9,
                        generation: 1,
                        attrs: attrs(cairn_format::inode::Kind::File),
                    }],
                );
                t[40] ^= 0xff;
                t
            }),
        ),
        (
            "inode out of range",
            Box::new(move |c| {
                log::build_txn(
                    seq(c),
                    &[Record::InodeSet {
                        ino: u64::MAX / 2,
                        generation: 1,
                        attrs: attrs(cairn_format::inode::Kind::File),
                    }],
                )
            }),
        ),
        (
            "entry to a missing inode",
            Box::new(move |c| {
                log::build_txn(
                    seq(c),
                    &[Record::DirentSet {
                        dir: 1,
                        name: b"ghost",
                        ino: 4000,
                        kind: cairn_format::inode::Kind::File,
                    }],
                )
            }),
        ),
        (
            "entry in a non-directory",
            Box::new(move |c| {
                log::build_txn(
                    seq(c),
                    &[Record::DirentSet {
                        dir: 999_999_999,
                        name: b"x",
                        ino: 1,
                        kind: cairn_format::inode::Kind::Dir,
                    }],
                )
            }),
        ),
        (
            "write to a free inode",
            Box::new(move |c| {
                log::build_txn(
                    seq(c),
                    &[Record::Write {
                        ino: 3000,
                        offset: 0,
                        size: 3,
                        mtime: 0,
                        data: b"abc",
                    }],
                )
            }),
        ),
    ];
    for (what, make) in cases {
        drop(store.fs()); // make sure a daemon runs
        let mut c = RawClient::connect(store.path());
        let bytes = make(&c);
        let r = c.log_bytes_and_digest(&bytes);
        assert!(
            matches!(r, Response::Error { .. }),
            "{what}: expected a refusal, got {r:?}"
        );
        // The daemon is alive and the committed data is intact.
        let fs = store.fs();
        assert_eq!(
            fs.read("/keep").unwrap(),
            b"committed before the attack",
            "{what}"
        );
        assert!(!fs.exists("/ghost"), "{what}");
        assert!(!fs.exists("/x"), "{what}");
        let st = fs.status().unwrap();
        assert_eq!(st.tiers[0].name, "nvm");
    }
    assert!(
        store.daemon_pid().is_some(),
        "the daemon survived every bad log"
    );
}

#[test]
fn corrupted_superblock_is_refused_with_a_clear_error() {
    let store = TestStore::new();
    {
        store.fs().write("/f", b"x").unwrap();
    }
    store.stop();
    let cfg = cairn_area::StoreDir::new(store.path())
        .load_config()
        .unwrap();
    let mut img = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cfg.nvm_path)
        .unwrap();
    use std::io::{Seek, SeekFrom, Write};
    img.seek(SeekFrom::Start(20)).unwrap();
    img.write_all(&[0xff; 8]).unwrap();
    drop(img);
    let out = std::process::Command::new(cairn_tests::harness::cairn_bin())
        .args(["daemon", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr) + String::from_utf8_lossy(&out.stdout);
    assert!(
        err.contains("superblock"),
        "error names the damaged structure: {err}"
    );
    assert!(!err.contains("panicked"), "no panic: {err}");
}

#[test]
fn full_tier_gives_enospc_and_recovers() {
    let store = TestStore::with_size(StoreSize {
        nvm: "64M",
        log: "1M",
        clients: 2,
        inodes: Some(1024),
        tiers: None,
    });
    let fs = store.fs();
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    let f = cairn::File::create(&fs, "/big").unwrap();
    let err = loop {
        match f.write_at(&chunk, written) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(written < 64 << 20, "wrote more than the tier holds");
    };
    assert_eq!(cairn_area::errno_of(&err), libc::ENOSPC, "{err}");
    assert!(written > 16 << 20, "only {written} bytes fit");
    // Everything acknowledged is readable, also by a new client.
    drop(f);
    drop(fs);
    let fs = store.fs();
    let data = fs.read("/big").unwrap();
    assert_eq!(data.len() as u64, written);
    assert!(data.iter().all(|&b| b == 0x5a));
    // Freeing space makes the store writable again.
    fs.remove_file("/big").unwrap();
    fs.digest().unwrap();
    fs.write("/after", &chunk).unwrap();
    assert_eq!(fs.read("/after").unwrap(), chunk);
    let _ = BLOCK_SIZE;
}

/// Random damage to inodes, map nodes, directory buckets and data: the daemon starts (an
/// unclean start walks every structure), answers, and stays up; reads give data or an
/// error, never a crash.
#[test]
fn random_damage_to_the_shared_area_never_crashes_the_daemon() {
    use cairn_tests::{snapshot, CairnFs};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xBAD5EED);
    for round in 0..6 {
        let store = TestStore::new();
        {
            let fs = store.fs();
            for d in 0..8 {
                fs.create_dir_all(format!("/d{d}/sub")).unwrap();
                for f in 0..40 {
                    let data = vec![(d * 40 + f) as u8; 100 + f * 700];
                    fs.write(format!("/d{d}/f{f}"), &data).unwrap();
                }
                fs.symlink("../d0/f1", format!("/d{d}/link")).unwrap();
            }
        }
        store.stop();
        let cfg = cairn_area::StoreDir::new(store.path())
            .load_config()
            .unwrap();
        let nvm = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&cfg.nvm_path)
            .unwrap();
        let layout = cairn_area::Area::open(&nvm, false)
            .unwrap()
            .layout()
            .to_owned();
        let map =
            cairn_media::Mapping::new(&nvm, 0, (layout.total_blocks * 4096) as usize, true, false)
                .unwrap();
        // Damage: inode table and the used part of the data region.
        let inodes = (layout.inode_start * 4096, 64 * 256 * 8);
        let data = (layout.data_start * 4096, 4096 * 600);
        for _ in 0..(20 << round) {
            let (base, len) = if rng.gen_bool(0.5) { inodes } else { data };
            let off = base + rng.gen_range(0..len as u64);
            map.write(off as usize, &[rng.gen()]).unwrap();
        }
        // Force an unclean start: recovery rebuilds by walking everything.
        map.store_u64(4096 + cairn_format::superblock::state::CLEAN, 0)
            .unwrap();
        drop(map);
        // The daemon may refuse the store or serve it; either way it must not crash,
        // and a refusal must say why.
        match cairn::Fs::open(store.path()) {
            Ok(fs) => {
                let _ = snapshot(&CairnFs { fs: &fs }, "/");
                for d in 0..8 {
                    let _ = fs.read(format!("/d{d}/f3"));
                    let _ = fs.read_dir(format!("/d{d}")).map(|r| r.count());
                    let _ = fs.write(format!("/d{d}/new"), b"x");
                }
                drop(fs);
                assert!(
                    store.daemon_pid().is_some(),
                    "round {round}: the daemon died"
                );
                assert!(
                    cairn::daemon_status(Some(store.path())).is_ok(),
                    "round {round}: no status"
                );
            }
            Err(e) => {
                let log =
                    std::fs::read_to_string(store.path().join("cairnd.log")).unwrap_or_default();
                assert!(!log.contains("panic"), "round {round}: {log}");
                assert!(!e.to_string().is_empty());
            }
        }
        let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap_or_default();
        assert!(
            !log.contains("panic"),
            "round {round}: the daemon panicked:\n{log}"
        );
    }
}

/// Fail-stop: a panic in the daemon (here a planted one, in checked builds) is written to
/// `cairnd.log` with its source location and stops the process at once; the client gets
/// an error, and the next daemon (started by the client) recovers the store from the
/// logs with nothing acknowledged lost.
#[test]
fn a_panic_stops_the_daemon_and_the_next_one_recovers() {
    if !cfg!(debug_assertions) {
        eprintln!("skipped: the planted panic exists in checked builds only (the ci profile)");
        return;
    }
    let store = TestStore::new();
    store.stop();
    let mut daemon = std::process::Command::new(cairn_tests::harness::cairn_bin())
        .args(["daemon", "--store"])
        .arg(store.path())
        .env("CAIRN_TEST_DAEMON_PANIC", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !store.path().join("cairnd.sock").exists() {
        assert!(t.elapsed().as_secs() < 10, "the daemon did not start");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let fs = store.fs();
    fs.write("/acked", b"durable before the panic").unwrap();
    cairn::daemon_status(Some(store.path())).expect_err("status answered");
    let st = daemon.wait().unwrap();
    assert!(!st.success(), "the daemon went on after the panic: {st}");
    let log_path = store.path().join("cairnd.log");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("internal error"))
        .unwrap_or_else(|| panic!("no internal error logged: {log}"));
    assert!(
        line.contains("planted by CAIRN_TEST_DAEMON_PANIC") && line.contains("requests.rs"),
        "{line}"
    );
    // The client goes on with a new daemon, which recovered the store.
    fs.write("/after", b"written to the next daemon").unwrap();
    assert_eq!(fs.read("/acked").unwrap(), b"durable before the panic");
    drop(fs);
    let fs = store.fs();
    assert_eq!(fs.read("/acked").unwrap(), b"durable before the panic");
    assert_eq!(fs.read("/after").unwrap(), b"written to the next daemon");
    drop(fs);
    // What the harness reports as a failure when a test does not expect it.
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::write(&log_path, log.replace("internal error", "planted error")).unwrap();
}

/// One process opens 10,000 connections to the daemon and holds them: a quarter idle,
/// a quarter with half a request sent, a quarter with a status request whose answer it
/// never reads, a quarter announcing a request of 1 GiB; eight more that ask for
/// thousands of status reports without reading them, and sixteen that send an empty or
/// a garbage request. The daemon holds them without
/// a thread each (at most two per log slot and a few more serve requests), closes the
/// oversized ones, and another client is served meanwhile; afterwards the daemon is the
/// same process and the store is intact.
#[test]
fn ten_thousand_held_connections_leave_other_clients_served() {
    use cairn_tests::harness::{allow_open_files, proc_status};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};
    const N: usize = 10_000;
    let store = TestStore::with_size(StoreSize {
        nvm: "256M",
        log: "1M",
        clients: 8,
        inodes: None,
        tiers: None,
    });
    let fs = store.fs();
    fs.write("/before", b"written before").unwrap();
    let pid = store.daemon_pid().expect("a daemon");
    let threads = || proc_status(pid, "Threads").expect("the daemon lives");
    let base = threads();
    allow_open_files(N as u64);
    let sock = cairn_area::StoreDir::new(store.path()).socket_path();
    // The daemon's bound: its own threads, and at most two workers per log slot (a
    // client's connection and its upcall channel) and 16 more for requests of
    // connections that are no client's (`base` counts two workers already: `fs`'s).
    let bound = base + 2 * 8 + 16;
    let (mut peak, rss_before) = (base, proc_status(pid, "VmRSS").unwrap());
    let t = Instant::now();
    let mut held = Vec::with_capacity(N);
    for i in 0..N {
        let mut s = UnixStream::connect(&sock).unwrap();
        match i % 4 {
            0 => {}
            1 => s.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap(),
            2 => cairn_proto::send(&mut s, &cairn_proto::Request::Status).unwrap(),
            _ => s.write_all(&(1u32 << 30).to_le_bytes()).unwrap(),
        }
        held.push(s);
        if i % 500 == 0 {
            peak = peak.max(threads());
        }
    }
    // Eight more ask for a status 2,000 times each and read nothing: the answers fill
    // the socket, and the daemon gives each up after 10 s instead of holding a thread.
    for _ in 0..8 {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_nonblocking(true).unwrap();
        let mut req = Vec::new();
        cairn_proto::send(&mut req, &cairn_proto::Request::Status).unwrap();
        for _ in 0..2000 {
            if s.write_all(&req).is_err() {
                break;
            }
        }
        held.push(s);
    }
    // And sixteen with requests that are empty or garbage: closed, each on its thread.
    for i in 0..16u8 {
        let mut s = UnixStream::connect(&sock).unwrap();
        let bad: &[u8] = if i % 2 == 0 {
            &[0, 0, 0, 0]
        } else {
            &[3, 0, 0, 0, 0xff, 0xff, i]
        };
        s.write_all(bad).unwrap();
        held.push(s);
    }
    let opened = t.elapsed();
    // Another client, meanwhile: a new one registers, writes, syncs and reads back.
    let t = Instant::now();
    {
        let other = store.fs();
        other
            .write("/during", b"written while 10,000 were held")
            .unwrap();
        assert_eq!(other.read("/before").unwrap(), b"written before");
    }
    let served = t.elapsed();
    cairn_tests::harness::output_ok(
        std::process::Command::new(cairn_tests::harness::cairn_bin())
            .args(["status", "--store"])
            .arg(store.path()),
        "cairn status",
    );
    // Idle workers stay a while (30 s) for the next requests; never more than the bound.
    for _ in 0..20 {
        peak = peak.max(threads());
        std::thread::sleep(Duration::from_millis(50));
    }
    let rss = proc_status(pid, "VmRSS").unwrap();
    eprintln!(
        "{N} connections opened in {opened:?}; daemon threads {base} before, peak {peak}; \
         RSS {rss_before} -> {rss} KiB; another client served in {served:?}"
    );
    assert!(peak <= bound, "{peak} daemon threads (bound {bound})");
    // A status request's answer is waiting, unread; the 1 GiB announcements were closed.
    let mut s = &held[2];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    match cairn_proto::recv::<cairn_proto::Response>(&mut s).unwrap() {
        cairn_proto::Response::Status(_) => {}
        r => panic!("{r:?}"),
    }
    let mut s = &held[3];
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(s.read(&mut [0u8; 16]).unwrap(), 0, "closed by the daemon");
    drop(held);
    assert_eq!(store.daemon_pid(), Some(pid), "the same daemon");
    assert_eq!(
        fs.read("/during").unwrap(),
        b"written while 10,000 were held"
    );
    fs.write("/after", b"and after").unwrap();
    drop(fs);
    store.fsck_clean();
}

/// A daemon whose store directory goes away (removed, or here moved elsewhere) stops
/// by itself within seconds, instead of running for good with the store's memory (as
/// a test that removes its store while a daemon serves it would leave one), and at
/// once, as if killed, writing nothing more to files that may be another store's by
/// then: back in place, the store recovers as after a crash, whole.
#[test]
fn a_daemon_whose_store_directory_goes_away_stops() {
    let store = TestStore::new();
    store.fs().write("/f", b"kept").unwrap();
    let pid = store.daemon_pid().expect("a daemon serves the store");
    let away = store.path().with_extension("away");
    std::fs::rename(store.path(), &away).unwrap();
    let t = std::time::Instant::now();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    };
    while alive() && t.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let gone_after = t.elapsed();
    std::fs::rename(&away, store.path()).unwrap();
    assert!(
        !alive(),
        "the daemon still runs 20 s after its store went away"
    );
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    assert!(
        log.contains("was removed or replaced: exiting at once"),
        "{log}"
    );
    eprintln!("the daemon stopped {gone_after:?} after its store went away");
    // Back in place, the store is whole and served by a new daemon.
    assert_eq!(store.fs().read("/f").unwrap(), b"kept");
    store.fsck_clean();
}

/// `cairn stop` returns once the daemon's process has exited, not only once its lock is
/// free: a script may replace the daemon's binary right after it (no `ETXTBSY`).
#[test]
fn stop_returns_once_the_daemon_process_has_exited() {
    let store = TestStore::new();
    drop(store.fs());
    let pid = store.daemon_pid().expect("the daemon runs");
    let out = std::process::Command::new(cairn_tests::harness::cairn_bin())
        .arg("--store")
        .arg(store.path())
        .arg("stop")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        !cairn_media::owner::running(pid),
        "daemon {pid} still running after `cairn stop` returned"
    );
}
