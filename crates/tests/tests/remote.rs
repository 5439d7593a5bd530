//! A store whose lower tier is a Ceph RADOS pool (`cairn mkfs --remote`), against a
//! cluster on this machine (`cairn_tests::ceph::Cluster`): data that outgrows NVM
//! migrates into objects and reads back through the daemon; orphan objects (a planted
//! one, and those of rounds the daemon was killed in) are swept; freed segments' objects
//! are removed; an OSD killed, or the whole cluster stopped, loses nothing.

use cairn_proto::StatusReport;
use cairn_tests::ceph::Cluster;
use cairn_tests::harness::{cairn_bin, content, verify_files as verify};
use cairn_tests::TestStore;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

fn remote(r: &StatusReport) -> &cairn_proto::RemoteStatus {
    r.remote.as_deref().expect("a remote tier in the status")
}

fn used(r: &StatusReport, name: &str) -> u64 {
    r.tiers
        .iter()
        .find(|t| t.name == name)
        .map_or(0, |t| t.used_bytes)
}

/// Files `/f0..` of 2 MiB each (version 0), and what they hold.
fn write_files(fs: &cairn::Fs, n: u32) -> BTreeMap<u32, (u32, usize)> {
    (0..n)
        .map(|i| {
            fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
            (i, (0, 2 << 20))
        })
        .collect()
}

/// The store's data objects in the pool (its header aside).
fn data_objects(c: &Cluster, prefix: &str) -> Vec<String> {
    c.objects(prefix)
        .into_iter()
        .filter(|o| !o.ends_with(".header"))
        .collect()
}

/// Wait (up to 30 s) until `cond` holds.
fn eventually(what: &str, cond: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(30), cond)
}

fn eventually_within(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`store`] with operations that give up after `timeout_ms` and NVM's watermarks at
/// 60% and 40%, so that it keeps room for writes while rounds into the cluster fail.
fn store_with_room(c: &Cluster, timeout_ms: u32) -> TestStore {
    let store = store(c);
    store.set_config("remote_timeout_ms", &timeout_ms.to_string());
    store.set_config("migrate_high_pct", "60");
    store.set_config("migrate_low_pct", "40");
    store
}

/// What `cairn status` prints for the store.
fn status_text(store: &TestStore) -> String {
    cairn_tests::harness::output_ok(
        Command::new(cairn_bin())
            .args(["status", "--store"])
            .arg(store.path()),
        "status",
    )
}

/// Wait until migration brought NVM well under its high watermark (60%, as
/// [`store_with_room`] sets it), so that the few MiB of writes that follow have room.
fn nvm_under_high_watermark(fs: &cairn::Fs) {
    eventually("NVM under its high watermark", || {
        let r = fs.status().unwrap();
        let nvm = r.tiers.iter().find(|t| t.name == "nvm").unwrap();
        r.migration.is_none() && nvm.used_bytes * 100 < nvm.capacity_bytes * 60
    });
}

/// 24 MiB of NVM over a remote tier of 1 MiB segments (one object each).
fn store(c: &Cluster) -> TestStore {
    TestStore::with_remote(&c.conf, "24M", "1G", "1M")
}

#[test]
fn a_remote_tier_takes_cold_data_reads_it_back_and_leaves_no_orphans() {
    let Some(c) = Cluster::start("store", 1) else {
        return;
    };
    let store = store(&c);
    let fs = store.fs();
    // 64 MiB: more than twice the NVM tier.
    let mut files = write_files(&fs, 32);
    let r = fs.status().unwrap();
    assert!(used(&r, "remote") >= 32 << 20, "{r:?}");
    let rm = remote(&r);
    assert!(rm.connected && rm.objects_written > 0, "{rm:?}");
    // Read back in this process, and cold from another one (`cairn get`): through the
    // daemon, which read the cluster.
    verify(&fs, &files);
    let out = Command::new(cairn_bin())
        .args(["get", "--store"])
        .arg(store.path())
        .args(["/f0", "-"])
        .output()
        .unwrap();
    assert!(out.status.success() && out.stdout == content(0, 0, 2 << 20));
    let rm = remote(&fs.status().unwrap()).clone();
    assert!(rm.reads > 0 && rm.bytes_read > 0, "{rm:?}");
    let prefix = {
        let any = data_objects(&c, "cairn.");
        let first = any.first().expect("objects in the pool").clone();
        first.splitn(4, '.').take(3).collect::<Vec<_>>().join(".") + "."
    };
    assert_eq!(
        data_objects(&c, &prefix).len() as u64,
        rm.objects,
        "one object per segment in use, nothing else"
    );

    // An orphan (a segment nothing uses, as a round killed before its switch leaves)
    // is removed by the sweep of the next daemon.
    let orphan = format!("{prefix}3ff.1.0");
    c.put(&orphan, b"left by a crash");
    drop(fs);
    store.stop();
    let fs = store.fs();
    // (The status may be asked for between the removal and its count.)
    eventually("the sweep removes the orphan and counts it", || {
        !c.objects(&prefix).contains(&orphan) && remote(&fs.status().unwrap()).orphans_removed >= 1
    });
    drop(fs);

    // The daemon killed while it migrates: nothing acknowledged is lost, and after
    // the next start's sweep the pool holds exactly the segments in use.
    for round in 1..=4u32 {
        let writer = {
            let path = store.path().to_path_buf();
            std::thread::spawn(move || {
                let fs = cairn::Fs::open(&path).unwrap();
                let mut done = Vec::new();
                for i in 0..8u32 {
                    let f = 100 + i;
                    let ok = fs
                        .write(format!("/f{f}"), content(f, round, 1 << 20))
                        .is_ok();
                    done.push((f, ok));
                    if !ok {
                        break;
                    }
                }
                done
            })
        };
        std::thread::sleep(Duration::from_millis(150 * round as u64));
        store.kill_daemon();
        // A write cut off by the kill leaves its file in any state: not checked.
        for (f, ok) in writer.join().unwrap() {
            if ok {
                files.insert(f, (round, 1 << 20));
            } else {
                files.remove(&f);
            }
        }
    }
    let fs = store.fs();
    verify(&fs, &files);
    drop(fs);
    store.stop();
    let fs = store.fs();
    eventually("the pool holds exactly the segments in use", || {
        let objects = remote(&fs.status().unwrap()).objects;
        data_objects(&c, &prefix).len() as u64 == objects
    });
    let log = std::fs::read_to_string(store.path().join("cairnd.log")).unwrap();
    let swept: u64 = log
        .lines()
        .filter_map(|l| {
            l.split("remote tier: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    eprintln!("4 kills during migration: {swept} orphan object(s) swept in all (1 planted)");

    // Files removed: their segments empty and their objects go.
    for i in 0..32 {
        fs.remove_file(format!("/f{i}")).unwrap();
    }
    fs.digest().unwrap();
    eventually("freed segments' objects are removed", || {
        let r = fs.status().unwrap();
        data_objects(&c, &prefix).len() as u64 == remote(&r).objects
            && used(&r, "remote") < 32 << 20
    });
    drop(fs);
    store.fsck_clean();
}

/// The cluster stops answering (every daemon SIGSTOPped, as a partition would): reads
/// of cold data fail with `ETIMEDOUT` within the tier's timeout, never hang; writes go on into NVM; migration to the remote tier
/// pauses (the status says so, with the error) and nothing is switched to an object the
/// cluster did not acknowledge. The cluster back, migration resumes by itself and every
/// file reads back.
#[test]
fn an_unreachable_cluster_pauses_migration_until_it_returns() {
    let Some(c) = Cluster::start("down", 1) else {
        return;
    };
    // NVM keeps room above its high watermark for writes while the cluster is away.
    // Operations give up after 5 s.
    let store = store_with_room(&c, 5000);
    let fs = store.fs();
    let mut files = write_files(&fs, 16);
    // Nothing left in the log: a block the log writes only part of is read back
    // whole by the digest, and the cluster could by then hold it.
    fs.digest().unwrap();
    let r = fs.status().unwrap();
    assert!(used(&r, "remote") > 0, "{r:?}");
    // The writes below need the room (the last round may still run here).
    nvm_under_high_watermark(&fs);
    c.pause();
    // Cold data: an error in about the timeout. (The first file went to the cluster
    // first; the cache holds nothing of it yet.)
    let t0 = Instant::now();
    let e = fs.read("/f0").unwrap_err();
    assert_eq!(
        e.raw_os_error().or(Some(cairn_area::errno_of(&e))),
        Some(libc::ETIMEDOUT),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    // Writes go on while NVM has room; once they take it past the high watermark (60%),
    // migration fails and pauses. (How far under it migration left NVM varies: write
    // until past it, 65%, well short of full.)
    let nvm_pct = || {
        let r = fs.status().unwrap();
        let nvm = r.tiers.iter().find(|t| t.name == "nvm").unwrap();
        nvm.used_bytes * 100 / nvm.capacity_bytes
    };
    for i in 16..32u32 {
        if nvm_pct() >= 65 {
            break;
        }
        fs.write(format!("/f{i}"), content(i, 0, 1 << 20)).unwrap();
        fs.digest().unwrap();
        files.insert(i, (0, 1 << 20));
    }
    assert!(nvm_pct() >= 60, "NVM at {}%", nvm_pct());
    eventually("migration to the remote tier pauses", || {
        let r = fs.status().unwrap();
        let rm = remote(&r);
        rm.paused && rm.last_error.is_some()
    });
    let r = fs.status().unwrap();
    let text = status_text(&store);
    assert!(text.contains("paused after a failure"), "{text}");
    eprintln!(
        "cluster down: {}",
        remote(&r).last_error.as_deref().unwrap_or_default()
    );
    // Back: the policy retries once the pause ends, with no new write. After a run of
    // failures the pause is up to 30 s (it doubles from 1 s), and a round in flight may
    // still wait out its 5 s timeout: the first round after the resume can take as long.
    let before = remote(&r).objects_written;
    c.resume();
    eventually_within(
        "migration resumes by itself",
        Duration::from_secs(75),
        || {
            let r = fs.status().unwrap();
            !remote(&r).paused && remote(&r).objects_written > before
        },
    );
    verify(&fs, &files);
    drop(fs);
    store.fsck_clean();
}

/// Three OSDs, three replicas (two needed to write): one OSD killed with SIGKILL while
/// data migrates into the cluster, another client reads cold files and a backup runs.
/// Every round finishes after the stall, no read fails, and every file reads back, with
/// the OSD down and after it came back; the backup taken meanwhile restores a store
/// that holds every file written before it.
#[test]
fn an_osd_killed_during_migration_and_cold_reads_loses_nothing() {
    let Some(c) = Cluster::start("osdkill", 3) else {
        return;
    };
    let store = store(&c);
    // No caches: every cold read goes to the cluster.
    store.set_config("read_cache_mib", "0");
    store.set_config("remote_cache_mib", "0");
    let fs = store.fs();
    let mut files = write_files(&fs, 16);
    let cold = files.clone();
    let reader = {
        let path = store.path().to_path_buf();
        std::thread::spawn(move || {
            let fs = cairn::Fs::open(&path).unwrap();
            let t0 = Instant::now();
            let mut slowest = Duration::ZERO;
            while t0.elapsed() < Duration::from_secs(8) {
                let t = Instant::now();
                verify(&fs, &cold);
                slowest = slowest.max(t.elapsed());
            }
            slowest
        })
    };
    let mut slowest = Duration::ZERO;
    let mut backup = None;
    for i in 16..40u32 {
        if i == 20 {
            c.run("kill-osd", 1);
            let path = store.path().to_path_buf();
            backup = Some(std::thread::spawn(move || {
                cairn::daemon_backup(Some(&path), None).expect("a backup with an OSD down")
            }));
        }
        let t = Instant::now();
        fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
        slowest = slowest.max(t.elapsed());
        files.insert(i, (0, 2 << 20));
    }
    let read_pass = reader.join().expect("every cold read succeeded");
    let r = fs.status().unwrap();
    assert!(remote(&r).bytes_read >= 64 << 20, "{:?}", remote(&r));
    assert!(used(&r, "remote") >= 40 << 20, "{r:?}");
    verify(&fs, &files);
    c.run("start-osd", 1);
    verify(&fs, &files);
    eprintln!(
        "one OSD of 3 killed: slowest 2 MiB write {slowest:?}, slowest pass over the cold \
         files {read_pass:?}"
    );
    drop(fs);
    store.fsck_clean();
    // The backup taken with the OSD down restores.
    let b = backup
        .expect("started")
        .join()
        .expect("the backup finished");
    let id = store_id(&c, b.taken_ns);
    let before: BTreeMap<u32, (u32, usize)> = files.into_iter().filter(|&(i, _)| i < 20).collect();
    store.kill_daemon();
    let restored = restore(&c, &id);
    verify(&restored.fs(), &before);
}

/// A full cluster (its full ratio lowered under what it holds): migration into it fails
/// with `ENOSPC` and the cluster's health in the status, not a bare timeout; writes to
/// NVM go on; `mkfs --remote` into it is refused at once; once the cluster has room,
/// migration resumes by itself and every file reads back.
#[test]
fn a_full_cluster_is_a_clear_error_and_migration_resumes_after_it() {
    let Some(c) = Cluster::start("full", 1) else {
        return;
    };
    let store = store_with_room(&c, 3000);
    let fs = store.fs();
    let mut files = write_files(&fs, 8);
    nvm_under_high_watermark(&fs);
    // Full at 4% of the OSD's 1 GiB: more than it holds once 48 MiB more are in.
    for (what, ratio) in [
        ("set-nearfull-ratio", "0.02"),
        ("set-backfillfull-ratio", "0.03"),
        ("set-full-ratio", "0.04"),
    ] {
        c.ceph(&["osd", what, ratio]);
    }
    for i in 0..3 {
        c.put(&format!("filler.{i}"), &vec![7u8; 16 << 20]);
    }
    // Full, not only nearfull or backfillfull (which contain "full" too: waiting for
    // those let a migration in before the OSD refused writes).
    eventually("the cluster says it is full", || {
        c.ceph(&["health"])
            .split(|ch: char| !ch.is_ascii_alphanumeric())
            .any(|w| w == "full")
    });
    // NVM keeps taking writes; a migration into the cluster fails as full.
    for i in 8..10u32 {
        fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
        files.insert(i, (0, 2 << 20));
    }
    fs.digest().unwrap();
    let out = Command::new(cairn_bin())
        .args(["migrate", "--tier", "nvm", "--free", "4M", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is full") && err.contains("No space left"),
        "{err}"
    );
    let text = status_text(&store);
    assert!(text.contains("is full"), "{text}");
    // A new store into the full pool: refused at once, with the reason.
    let dir = tempfile::tempdir().unwrap();
    let nvm = std::path::Path::new("/dev/shm")
        .join(format!("cairn-test-full-{}.nvm", std::process::id()));
    let t = Instant::now();
    let out = Command::new(cairn_bin())
        .args(["mkfs", "--store"])
        .arg(dir.path().join("s"))
        .args(["--nvm-size", "64M", "--nvm-path"])
        .arg(&nvm)
        .args(["--remote", "ceph:cairn", "--ceph-conf"])
        .arg(&c.conf)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is full"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(!nvm.exists(), "a refused mkfs leaves no NVM file");
    // Room again: once the pause ends, migration into the cluster works.
    c.ceph(&["osd", "set-full-ratio", "0.95"]);
    c.ceph(&["osd", "set-backfillfull-ratio", "0.90"]);
    c.ceph(&["osd", "set-nearfull-ratio", "0.85"]);
    eventually("migration works once the cluster has room", || {
        cairn::daemon_migrate(Some(store.path()), 0, 3, 4 << 20).is_ok_and(|(n, _)| n > 0)
    });
    verify(&fs, &files);
    drop(fs);
    store.fsck_clean();
}

/// `cairn restore --store DIR` of the pool's backup of store `id`, into a new test
/// store (its NVM file in /dev/shm, removed with it), checked by `cairn fsck` first.
/// The store's daemon was killed a moment ago: without `--force`, restore refuses (its
/// heartbeat is fresh) and makes nothing.
fn restore(c: &Cluster, id: &str) -> TestStore {
    let dir = tempfile::Builder::new()
        .prefix("cairn-test-")
        .tempdir()
        .unwrap();
    let nvm = std::path::Path::new("/dev/shm").join(format!(
        "{}.nvm",
        dir.path().file_name().unwrap().to_string_lossy()
    ));
    let cmd = || {
        let mut cmd = Command::new(cairn_bin());
        cmd.arg("--store").arg(dir.path());
        cmd.args(["restore", "--remote", "ceph:cairn", "--id", id]);
        cmd.arg("--ceph-conf")
            .arg(&c.conf)
            .arg("--nvm-path")
            .arg(&nvm);
        cmd
    };
    let refused = cmd().output().unwrap();
    let text = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && text.contains("still runs"),
        "{text}"
    );
    assert!(!nvm.exists(), "a refused restore makes nothing");
    let out = cairn_tests::harness::output_ok(cmd().arg("--force"), "restore --force");
    assert!(out.contains("restored store"), "{out}");
    cairn_tests::harness::output_ok(
        Command::new(cairn_bin())
            .args(["fsck", "--store"])
            .arg(dir.path()),
        "fsck of the restored store",
    );
    TestStore { dir }
}

fn backup_now(store: &TestStore) -> cairn_proto::BackupReport {
    cairn::daemon_backup(Some(store.path()), None).expect("backup")
}

/// The store's id, from `cairn restore --list` (its newest backup's manifest).
fn store_id(c: &Cluster, taken_ns: i64) -> String {
    let out = cairn_tests::harness::output_ok(
        Command::new(cairn_bin())
            .args([
                "restore",
                "--remote",
                "ceph:cairn",
                "--list",
                "--json",
                "--ceph-conf",
            ])
            .arg(&c.conf),
        "restore --list",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|m| m["taken_ns"].as_i64() == Some(taken_ns))
        .expect("the backup is listed")["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The machine is lost (its daemon killed, its store directory and NVM file deleted)
/// after a backup: the store restored from the pool on "another machine" (a new
/// directory and NVM file) is clean and holds every file the backup holds, including
/// files removed after it, whose remote objects the backup kept. Then a store whose
/// lower tier is a local SSD (its segments copied into the pool), with backups every
/// second.
#[test]
fn a_store_lost_with_its_machine_is_restored_from_its_backup() {
    let Some(c) = Cluster::start("backup", 1) else {
        return;
    };
    let store = store(&c);
    let fs = store.fs();
    let files = write_files(&fs, 32);
    fs.create_dir("/d").unwrap();
    fs.symlink("/f1", "/d/link").unwrap();
    fs.set_xattr("/f2", b"user.kept", b"across machines", 0, true)
        .unwrap();
    assert!(used(&fs.status().unwrap(), "remote") >= 32 << 20);
    let b1 = backup_now(&store);
    assert!(
        b1.seq == 1 && b1.remote_segments > 0 && b1.objects_written > 0,
        "{b1:?}"
    );
    // After the backup: files whose data is in the remote tier removed (their segments
    // empty; the backup keeps their objects), a new file (not in the backup).
    for i in 0..8 {
        fs.remove_file(format!("/f{i}")).unwrap();
    }
    fs.write("/late", b"after the backup").unwrap();
    fs.digest().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    drop(fs);
    store.kill_daemon();
    let id = store_id(&c, b1.taken_ns);
    let nvm = cairn_area::StoreDir::new(store.path())
        .load_config()
        .unwrap()
        .nvm_path;
    assert!(cairn_area::store::remove_nvm_files(&nvm).unwrap().len() > 1);
    std::fs::remove_dir_all(store.path()).unwrap();
    drop(store);

    let restored = restore(&c, &id);
    let fs = restored.fs();
    verify(&fs, &files);
    assert_eq!(
        fs.read_link("/d/link").unwrap(),
        std::path::Path::new("/f1")
    );
    assert_eq!(
        fs.get_xattr("/f2", b"user.kept", true).unwrap(),
        b"across machines"
    );
    // The next backup writes only what changed.
    fs.write("/new", b"on the new machine").unwrap();
    let b2 = backup_now(&restored);
    assert!(b2.seq == 2 && b2.objects_kept > 0, "{b2:?}");
    assert!(b2.objects_written < b2.objects, "{b2:?}");
    drop(fs);
    restored.fsck_clean();
    drop(restored);

    // A store with a local SSD tier: its segments in use are copied.
    let local = TestStore::with_size(cairn_tests::harness::StoreSize {
        nvm: "24M",
        log: "1M",
        clients: 4,
        inodes: Some(2048),
        tiers: Some(cairn_tests::harness::Tiers {
            ssd: "256M",
            ssd_device: None,
            hdd: None,
            segment: "1M",
        }),
    });
    local.set_config("backup_remote", "\"ceph:cairn\"");
    local.set_config("ceph_conf", &format!("{:?}", c.conf.display().to_string()));
    local.set_config("backup_interval_s", "1");
    let fs = local.fs();
    let mut files = BTreeMap::new();
    for i in 0..24u32 {
        fs.write(format!("/f{i}"), content(i, 1, 2 << 20)).unwrap();
        files.insert(i, (1, 2 << 20));
    }
    assert!(used(&fs.status().unwrap(), "ssd") >= 16 << 20);
    // Backups every second: one that holds all of it comes.
    let t = cairn_area::time::now_ns();
    let mut last = None;
    eventually("a periodic backup after the writes", || {
        last = fs.status().unwrap().backup.filter(|b| b.taken_ns > t);
        last.is_some()
    });
    let b = *last.unwrap();
    eprintln!("periodic backup: {b:?}");
    drop(fs);
    local.kill_daemon();
    let id = store_id(&c, b.taken_ns);
    drop(local);
    let restored = restore(&c, &id);
    let fs = restored.fs();
    verify(&fs, &files);
    drop(fs);
    restored.fsck_clean();
}
