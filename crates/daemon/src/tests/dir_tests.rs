//! Linear-hashing directories against a HashMap model.

use super::map_tests::Rng;
use super::*;
use crate::store::dirhash::{self, NameChange};
use crate::store::shared::Work;
use cairn_format::dir;
use std::collections::HashMap;

fn name(rng: &mut Rng, long: bool) -> Vec<u8> {
    let len = if long {
        255
    } else {
        1 + rng.below(40) as usize
    };
    let mut n: Vec<u8> = (0..len)
        .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789._-"[rng.below(39) as usize])
        .collect();
    n[0] = b'n'; // never "." or ".."
    n
}

/// Apply a batch to a DRAM-only directory inode, retiring (freeing) old blocks at once.
fn apply(sh: &mut Shared, d: &mut Inode, changes: &[NameChange<'_>]) {
    let mut w = Work::default();
    let old = *d;
    dirhash::apply(sh, &mut w, &old, d, changes).unwrap();
    for b in w.retired {
        assert!(sh.blocks.free(b), "double retire of {b}");
    }
}

fn check(sh: &Shared, d: &Inode, model: &HashMap<Vec<u8>, u64>, base_used: u64) {
    assert_eq!(d.dir_entries, model.len() as u64);
    let all = sh.area.dir_list(d).unwrap();
    assert_eq!(all.len(), model.len());
    for e in &all {
        assert_eq!(model.get(&e.name), Some(&e.ino));
    }
    let buckets = dirhash::bucket_blocks(sh, d).unwrap();
    assert_eq!(d.attrs.size, buckets.len() as u64 * 4096);
    let mut nodes = 0u64;
    crate::store::maptree::walk(
        sh,
        d.map_root,
        d.map_height,
        &mut |_| nodes += 1,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(d.blocks, buckets.len() as u64 + nodes);
    assert_eq!(used_blocks(sh) - base_used, d.blocks, "leak");
    assert!(
        d.dir_entries <= dir::SPLIT_LOAD * dir::bucket_count(d.dir_level, d.dir_split),
        "load factor kept"
    );
}

#[test]
fn insert_remove_100k_names_match_model() {
    let ts = TestStore::new(128 << 20, 1 << 20, 1);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let base_used = used_blocks(sh);
    let mut rng = Rng(42);
    let mut model: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut d = Inode {
        attrs: attrs(Kind::Dir, 0, 2, 1),
        ..Default::default()
    };
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut inserted = 0;
    while inserted < 100_000 {
        let n = 1 + rng.below(5000) as usize;
        let mut batch: Vec<(Vec<u8>, u64)> = Vec::new();
        for _ in 0..n {
            if !names.is_empty() && rng.below(4) == 0 {
                // remove (or replace) an existing name
                let i = rng.below(names.len() as u64) as usize;
                let nm = names.swap_remove(i);
                batch.push((nm, 0));
            } else {
                let long = rng.below(50) == 0;
                let nm = name(&mut rng, long);
                batch.push((nm.clone(), 2 + rng.below(1000)));
                names.push(nm);
                inserted += 1;
            }
        }
        // Last change per name wins (as the digest plan delivers them).
        let mut last: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for (nm, ino) in batch {
            last.insert(nm, ino);
        }
        let changes: Vec<NameChange<'_>> = last
            .iter()
            .map(|(nm, &ino)| NameChange {
                name: nm,
                ino,
                kind: if ino == 0 { Kind::Free } else { Kind::File },
            })
            .collect();
        apply(sh, &mut d, &changes);
        for (nm, ino) in last {
            if ino == 0 {
                model.remove(&nm);
            } else {
                model.insert(nm, ino);
            }
        }
        names.retain(|n| model.contains_key(n));
        names.sort();
        names.dedup();
    }
    check(sh, &d, &model, base_used);
    assert!(
        d.dir_level >= 10,
        "buckets were split (level {})",
        d.dir_level
    );
    for (nm, ino) in model.iter().take(5000) {
        assert_eq!(
            sh.area.dir_lookup(&d, nm).unwrap(),
            Some((*ino, Kind::File))
        );
    }
    assert_eq!(sh.area.dir_lookup(&d, b"not-there").unwrap(), None);
    // Remove everything: buckets become holes again.
    let all: Vec<Vec<u8>> = model.keys().cloned().collect();
    let changes: Vec<NameChange<'_>> = all
        .iter()
        .map(|n| NameChange {
            name: n,
            ino: 0,
            kind: Kind::Free,
        })
        .collect();
    apply(sh, &mut d, &changes);
    model.clear();
    check(sh, &d, &model, base_used);
}

#[test]
fn long_names_chain_overflow_blocks() {
    let ts = TestStore::new(64 << 20, 1 << 20, 1);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let base_used = used_blocks(sh);
    let mut d = Inode {
        attrs: attrs(Kind::Dir, 0, 2, 1),
        ..Default::default()
    };
    // 40 names of 255 bytes in one bucket (no split yet): 265 bytes each, 15 per block.
    let names: Vec<Vec<u8>> = (0..40u8)
        .map(|i| {
            let mut n = vec![b'x'; 255];
            n[0] = b'a' + (i % 26);
            n[1] = b'a' + i / 26;
            n
        })
        .collect();
    let changes: Vec<NameChange<'_>> = names
        .iter()
        .map(|n| NameChange {
            name: n,
            ino: 7,
            kind: Kind::File,
        })
        .collect();
    apply(sh, &mut d, &changes);
    assert_eq!(d.dir_level, 0);
    let (entries, chain) = sh.area.dir_bucket(&d, 0).unwrap();
    assert_eq!(entries.len(), 40);
    assert_eq!(chain.len(), 3);
    let mut model: HashMap<Vec<u8>, u64> = names.iter().map(|n| (n.clone(), 7)).collect();
    check(sh, &d, &model, base_used);
    // One more entry splits bucket 0.
    let extra = b"extra".to_vec();
    apply(
        sh,
        &mut d,
        &[NameChange {
            name: &extra,
            ino: 9,
            kind: Kind::Symlink,
        }],
    );
    model.insert(extra.clone(), 9);
    assert_eq!((d.dir_level, d.dir_split), (1, 0));
    check(sh, &d, &model, base_used);
    assert_eq!(
        sh.area.dir_lookup(&d, &extra).unwrap(),
        Some((9, Kind::Symlink))
    );
}

#[test]
fn million_entry_directory() {
    let ts = TestStore::with_inodes(768 << 20, 1 << 20, 1, 4096);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let mut d = Inode {
        attrs: attrs(Kind::Dir, 0, 2, 1),
        ..Default::default()
    };
    let t = std::time::Instant::now();
    const N: u64 = 1_000_000;
    const BATCH: u64 = 100_000;
    for b in 0..N / BATCH {
        let names: Vec<Vec<u8>> = (b * BATCH..(b + 1) * BATCH)
            .map(|i| format!("file-{i:07}").into_bytes())
            .collect();
        let changes: Vec<NameChange<'_>> = names
            .iter()
            .map(|n| NameChange {
                name: n,
                ino: 5,
                kind: Kind::File,
            })
            .collect();
        apply(sh, &mut d, &changes);
    }
    assert_eq!(d.dir_entries, N);
    let buckets = dir::bucket_count(d.dir_level, d.dir_split);
    assert!(buckets >= N / dir::SPLIT_LOAD);
    let t2 = std::time::Instant::now();
    for i in (0..N).step_by(997) {
        let n = format!("file-{i:07}");
        assert_eq!(
            sh.area.dir_lookup(&d, n.as_bytes()).unwrap(),
            Some((5, Kind::File))
        );
    }
    let per = t2.elapsed() / (N / 997) as u32;
    eprintln!(
        "1M entries inserted in {:?}; {} buckets; lookup {:?} each",
        t2 - t,
        buckets,
        per
    );
    assert!(
        per < std::time::Duration::from_millis(1),
        "lookups stay O(1)"
    );
}
