//! Copy-on-write maps against a BTreeMap model.

use super::*;
use crate::store::maptree;
use crate::store::shared::Work;
use cairn_format::map::coverage;

/// xorshift64*: deterministic randomness without a dependency.
pub(crate) struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn walk_model(sh: &Shared, root: u64, h: u8) -> (BTreeMap<u64, u64>, u64) {
    let mut m = BTreeMap::new();
    let mut nodes = 0;
    maptree::walk(sh, root, h, &mut |_| nodes += 1, &mut |f, b| {
        m.insert(f, b);
    })
    .unwrap();
    (m, nodes)
}

#[test]
fn random_changes_match_model_with_growth_and_truncation() {
    let ts = TestStore::new(64 << 20, 1 << 20, 1);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let base_used = used_blocks(sh);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut root, mut h) = (0u64, 0u8);
    let mut owned: i64 = 0;
    for round in 0..300 {
        let mut w = Work::default();
        // Mostly small file blocks, sometimes far ones (grow to height 3 or 4).
        let n = rng.below(40);
        let mut changes: BTreeMap<u64, u64> = BTreeMap::new();
        for _ in 0..n {
            let fb = match rng.below(10) {
                0 => rng.below(coverage(3)),
                1 if round % 50 == 7 => coverage(3) + rng.below(coverage(4) - coverage(3)),
                2 | 3 => rng.below(600),
                _ => rng.below(64),
            };
            let blk = if rng.below(5) == 0 {
                0
            } else {
                sh.alloc_block(&mut w).unwrap()
            };
            if let Some(old) = changes.insert(fb, blk) {
                if old != 0 {
                    sh.blocks.free(old);
                }
            }
        }
        let keep = if rng.below(6) == 0 {
            match rng.below(3) {
                0 => 0,
                1 => rng.below(64),
                _ => rng.below(2000),
            }
        } else {
            u64::MAX
        };
        let ch: Vec<(u64, u64)> = changes.iter().map(|(a, b)| (*a, *b)).collect();
        let r = maptree::update(sh, &mut w, root, h, &ch, keep, true).unwrap();
        // Model: truncation, then the changes.
        let _ = model.split_off(&keep);
        for (f, b) in &changes {
            if *b == 0 {
                model.remove(f);
            } else {
                model.insert(*f, *b);
            }
        }
        let (got, nodes) = walk_model(sh, r.root, r.height);
        assert_eq!(got, model, "round {round}");
        owned += r.delta;
        assert_eq!(
            owned,
            nodes as i64 + got.len() as i64,
            "round {round}: block count"
        );
        // Every retired block must be a block we own exactly once.
        for b in w.retired.drain(..) {
            assert!(sh.blocks.free(b), "round {round}: block {b} retired twice");
        }
        root = r.root;
        h = r.height;
        assert_eq!(
            used_blocks(sh) - base_used,
            nodes + got.len() as u64,
            "round {round}: leak"
        );
    }
    assert!(h >= 3, "the tree grew (height {h})");
}

#[test]
fn unchanged_subtrees_are_shared() {
    let ts = TestStore::new(64 << 20, 1 << 20, 1);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let mut w = Work::default();
    let mut ch = Vec::new();
    for fb in [0u64, 1000, 600_000] {
        ch.push((fb, sh.alloc_block(&mut w).unwrap()));
    }
    let r1 = maptree::update(sh, &mut w, 0, 0, &ch, u64::MAX, true).unwrap();
    assert_eq!(r1.height, 3);
    // 3 data blocks; nodes: the root, 2 level-2 nodes, 3 leaves.
    assert_eq!(r1.delta, 3 + 6);
    let b = sh.alloc_block(&mut w).unwrap();
    let mut w2 = Work::default();
    let r2 = maptree::update(sh, &mut w2, r1.root, r1.height, &[(1, b)], u64::MAX, true).unwrap();
    // Path to block 1: root, one level-2 node, one leaf are copied (3 retired nodes).
    assert_eq!(w2.retired.len(), 3);
    assert_eq!(w2.allocated.len(), 3);
    // The subtree of block 600000 is shared.
    let leaf = |root| {
        let i = Inode {
            map_root: root,
            map_height: 3,
            ..Default::default()
        };
        sh.area.block_of(&i, 600_000).unwrap()
    };
    assert_eq!(leaf(r1.root), leaf(r2.root));
    // Truncate everything.
    let mut w3 = Work::default();
    let r3 = maptree::update(sh, &mut w3, r2.root, r2.height, &[], 0, true).unwrap();
    assert_eq!((r3.root, r3.height), (0, 0));
    assert_eq!(r3.delta, -(r1.delta + r2.delta));
}

/// A map holding only file block 0 is direct (no node), grows into a tree when another
/// block comes and becomes direct again when it goes.
#[test]
fn one_block_maps_are_direct() {
    let ts = TestStore::new(64 << 20, 1 << 20, 1);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let base = used_blocks(sh);
    let mut w = Work::default();
    let b0 = sh.alloc_block(&mut w).unwrap();
    let r = maptree::update(sh, &mut w, 0, 0, &[(0, b0)], u64::MAX, true).unwrap();
    assert_eq!((r.root, r.height, r.delta), (b0, 0, 1));
    let i = |root, h| Inode {
        map_root: root,
        map_height: h,
        ..Default::default()
    };
    assert_eq!(sh.area.block_of(&i(r.root, 0), 0).unwrap(), Some(b0));
    assert_eq!(sh.area.block_of(&i(r.root, 0), 1).unwrap(), None);
    assert_eq!(
        sh.area.next_block(&i(r.root, 0), 0, 10, true).unwrap(),
        Some(0)
    );
    assert_eq!(
        sh.area.next_block(&i(r.root, 0), 0, 10, false).unwrap(),
        Some(1)
    );
    assert_eq!(
        sh.area.next_block(&i(r.root, 0), 1, 10, true).unwrap(),
        None
    );
    // A second block: a leaf node again, block 0 kept.
    let b1 = sh.alloc_block(&mut w).unwrap();
    let r2 = maptree::update(sh, &mut w, r.root, r.height, &[(1, b1)], u64::MAX, true).unwrap();
    assert_eq!((r2.height, r2.delta), (1, 2));
    assert_eq!(sh.area.block_of(&i(r2.root, 1), 0).unwrap(), Some(b0));
    // Block 1 goes: direct again (the node retired).
    let mut w2 = Work::default();
    let r3 = maptree::update(sh, &mut w2, r2.root, r2.height, &[], 1, true).unwrap();
    assert_eq!((r3.root, r3.height, r3.delta), (b0, 0, -2));
    // Block 1, the old leaf node and the one the update wrote before it saw a single
    // block left.
    assert_eq!(w2.retired.len(), 3);
    // Replaced, then truncated away.
    let b2 = sh.alloc_block(&mut w2).unwrap();
    let r4 = maptree::update(sh, &mut w2, r3.root, 0, &[(0, b2)], u64::MAX, true).unwrap();
    assert_eq!((r4.root, r4.height, r4.delta), (b2, 0, 0));
    let r5 = maptree::update(sh, &mut w2, r4.root, 0, &[], 0, true).unwrap();
    assert_eq!((r5.root, r5.height, r5.delta), (0, 0, -1));
    assert!(w.retired.is_empty(), "a new one-block map writes no node");
    for b in w.retired.drain(..).chain(w2.retired.drain(..)) {
        assert!(sh.blocks.free(b));
    }
    assert_eq!(used_blocks(sh), base);
}
