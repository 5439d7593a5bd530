//! Digest of hand-built logs.

use super::map_tests::Rng;
use super::*;
use crate::digest::{digest, DigestError, Mode};
use cairn_format::slot::{client_page, SlotHead};

fn set_size(ino: u64, kind: Kind, size: u64) -> Record<'static> {
    Record::InodeSet {
        ino,
        generation: 1,
        attrs: attrs(kind, size, 1, 0),
    }
}

fn lookup(sh: &Shared, dir: u64, name: &str) -> Option<u64> {
    let d = sh.area.read_inode(dir).unwrap();
    sh.area
        .dir_lookup(&d, name.as_bytes())
        .unwrap()
        .map(|x| x.0)
}

#[test]
fn create_write_mkdir_and_counters() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    lw.append(sh, &create_file(10, ROOT_INO, b"a.txt"));
    lw.append(sh, &[write(10, 0, 10_000, &data)]);
    lw.append(sh, &mkdir(11, ROOT_INO, b"sub"));
    lw.append(sh, &create_file(12, 11, b"b"));
    lw.append(sh, &[write(12, 5000, 5003, b"xyz")]);
    let o = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(o.head_lsn, lw.tail);
    assert_eq!(o.head_seq, lw.seq);
    assert_eq!(o.records, 8);
    assert_eq!(o.skipped, 0);
    assert_eq!(o.charge, 3 + 1);
    assert_eq!(lookup(sh, ROOT_INO, "a.txt"), Some(10));
    assert_eq!(lookup(sh, ROOT_INO, "sub"), Some(11));
    assert_eq!(lookup(sh, 11, "b"), Some(12));
    assert_eq!(read_all(sh, 10), data);
    let b = read_all(sh, 12);
    assert_eq!(b.len(), 5003);
    assert!(b[..5000].iter().all(|&x| x == 0));
    assert_eq!(&b[5000..], b"xyz");
    let f = sh.area.read_inode(12).unwrap();
    assert_eq!(f.generation, 1);
    assert_eq!(f.attrs.mtime, 77);
    assert_eq!(
        f.blocks, 2,
        "one data block + one leaf node (block 0 is a hole)"
    );
    let (h, _) = sh.slot_head(lw.slot).unwrap();
    assert_eq!((h.head_lsn, h.head_seq, h.active), (lw.tail, lw.seq, true));
    assert_eq!(sh.area.published_head(lw.slot).unwrap(), lw.tail);
    assert_eq!(sh.counters.digests, 1);
    assert_eq!(sh.counters.records_digested, 8);
    assert_eq!(sh.counters.log_bytes_written, o.log_bytes);
    assert!(sh.counters.shared_bytes_written >= 4 * 4096);
    assert_eq!(
        sh.area
            .state_field(cairn_format::superblock::state::DIGESTS)
            .unwrap(),
        1
    );
    assert!(sh.inodes.is_used(10) && sh.inodes.is_used(12));
    assert_eq!(sh.epoch(), 2);
}

fn punch(ino: u64, offset: u64, len: u64) -> Record<'static> {
    Record::Punch {
        ino,
        offset,
        len,
        mtime: 88,
    }
}

/// `PUNCH` frees whole blocks, zeroes partial ones, drops earlier writes of the batch in
/// its range, and a later write into a punched block starts from zeros; within one batch
/// and across batches; past the end it does nothing.
#[test]
fn punch_frees_blocks_and_reads_zeros() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let size = 6 * 4096;
    let data: Vec<u8> = (0..size as u32).map(|i| (i % 251) as u8 + 1).collect();
    lw.append(sh, &create_file(10, ROOT_INO, b"f"));
    lw.append(sh, &[write(10, 0, size, &data)]);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    let before = sh.area.read_inode(10).unwrap().blocks;
    let mut want = data.clone();
    // One batch: a write into block 3, then a punch of blocks 1..5 (drops it), a write
    // into punched block 2, a punch inside block 0, and one past the end.
    lw.append(sh, &[write(10, 3 * 4096, size, b"gone")]);
    lw.append(sh, &[punch(10, 4096, 4 * 4096)]);
    want[4096..5 * 4096].fill(0);
    lw.append(sh, &[write(10, 2 * 4096 + 10, size, b"kept")]);
    want[2 * 4096 + 10..2 * 4096 + 14].copy_from_slice(b"kept");
    lw.append(sh, &[punch(10, 100, 200)]);
    want[100..300].fill(0);
    lw.append(sh, &[punch(10, size + 4096, 4096)]);
    let o = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(o.charge, 3, "two written blocks, one partial punched block");
    let same = |got: Vec<u8>, want: &[u8]| {
        let diff = got.iter().zip(want).position(|(a, b)| a != b);
        assert!(
            got.len() == want.len() && diff.is_none(),
            "differ at {diff:?}"
        );
    };
    same(read_all(sh, 10), &want);
    let i = sh.area.read_inode(10).unwrap();
    assert_eq!(i.attrs.size, size);
    assert_eq!(i.attrs.mtime, 88);
    assert_eq!(before - i.blocks, 3, "blocks 1, 3 and 4 freed");
    for (b, data) in [
        (0, true),
        (1, false),
        (2, true),
        (3, false),
        (4, false),
        (5, true),
    ] {
        assert_eq!(
            sh.area.block_of(&i, b).unwrap().is_some(),
            data,
            "block {b}"
        );
    }
    // Next batch: a punch across partial and whole blocks of the digested file.
    lw.append(sh, &[punch(10, 5 * 4096 - 10, 30)]);
    want[5 * 4096 - 10..5 * 4096 + 20].fill(0);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    same(read_all(sh, 10), &want);
    // A punch of a directory or a free inode is malformed.
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &[punch(ROOT_INO, 0, 4096)]);
    });
    assert!(m.contains("PUNCH of inode 1, a Dir"), "{m}");
}

#[test]
fn coalescing_overwrites_truncation_and_skips() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    // First batch: a 3-block file of 'a'.
    let a = vec![b'a'; 3 * 4096];
    lw.append(sh, &create_file(10, ROOT_INO, b"f"));
    lw.append(sh, &[write(10, 0, a.len() as u64, &a)]);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    // Second batch: overwrite, truncate into block 1, extend, write, overwrite again.
    let mut model = a.clone();
    let b = vec![b'b'; 1000];
    lw.append(sh, &[write(10, 100, model.len() as u64, &b)]); // fully overwritten below
    model[100..1100].copy_from_slice(&b);
    lw.append(sh, &[set_size(10, Kind::File, 5000)]);
    model.truncate(5000);
    lw.append(sh, &[set_size(10, Kind::File, 20_000)]);
    model.resize(20_000, 0);
    let c = vec![b'c'; 2000];
    lw.append(sh, &[write(10, 16_000, 20_000, &c)]);
    model[16_000..18_000].copy_from_slice(&c);
    let d2 = vec![b'd'; 1200];
    lw.append(sh, &[write(10, 50, 20_000, &d2)]);
    model[50..1250].copy_from_slice(&d2);
    let o = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(read_all(sh, 10), model);
    // The 'b' write (100..1100 lies inside 50..1250) and the first INODE_SET (superseded
    // by the second) have no surviving effect.
    assert_eq!(o.records, 5);
    assert_eq!(o.skipped, 2);
    let i = sh.area.read_inode(10).unwrap();
    assert_eq!(i.attrs.size, 20_000);
    // Blocks 0, 1 (tail zeroed), 3, 4 mapped; block 2 is beyond the truncation: a hole.
    assert!(sh.area.block_of(&i, 2).unwrap().is_none());
    assert_eq!(i.blocks, 4 + 1);
    reclaim_all(sh);
}

#[test]
fn replaying_a_batch_gives_identical_state() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let mut rng = Rng(7);
    let (h0, _) = sh.slot_head(lw.slot).unwrap();
    lw.append(sh, &mkdir(20, ROOT_INO, b"d"));
    let blobs: Vec<Vec<u8>> = (0..30)
        .map(|i| vec![i as u8 + 1; rng.below(9000) as usize + 1])
        .collect();
    let names: Vec<String> = (0..30).map(|i| format!("f{i}")).collect();
    for i in 0..30u64 {
        lw.append(sh, &create_file(30 + i, 20, names[i as usize].as_bytes()));
        let blob = &blobs[i as usize];
        lw.append(
            sh,
            &[write(30 + i, i * 100, i * 100 + blob.len() as u64, blob)],
        );
    }
    // unlink f3, rename f4 -> g4, truncate f5, write-then-free a temp file.
    lw.append(
        sh,
        &[
            Record::DirentSet {
                dir: 20,
                name: b"f3",
                ino: 0,
                kind: Kind::Free,
            },
            Record::InodeSet {
                ino: 33,
                generation: 1,
                attrs: attrs(Kind::File, 0, 0, 0),
            },
        ],
    );
    lw.append(
        sh,
        &[
            Record::DirentSet {
                dir: 20,
                name: b"f4",
                ino: 0,
                kind: Kind::Free,
            },
            Record::DirentSet {
                dir: 20,
                name: b"g4",
                ino: 34,
                kind: Kind::File,
            },
        ],
    );
    lw.append(sh, &[set_size(35, Kind::File, 10)]);
    let first_digest = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert!(!sh.inodes.is_used(33));
    let snap1 = snapshot(sh);
    reclaim_all(sh);
    let used1 = used_blocks(sh);
    // Crash before the head was persisted: the head is still the old one.
    sh.rewind_slot_head(lw.slot, SlotHead { active: true, ..h0 })
        .unwrap();
    let again = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(again.head_lsn, first_digest.head_lsn);
    let snap2 = snapshot(sh);
    reclaim_all(sh);
    assert_eq!(snap1, snap2);
    assert_eq!(used_blocks(sh), used1);
    assert_eq!(snap1.len(), 1 + 1 + 29);
    assert_eq!(snap1["/d/f5"].3, vec![0u8; 10], "f5's data started at 500");
    assert!(snap1.contains_key("/d/g4") && !snap1.contains_key("/d/f4"));
}

fn expect_malformed(ts: &TestStore, build: impl FnOnce(&Shared, &mut LogWriter)) -> String {
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let before = snapshot(sh);
    let used = used_blocks(sh);
    let (h, _) = sh.slot_head(lw.slot).unwrap();
    build(sh, &mut lw);
    let e = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap_err();
    assert_eq!(snapshot(sh), before, "shared area untouched");
    assert_eq!(used_blocks(sh), used);
    assert_eq!(sh.slot_head(lw.slot).unwrap().0, h, "head unchanged");
    core.release(lw.slot, None).unwrap();
    match e {
        DigestError::Malformed { msg, discard_lsn } => {
            assert_eq!(discard_lsn, lw.tail);
            msg
        }
        DigestError::Failed(e) => panic!("expected malformed, got {e}"),
    }
}

#[test]
fn malformed_logs_are_refused_without_touching_the_area() {
    let ts = TestStore::small();
    let data = vec![1u8; 5000];
    // Corrupt crc in the middle of the range.
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &create_file(10, ROOT_INO, b"x"));
        let mut t = log::build_txn(lw.seq, &[write(10, 0, 5000, &data)]);
        t[100] ^= 1;
        lw.put(sh, &t);
        lw.append(sh, &create_file(11, ROOT_INO, b"y"));
    });
    assert!(m.contains("checksum"), "{m}");
    // A dirent in a file.
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &create_file(10, ROOT_INO, b"x"));
        lw.append(sh, &create_file(11, 10, b"y"));
    });
    assert!(m.contains("not a directory"), "{m}");
    // A write to a free inode.
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &create_file(10, ROOT_INO, b"x"));
        lw.append(sh, &[write(99, 0, 5000, &data)]);
    });
    assert!(m.contains("free inode 99"), "{m}");
    // An inode number out of range.
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &create_file(1 << 40, ROOT_INO, b"x"));
    });
    assert!(m.contains("out of range"), "{m}");
    // A write to a FIFO; a device node whose number changes.
    let fifo = |ino: u64, rdev: u64, kind: Kind| {
        vec![
            Record::InodeSet {
                ino,
                generation: 1,
                attrs: Attrs {
                    rdev,
                    ..attrs(kind, 0, 1, 0)
                },
            },
            Record::DirentSet {
                dir: ROOT_INO,
                name: b"special",
                ino,
                kind,
            },
        ]
    };
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &fifo(10, 0, Kind::Fifo));
        lw.append(sh, &[write(10, 0, 5000, &data)]);
    });
    assert!(m.contains("WRITE to inode 10, a Fifo"), "{m}");
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &fifo(10, 0x103, Kind::CharDev));
        lw.append(
            sh,
            &[Record::InodeSet {
                ino: 10,
                generation: 1,
                attrs: Attrs {
                    rdev: 0x105,
                    ..attrs(Kind::CharDev, 0, 1, 0)
                },
            }],
        );
    });
    assert!(m.contains("device number"), "{m}");
    // A dirent naming a free inode; a kind change; freeing the root.
    expect_malformed(&ts, |sh, lw| {
        lw.append(
            sh,
            &[Record::DirentSet {
                dir: ROOT_INO,
                name: b"z",
                ino: 50,
                kind: Kind::File,
            }],
        );
    });
    expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &[set_size(ROOT_INO, Kind::File, 0)]);
    });
    expect_malformed(&ts, |sh, lw| {
        lw.append(
            sh,
            &[Record::InodeSet {
                ino: ROOT_INO,
                generation: 1,
                attrs: attrs(Kind::Dir, 0, 0, 1),
            }],
        );
    });
}

#[test]
fn upto_must_be_a_transaction_boundary_within_the_ring() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    lw.append(sh, &create_file(10, ROOT_INO, b"x"));
    let ring = sh.layout.ring_bytes();
    // Behind the head: nothing to do.
    assert_eq!(digest(sh, lw.slot, Mode::Upto(0)).unwrap().head_lsn, 0);
    for bad in [lw.tail - 64, lw.tail + 64, ring + 64, 3] {
        match digest(sh, lw.slot, Mode::Upto(bad)) {
            Err(DigestError::Malformed { .. }) => {}
            other => panic!("upto {bad}: {other:?}"),
        }
    }
    assert!(lookup(sh, ROOT_INO, "x").is_none());
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(lookup(sh, ROOT_INO, "x"), Some(10));
}

#[test]
fn nonempty_directory_cannot_be_freed_and_free_keeps_generation() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let big = vec![9u8; 100_000];
    lw.append(sh, &mkdir(10, ROOT_INO, b"d"));
    lw.append(sh, &create_file(11, 10, b"y"));
    lw.append(sh, &[write(11, 0, big.len() as u64, &big)]);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    reclaim_all(sh);
    let used = used_blocks(sh);
    // rmdir of a non-empty directory.
    let (h, _) = sh.slot_head(lw.slot).unwrap();
    lw.append(
        sh,
        &[
            Record::DirentSet {
                dir: ROOT_INO,
                name: b"d",
                ino: 0,
                kind: Kind::Free,
            },
            Record::InodeSet {
                ino: 10,
                generation: 1,
                attrs: attrs(Kind::Dir, 0, 0, 1),
            },
        ],
    );
    match digest(sh, lw.slot, Mode::Upto(lw.tail)) {
        Err(DigestError::Malformed { msg, .. }) => assert!(msg.contains("entries left"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // Discard that log (as the server does) and do it properly.
    sh.rewind_slot_head(
        lw.slot,
        SlotHead {
            head_lsn: lw.tail,
            head_seq: lw.seq,
            ..h
        },
    )
    .unwrap();
    lw.append(
        sh,
        &[
            Record::DirentSet {
                dir: 10,
                name: b"y",
                ino: 0,
                kind: Kind::Free,
            },
            Record::InodeSet {
                ino: 11,
                generation: 1,
                attrs: attrs(Kind::File, 0, 0, 0),
            },
            Record::DirentSet {
                dir: ROOT_INO,
                name: b"d",
                ino: 0,
                kind: Kind::Free,
            },
            Record::InodeSet {
                ino: 10,
                generation: 1,
                attrs: attrs(Kind::Dir, 0, 0, 1),
            },
        ],
    );
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    reclaim_all(sh);
    assert!(used_blocks(sh) < used);
    assert_eq!(
        used_blocks(sh),
        sh.area.read_inode(ROOT_INO).unwrap().blocks
    );
    let f = sh.area.read_inode(11).unwrap();
    assert_eq!((f.attrs.kind, f.generation), (Kind::Free, 1));
    assert!(!sh.inodes.is_used(11));
    // Reuse: the new user gets generation + 1.
    sh.inodes.reserve_one(lw.slot, 11);
    lw.append(sh, &create_file(11, ROOT_INO, b"again"));
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(sh.area.read_inode(11).unwrap().generation, 2);
}

#[test]
fn created_and_freed_in_one_batch_is_skipped() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let data = vec![1u8; 50_000];
    lw.append(sh, &create_file(10, ROOT_INO, b"tmp"));
    lw.append(sh, &[write(10, 0, 50_000, &data)]);
    lw.append(
        sh,
        &[
            Record::DirentSet {
                dir: ROOT_INO,
                name: b"tmp",
                ino: 0,
                kind: Kind::Free,
            },
            Record::InodeSet {
                ino: 10,
                generation: 1,
                attrs: attrs(Kind::File, 50_000, 0, 0),
            },
        ],
    );
    let used = used_blocks(sh);
    let o = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(o.records, 5);
    assert_eq!(o.skipped, 5);
    assert_eq!(used_blocks(sh), used, "no data written");
    assert!(!sh.inodes.is_used(10));
    assert_eq!(sh.area.read_inode(10).unwrap().attrs.kind, Kind::Free);
}

#[test]
fn enospc_leaves_the_log_authoritative() {
    // 8 MiB tier: about 1.7k data blocks.
    let ts = TestStore::with_inodes(8 << 20, 1 << 20, 1, 256);
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let free = sh.blocks.free_count();
    let chunk = vec![5u8; 200 * 1024];
    lw.append(sh, &create_file(10, ROOT_INO, b"small"));
    lw.append(sh, &[write(10, 0, 10, b"0123456789")]);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    let before = snapshot(sh);
    let used = used_blocks(sh);
    let (h, _) = sh.slot_head(lw.slot).unwrap();
    lw.append(sh, &create_file(11, ROOT_INO, b"big"));
    let mut off = 0u64;
    while off / 4096 < free + 10 {
        if lw.tail - h.head_lsn + chunk.len() as u64 + 4096 > sh.layout.ring_bytes() {
            break;
        }
        lw.append(sh, &[write(11, off, off + chunk.len() as u64, &chunk)]);
        off += chunk.len() as u64;
    }
    // Not enough to fill the tier through one ring: fill it directly instead.
    let mut hog = crate::store::shared::Work::default();
    while sh.blocks.free_count() > 20 {
        sh.alloc_block(&mut hog).unwrap();
    }
    match digest(sh, lw.slot, Mode::Upto(lw.tail)) {
        Err(DigestError::Failed(e)) => assert_eq!(cairn_area::errno_of(&e), libc::ENOSPC),
        other => panic!("{other:?}"),
    }
    assert_eq!(snapshot(sh), before);
    assert_eq!(sh.slot_head(lw.slot).unwrap().0, h);
    assert_eq!(
        sh.blocks.free_count(),
        20,
        "every block of the failed digest returned"
    );
    // Space comes back: the same batch digests.
    sh.rollback(&hog);
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    assert_eq!(read_all(sh, 11).len() as u64, off);
    assert!(used_blocks(sh) > used);
}

#[test]
fn ring_wraps_across_digests_and_committed_scan_stops_at_torn_tail() {
    let ts = TestStore::new(64 << 20, 256 << 10, 1);
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    lw.append(sh, &create_file(10, ROOT_INO, b"f"));
    let mut model = Vec::new();
    for round in 0..40u64 {
        let chunk = vec![round as u8; 30_000];
        let off = model.len() as u64;
        lw.append(sh, &[write(10, off, off + chunk.len() as u64, &chunk)]);
        model.extend_from_slice(&chunk);
        if round % 3 == 2 {
            digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        }
    }
    assert!(
        lw.tail > 3 * sh.layout.ring_bytes(),
        "wrapped several times"
    );
    // A torn transaction at the tail: committed mode stops before it.
    let chunk = vec![0xee; 1000];
    let mut t = log::build_txn(lw.seq, &[write(10, 0, model.len() as u64, &chunk)]);
    let n = t.len();
    t[n - 10] ^= 0xff;
    lw.append_raw_len_pub(sh, n);
    let committed_end = lw.tail;
    lw.put(sh, &t);
    let o = digest(sh, lw.slot, Mode::Committed).unwrap();
    assert_eq!(o.head_lsn, committed_end);
    assert_eq!(read_all(sh, 10), model);
}

#[test]
fn ten_mib_batch_of_4k_writes_digests_fast() {
    let ts = TestStore::new(128 << 20, 16 << 20, 1);
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    lw.append(sh, &create_file(10, ROOT_INO, b"big"));
    let blk = vec![0x5a; 4096];
    for i in 0..2560u64 {
        lw.append(sh, &[write(10, i * 4096, (i + 1) * 4096, &blk)]);
    }
    let t = std::time::Instant::now();
    let o = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    let el = t.elapsed();
    eprintln!("digest of {} bytes of log: {el:?}", o.log_bytes);
    assert!(o.log_bytes > 10 << 20);
    assert!(el < std::time::Duration::from_secs(1), "took {el:?}");
    let i = sh.area.read_inode(10).unwrap();
    assert_eq!(i.attrs.size, 10 << 20);
    // Five 2 MiB ranges filled by the batch: five superpage extents under the root.
    assert_eq!(i.blocks, 2560 + 1);
}

/// The checks run after every digest in checked builds (`store::check`) find a wrong
/// block count, a block of a file marked free, a wrong entry count and an allocator
/// whose count disagrees with its bitmap.
#[test]
fn the_post_digest_checks_catch_planted_damage() {
    use crate::store::check::{allocation, published_inode};
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    let data = vec![7u8; 10_000];
    lw.append(sh, &create_file(10, ROOT_INO, b"f"));
    lw.append(sh, &[write(10, 0, 10_000, &data)]);
    lw.append(sh, &mkdir(11, ROOT_INO, b"d"));
    digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    let f = sh.area.read_inode(10).unwrap();
    let d = sh.area.read_inode(ROOT_INO).unwrap();
    assert_eq!(published_inode(sh, 10, &f), Ok(()));
    assert_eq!(published_inode(sh, ROOT_INO, &d), Ok(()));
    assert_eq!(allocation(sh), Ok(()));

    let wrong = Inode {
        blocks: f.blocks + 1,
        ..f
    };
    assert!(published_inode(sh, 10, &wrong)
        .unwrap_err()
        .contains("block count"));
    let wrong = Inode {
        dir_entries: d.dir_entries + 1,
        ..d
    };
    assert!(published_inode(sh, ROOT_INO, &wrong)
        .unwrap_err()
        .contains("entry count"));
    let b = sh.area.block_of(&f, 1).unwrap().unwrap();
    assert!(sh.blocks.free(b));
    assert!(published_inode(sh, 10, &f).unwrap_err().contains("is free"));
    // The allocator's count and bitmap still agree; a count off by one does not.
    assert_eq!(allocation(sh), Ok(()));
    sh.blocks.mark_used(b);
    sh.blocks.skew_free_count_for_test();
    assert!(allocation(sh).unwrap_err().contains("free blocks"));
}

/// Long one-`WRITE` transactions of a live client's range are digested from the ring in
/// place (their heads copied and checked), short ones and everything else from a copy:
/// the file gets the bytes of both kinds, and a bad head of a long one is refused.
#[test]
fn long_writes_are_digested_in_place_and_their_heads_checked() {
    let ts = TestStore::small();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    {
        let mut core = ts.core();
        let mut lw = LogWriter::register(&mut core);
        let sh = &mut core.sh;
        lw.append(sh, &create_file(10, ROOT_INO, b"big"));
        lw.append(sh, &[write(10, 0, 300_000, &big)]);
        lw.append(sh, &[write(10, 1000, 300_000, b"short")]);
        lw.append(sh, &[write(10, 200_000, 300_000, &big[..20_000])]);
        let o = digest(sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        assert_eq!(o.head_lsn, lw.tail);
        let mut want = big.clone();
        want[1000..1005].copy_from_slice(b"short");
        want[200_000..220_000].copy_from_slice(&big[..20_000]);
        assert_eq!(read_all(sh, 10), want);
        core.release(lw.slot, None).unwrap();
    }
    // The WRITE head of a long transaction says more data than the record holds.
    let m = expect_malformed(&ts, |sh, lw| {
        lw.append(sh, &create_file(10, ROOT_INO, b"x"));
        let mut t = log::build_txn(lw.seq, &[write(10, 0, 40_000, &big[..40_000])]);
        t[log::TXN_HEADER + 40..log::TXN_HEADER + 44].copy_from_slice(&50_000u32.to_le_bytes());
        lw.put(sh, &t);
    });
    assert!(m.contains("WRITE"), "{m}");
    // A range that ends inside a long transaction.
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let sh = &mut core.sh;
    lw.append(sh, &create_file(10, ROOT_INO, b"x"));
    lw.append(sh, &[write(10, 0, 40_000, &big[..40_000])]);
    match digest(sh, lw.slot, Mode::Upto(lw.tail - 64)) {
        Err(DigestError::Malformed { msg, .. }) => assert!(msg.contains("inside"), "{msg}"),
        r => panic!("expected malformed, got {r:?}"),
    }
    core.release(lw.slot, None).unwrap();
}

/// A client's digest request is one batch, or, while the client says more than half of
/// its log is undigested, published in slices (a writer waiting for room goes on after
/// the first); the outcome adds the slices up and the shared area is the whole range's.
#[test]
fn a_digest_request_is_published_in_slices_under_pressure() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let mut lw = LogWriter::register(&mut core);
    let slice = core.sh.layout.ring_bytes() / crate::digest::SLICES;
    let chunk: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
    let n = (3 * slice / chunk.len() as u64) + 1;
    let mut size = 0;
    for pressure in [false, true] {
        let (page, at) = core.sh.area.slot_log(lw.slot);
        page.store_u64(at + client_page::PRESSURE as usize, u64::from(pressure))
            .unwrap();
        let first = lw.seq;
        if size == 0 {
            lw.append(&core.sh, &create_file(10, ROOT_INO, b"f"));
        }
        for _ in 0..n {
            size += chunk.len() as u64;
            lw.append(
                &core.sh,
                &[write(10, size - chunk.len() as u64, size, &chunk)],
            );
        }
        let before = core.sh.counters.digests;
        let o = core.digest_client(lw.slot, lw.tail).unwrap();
        assert_eq!((o.head_lsn, o.head_seq), (lw.tail, lw.seq));
        assert_eq!(o.txns, lw.seq - first);
        let digests = core.sh.counters.digests - before;
        if pressure {
            assert!(
                digests >= 3,
                "{digests} digests for {n} writes of 100 KB in slices of {slice} bytes"
            );
        } else {
            assert_eq!(digests, 1, "one batch without pressure");
        }
        assert_eq!(
            read_all(&core.sh, 10),
            chunk.repeat(size as usize / chunk.len())
        );
    }
    core.release(lw.slot, None).unwrap();
}
