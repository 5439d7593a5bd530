//! Parallel digests (`crate::digest::parallel`): two slots' batches digested by two threads give
//! the shared state of the serial daemon, also when their claims conflict, and replaying
//! batches from their old heads (a crash before the heads were persisted, including with
//! two digests in flight) is idempotent.

use super::map_tests::Rng;
use super::*;
use crate::digest::parallel::{self, CoreLock};
use crate::digest::{digest, Mode};
use cairn_format::slot::SlotHead;
use std::collections::HashMap;
use std::time::Instant;

/// One logged call, owning its bytes.
#[derive(Debug, Clone)]
enum Op {
    Create {
        ino: u64,
        dir: u64,
        name: Vec<u8>,
    },
    Write {
        ino: u64,
        off: u64,
        size: u64,
        data: Vec<u8>,
    },
    Trunc {
        ino: u64,
        size: u64,
    },
    Unlink {
        ino: u64,
        dir: u64,
        name: Vec<u8>,
    },
}

fn records(op: &Op) -> Vec<Record<'_>> {
    match op {
        Op::Create { ino, dir, name } => create_file(*ino, *dir, name),
        Op::Write {
            ino,
            off,
            size,
            data,
        } => vec![Record::Write {
            ino: *ino,
            offset: *off,
            size: *size,
            mtime: 77,
            data,
        }],
        Op::Trunc { ino, size } => vec![Record::InodeSet {
            ino: *ino,
            generation: 1,
            attrs: attrs(Kind::File, *size, 1, 0),
        }],
        Op::Unlink { ino, dir, name } => vec![
            Record::InodeSet {
                ino: *ino,
                generation: 1,
                attrs: attrs(Kind::File, 0, 0, 0),
            },
            Record::DirentSet {
                dir: *dir,
                name,
                ino: 0,
                kind: Kind::Free,
            },
        ],
    }
}

/// A client's model: its directory, its files' sizes and names.
struct Client {
    slot: u32,
    dir: u64,
    next: u64,
    files: HashMap<u64, (u64, u64, Vec<u8>)>,
}

impl Client {
    /// A random batch: creations, writes, truncations, removals in its own directory,
    /// and now and then a creation in the root (shared with the other client).
    fn batch(&mut self, rng: &mut Rng) -> Vec<Op> {
        let mut ops = Vec::new();
        for _ in 0..1 + rng.below(12) {
            let live: Vec<u64> = self.files.keys().copied().collect();
            let pick = rng.below(10);
            if live.is_empty() || pick < 2 {
                let ino = self.next;
                self.next += 1;
                let dir = if rng.below(5) == 0 {
                    ROOT_INO
                } else {
                    self.dir
                };
                let name = format!("s{}f{ino}", self.slot).into_bytes();
                self.files.insert(ino, (0, dir, name.clone()));
                ops.push(Op::Create { ino, dir, name });
                continue;
            }
            let ino = live[rng.below(live.len() as u64) as usize];
            let cur = self.files[&ino].0;
            if pick < 8 {
                let off = rng.below(40_000);
                let len = 1 + rng.below(9_000);
                let size = cur.max(off + len);
                let data = (0..len)
                    .map(|i| (i as u8) ^ (ino as u8) ^ (rng.next() as u8 & 1))
                    .collect();
                self.files.get_mut(&ino).unwrap().0 = size;
                ops.push(Op::Write {
                    ino,
                    off,
                    size,
                    data,
                });
            } else if pick < 9 {
                let size = rng.below(cur + 1);
                self.files.get_mut(&ino).unwrap().0 = size;
                ops.push(Op::Trunc { ino, size });
            } else {
                let (_, dir, name) = self.files.remove(&ino).unwrap();
                ops.push(Op::Unlink { ino, dir, name });
            }
        }
        ops
    }
}

fn append(lw: &mut LogWriter, sh: &Shared, ops: &[Op]) {
    for op in ops {
        lw.append(sh, &records(op));
    }
}

/// Two registered clients, each with its own directory (digested serially).
fn setup(core: &mut Core) -> (Vec<LogWriter>, Vec<Client>) {
    let mut lws = vec![LogWriter::register(core), LogWriter::register(core)];
    let mut clients = Vec::new();
    for (i, lw) in lws.iter_mut().enumerate() {
        let dir = 150 + i as u64;
        let name = format!("d{i}").into_bytes();
        lw.append(&core.sh, &mkdir(dir, ROOT_INO, &name));
        digest(&mut core.sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        clients.push(Client {
            slot: lw.slot,
            dir,
            next: 200 + 400 * i as u64,
            files: HashMap::new(),
        });
    }
    (lws, clients)
}

/// Digest every slot up to its tail, one thread per slot.
fn digest_parallel(cl: &CoreLock, jobs: &[(u32, u64)]) {
    std::thread::scope(|s| {
        for &(slot, upto) in jobs {
            s.spawn(move || {
                let mut scratch = Vec::new();
                let o = parallel::digest_client(cl, slot, 1, upto, &mut scratch)
                    .unwrap_or_else(|e| panic!("slot {slot}: {e}"))
                    .expect("the slot is still the client's");
                assert_eq!(o.head_lsn, upto);
            });
        }
    });
    assert!(cl.serial().par.claims.is_empty());
}

fn state(sh: &mut Shared) -> (Snapshot, u64, u64) {
    reclaim_all(sh);
    (norm(snapshot(sh)), used_blocks(sh), sh.inodes.used_count())
}

/// The root's times come from mkfs (each store's own).
fn norm(mut s: Snapshot) -> Snapshot {
    if let Some(r) = s.get_mut("/") {
        (r.2.atime, r.2.mtime, r.2.ctime, r.2.btime) = (0, 0, 0, 0);
    }
    s
}

/// The first difference between two states, if any (short enough to read).
fn diff(a: &(Snapshot, u64, u64), b: &(Snapshot, u64, u64)) -> Option<String> {
    for k in a.0.keys().chain(b.0.keys()) {
        match (a.0.get(k), b.0.get(k)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                let f = |v: Option<&(u64, u64, Attrs, Vec<u8>)>| {
                    v.map(|(i, g, a, d)| format!("ino {i} gen {g} {a:?} {} bytes", d.len()))
                };
                return Some(format!("{k}: {:?} vs {:?}", f(x), f(y)));
            }
        }
    }
    (a.1 != b.1 || a.2 != b.2).then(|| format!("blocks/inodes {}/{} vs {}/{}", a.1, a.2, b.1, b.2))
}

#[test]
fn parallel_digests_equal_serial_and_replays_are_idempotent() {
    let (ts_s, ts_p) = (TestStore::small(), TestStore::small());
    let mut serial = ts_s.core();
    let mut par = ts_p.core();
    let (mut lw_s, mut clients) = setup(&mut serial);
    let (mut lw_p, _) = setup(&mut par);
    let cl = CoreLock::new(par);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut replays = 0;
    for round in 0..60 {
        let batches: Vec<Vec<Op>> = clients.iter_mut().map(|c| c.batch(&mut rng)).collect();
        let mut jobs = Vec::new();
        let mut old_heads: Vec<SlotHead> = Vec::new();
        {
            let g = cl.serial();
            for i in 0..2 {
                append(&mut lw_s[i], &serial.sh, &batches[i]);
                append(&mut lw_p[i], &g.sh, &batches[i]);
                old_heads.push(g.sh.slot_head(lw_p[i].slot).unwrap().0);
                jobs.push((lw_p[i].slot, lw_p[i].tail));
            }
        }
        // The serial daemon's order.
        for lw in &lw_s {
            digest(&mut serial.sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
        }
        digest_parallel(&cl, &jobs);
        // A crash before some heads were persisted: replay those batches from their
        // old heads (both: two digests were in flight), serially or in parallel.
        let which = rng.below(4);
        let replay: Vec<usize> = (0..2).filter(|i| which & (1 << i) != 0).collect();
        if !replay.is_empty() {
            replays += 1;
            {
                let g = cl.serial();
                for &i in &replay {
                    g.sh.rewind_slot_head(lw_p[i].slot, old_heads[i]).unwrap();
                }
            }
            if replay.len() == 2 && rng.below(2) == 0 {
                digest_parallel(&cl, &jobs);
            } else {
                let mut g = cl.serial();
                for &i in replay.iter().rev() {
                    let o = digest(&mut g.sh, lw_p[i].slot, Mode::Upto(lw_p[i].tail)).unwrap();
                    assert_eq!(o.head_lsn, lw_p[i].tail);
                }
            }
        }
        let mut g = cl.serial();
        let d = diff(&state(&mut g.sh), &state(&mut serial.sh));
        assert!(
            d.is_none(),
            "round {round}: parallel (replayed: {replay:?}) differs from serial: {d:?}"
        );
    }
    assert!(replays > 20);
}

#[test]
fn conflicting_batches_wait_for_each_other() {
    // Both clients change the root directory and the same file: the claims conflict,
    // the second digest plans again after the first published.
    let (ts_s, ts_p) = (TestStore::small(), TestStore::small());
    let mut serial = ts_s.core();
    let mut par = ts_p.core();
    let (mut lw_s, _) = setup(&mut serial);
    let (mut lw_p, _) = setup(&mut par);
    let shared_file = vec![
        Op::Create {
            ino: 300,
            dir: ROOT_INO,
            name: b"shared".to_vec(),
        },
        Op::Write {
            ino: 300,
            off: 0,
            size: 10_000,
            data: vec![1u8; 10_000],
        },
    ];
    let mut batches: Vec<Vec<Op>> = Vec::new();
    for i in 0..2u64 {
        let mut b = Vec::new();
        for k in 0..50 {
            b.push(Op::Create {
                ino: 400 + i * 100 + k,
                dir: ROOT_INO,
                name: format!("c{i}-{k}").into_bytes(),
            });
        }
        batches.push(b);
    }
    batches[0].extend(shared_file);
    // Slot 1 writes the file slot 0 creates: correct only if slot 0 is digested first,
    // so the serial order is 0 then 1 and slot 1's batch goes second in both stores.
    let cl = CoreLock::new(par);
    {
        let g = cl.serial();
        for i in 0..2 {
            append(&mut lw_s[i], &serial.sh, &batches[i]);
            append(&mut lw_p[i], &g.sh, &batches[i]);
        }
    }
    for lw in &lw_s {
        digest(&mut serial.sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
    }
    let jobs: Vec<(u32, u64)> = lw_p.iter().map(|l| (l.slot, l.tail)).collect();
    digest_parallel(&cl, &jobs);
    let mut g = cl.serial();
    let d = diff(&state(&mut g.sh), &state(&mut serial.sh));
    assert!(d.is_none(), "parallel differs from serial: {d:?}");
    assert_eq!(snapshot(&g.sh).len(), 1 + 2 + 101);
}

#[test]
fn digest_throughput_two_10mib_batches() {
    const MIB10: usize = 10 << 20;
    let run = |parallel: bool| -> (f64, Snapshot) {
        let ts = TestStore::new(160 << 20, 32 << 20, 2);
        let mut core = ts.core();
        let mut lws = [
            LogWriter::register(&mut core),
            LogWriter::register(&mut core),
        ];
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        for (i, lw) in lws.iter_mut().enumerate() {
            let ino = 150 + i as u64;
            let dir = 160 + i as u64;
            let dname = format!("d{i}").into_bytes();
            lw.append(&core.sh, &mkdir(dir, ROOT_INO, &dname));
            lw.append(&core.sh, &create_file(ino, dir, b"f"));
            digest(&mut core.sh, lw.slot, Mode::Upto(lw.tail)).unwrap();
            for k in 0..(MIB10 / 4096) as u64 {
                lw.append(
                    &core.sh,
                    &[Record::Write {
                        ino,
                        offset: k * 4096,
                        size: (k + 1) * 4096,
                        mtime: 9,
                        data: &data,
                    }],
                );
            }
        }
        let jobs: Vec<(u32, u64)> = lws.iter().map(|l| (l.slot, l.tail)).collect();
        // Batch buffers already faulted in, as in a running daemon (kept across digests).
        core.sh.scratch = vec![1u8; MIB10 + (1 << 20)];
        let mut scratches = vec![vec![1u8; MIB10 + (1 << 20)]; 2];
        let cl = CoreLock::new(core);
        let t = Instant::now();
        if parallel {
            std::thread::scope(|s| {
                for (&(slot, upto), scratch) in jobs.iter().zip(scratches.iter_mut()) {
                    let cl = &cl;
                    s.spawn(move || {
                        let o = parallel::digest_client(cl, slot, 1, upto, scratch);
                        assert_eq!(o.unwrap().unwrap().head_lsn, upto);
                    });
                }
            });
        } else {
            let mut g = cl.serial();
            for &(slot, upto) in &jobs {
                digest(&mut g.sh, slot, Mode::Upto(upto)).unwrap();
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let g = cl.serial();
        (secs, norm(snapshot(&g.sh)))
    };
    // Alternate, take the medians (each run has a fresh store, page faults included).
    let (mut ser, mut par) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (ts, ss) = run(false);
        let (tp, sp) = run(true);
        assert!(ss == sp, "parallel digest differs from serial");
        assert_eq!(ss["/d0/f"].3.len(), MIB10);
        ser.push(ts);
        par.push(tp);
    }
    ser.sort_by(f64::total_cmp);
    par.sort_by(f64::total_cmp);
    let (ts, tp) = (ser[2], par[2]);
    let mib = 2.0 * MIB10 as f64 / (1 << 20) as f64;
    println!(
        "digest of two 10 MiB batches (4 KiB writes), median of 5: serial {:.1} ms ({:.0} MiB/s), parallel {:.1} ms ({:.0} MiB/s), {} cores",
        ts * 1e3,
        mib / ts,
        tp * 1e3,
        mib / tp,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
}

/// Every block is either free to grant, promised to a client, or in the credit float.
fn credits_add_up(c: &crate::core::Core) {
    let promised: u64 = c.clients.iter().flatten().map(|c| c.credits).sum();
    let reserve = (c.sh.layout.data_blocks / 64).max(256);
    assert_eq!(
        c.available_credits() + promised + c.float.held(),
        c.sh.blocks.free_count() - reserve
    );
}

#[test]
fn credits_come_from_the_float_while_a_digest_holds_the_core() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let lw = LogWriter::register(&mut core);
    let slot = lw.slot as usize;
    let before = core.clients[slot].as_ref().unwrap().credits;
    credits_add_up(&core);
    assert!(
        core.float.held() > 0,
        "registration's grant filled the pool"
    );
    let cl = CoreLock::new(core);
    let held = cl.serial();
    // The connection thread grants from the float without the core lock.
    assert!(cl.float().take(lw.slot, 16));
    assert!(
        !cl.float().take(lw.slot, u64::MAX / 2),
        "no more than the pool"
    );
    drop(held);
    let mut g = cl.serial();
    credits_add_up(&g);
    // Folded into the client's credits when the core is next held, and not granted
    // twice: a grant of everything left sees the float's blocks as promised.
    let rest = g.grant(lw.slot, u64::MAX);
    assert_eq!(
        g.clients[slot].as_ref().unwrap().credits,
        before + 16 + rest
    );
    credits_add_up(&g);
    assert_eq!(g.available_credits(), 0);
    assert!(
        !cl.float().take(lw.slot, 1),
        "nothing was left to set aside"
    );
}

#[test]
fn credits_a_client_took_from_the_float_go_with_it() {
    let ts = TestStore::small();
    let mut core = ts.core();
    let lw = LogWriter::register(&mut core);
    let cl = CoreLock::new(core);
    assert!(cl.float().take(lw.slot, 16));
    let mut g = cl.serial();
    g.release(lw.slot, None).unwrap();
    assert_eq!(g.float.drain(lw.slot), 0, "dropped with the client");
    credits_add_up(&g);
}
