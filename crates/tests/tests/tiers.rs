//! Cross-media tiers: data that outgrows NVM moves to the SSD and HDD tiers in whole
//! segments and reads back intact; the daemon killed during migration and cleaning loses
//! nothing acknowledged and leaks no space; a full store fails writes with `ENOSPC` and
//! takes them again once space is freed.

use cairn_proto::{StatusReport, TierStatus};
use cairn_tests::harness::{content, verify_files as verify, StoreSize, Tiers};

use cairn_tests::TestStore;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn tier<'a>(r: &'a StatusReport, name: &str) -> &'a TierStatus {
    r.tiers.iter().find(|t| t.name == name).unwrap()
}

/// Three tiers with 1 MiB segments; NVM holds about 19 MiB of data.
fn three_tiers(ssd: &'static str, hdd: &'static str) -> TestStore {
    three_tiers_with(ssd, hdd, "1M")
}

fn three_tiers_with(ssd: &'static str, hdd: &'static str, segment: &'static str) -> TestStore {
    TestStore::with_size(StoreSize {
        nvm: "24M",
        log: "1M",
        clients: 4,
        inodes: Some(2048),
        tiers: Some(Tiers {
            ssd,
            ssd_device: None,
            hdd: Some(hdd),
            segment,
        }),
    })
}

/// Per-tier accounting as `cairn status` reports it.
fn accounting(r: &StatusReport) -> Vec<(String, u64, u64, u64)> {
    r.tiers
        .iter()
        .map(|t| (t.name.clone(), t.used_bytes, t.live_bytes, t.segments_free))
        .collect()
}

/// The accounting after a clean restart (the saved allocation state) must equal the one
/// after a SIGKILL (rebuilt by walking every file map): no space leaks.
fn check_accounting_equals_full_scan(store: &TestStore) {
    // No background migration or cleaning between the two reports.
    store.set_config("background_migration", "false");
    store.stop();
    let saved = cairn::daemon_status(Some(store.path())).unwrap();
    assert!(store.kill_daemon(), "no daemon runs");
    let scanned = cairn::daemon_status(Some(store.path())).unwrap();
    assert_eq!(
        accounting(&saved),
        accounting(&scanned),
        "the saved accounting differs from a full scan"
    );
    store.set_config("background_migration", "true");
    store.stop();
}

#[test]
fn working_set_four_times_nvm_spans_three_tiers() {
    let store = three_tiers("48M", "160M");
    let fs = store.fs();
    let mut files = BTreeMap::new();
    // 96 MiB: four times the NVM tier.
    for i in 0..48u32 {
        fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
        files.insert(i, (0, 2 << 20));
    }
    // Rewrite every third file (their old copies are in the lower tiers by now), and
    // read the others back meanwhile.
    for i in (0..48u32).step_by(3) {
        let len = (1 << 20) + 4096 * i as usize + 100;
        fs.write(format!("/f{i}"), content(i, 1, len)).unwrap();
        files.insert(i, (1, len));
    }
    verify(&fs, &files);
    let r = fs.status().unwrap();
    for t in ["ssd", "hdd"] {
        assert!(
            tier(&r, t).live_bytes > 0,
            "no data reached the {t} tier: {r:?}"
        );
    }
    assert!(tier(&r, "nvm").bytes_migrated_down >= 64 << 20, "{r:?}");
    assert!(tier(&r, "ssd").bytes_migrated_down > 0, "{r:?}");
    // The coldest file is on the HDD by now: a second read is served by the DRAM cache,
    // and the first one read ahead (fewer misses than blocks).
    let _ = fs.read("/f1").unwrap();
    let (hits, misses, read) = fs.read_cache_stats().expect("a read cache");
    assert!(misses > 0 && read >= misses, "{hits} {misses} {read}");
    assert!(
        misses * 8 < read,
        "no read-ahead: {misses} misses, {read} blocks read"
    );
    assert_eq!(fs.read("/f1").unwrap(), content(1, 0, 2 << 20));
    let (hits2, misses2, read2) = fs.read_cache_stats().unwrap();
    assert!(hits2 >= hits + 512, "{hits} -> {hits2}");
    assert_eq!((misses2, read2), (misses, read));
    drop(fs);
    check_accounting_equals_full_scan(&store);
    verify(&store.fs(), &files);
}

#[test]
fn chunks_of_one_file_move_in_any_order() {
    // Each file's 1 MiB chunks are written last to first, in separate digests, so the
    // coldest chunk of a file is its last one and migration meets a file's blocks out of
    // file order (4 MiB segments: a round moves several chunks).
    let store = three_tiers_with("48M", "160M", "4M");
    let fs = store.fs();
    let mut files = BTreeMap::new();
    for i in 0..12u32 {
        let data = content(i, 0, 8 << 20);
        let f = cairn::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&fs, format!("/f{i}").as_str())
            .unwrap();
        for c in (0..8usize).rev() {
            let part = &data[c << 20..(c + 1) << 20];
            let mut done = 0;
            while done < part.len() {
                done += f
                    .write_at(&part[done..], ((c << 20) + done) as u64)
                    .unwrap();
            }
            fs.digest().unwrap();
        }
        files.insert(i, (0, 8 << 20));
    }
    verify(&fs, &files);
    let r = fs.status().unwrap();
    assert!(
        tier(&r, "nvm").bytes_migrated_down >= 32 << 20,
        "{:?}",
        r.tiers
    );
    drop(fs);
    check_accounting_equals_full_scan(&store);
    verify(&store.fs(), &files);
}

/// A loop device over a file in the store's temporary directory (detached at drop).
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

#[test]
fn a_block_device_tier_works() {
    // Root and loop devices are needed (this machine and CI have both).
    if !std::path::Path::new("/dev/loop-control").exists() {
        eprintln!("skipped: no /dev/loop-control");
        return;
    }
    let img = tempfile::NamedTempFile::new().unwrap();
    img.as_file().set_len(48 << 20).unwrap();
    let out = std::process::Command::new("losetup")
        .args(["-f", "--show"])
        .arg(img.path())
        .output()
        .expect("run losetup");
    assert!(
        out.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dev = Loop(String::from_utf8_lossy(&out.stdout).trim().to_string());
    let store = TestStore::with_size(StoreSize {
        nvm: "24M",
        log: "1M",
        clients: 4,
        inodes: Some(2048),
        tiers: Some(Tiers {
            ssd: "",
            ssd_device: Some(dev.0.clone().into()),
            hdd: None,
            segment: "1M",
        }),
    });
    let fs = store.fs();
    let mut files = BTreeMap::new();
    for i in 0..24u32 {
        fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
        files.insert(i, (0, 2 << 20));
    }
    verify(&fs, &files);
    let r = fs.status().unwrap();
    assert!(tier(&r, "ssd").live_bytes >= 16 << 20, "{:?}", r.tiers);
    drop(fs);
    check_accounting_equals_full_scan(&store);
    verify(&store.fs(), &files);
    store.stop();
    drop(store);
    drop(dev);
}

#[test]
fn data_read_often_moves_back_up() {
    let store = three_tiers("96M", "160M");
    let fs = store.fs();
    let mut files = BTreeMap::new();
    for i in 0..40u32 {
        fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
        files.insert(i, (0, 2 << 20));
    }
    // Push the coldest data on to the HDD (as `cairn migrate --tier ssd --to hdd`), so
    // that the SSD has room to take promotions (below its low watermark).
    let (moved, _) = cairn::daemon_migrate(Some(store.path()), 1, 2, 48 << 20).unwrap();
    assert!(moved >= 48 << 20, "{moved}");
    // And NVM below its low watermark (promotions fill a tier only up to it): the
    // writes leave it between the watermarks, where nothing moves by itself.
    cairn::daemon_migrate(Some(store.path()), 0, 1, 8 << 20).unwrap();
    // The first files are the coldest: on the HDD by now. Read them again and again (the
    // cache serves the bytes, the hints still count the reads): they move to the SSD,
    // and from there to NVM.
    let deadline = Instant::now() + Duration::from_secs(30);
    let moved_up = |r: &StatusReport| ["nvm", "ssd"].map(|t| tier(r, t).bytes_migrated_up);
    loop {
        for i in 0..4u32 {
            assert_eq!(fs.read(format!("/f{i}")).unwrap(), content(i, 0, 2 << 20));
        }
        let r = fs.status().unwrap();
        if moved_up(&r).iter().all(|&b| b > 0) {
            break;
        }
        assert!(Instant::now() < deadline, "nothing moved up: {:?}", r.tiers);
        std::thread::sleep(Duration::from_millis(50));
    }
    verify(&fs, &files);
    drop(fs);
    check_accounting_equals_full_scan(&store);
    verify(&store.fs(), &files);
}

#[test]
fn daemon_killed_during_migration_and_cleaning_loses_nothing() {
    let store = three_tiers("24M", "96M");
    // Clean whenever fewer than half the segments are free, so that cleaning runs all
    // along too.
    store.set_config("clean_free_pct", "50");
    let acked: Arc<Mutex<BTreeMap<u32, (u32, usize)>>> = Default::default();
    {
        // Cold data: it ends up below NVM and stays, so the SSD fills, cascades to the
        // HDD and needs cleaning.
        let fs = store.fs();
        for i in 100..116u32 {
            fs.write(format!("/f{i}"), content(i, 0, 2 << 20)).unwrap();
            acked.lock().unwrap().insert(i, (0, 2 << 20));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, path) = (acked.clone(), stop.clone(), store.path().to_path_buf());
        std::thread::spawn(move || {
            let fs = cairn::Fs::open(&path).unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(0x71E5);
            let mut v = 0u32;
            // 24 files of up to 2 MiB rewritten over and over: ~3 times the NVM tier
            // live, so migration (and cleaning of the rewritten copies) never stops.
            while !stop.load(Ordering::SeqCst) {
                let i = rng.gen_range(0..24u32);
                let len = rng.gen_range(1..=512) * 4096 - rng.gen_range(0..4096);
                v += 1;
                fs.write(format!("/f{i}"), content(i, v, len)).unwrap();
                acked.lock().unwrap().insert(i, (v, len));
            }
        })
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xD1E);
    let runs = 20;
    let mut kills = 0;
    let start = Instant::now();
    for _ in 0..runs {
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..600)));
        if store.kill_daemon() {
            kills += 1;
        }
        // A new daemon (the writer re-attaches to it, or starts it itself).
        drop(store.fs());
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert!(
        kills >= runs / 2,
        "only {kills} kills in {:?}",
        start.elapsed()
    );
    let fs = store.fs();
    let files = acked.lock().unwrap().clone();
    verify(&fs, &files);
    let r = fs.status().unwrap();
    // The kills landed while data moved down both levels and the SSD was cleaned.
    assert!(tier(&r, "nvm").bytes_migrated_down > 0, "{r:?}");
    assert!(tier(&r, "ssd").bytes_migrated_down > 0, "{r:?}");
    let cleaned: u64 = r.tiers.iter().map(|t| t.bytes_cleaned).sum();
    assert!(cleaned > 0, "{r:?}");
    drop(fs);
    check_accounting_equals_full_scan(&store);
    verify(&store.fs(), &files);
}

#[test]
fn full_store_fails_with_enospc_and_recovers() {
    // NVM ~19 MiB + SSD 6 MiB + HDD 12 MiB of data segments (one kept for cleaning).
    let store = three_tiers("8M", "14M");
    let fs = store.fs();
    let mut files = BTreeMap::new();
    let mut err = None;
    for i in 0..64u32 {
        match fs.write(format!("/f{i}"), content(i, 0, 1 << 20)) {
            Ok(()) => {
                files.insert(i, (0, 1 << 20));
            }
            Err(e) => {
                err = Some((i, e));
                break;
            }
        }
    }
    let (failed, e) = err.expect("the store never filled up");
    assert_eq!(cairn_area::errno_of(&e), libc::ENOSPC, "{e}");
    assert!(e.to_string().contains("no space"), "unclear message: {e}");
    assert!(failed >= 24, "only {failed} MiB fit in ~37 MiB of tiers");
    // The file that failed may hold a prefix; every acknowledged one is whole.
    let _ = fs.remove_file(format!("/f{failed}"));
    verify(&fs, &files);
    let r = fs.status().unwrap();
    for t in ["ssd", "hdd"] {
        let t = tier(&r, t);
        assert!(
            t.segments_free <= 2,
            "the {} tier is not full: {t:?}",
            t.name
        );
    }
    // Free half of it: writes are taken again.
    for i in (0..failed).step_by(2) {
        fs.remove_file(format!("/f{i}")).unwrap();
        files.remove(&i);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 100;
    let mut written = 0;
    while written < 8 {
        match fs.write(format!("/f{i}"), content(i, 0, 1 << 20)) {
            Ok(()) => {
                files.insert(i, (0, 1 << 20));
                written += 1;
                i += 1;
            }
            Err(e) if cairn_area::errno_of(&e) == libc::ENOSPC && Instant::now() < deadline => {
                // Freed blocks return after the epoch; the cleaner compacts meanwhile.
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("write after freeing space: {e}"),
        }
    }
    verify(&fs, &files);
    drop(fs);
    check_accounting_equals_full_scan(&store);
}
