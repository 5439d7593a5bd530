//! Superpage extents: placement at digest, in-place writes, punch and demotion,
//! promotion, truncation, rebuild; and copy-on-write maps with extents against a model.

use super::map_tests::Rng;
use super::*;
use crate::digest::parallel::CoreLock;
use crate::digest::{digest, Mode};
use crate::store::shared::Work;
use crate::store::{check, maptree};
use cairn_format::map::{huge_entry, is_huge, HUGE_BLOCKS, HUGE_BYTES};

/// Whether range `r` of `ino` is a superpage extent.
fn huge(sh: &Shared, ino: u64, r: u64) -> bool {
    let i = sh.area.read_inode(ino).unwrap();
    sh.area
        .range_entry(&i, r * HUGE_BLOCKS)
        .unwrap()
        .is_some_and(is_huge)
}

/// Log `data` as the content of file `ino` in writes of `piece` bytes (each digested on
/// its own when `digest_each`).
fn write_in_pieces(
    lw: &mut LogWriter,
    sh: &mut Shared,
    ino: u64,
    data: &[u8],
    piece: usize,
    digest_each: bool,
) {
    for (k, c) in data.chunks(piece).enumerate() {
        let off = (k * piece) as u64;
        lw.append(sh, &[write(ino, off, off + c.len() as u64, c)]);
        if digest_each {
            digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        }
    }
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8 | 1)
        .collect()
}

fn check_inode(sh: &Shared, ino: u64) {
    let i = sh.area.read_inode(ino).unwrap();
    check::published_inode(sh, ino, &i).unwrap();
    check::allocation(sh).unwrap();
}

/// 64 MiB tier (30 whole extents), 8 MiB logs.
fn store() -> TestStore {
    TestStore::new(64 << 20, 8 << 20, 2)
}

#[test]
fn a_range_filled_by_one_digest_goes_into_an_extent_written_in_place_later() {
    let ts = store();
    let mut core = ts.core();
    assert!(core.sh.superpages.enabled, "a new store has superpages");
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let size = 2 * HUGE_BYTES + 100 * 1024;
    let mut want = pattern(size as usize, 1);
    lw.append(sh, &create_file(10, ROOT_INO, b"big"));
    write_in_pieces(&mut lw, sh, 10, &want, 1 << 20, false);
    let free_ext = sh.blocks.free_extents();
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert!(
        huge(sh, 10, 0) && huge(sh, 10, 1),
        "both whole ranges are extents"
    );
    assert!(!huge(sh, 10, 2), "the 100 KiB tail stays in 4 KiB blocks");
    assert_eq!(sh.blocks.free_extents(), free_ext - 2);
    assert_eq!(read_all(sh, 10), want);
    check_inode(sh, 10);
    // Two extents, 25 tail blocks, a leaf for them and the level-2 root.
    assert_eq!(sh.area.read_inode(10).unwrap().blocks, 1024 + 25 + 2);
    // An overwrite inside an extent is made in place: the extent stays.
    let patch = pattern(10_000, 9);
    lw.append(sh, &[write(10, HUGE_BYTES + 5000, size, &patch)]);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    want[(HUGE_BYTES + 5000) as usize..][..10_000].copy_from_slice(&patch);
    assert!(huge(sh, 10, 1));
    assert_eq!(read_all(sh, 10), want);
    assert!(sh.superpages.inplace_seq > 0);
    check_inode(sh, 10);
    // Removing the file frees everything (after the epoch).
    lw.append(
        sh,
        &[
            Record::DirentSet {
                dir: ROOT_INO,
                ino: 0,
                kind: Kind::Free,
                name: b"big",
            },
            Record::InodeSet {
                ino: 10,
                generation: 1,
                attrs: Attrs {
                    nlink: 0,
                    ..attrs(Kind::File, size, 0, 0)
                },
            },
        ],
    );
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    reclaim_all(sh);
    assert_eq!(
        used_blocks(sh),
        sh.area.read_inode(ROOT_INO).unwrap().blocks
    );
    assert_eq!(sh.blocks.free_extents(), free_ext);
}

#[test]
fn punched_extents_stay_until_demoted_and_truncation_splits_them() {
    let ts = store();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let size = 3 * HUGE_BYTES;
    let mut want = pattern(size as usize, 2);
    lw.append(sh, &create_file(10, ROOT_INO, b"f"));
    write_in_pieces(&mut lw, sh, 10, &want, 1 << 20, false);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert!((0..3).all(|r| huge(sh, 10, r)));
    // Punch 300 of range 1's blocks: zeroed in place, the extent stays (Ingens'
    // deferred demotion) and becomes a candidate.
    let (ps, pl) = (HUGE_BYTES + 10 * 4096, 300 * 4096);
    lw.append(
        sh,
        &[Record::Punch {
            ino: 10,
            offset: ps,
            len: pl,
            mtime: 5,
        }],
    );
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    want[ps as usize..(ps + pl) as usize].fill(0);
    assert!(huge(sh, 10, 1));
    assert_eq!(read_all(sh, 10), want);
    assert!(sh.superpages.sparse.contains(&(10, 1)));
    let st = crate::superpage::status(sh);
    assert_eq!(st.internal_fragmentation_bytes, 300 * 4096);
    // 212 of 512 blocks still hold data: below 50%, demoted; the 300 zero blocks go.
    let blocks = sh.area.read_inode(10).unwrap().blocks;
    assert_eq!(blocks, 3 * 512 + 1);
    assert!(crate::superpage::demote(sh, 10, 1).unwrap());
    assert!(!huge(sh, 10, 1) && huge(sh, 10, 0) && huge(sh, 10, 2));
    assert_eq!(read_all(sh, 10), want);
    assert_eq!(sh.area.read_inode(10).unwrap().blocks, blocks - 300 + 1);
    check_inode(sh, 10);
    assert!(
        !crate::superpage::demote(sh, 10, 0).unwrap(),
        "a full extent stays"
    );
    // Truncation into extent 2 splits it; past extent 0's end drops the rest.
    let t = 2 * HUGE_BYTES + 7 * 4096 + 100;
    lw.append(
        sh,
        &[Record::InodeSet {
            ino: 10,
            generation: 1,
            attrs: attrs(Kind::File, t, 1, 0),
        }],
    );
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    want.truncate(t as usize);
    assert!(!huge(sh, 10, 2) && huge(sh, 10, 0));
    assert_eq!(read_all(sh, 10), want);
    check_inode(sh, 10);
    // Growing again reads zeros where the extent was cut.
    lw.append(
        sh,
        &[Record::InodeSet {
            ino: 10,
            generation: 1,
            attrs: attrs(Kind::File, 3 * HUGE_BYTES, 1, 0),
        }],
    );
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    want.resize(3 * HUGE_BYTES as usize, 0);
    assert_eq!(read_all(sh, 10), want);
    check_inode(sh, 10);
    // A rebuild (unclean start) finds the same blocks in use.
    reclaim_all(sh);
    let (used, ext) = (used_blocks(sh), sh.blocks.free_extents());
    drop(core);
    let core = ts.core();
    assert_eq!(used_blocks(&core.sh), used);
    assert_eq!(core.sh.blocks.free_extents(), ext);
    assert_eq!(read_all(&core.sh, 10), want);
}

#[test]
fn a_range_filled_in_small_digests_is_promoted_by_copy() {
    let ts = store();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let size = HUGE_BYTES + 4096;
    let want = pattern(size as usize, 3);
    {
        let sh = &mut core.sh;
        lw.append(sh, &create_file(10, ROOT_INO, b"f"));
        // 64 KiB per digest: no digest fills a range, so 4 KiB blocks.
        write_in_pieces(&mut lw, sh, 10, &want, 64 << 10, true);
        assert!(!huge(sh, 10, 0));
        assert!(sh.superpages.candidates.contains(&(10, 0)));
    }
    let blocks = core.sh.area.read_inode(10).unwrap().blocks;
    let lock = CoreLock::new(core);
    assert!(
        !crate::superpage::promote(&lock, 10, 1).unwrap(),
        "1 of 512 blocks"
    );
    assert!(crate::superpage::promote(&lock, 10, 0).unwrap());
    assert!(
        !crate::superpage::promote(&lock, 10, 0).unwrap(),
        "already an extent"
    );
    let mut c = lock.serial();
    let sh = &mut c.sh;
    assert!(huge(sh, 10, 0));
    assert_eq!(read_all(sh, 10), want);
    // 512 data blocks and their leaf became one extent.
    assert_eq!(sh.area.read_inode(10).unwrap().blocks, blocks - 1);
    assert_eq!(sh.superpages.promotions, 1);
    reclaim_all(sh);
    check_inode(sh, 10);
    let st = crate::superpage::status(sh);
    assert_eq!((st.extent_bytes, st.promotions), (HUGE_BYTES, 1));
    assert_eq!(st.internal_fragmentation_bytes, 0);
    // A pass finds nothing more to do; the counters are persistent.
    drop(c);
    crate::superpage::pass(&lock, 64 << 20);
    let c = lock.serial();
    assert_eq!(
        c.sh.area
            .state_field(cairn_format::superblock::state::SUPERPAGES)
            .unwrap(),
        1
    );
}

#[test]
fn a_promotion_whose_range_changed_meanwhile_is_dropped() {
    let ts = store();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let want = pattern(HUGE_BYTES as usize, 4);
    let sh = &mut core.sh;
    lw.append(sh, &create_file(10, ROOT_INO, b"f"));
    write_in_pieces(&mut lw, sh, 10, &want, 256 << 10, true);
    // The switch compares the range's leaf node with the one copied: a digest that
    // wrote the range replaced it.
    let inode = sh.area.read_inode(10).unwrap();
    let leaf = sh.area.range_entry(&inode, 0).unwrap().unwrap();
    lw.append(sh, &[write(10, 100, HUGE_BYTES, b"new")]);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    let inode = sh.area.read_inode(10).unwrap();
    assert_ne!(sh.area.range_entry(&inode, 0).unwrap().unwrap(), leaf);
}

/// Maps with superpage extents against a model: random sets of whole extents, single
/// blocks inside them (splits), holes and truncations.
#[test]
fn maps_with_extents_match_a_model() {
    let ts = TestStore::new(256 << 20, 1 << 20, 1);
    let mut core = ts.core();
    let sh = &mut core.sh;
    let base_used = used_blocks(sh);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut root, mut h) = (0u64, 0u8);
    let mut owned: i64 = 0;
    for round in 0..200 {
        let mut w = Work::default();
        let mut changes: BTreeMap<u64, u64> = BTreeMap::new();
        let mut extents = Vec::new();
        for _ in 0..rng.below(4) {
            let r = rng.below(6);
            if let Some(first) = sh.alloc_extent(&mut w) {
                // No other change in an extent's range.
                changes.retain(|&f, b| {
                    let keep = f / HUGE_BLOCKS != r;
                    if !keep && *b != 0 {
                        sh.blocks.free(*b);
                    }
                    keep
                });
                extents.retain(|&(x, f)| {
                    x != r || {
                        (f..f + HUGE_BLOCKS).for_each(|b| {
                            sh.blocks.free(b);
                        });
                        false
                    }
                });
                extents.push((r, first));
            }
        }
        for _ in 0..rng.below(20) {
            let fb = rng.below(6 * HUGE_BLOCKS);
            if extents.iter().any(|&(r, _)| r == fb / HUGE_BLOCKS) {
                continue;
            }
            let blk = if rng.below(4) == 0 {
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
        let keep = if rng.below(8) == 0 {
            rng.below(6 * HUGE_BLOCKS)
        } else {
            u64::MAX
        };
        let mut ch: Vec<(u64, u64)> = changes.iter().map(|(a, b)| (*a, *b)).collect();
        for &(r, first) in &extents {
            ch.push((r * HUGE_BLOCKS, huge_entry(first)));
        }
        ch.sort_unstable_by_key(|c| c.0);
        let r = maptree::update(sh, &mut w, root, h, &ch, keep, true).unwrap();
        let _ = model.split_off(&keep);
        for &(r, first) in &extents {
            for k in 0..HUGE_BLOCKS {
                model.insert(r * HUGE_BLOCKS + k, first + k);
            }
        }
        for (f, b) in &changes {
            if *b == 0 {
                model.remove(f);
            } else {
                model.insert(*f, *b);
            }
        }
        let mut got = BTreeMap::new();
        let mut nodes = 0u64;
        maptree::walk(sh, r.root, r.height, &mut |_| nodes += 1, &mut |f, b| {
            got.insert(f, b);
        })
        .unwrap();
        assert_eq!(got, model, "round {round}");
        owned += r.delta;
        assert_eq!(
            owned,
            (nodes + got.len() as u64) as i64,
            "round {round}: count"
        );
        for b in w.retired.drain(..) {
            assert!(sh.blocks.free(b), "round {round}: block {b} retired twice");
        }
        (root, h) = (r.root, r.height);
        assert_eq!(
            used_blocks(sh) - base_used,
            nodes + got.len() as u64,
            "round {round}: leak"
        );
        // What the reader sees agrees.
        let inode = Inode {
            map_root: root,
            map_height: h,
            ..Default::default()
        };
        for _ in 0..20 {
            let fb = rng.below(6 * HUGE_BLOCKS);
            assert_eq!(
                sh.area.block_of(&inode, fb).unwrap(),
                model.get(&fb).copied()
            );
        }
    }
}

/// With every extent broken up by small files and half of them deleted, a promotion
/// finds no extent; compaction moves the emptiest chunks' blocks elsewhere, which frees
/// whole extents, and the waiting range is promoted.
#[test]
fn compaction_frees_extents_for_a_waiting_promotion() {
    let ts = store();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let mut files = Vec::new();
    {
        let sh = &mut core.sh;
        let mut ino = 100;
        while sh.blocks.free_extents() > 0 {
            let name = format!("s{ino}");
            let data = pattern(64 << 10, ino as u32);
            lw.append(sh, &create_file(ino, ROOT_INO, name.as_bytes()));
            lw.append(sh, &[write(ino, 0, data.len() as u64, &data)]);
            digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
            files.push((ino, name, data));
            ino += 1;
        }
        // Every other file goes (not the last, which broke the last extent): half of
        // every chunk is free, no extent is.
        let last = files.len() - 1;
        for (ino, name, data) in files[..last].iter().skip(1).step_by(2) {
            lw.append(
                sh,
                &[
                    Record::DirentSet {
                        dir: ROOT_INO,
                        ino: 0,
                        kind: Kind::Free,
                        name: name.as_bytes(),
                    },
                    Record::InodeSet {
                        ino: *ino,
                        generation: 1,
                        attrs: attrs(Kind::File, data.len() as u64, 0, 0),
                    },
                ],
            );
            digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
            reclaim_all(sh);
        }
        assert_eq!(sh.blocks.free_extents(), 0);
        assert!(crate::superpage::compact::fmfi(sh) > 0.8);
    }
    let last = files.len() - 1;
    let kept: Vec<_> = files
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % 2 == 0 || *i == last)
        .map(|x| x.1)
        .collect();
    // A range filled in 4 KiB blocks.
    let big = pattern(HUGE_BYTES as usize + 4096, 77);
    {
        let sh = &mut core.sh;
        lw.append(sh, &create_file(10, ROOT_INO, b"big"));
        write_in_pieces(&mut lw, sh, 10, &big, 64 << 10, true);
    }
    let lock = CoreLock::new(core);
    let migrator = crate::tiers::migrate::Migrator::default();
    assert!(
        !crate::superpage::promote(&lock, 10, 0).unwrap(),
        "no free extent"
    );
    assert!(crate::superpage::compact::needed(&lock.serial().sh));
    let moved = migrator.compact(&lock);
    assert!(moved > 0);
    {
        let mut c = lock.serial();
        c.reclaim();
        assert!(c.sh.blocks.free_extents() > 0, "compaction freed no extent");
        assert_eq!(c.sh.superpages.bytes_compacted, moved * 4096);
        check::allocation(&c.sh).unwrap();
        for (ino, _, data) in &kept {
            assert!(read_all(&c.sh, *ino) == *data, "file {ino} differs");
            check_inode(&c.sh, *ino);
        }
    }
    crate::superpage::pass(&lock, 1 << 30);
    let c = lock.serial();
    assert!(huge(&c.sh, 10, 0), "the waiting range was promoted");
    assert_eq!(read_all(&c.sh, 10), big);
    assert!(!crate::superpage::compact::needed(&c.sh));
}

/// A superpage entry that is not a 2 MiB-aligned extent of the data region is damage:
/// reads fail with `EIO` and `fsck` reports it; a store of format version 4 opens with
/// superpages off and never gets extents.
#[test]
fn bad_extent_entries_are_caught_and_older_stores_get_none() {
    use std::os::unix::fs::FileExt;
    // Version 6: the layout of version 4 (the logs in the NVM file), stamped 4 below.
    let ts = TestStore::with_format(64 << 20, 8 << 20, 2, 6);
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let data = pattern(HUGE_BYTES as usize * 2, 5);
    {
        let sh = &mut core.sh;
        lw.append(sh, &create_file(10, ROOT_INO, b"f"));
        write_in_pieces(&mut lw, sh, 10, &data, 1 << 20, false);
        digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        assert!(huge(sh, 10, 1));
    }
    let inode = core.sh.area.read_inode(10).unwrap();
    assert_eq!(inode.map_height, 2);
    let at = inode.map_root * 4096 + 8;
    let e = core.sh.area.map().load_u64(at as usize).unwrap();
    assert!(is_huge(e));
    core.shutdown().unwrap();
    drop(core);
    let nvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ts.nvm)
        .unwrap();
    let opts = crate::offline::fsck::FsckOptions::default();
    let clean = crate::offline::fsck::fsck(&ts.store.path, &opts).unwrap();
    assert!(clean.problems.is_empty(), "{clean:?}");
    // Misaligned by one block: caught by the reader and by fsck.
    nvm.write_all_at(&(e + 1).to_le_bytes(), at).unwrap();
    let rep = crate::offline::fsck::fsck(&ts.store.path, &opts).unwrap();
    assert!(
        !rep.problems.is_empty(),
        "a misaligned extent went unnoticed"
    );
    let area = cairn_area::Area::open(&nvm, false).unwrap();
    let inode = area.read_inode(10).unwrap();
    assert!(area.block_of(&inode, 512 + 3).is_err());
    nvm.write_all_at(&e.to_le_bytes(), at).unwrap();
    drop(area);
    // The same store stamped version 4 (its layout is the same): superpages off.
    let mut b = vec![0u8; 4096];
    nvm.read_exact_at(&mut b, 0).unwrap();
    let mut sb = cairn_format::superblock::Superblock::decode(&b, u64::MAX).unwrap();
    sb.version = 4;
    let enc = sb.encode();
    nvm.write_all_at(&enc, 0).unwrap();
    nvm.write_all_at(&enc, sb.layout.sb_copy * 4096).unwrap();
    let mut core = ts.core();
    assert!(!core.sh.superpages.enabled);
    let st = crate::superpage::status(&core.sh);
    assert!(st.off_reason.unwrap().contains("format version (4)"));
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    lw.append(sh, &create_file(11, ROOT_INO, b"g"));
    write_in_pieces(&mut lw, sh, 11, &data, 1 << 20, false);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert!(!huge(sh, 11, 0) && !huge(sh, 11, 1));
    assert_eq!(read_all(sh, 11), data);
    assert_eq!(read_all(sh, 10), data, "its existing extents still read");
}

/// Once the store stopped (its allocation state saved), the background pass changes
/// nothing: the power-failure simulator found a demotion that ran after a clean stop,
/// leaking the blocks it freed (seed 11 of `powerfail`).
#[test]
fn nothing_is_demoted_after_a_stop() {
    let ts = store();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let data = pattern(HUGE_BYTES as usize, 8);
    {
        let sh = &mut core.sh;
        lw.append(sh, &create_file(10, ROOT_INO, b"f"));
        lw.append(sh, &[write(10, 0, HUGE_BYTES, &data)]);
        digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        lw.append(
            sh,
            &[Record::Punch {
                ino: 10,
                offset: 4096,
                len: HUGE_BYTES - 8192,
                mtime: 5,
            }],
        );
        digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        assert!(huge(sh, 10, 0) && sh.superpages.sparse.contains(&(10, 0)));
    }
    core.shutdown().unwrap();
    let lock = CoreLock::new(core);
    // A pass that began before the stop goes on with its pending demotions.
    crate::superpage::demote_pending(&lock, 1 << 30);
    let c = lock.serial();
    assert!(huge(&c.sh, 10, 0), "demoted after the stop");
    assert_eq!(c.sh.superpages.demotions, 0);
}

/// An append written into the range's leaf in place while the range was being copied
/// (`maptree::append_leaf`: the leaf keeps its block) drops the promotion: the switch
/// compares the leaf's entries too, not only its block, so the appended blocks are not
/// replaced by the copy's zeros.
#[test]
fn a_promotion_of_a_range_appended_to_in_place_meanwhile_is_dropped() {
    let ts = store();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let mut want = pattern(500 * 4096, 5);
    {
        let sh = &mut core.sh;
        lw.append(sh, &create_file(10, ROOT_INO, b"f"));
        write_in_pieces(&mut lw, sh, 10, &want, 64 << 10, true);
        assert!(!huge(sh, 10, 0));
    }
    let lock = CoreLock::new(core);
    let p = crate::superpage::plan_promotion(&mut lock.serial().sh, 10, 0)
        .unwrap()
        .expect("500 of 512 blocks: a candidate");
    let leaf = {
        let mut c = lock.serial();
        let sh = &mut c.sh;
        let leaf = sh.area.read_inode(10).unwrap().map_root;
        let more = pattern(8 * 4096, 6);
        lw.append(
            sh,
            &[write(
                10,
                want.len() as u64,
                (want.len() + more.len()) as u64,
                &more,
            )],
        );
        want.extend_from_slice(&more);
        digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        leaf
    };
    let area = lock.serial().sh.area.clone();
    let copied = crate::superpage::copy_promotion(&area, &p);
    assert!(!crate::superpage::finish_promotion(&lock, p, copied).unwrap());
    let c = lock.serial();
    let sh = &c.sh;
    let inode = sh.area.read_inode(10).unwrap();
    assert_eq!(inode.map_root, leaf, "the append was written in place");
    assert!(!huge(sh, 10, 0));
    assert!(read_all(sh, 10) == want, "the appended blocks read back");
    check_inode(sh, 10);
}
