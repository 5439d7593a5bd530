//! Digest: turn a client's committed log transactions into shared-area state.
//!
//! 1. Copy `[head, upto)` out of the client's ring into DRAM (the client cannot change
//!    the copy), verify every transaction and decode every record.
//! 2. Plan: fold the records per inode in order (last `INODE_SET` wins, `WRITE`s in an
//!    interval map, truncations cut it and lower the truncation point) and per
//!    (directory, name) (last `DIRENT_SET` wins); an inode created and freed inside the
//!    batch is dropped with all its records.
//! 3. Validate the plan against the shared area. Nothing is written before the whole batch
//!    is known to be valid: a malformed batch leaves the shared area untouched.
//! 4. Apply out of place (data, map nodes, buckets written and written back); any failure
//!    (`ENOSPC`) gives every new block back and publishes nothing.
//! 5. Fence, publish the inodes under their seqlocks, fence, persist the slot head (A/B)
//!    and `published_head`, retire the replaced blocks in the current epoch and advance it.
//!
//! Records are absolute post-state, so digesting a batch again after a crash anywhere
//! before step 5 persisted the head gives the same shared state.
//!
//! The steps are separate functions (`read_batch`, `plan_batch`, `apply_batch`,
//! `write_data`, `publish_batch`) so that `crate::digest::parallel` can run the reading and the
//! data copies of different slots' digests without the core lock; [`digest`] runs them
//! in a row.

mod apply;
pub(crate) mod parallel;
mod plan;
mod validate;

use crate::store::shared::{Shared, Work};
pub(crate) use apply::write_data;
use apply::{apply_batch, publish_batch, retire_all};
use cairn_format::inode::{Inode, Kind};
use cairn_format::log::{self, Record, Stop, KIND_COMMIT, KIND_WRAP, TXN_HEADER, TXN_MAGIC};
use cairn_format::slot::SlotHead;
use plan::{InodePlan, Life, Plan};
use std::collections::BTreeMap;
use std::io;
use validate::{validate, Checked};

/// How far to digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Exactly `[head, upto)`: the client claims every transaction in it is committed.
    Upto(u64),
    /// From the head for as long as transactions are valid (dead clients, shutdown).
    Committed,
}

/// What a successful digest did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub head_lsn: u64,
    pub head_seq: u64,
    /// Space credits the batch charged (`write_charge` of its `WRITE`s).
    pub charge: u64,
    pub txns: u64,
    pub records: u64,
    pub skipped: u64,
    pub log_bytes: u64,
    pub shared_bytes: u64,
    /// Inodes the batch created (their creator holds their write leases).
    pub created: Vec<u64>,
}

impl Outcome {
    /// `o`, digested right after the batch `self` describes, added to it.
    pub(crate) fn add(&mut self, o: Outcome) {
        self.head_lsn = o.head_lsn;
        self.head_seq = o.head_seq;
        self.charge += o.charge;
        self.txns += o.txns;
        self.records += o.records;
        self.skipped += o.skipped;
        self.log_bytes += o.log_bytes;
        self.shared_bytes += o.shared_bytes;
        self.created.extend(o.created);
    }
}

/// A client's digest request is published in slices of at most a `SLICES`th of its log
/// ([`slice_end`]; a transaction longer than that is a slice of its own).
pub(crate) const SLICES: u64 = 16;

/// Why a digest did not happen.
#[derive(Debug)]
pub(crate) enum DigestError {
    /// The log is malformed: the client is refused, its log discarded up to
    /// `discard_lsn`, the shared area untouched.
    Malformed { msg: String, discard_lsn: u64 },
    /// The batch could not be applied (`ENOSPC`, `EIO`); the log stays authoritative.
    Failed(io::Error),
}

impl std::fmt::Display for DigestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DigestError::Malformed { msg, .. } => write!(f, "malformed log: {msg}"),
            DigestError::Failed(e) => write!(f, "digest failed: {e}"),
        }
    }
}

impl From<io::Error> for DigestError {
    fn from(e: io::Error) -> Self {
        DigestError::Failed(e)
    }
}

/// Plan-time failure: a bad batch or an I/O error reading the shared area.
enum PErr {
    Bad(String),
    Io(io::Error),
}

impl From<io::Error> for PErr {
    fn from(e: io::Error) -> Self {
        PErr::Io(e)
    }
}

/// Copy `len` log bytes from LSN `lsn` out of `slot`'s ring (linearised) into `buf`
/// (grown as needed, never shrunk); returns the `len` bytes.
pub(crate) fn copy_ring<'b>(
    sh: &cairn_area::Area,
    slot: u32,
    lsn: u64,
    len: usize,
    buf: &'b mut Vec<u8>,
) -> io::Result<&'b [u8]> {
    let ring = sh.layout().ring_bytes();
    let (m, roff) = sh.slot_ring(slot);
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let buf = &mut buf[..len];
    let start = (lsn % ring) as usize;
    let first = len.min(ring as usize - start);
    m.read(roff + start, &mut buf[..first])?;
    if first < len {
        m.read(roff, &mut buf[first..])?;
    }
    Ok(buf)
}

/// Where the transaction whose header sits at `lsn` with sequence number `seq` in
/// `slot`'s ring ends (a wrap ends at the end of its lap), if the header looks like one
/// (`log::check_header`; no checksum).
fn txn_end_estimate(
    sh: &cairn_area::Area,
    slot: u32,
    lsn: u64,
    seq: u64,
) -> io::Result<Option<u64>> {
    let ring = sh.layout().ring_bytes();
    let mut hdr = [0u8; TXN_HEADER];
    let (m, roff) = sh.slot_ring(slot);
    m.read(roff + (lsn % ring) as usize, &mut hdr)?;
    Ok(log::check_header(&hdr, seq, lsn, ring)
        .ok()
        .map(|(len, kind, _)| {
            lsn + if kind == KIND_WRAP {
                ring - lsn % ring
            } else {
                len as u64
            }
        }))
}

/// Estimated end of `slot`'s log: follows transaction headers from the head
/// ([`txn_end_estimate`]). For status reports only.
pub(crate) fn log_end_estimate(sh: &Shared, slot: u32) -> io::Result<u64> {
    let (h, _) = sh.slot_head(slot)?;
    let ring = sh.layout.ring_bytes();
    let (mut lsn, mut seq) = (h.head_lsn, h.head_seq);
    while lsn - h.head_lsn < ring {
        match txn_end_estimate(&sh.area, slot, lsn, seq)? {
            Some(end) => (lsn, seq) = (end, seq + 1),
            None => break,
        }
    }
    Ok(lsn.min(h.head_lsn + ring))
}

/// The end of the first slice of a digest of `slot`'s log from `head` up to `upto`: the
/// end of the last transaction within `slice` bytes of the head (of the first one if it
/// is longer), or `upto` if the whole range fits or its headers do not look right (the
/// digest of the whole range then says what is wrong). Headers only: the slice's digest
/// verifies what it digests.
pub(crate) fn slice_end(
    area: &cairn_area::Area,
    slot: u32,
    head: SlotHead,
    upto: u64,
    slice: u64,
) -> io::Result<u64> {
    if upto <= head.head_lsn + slice {
        return Ok(upto);
    }
    let (mut lsn, mut seq) = (head.head_lsn, head.head_seq);
    while lsn < upto {
        let Some(end) = txn_end_estimate(area, slot, lsn, seq)? else {
            return Ok(upto);
        };
        if end > head.head_lsn + slice && lsn > head.head_lsn {
            return Ok(lsn);
        }
        (lsn, seq) = (end, seq + 1);
    }
    Ok(upto)
}

/// Where a batch ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub head: SlotHead,
    pub end: u64,
    pub end_seq: u64,
    pub txns: u64,
}

/// A batch copied out of a ring, verified and decoded (step 1).
pub(crate) struct Batch<'b> {
    pub span: Span,
    pub recs: Vec<Record<'b>>,
    pub txn_ends: Vec<usize>,
}

/// A transaction this long or longer whose one record is a `WRITE` (the write path's
/// transactions) has its data read in place from the ring by the digest of a live
/// client's log ([`read_upto`]) instead of being copied out first.
const IN_PLACE_MIN: usize = 16 << 10;

/// Step 1: copy `slot`'s batch from `head` into `scratch`, verify and decode it (a live
/// client's range in [`read_upto`]). Reads only the slot's ring (no shared state): runs
/// without the core lock in parallel digests. `Ok(None)`: nothing to digest.
pub(crate) fn read_batch<'b>(
    area: &'b cairn_area::Area,
    slot: u32,
    head: SlotHead,
    mode: Mode,
    scratch: &'b mut Vec<u8>,
) -> Result<Option<Batch<'b>>, DigestError> {
    let ring = area.layout().ring_bytes();
    let (h0, s0) = (head.head_lsn, head.head_seq);
    match mode {
        Mode::Upto(u) if u <= h0 => {
            // Already digested (e.g. by a shutdown that digested a live client's log).
            return Ok(None);
        }
        Mode::Upto(u) => {
            if u - h0 > ring || u % log::TXN_ALIGN != 0 {
                let discard = u.clamp(h0, h0 + ring);
                return Err(DigestError::Malformed {
                    msg: format!(
                        "digest up to lsn {u} is outside [head {h0}, head + ring {}] or unaligned",
                        h0 + ring
                    ),
                    discard_lsn: cairn_format::align_up(discard, log::TXN_ALIGN),
                });
            }
            return read_upto(area, slot, head, u, scratch);
        }
        Mode::Committed => {}
    }
    let buf: &'b [u8] = copy_ring(area, slot, h0, ring as usize, scratch)?;
    let s = log::scan(buf, h0, s0, ring);
    let mut txns = s.txns;
    let (mut end, mut end_seq) = (s.end_lsn, s.end_seq);
    if let Some(t) = txns.last().cloned() {
        if t.kind == KIND_WRAP && (t.lsn / ring + 1) * ring > h0 + ring {
            txns.pop();
            end = t.lsn;
            end_seq = t.seq;
        }
    }
    if txns.is_empty() {
        return Ok(None);
    }
    let malformed = |msg: String| DigestError::Malformed {
        msg,
        discard_lsn: end,
    };
    let mut recs: Vec<Record<'b>> = Vec::new();
    let mut txn_ends: Vec<usize> = Vec::new();
    for t in txns.iter().filter(|t| t.kind == KIND_COMMIT) {
        let off = (t.lsn - h0) as usize;
        let r = log::records(&buf[off..off + t.len], t.nrec)
            .map_err(|e| malformed(format!("transaction at lsn {}: {}", t.lsn, e.0)))?;
        recs.extend(r);
        txn_ends.push(recs.len());
    }
    Ok(Some(Batch {
        span: Span {
            head,
            end,
            end_seq,
            txns: txns.len() as u64,
        },
        recs,
        txn_ends,
    }))
}

/// Step 1 for a live client's range `[head, u)`, which it says is committed: every
/// transaction in it must be valid (header, sequence number, checksum, records) and the
/// range must end at a transaction's end, or the log is malformed. Transactions are
/// copied into `scratch`, checked and decoded from the copy, except long one-`WRITE`
/// transactions ([`IN_PLACE_MIN`]): their heads are copied and checked, and their data
/// is read in place from the ring when the digest writes it, without its checksum
/// verified. The checksum is the commit mark that recovery needs to find where a log
/// ends after a crash (`Mode::Committed` verifies every one); here the client's request
/// is the commit mark, and reading those bytes twice (to check, then to copy) costs
/// more than the copy itself. What the daemon acts on (records, names, attributes) is
/// always checksummed and copied first, so a client that lies, or rewrites its log
/// below the published head meanwhile, only changes the bytes that go into a file it
/// may write.
fn read_upto<'b>(
    area: &'b cairn_area::Area,
    slot: u32,
    head: SlotHead,
    u: u64,
    scratch: &'b mut Vec<u8>,
) -> Result<Option<Batch<'b>>, DigestError> {
    let ring = area.layout().ring_bytes();
    let (log_map, roff) = area.slot_ring(slot);
    let bad = |msg: String| DigestError::Malformed {
        msg,
        discard_lsn: u,
    };
    /// A transaction found: its LSN, length, record count, where its copy starts in
    /// `scratch`, and whether its data stays in the ring.
    struct Found {
        lsn: u64,
        len: usize,
        nrec: u32,
        copy: usize,
        in_place: bool,
    }
    scratch.clear();
    let mut found: Vec<Found> = Vec::new();
    let (mut lsn, mut seq, mut txns) = (head.head_lsn, head.head_seq, 0u64);
    let mut h = [0u8; log::WRITE_TXN_HEAD];
    while lsn < u {
        let at = roff + (lsn % ring) as usize;
        let in_lap = (ring - lsn % ring) as usize;
        let peek = h.len().min(in_lap);
        log_map.read(at, &mut h[..peek])?;
        let why = |e: String| bad(format!("transaction at lsn {lsn}: {e}"));
        let (len, kind, nrec) = log::check_header(&h[..peek], seq, lsn, ring).map_err(why)?;
        txns += 1;
        seq += 1;
        if kind == KIND_WRAP {
            let next = (lsn / ring + 1) * ring;
            if next > u {
                return Err(bad(format!(
                    "digest range ends at {u}, inside the wrap at lsn {lsn}"
                )));
            }
            log::check_crc(log_map.bytes(at, len)?).map_err(why)?;
            lsn = next;
            continue;
        }
        if lsn + len as u64 > u {
            return Err(bad(format!(
                "digest range ends at {u}, inside the transaction at lsn {lsn}"
            )));
        }
        let in_place = nrec == 1
            && len >= IN_PLACE_MIN
            && u16::from_le_bytes([h[TXN_HEADER], h[TXN_HEADER + 1]]) == log::REC_WRITE;
        let copy = scratch.len();
        if in_place {
            scratch.extend_from_slice(&h);
        } else {
            scratch.resize(copy + len, 0);
            log_map.read(at, &mut scratch[copy..])?;
            log::check_crc(&scratch[copy..]).map_err(why)?;
        }
        found.push(Found {
            lsn,
            len,
            nrec,
            copy,
            in_place,
        });
        lsn += len as u64;
    }
    let buf: &'b [u8] = scratch;
    let mut recs: Vec<Record<'b>> = Vec::new();
    let mut txn_ends: Vec<usize> = Vec::new();
    for f in &found {
        let why =
            |e: cairn_format::FormatError| bad(format!("transaction at lsn {}: {}", f.lsn, e.0));
        if f.in_place {
            // The copy is the transaction's head: its header and the WRITE's header.
            let head = &buf[f.copy..f.copy + log::WRITE_TXN_HEAD];
            let (ino, offset, size, mtime, n) = log::one_write_head(head, f.len).map_err(why)?;
            let data_at = roff + (f.lsn % ring) as usize + log::WRITE_TXN_HEAD;
            recs.push(Record::Write {
                ino,
                offset,
                size,
                mtime,
                data: log_map.bytes(data_at, n)?,
            });
        } else {
            recs.extend(log::records(&buf[f.copy..f.copy + f.len], f.nrec).map_err(why)?);
        }
        txn_ends.push(recs.len());
    }
    Ok(Some(Batch {
        span: Span {
            head,
            end: u,
            end_seq: seq,
            txns,
        },
        recs,
        txn_ends,
    }))
}

/// A permission-checked, validated plan (steps 2 and 3).
pub(crate) struct Planned<'b> {
    plan: Plan<'b>,
    checked: Checked<'b>,
}

impl Planned<'_> {
    /// Every inode the batch publishes (or plans and leaves free).
    pub(crate) fn inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.plan.inodes.keys().copied()
    }
}

/// Steps 2 and 3: check the batch against the client's permissions, fold it into a plan
/// and validate the plan against the shared area. Reads the shared area only (through
/// [`Shared::inode`], so a parallel digest can record its read set).
pub(crate) fn plan_batch<'b>(
    sh: &Shared,
    slot: u32,
    b: &Batch<'b>,
) -> Result<Planned<'b>, DigestError> {
    let malformed = |msg: String| DigestError::Malformed {
        msg,
        discard_lsn: b.span.end,
    };
    // Permissions of the slot's client (crate::perm).
    let cred = crate::perm::slot_cred(sh, slot)?;
    let replay = sh.replaying.contains(&slot);
    crate::perm::check_batch(sh, slot, &cred, &b.recs, &b.txn_ends, replay).map_err(
        |e| match e {
            crate::perm::Denial::Denied(m) => malformed(m),
            crate::perm::Denial::Io(e) => DigestError::Failed(e),
        },
    )?;
    // Plan and validate.
    let mut plan = Plan {
        slot,
        inodes: BTreeMap::new(),
        dirents: BTreeMap::new(),
        nrec: b.recs.len(),
        charge: 0,
    };
    let perr = |e: PErr| match e {
        PErr::Bad(m) => malformed(m),
        PErr::Io(e) => DigestError::Failed(e),
    };
    for (i, r) in b.recs.iter().cloned().enumerate() {
        plan.fold(sh, i, r).map_err(perr)?;
    }
    for p in plan.inodes.values_mut() {
        p.pending.settle();
    }
    let checked = validate(sh, slot, &mut plan).map_err(perr)?;
    Ok(Planned { plan, checked })
}

/// Digest `slot`'s log (see the module documentation).
pub(crate) fn digest(sh: &mut Shared, slot: u32, mode: Mode) -> Result<Outcome, DigestError> {
    // The batch is copied into a buffer kept across digests: a fresh multi-megabyte
    // allocation per digest made the kernel fault in and zero every page of it.
    let mut scratch = std::mem::take(&mut sh.scratch);
    let r = digest_with(sh, slot, mode, &mut scratch);
    sh.scratch = scratch;
    r
}

fn digest_with(
    sh: &mut Shared,
    slot: u32,
    mode: Mode,
    scratch: &mut Vec<u8>,
) -> Result<Outcome, DigestError> {
    if slot >= sh.layout.nslots {
        return Err(DigestError::Failed(crate::util::einval(format!(
            "slot {slot} out of range"
        ))));
    }
    let (head, _) = sh.slot_head(slot)?;
    let area = sh.area.clone();
    let Some(b) = read_batch(&area, slot, head, mode, scratch)? else {
        return Ok(Outcome {
            head_lsn: head.head_lsn,
            head_seq: head.head_seq,
            ..Default::default()
        });
    };
    let pl = plan_batch(sh, slot, &b)?;
    let a = apply_batch(sh, &pl)?;
    if let Err(e) = write_data(&area, &a.data) {
        sh.rollback(&a.w);
        return Err(DigestError::Failed(e));
    }
    publish_batch(sh, slot, b.span, &pl, a)
}

/// What the committed, undigested transactions of `slot` hold (after a daemon restart):
/// the inode numbers they create (`INODE_SET` with `nlink > 0`) that are free in the
/// shared area, reserved for it so that no other client gets them before its log is
/// digested; and the space they charged (the credits their `WRITE`s used), which stays
/// promised until digested.
/// How many committed transactions `slot`'s log holds past its head (not digested yet).
pub(crate) fn pending_commits(sh: &Shared, slot: u32) -> io::Result<usize> {
    let (head, _) = sh.slot_head(slot)?;
    let ring = sh.layout.ring_bytes();
    let mut scratch = Vec::new();
    let buf = copy_ring(&sh.area, slot, head.head_lsn, ring as usize, &mut scratch)?;
    let s = log::scan(buf, head.head_lsn, head.head_seq, ring);
    Ok(s.txns.iter().filter(|t| t.kind == KIND_COMMIT).count())
}

pub(crate) fn logged(sh: &Shared, slot: u32) -> io::Result<(Vec<u64>, u64)> {
    let (head, _) = sh.slot_head(slot)?;
    let ring = sh.layout.ring_bytes();
    let mut scratch = Vec::new();
    let buf = copy_ring(&sh.area, slot, head.head_lsn, ring as usize, &mut scratch)?;
    let s = log::scan(buf, head.head_lsn, head.head_seq, ring);
    let mut out = Vec::new();
    let mut charge = 0;
    for t in s.txns.iter().filter(|t| t.kind == KIND_COMMIT) {
        let off = (t.lsn - head.head_lsn) as usize;
        let Ok(recs) = log::records(&buf[off..off + t.len], t.nrec) else {
            break;
        };
        for r in recs {
            match r {
                Record::InodeSet { ino, attrs, .. }
                    if attrs.nlink > 0 && sh.layout.ino_valid(ino) && !sh.inodes.is_used(ino) =>
                {
                    out.push(ino);
                }
                r => charge += r.charge(),
            }
        }
    }
    Ok((out, charge))
}

/// Check the unsealed transaction a client asks the daemon to `Commit` (shared-write
/// mode): `len` bytes at `lsn` of `slot`'s ring, at or after the head, within one lap
/// and the ring's free space, with a zero magic and otherwise a valid commit
/// transaction with sequence `seq`. Returns the inodes it writes (`INODE_SET` and
/// `WRITE` inodes, `DIRENT_SET` directories), sorted and without duplicates.
pub(crate) fn unsealed_writes(
    sh: &Shared,
    slot: u32,
    lsn: u64,
    len: u32,
    seq: u64,
) -> io::Result<Vec<u64>> {
    let bad = |m: String| -> io::Result<Vec<u64>> {
        Err(crate::util::einval(format!("commit at LSN {lsn}: {m}")))
    };
    let ring = sh.layout.ring_bytes();
    let (head, _) = sh.slot_head(slot)?;
    let len64 = len as u64;
    if lsn < head.head_lsn || lsn + len64 > head.head_lsn + ring || len64 > ring / 4 {
        return bad(format!(
            "outside the log's free space (head {}, {len} bytes)",
            head.head_lsn
        ));
    }
    let mut buf = Vec::new();
    let txn = copy_ring(&sh.area, slot, lsn, len as usize, &mut buf)?;
    if txn.len() < TXN_HEADER || txn[..4] != [0; 4] {
        return bad("not an unsealed transaction".into());
    }
    let mut txn = txn.to_vec();
    txn[..4].copy_from_slice(&TXN_MAGIC.to_le_bytes());
    let s = log::scan(&txn, lsn, seq, ring);
    match (&s.stop, s.txns.as_slice()) {
        (Stop::End, [t]) if t.kind == KIND_COMMIT && t.len == len as usize => {
            let recs =
                log::records(&txn, t.nrec).map_err(|e| crate::util::einval(e.to_string()))?;
            let mut inos: Vec<u64> = recs
                .iter()
                .map(|r| match r {
                    Record::InodeSet { ino, .. }
                    | Record::Write { ino, .. }
                    | Record::Punch { ino, .. } => *ino,
                    Record::DirentSet { dir, .. } => *dir,
                })
                .collect();
            inos.sort_unstable();
            inos.dedup();
            Ok(inos)
        }
        (Stop::Invalid { why, .. }, _) => bad(why.clone()),
        _ => bad("not one commit transaction of the given length".into()),
    }
}

/// Seal the transaction at `lsn` of `slot`'s ring (checked by [`unsealed_writes`]):
/// write its magic and make it durable. From here the transaction is committed.
pub(crate) fn seal(sh: &Shared, slot: u32, lsn: u64) -> io::Result<()> {
    let (m, roff) = sh.area.slot_ring(slot);
    let off = roff + (lsn % sh.layout.ring_bytes()) as usize;
    m.write(off, &TXN_MAGIC.to_le_bytes())?;
    m.persist(off, 4)
}

/// Free inode `ino` if it is an orphan: a file or symlink with `nlink = 0` that an
/// unlink kept because another client had it open (`Shared::pins`). Its blocks are
/// retired (reused once no reader can see them). Returns whether it was freed.
pub(crate) fn free_orphan(sh: &mut Shared, ino: u64) -> io::Result<bool> {
    let inode = sh.inode(ino)?;
    if inode.attrs.nlink != 0 || !matches!(inode.attrs.kind, Kind::File | Kind::Symlink) {
        return Ok(false);
    }
    let mut w = Work::default();
    retire_all(sh, &mut w, &inode)?;
    let free = Inode {
        generation: inode.generation,
        ..Default::default()
    };
    cairn_media::fence();
    sh.write_inode(ino, &free)?;
    cairn_media::fence();
    sh.inodes.mark_free(ino);
    sh.retire_and_advance(w.retired)?;
    Ok(true)
}
