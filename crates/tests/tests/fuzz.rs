//! Fuzzing every decoder that reads bytes another party wrote: a client's log (the
//! daemon does not trust it: transactions and their records), the client–daemon
//! messages (anyone may connect to the socket), the superblock and its copy, inodes,
//! directory buckets, slot heads and the extended-attribute journal (the media), the
//! key-value pool's header, segments, records and journal, and the RESP parser of
//! `cairn kv serve` (anyone on the network).
//!
//! Each decoder gets random bytes and mutations of valid encodings (bits flipped, bytes
//! overwritten, the input cut short or extended). It must answer with a value or an
//! error: never panic, never allocate more in one piece than the input can justify
//! ([`bounded`]), and a valid encoding decodes to what was encoded.
//!
//! `CAIRN_FUZZ_CASES` sets the cases per decoder (default 2,000, a few seconds in all);
//! the long run (docs/TESTING.md) is `CAIRN_FUZZ_CASES=1000000 cargo test --release -p
//! cairn-tests --test fuzz`.

use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::log::{self, Record};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, watching the largest single allocation made by the thread
/// while [`bounded`] runs.
struct Watching;

thread_local! {
    static WATCHED: Cell<bool> = const { Cell::new(false) };
    static BIGGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the bookkeeping touches only
// const-initialized thread-locals (no allocation, no reentrance).
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}

fn note(size: usize) {
    let _ = WATCHED.try_with(|w| {
        if w.get() {
            let _ = BIGGEST.try_with(|b| b.set(b.get().max(size)));
        }
    });
}

#[global_allocator]
static ALLOC: Watching = Watching;

/// Run a decoder on `input`: no single allocation larger than 64 KiB plus 16 bytes per
/// input byte (what decoding every byte into a structure of its own could take).
fn bounded<R>(what: &str, input: &[u8], f: impl FnOnce() -> R) -> R {
    BIGGEST.with(|b| b.set(0));
    WATCHED.with(|w| w.set(true));
    let r = f();
    WATCHED.with(|w| w.set(false));
    let biggest = BIGGEST.with(|b| b.get());
    let limit = (64 << 10) + 16 * input.len();
    assert!(
        biggest <= limit,
        "{what}: an allocation of {biggest} bytes for {} input bytes",
        input.len()
    );
    r
}

fn cases() -> u32 {
    std::env::var("CAIRN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// A change to a valid encoding.
#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Set { at: usize, byte: u8 },
    Cut { to: usize },
    Grow { by: Vec<u8> },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        1 => any::<usize>().prop_map(|to| Mutation::Cut { to }),
        1 => proptest::collection::vec(any::<u8>(), 1..64).prop_map(|by| Mutation::Grow { by }),
    ]
}

fn mutate(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        match m {
            Mutation::Flip { at, bit } if !b.is_empty() => {
                let i = at % b.len();
                b[i] ^= 1 << bit;
            }
            Mutation::Set { at, byte } if !b.is_empty() => {
                let i = at % b.len();
                b[i] = *byte;
            }
            Mutation::Cut { to } => {
                let n = to % (b.len() + 1);
                b.truncate(n);
            }
            Mutation::Grow { by } => b.extend_from_slice(by),
            _ => {}
        }
    }
    b
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..4)
}

fn garbage() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..5000)
}

fn attrs(kind: u8, perm: u32, size: u64, t: i64) -> Attrs {
    let kind = match kind % 4 {
        0 => Kind::File,
        1 => Kind::Dir,
        2 => Kind::Symlink,
        _ => Kind::Fifo,
    };
    Attrs {
        kind,
        perm: perm & 0o7777,
        uid: 1000,
        gid: 1000,
        nlink: 1,
        size: if kind == Kind::Fifo {
            0
        } else {
            size % (1 << 40)
        },
        atime: t,
        mtime: t,
        ctime: t,
        btime: t,
        parent: 1,
        rdev: 0,
    }
}

/// Records of every kind, from the generated numbers.
fn some_records<'a>(n: &[(u64, u64, u8)], names: &'a [Vec<u8>], data: &'a [u8]) -> Vec<Record<'a>> {
    n.iter()
        .zip(names.iter().cycle())
        .map(|(&(a, b, k), name)| match k % 4 {
            0 => Record::InodeSet {
                ino: a,
                generation: b,
                attrs: attrs(k, a as u32, b, a as i64),
            },
            1 => {
                let data = &data[..(a as usize) % (data.len() + 1)];
                let offset = b % (1 << 40);
                Record::Write {
                    ino: a,
                    offset,
                    size: offset + data.len() as u64 + a % 4096,
                    mtime: a as i64,
                    data,
                }
            }
            2 => Record::DirentSet {
                dir: a,
                name,
                ino: b | 1,
                kind: Kind::File,
            },
            _ => Record::Punch {
                ino: a,
                offset: b % (1 << 40),
                len: a % (1 << 30) + 1,
                mtime: b as i64,
            },
        })
        .collect()
}

/// A log transaction: scanned at a given lsn and sequence, then its records.
fn read_log(bytes: &[u8], nrec: u32) {
    bounded("log scan", bytes, || {
        let s = log::scan(bytes, 4096, 7, 1 << 20);
        for t in &s.txns {
            let lsn = (t.lsn - 4096) as usize;
            if let Some(txn) = bytes.get(lsn..lsn + t.len) {
                let _ = log::records(txn, t.nrec);
            }
        }
    });
    bounded("log records", bytes, || log::records(bytes, nrec).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn log_transactions(
        n in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u8>()), 0..6),
        names in proptest::collection::vec(proptest::collection::vec(1u8..=255, 1..40), 1..4),
        data in proptest::collection::vec(any::<u8>(), 0..300),
        ms in mutations(),
        junk in garbage(),
        nrec in 0u32..20,
    ) {
        let names: Vec<Vec<u8>> = names
            .into_iter()
            .map(|v| v.into_iter().filter(|&b| b != b'/').collect::<Vec<u8>>())
            .filter(|v| !v.is_empty() && v != b"." && v != b"..")
            .collect();
        prop_assume!(!names.is_empty());
        let recs = some_records(&n, &names, &data);
        let txn = log::build_txn(7, &recs);
        // Valid: found whole, and its records are what was written.
        let s = log::scan(&txn, 4096, 7, 1 << 20);
        prop_assert_eq!(s.txns.len(), 1);
        prop_assert_eq!(&log::records(&txn, recs.len() as u32).unwrap(), &recs);
        read_log(&mutate(txn.clone(), &ms), nrec);
        read_log(&junk, nrec);
    }

    #[test]
    fn client_daemon_messages(ms in mutations(), junk in garbage(), ino: u64, lsn: u64) {
        for msg in [
            cairn_proto::Request::Unpin { ino, tail_lsn: lsn },
            cairn_proto::Request::Credentials { tail_lsn: lsn },
            cairn_proto::Request::Lease { ino, write: true },
            cairn_proto::Request::MapObject {
                ino,
                gen: lsn,
                write: true,
                create: false,
                tail_lsn: lsn,
            },
            cairn_proto::Request::SjObject {
                ino,
                gen: lsn,
                undo: ino % 2 == 0,
                write: true,
                tail_lsn: lsn,
            },
            cairn_proto::Request::SjRefresh {
                ino,
                gen: lsn,
                ranges: (0..lsn % 4).map(|i| (i << 12, ino)).collect(),
                tail_lsn: lsn,
            },
            cairn_proto::Request::SjDrop { ino, gen: lsn, undo: true },
        ] {
            let mut b = Vec::new();
            cairn_proto::send(&mut b, &msg).unwrap();
            let back: cairn_proto::Request = cairn_proto::recv(&mut &b[..]).unwrap();
            prop_assert_eq!(back, msg);
            let m = mutate(b, &ms);
            bounded("request", &m, || cairn_proto::recv::<cairn_proto::Request>(&mut &m[..]).is_ok());
            bounded("response", &m, || cairn_proto::recv::<cairn_proto::Response>(&mut &m[..]).is_ok());
        }
        bounded("request", &junk, || cairn_proto::recv::<cairn_proto::Request>(&mut &junk[..]).is_ok());
        bounded("upcall", &junk, || cairn_proto::recv::<cairn_proto::Upcall>(&mut &junk[..]).is_ok());
        // A frame announcing more than is there: an error, without room for the claim.
        let mut claim = (16u32 << 20).to_le_bytes().to_vec();
        claim.extend_from_slice(&junk[..junk.len().min(100)]);
        prop_assert!(bounded("frame", &claim, || cairn_proto::recv::<cairn_proto::Request>(&mut &claim[..]).is_err()));
    }

    /// A segment's stage file, which its writers write and the daemon reads to build
    /// resident copies: mutated or garbage, an error or a header whose runs lie inside
    /// the segment, never a panic or an allocation sized by what the file claims.
    #[test]
    fn stage_files(
        ms in mutations(),
        junk in garbage(),
        runs in proptest::collection::vec((0u64..64, 1u64..3), 0..8),
        claim in 4096u64..(1 << 24),
    ) {
        use cairn_format::sj::StageHeader;
        let len = 8u64 << 20;
        let mut at = 0;
        let runs: Vec<(u64, u64)> = runs
            .into_iter()
            .map(|(gap, l)| {
                let r = (at + gap * 4096, l * 4096);
                at = r.0 + r.1;
                r
            })
            .collect();
        let head = StageHeader { seq: 9, ino: 5, gen: 2, runs };
        let mut file = head.encode();
        file.resize(head.data_off() as usize + 8192, 7);
        let load = |b: &[u8]| {
            let mut read = |buf: &mut [u8], at: u64| -> std::io::Result<()> {
                let s = b.get(at as usize..at as usize + buf.len()).ok_or_else(|| {
                    std::io::Error::from_raw_os_error(libc::EINVAL)
                })?;
                buf.copy_from_slice(s);
                Ok(())
            };
            StageHeader::load(&mut read, b.len() as u64, (5, 2, len), 9)
        };
        prop_assert_eq!(load(&file).unwrap(), head);
        // A file announcing more runs than it holds.
        let mut claimed = file.clone();
        claimed[32..40].copy_from_slice(&claim.to_le_bytes());
        for b in [mutate(file, &ms), junk, claimed] {
            if let Ok(h) = bounded("stage file", &b, || load(&b)) {
                prop_assert!(h.runs.iter().all(|&(o, l)| l > 0 && o + l <= len));
            }
        }
    }

    #[test]
    fn superblock_and_its_copy(ms in mutations(), junk in garbage(), seed: u8) {
        use cairn_format::superblock::{Layout as L, Params, Superblock, TierGeom, FORMAT_VERSION, LOWER_TIERS};
        let len = 64u64 << 20;
        let sb = Superblock {
            version: FORMAT_VERSION,
            layout: L::compute(Params {
                total_bytes: len,
                nslots: 4,
                log_bytes: 1 << 20,
                inode_count: 1024,
                tiers: [TierGeom::default(); LOWER_TIERS],
            }).unwrap(),
            uuid: [seed; 16],
            created_ns: seed as i64,
        };
        let b = sb.encode();
        prop_assert_eq!(&Superblock::decode(&b, len).unwrap(), &sb);
        for input in [mutate(b, &ms), junk] {
            let d = bounded("superblock", &input, || Superblock::decode(&input, len));
            let c = bounded("superblock copy", &input, || Superblock::decode_copy(&input, len));
            // Checksummed: what decodes re-encodes to the same covered bytes.
            if let Ok(d) = d {
                prop_assert_eq!(Superblock::decode(&d.encode(), len).unwrap(), d);
            }
            let _ = c;
        }
    }

    #[test]
    fn inodes(ms in mutations(), junk in garbage(), kind: u8, perm: u32, size: u64, gen: u64, t: i64) {
        let i = Inode { generation: gen, attrs: attrs(kind, perm, size, t), ..Inode::default() };
        let b = i.encode();
        prop_assert_eq!(&Inode::decode(&b).unwrap(), &i);
        for input in [mutate(b.to_vec(), &ms), junk] {
            bounded("inode", &input, || Inode::decode(&input).is_ok());
            bounded("inode copy", &input, || Inode::decode_copy(&input).is_ok());
        }
    }

    #[test]
    fn directory_buckets(
        names in proptest::collection::vec("[a-z0-9._-]{1,40}", 0..60),
        ms in mutations(),
        junk in garbage(),
        next: u64,
    ) {
        use cairn_format::dir::{BucketBlock, Entry, BUCKET_SPACE};
        let mut used = 0;
        let entries: Vec<Entry> = names
            .iter()
            .filter(|n| n.as_str() != "." && n.as_str() != "..")
            .map(|n| Entry { name: n.as_bytes().to_vec(), ino: 5, kind: Kind::File })
            .take_while(|e| { used += e.size(); used <= BUCKET_SPACE })
            .collect();
        let b = BucketBlock { entries, next }.encode();
        let back = BucketBlock::decode(&b).unwrap();
        prop_assert_eq!(back.encode(), b.clone());
        for input in [mutate(b, &ms), junk] {
            bounded("bucket", &input, || BucketBlock::decode(&input).is_ok());
        }
    }

    #[test]
    fn slot_heads_and_xattr_journal(
        ms in mutations(),
        junk in garbage(),
        gen: u64, lsn: u64,
        name in "user\\.[a-z0-9._-]{1,200}",
        value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..2000)),
    ) {
        use cairn_format::slot::SlotHead;
        use cairn_format::xattr::JournalRecord;
        let h = SlotHead { gen, active: true, head_lsn: lsn, head_seq: gen, slot_gen: lsn };
        let b = h.encode();
        prop_assert_eq!(SlotHead::decode(&b), Some(h));
        let r = JournalRecord { ino: gen, generation: lsn, name: name.into_bytes(), value };
        let j = r.encode();
        prop_assert_eq!(JournalRecord::decode(&j), Some((r.clone(), j.len())));
        for input in [mutate(b.to_vec(), &ms), mutate(j, &ms), junk] {
            bounded("slot head", &input, || SlotHead::decode(&input).is_some());
            if let Some((rec, n)) = bounded("xattr journal", &input, || JournalRecord::decode(&input)) {
                // What decodes is a whole record of the bytes it says it took.
                prop_assert!(n <= input.len());
                prop_assert_eq!(&rec.encode()[..], &input[..n]);
            }
        }
    }

    #[test]
    fn key_value_pool(
        ms in mutations(),
        junk in garbage(),
        seq: u64, version: u64,
        key in proptest::collection::vec(any::<u8>(), 1..100),
        value in proptest::collection::vec(any::<u8>(), 0..3000),
    ) {
        use cairn_kv::format as f;
        let ph = f::PoolHeader { segments: 8, uuid: [3; 16] };
        let len = 9 * f::SEGMENT_BYTES;
        prop_assert_eq!(f::PoolHeader::decode(&ph.encode(), len).unwrap(), ph);
        let seg = f::encode_segment_header(seq);
        prop_assert_eq!(f::decode_segment_header(&seg), Some(seq));
        let rec = f::encode_record(seq, version, f::Kind::Value, &key, &value);
        let h = f::decode_record_header(&rec, rec.len() as u64).unwrap();
        prop_assert!(f::record_valid(seq, &h, &rec));
        let jr = f::encode_journal(4096, seq, &rec);
        prop_assert_eq!(f::decode_journal(&jr).map(|e| e.record), Some(rec.clone()));
        for input in [mutate(ph.encode(), &ms), mutate(seg, &ms), mutate(rec, &ms), mutate(jr, &ms), junk] {
            bounded("pool header", &input, || f::PoolHeader::decode(&input, len).is_ok());
            bounded("segment header", &input, || f::decode_segment_header(&input));
            let h = bounded("record header", &input, || f::decode_record_header(&input, input.len() as u64));
            if let Some(h) = h {
                // A header that decodes fits the room it was given.
                prop_assert!(h.len <= input.len() as u64);
                bounded("record", &input, || f::record_valid(seq, &h, &input));
            }
            bounded("kv journal", &input, || f::decode_journal(&input).is_some());
        }
    }

    #[test]
    fn resp_requests(
        args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..6),
        ms in mutations(),
        junk in garbage(),
        huge in 1u64..(1 << 40),
    ) {
        use cairn_kvserver::resp::{parse, wanted};
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in &args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        prop_assert_eq!(parse(&req).unwrap(), Some((args.clone(), req.len())));
        // Every prefix asks for more; none is a request.
        for cut in [0, req.len() / 2, req.len() - 1] {
            prop_assert_eq!(parse(&req[..cut]), Ok(None));
        }
        let big = format!("*2\r\n$3\r\nGET\r\n${huge}\r\nabc").into_bytes();
        for input in [mutate(req, &ms), junk, big] {
            bounded("resp", &input, || parse(&input).is_ok());
            bounded("resp wanted", &input, || wanted(&input));
        }
    }
}
