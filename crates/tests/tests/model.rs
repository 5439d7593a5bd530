//! Model-based tests: generated operation sequences run against Cairn and against a
//! reference directory (std::fs on tmpfs); every outcome and the final tree must agree,
//! also after the client leaves (its log digested) and after a clean daemon restart.

use cairn_tests::harness::StoreSize;
use cairn_tests::snapshot::diff;
use cairn_tests::{apply, gen_ops, gen_ops_with, snapshot, CairnFs, Extras, HostFs, TestStore};
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

static RUN: AtomicU64 = AtomicU64::new(0);

fn run_case(store: &TestStore, seed: u64, n: usize, extras: Extras) -> Result<(), TestCaseError> {
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let prefix = format!("/m{run}");
    let host_dir = tempfile::Builder::new()
        .prefix("cairn-ref-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let host = HostFs {
        root: host_dir.path().to_path_buf(),
    };
    let ops = gen_ops_with(seed, n, &prefix, extras);
    {
        let fs = store.fs();
        let cairn = CairnFs { fs: &fs };
        cairn_tests::FsOps::mkdir(&cairn, &prefix).unwrap();
        cairn_tests::FsOps::mkdir(&host, &prefix).unwrap();
        for (i, op) in ops.iter().enumerate() {
            let a = apply(&cairn, op);
            let b = apply(&host, op);
            prop_assert_eq!(&a, &b, "op {} {:?} (seed {}, {} ops)", i, op, seed, n);
        }
        let sc = snapshot(&cairn, &prefix).unwrap();
        let sh = snapshot(&host, &prefix).unwrap();
        prop_assert!(sc == sh, "trees differ after the run:\n{}", diff(&sc, &sh));
    }
    // A new client (the previous one left and was digested) sees the same tree.
    let fs = store.fs();
    let sc = snapshot(&CairnFs { fs: &fs }, &prefix).unwrap();
    let sh = snapshot(&host, &prefix).unwrap();
    prop_assert!(
        sc == sh,
        "trees differ after reopening:\n{}",
        diff(&sc, &sh)
    );
    Ok(())
}

/// Generated cases against one store (dropped at the end, so its daemon stops and its
/// NVM file goes; a failure keeps it for inspection).
fn run_generated(store: &TestStore) {
    run_generated_with(store, Extras::default());
}

fn run_generated_with(store: &TestStore, extras: Extras) {
    let config = ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let r = runner.run(&(any::<u64>(), 1usize..160), |(seed, n)| {
        run_case(store, seed, n, extras)
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

#[test]
fn matches_reference() {
    run_generated(&TestStore::new());
}

/// Stores through shared mappings among the calls (`Op::MapWrite`: map the whole file,
/// store, `msync`, unmap), next to writes, truncations and renames of the same files:
/// the map object, its write-back and its fold agree with tmpfs.
#[test]
fn matches_reference_with_shared_mappings() {
    run_generated_with(&TestStore::new(), Extras { mapped: true });
}

#[test]
fn matches_reference_with_constant_digests() {
    // A 64 KiB log: digests happen every few operations, and writes larger than a
    // quarter of the log are split into several transactions.
    run_generated(&TestStore::with_size(StoreSize {
        log: "64K",
        ..StoreSize::default()
    }));
}

#[test]
fn matches_reference_on_three_tiers_with_tiny_nvm() {
    // About 6 MiB of NVM data blocks with SSD and HDD tiers of 64 KiB segments,
    // watermarks of 2% and 0% and cleaning whenever a tier has segments to compact:
    // every tier above 2% moves its files' data down, so migration down both levels
    // and cleaning run all along, under the operations, and the files the cases read
    // and rewrite are spread over the three tiers.
    let store = TestStore::with_size(StoreSize {
        nvm: "8M",
        log: "64K",
        clients: 4,
        inodes: Some(4096),
        tiers: Some(cairn_tests::harness::Tiers {
            ssd: "4M",
            ssd_device: None,
            hdd: Some("96M"),
            segment: "64K",
        }),
    });
    store.set_config("migrate_high_pct", "2");
    store.set_config("migrate_low_pct", "0");
    store.set_config("clean_free_pct", "100");
    run_generated(&store);
    let r = store.fs().status().unwrap();
    let moved = |t: &str| {
        r.tiers
            .iter()
            .find(|x| x.name == t)
            .map_or(0, |x| x.bytes_migrated_down)
    };
    assert!(moved("nvm") > 0 && moved("ssd") > 0, "{:?}", r.tiers);
    let cleaned: u64 = r.tiers.iter().map(|t| t.bytes_cleaned).sum();
    assert!(cleaned > 0, "no cleaning: {:?}", r.tiers);
}

#[test]
fn matches_reference_with_superpages_promoted_and_demoted_constantly() {
    // A promotion threshold of 0% (any range holding data) under the demotion one
    // (50%): every range a digest writes goes into a superpage extent (at the digest,
    // or promoted by the background pass it wakes) and is demoted right after, then
    // promoted again when written: writes in place into extents, truncations and punched
    // holes splitting and zeroing them, all under the operations.
    let store = TestStore::with_size(StoreSize {
        log: "64K",
        ..StoreSize::default()
    });
    store.set_config("superpage_promote_pct", "0");
    store.set_config("superpage_rate_mib", "100000");
    run_generated(&store);
    let s = store.fs().status().unwrap().superpages.unwrap();
    assert!(s.placed + s.promotions > 0 && s.demotions > 0, "{s:?}");
    eprintln!(
        "superpages: {} placed, {} promoted, {} demoted",
        s.placed, s.promotions, s.demotions
    );
}

#[test]
fn survives_clean_daemon_restart() {
    let store = TestStore::with_size(StoreSize {
        log: "128K",
        ..StoreSize::default()
    });
    let host_dir = tempfile::Builder::new()
        .prefix("cairn-ref-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let host = HostFs {
        root: host_dir.path().to_path_buf(),
    };
    let ops = gen_ops(7, 400, "/r");
    {
        let fs = store.fs();
        let c = CairnFs { fs: &fs };
        cairn_tests::FsOps::mkdir(&c, "/r").unwrap();
        cairn_tests::FsOps::mkdir(&host, "/r").unwrap();
        for op in &ops {
            assert_eq!(apply(&c, op), apply(&host, op), "{op:?}");
        }
    }
    store.stop();
    let fs = store.fs(); // auto-starts a new daemon
    let sc = snapshot(&CairnFs { fs: &fs }, "/r").unwrap();
    let sh = snapshot(&host, "/r").unwrap();
    assert!(sc == sh, "{}", diff(&sc, &sh));
}
