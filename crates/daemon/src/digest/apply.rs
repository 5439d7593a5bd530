//! Applying a validated plan out of place (data, map nodes and buckets in new blocks,
//! written back), then publishing it (the inodes switched, the slot head advanced).

use super::{DigestError, InodePlan, Life, Outcome, Planned, Span};
use crate::store::dirhash::{self};
use crate::store::maptree;
use crate::store::shared::{Shared, Work};
use cairn_format::inode::{Inode, Kind};
use cairn_format::map::{huge_entry, HUGE_BLOCKS};
use cairn_format::slot::SlotHead;
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use std::io;

/// Retire every block an inode owns (map nodes, data blocks, bucket chains).
pub(super) fn retire_all(sh: &Shared, w: &mut Work, inode: &Inode) -> io::Result<()> {
    w.retired
        .extend(crate::store::recovery::owned_blocks(sh, inode)?);
    Ok(())
}

/// Write a file's pending data out of place and update its map.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply_file<'a>(
    sh: &mut Shared,
    ino: u64,
    w: &mut Work,
    old: &Inode,
    new: &mut Inode,
    plan: &InodePlan<'a>,
    keep: Option<u64>,
    data: &mut Vec<DataWrite<'a>>,
) -> io::Result<()> {
    let pending = &plan.pending;
    let base_size = old.attrs.size;
    let t = keep.filter(|&t| t < base_size);
    let keep_blocks = t.map_or(u64::MAX, |t| t.div_ceil(BLOCK_SIZE_U64));
    let touched = touched_blocks(sh, old, plan, t)?;
    if touched.is_empty() && t.is_none() && plan.holes.is_empty() {
        return Ok(());
    }
    let mut chunk = u64::MAX;
    for &b in &touched {
        if b / sh.recency.grain(0) != chunk {
            chunk = b / sh.recency.grain(0);
            sh.recency.touch(0, ino, b, b);
        }
    }
    // Old content is kept below the truncation point (beyond the old size it is zero).
    let limit = t.unwrap_or(u64::MAX);
    let mut changes = Vec::with_capacity(touched.len());
    // Superpage extents: the ranges this batch fills from nothing go into new extents;
    // blocks of existing extents (below a truncation) are written in place.
    let fresh = fresh_extents(sh, w, old, &touched, keep_blocks)?;
    let mut inplace = false;
    let mut small = Vec::new();
    // The batch's pieces cut at block boundaries, in order: one pass over the pieces
    // instead of a search of them per touched block.
    let mut cut: Vec<(u64, usize, &'a [u8])> = Vec::new();
    for (&k, p) in pending.pieces() {
        let mut s = k;
        while s < p.end {
            let fb = s / BLOCK_SIZE_U64;
            let e = p.end.min((fb + 1) * BLOCK_SIZE_U64);
            let d: &'a [u8] = p.data;
            cut.push((
                fb,
                (s - fb * BLOCK_SIZE_U64) as usize,
                &d[(s - k) as usize..(e - k) as usize],
            ));
            s = e;
        }
    }
    let mut next_cut = 0;
    for &fb in &touched {
        let bs = fb * BLOCK_SIZE_U64;
        let be = bs + BLOCK_SIZE_U64;
        while cut.get(next_cut).is_some_and(|c| c.0 < fb) {
            next_cut += 1;
        }
        let mut pieces = Vec::new();
        while let Some(&(_, o, d)) = cut.get(next_cut).filter(|c| c.0 == fb) {
            pieces.push((o, d));
            next_cut += 1;
        }
        debug_assert!(pieces
            .iter()
            .copied()
            .eq(pending.overlapping(bs, be).map(|(k, p)| {
                let (s, e) = (k.max(bs), p.end.min(be));
                (
                    (s - bs) as usize,
                    &p.data[(s - k) as usize..(e - k) as usize],
                )
            })));
        let covered: u64 = pieces.iter().map(|p| p.1.len() as u64).sum();
        // What the pieces do not cover keeps the old block's content, read when the
        // block is written (`write_data`, without the core lock): the old block stays
        // until this digest publishes and retires it, and no other digest or migration
        // touches the inode's blocks while its claim is registered.
        let old_part = covered < BLOCK_SIZE_U64 && bs < limit && !plan.in_hole(fb);
        let mut base = match old_part.then(|| sh.area.block_of(old, fb)).transpose()? {
            Some(Some(entry)) => Base::Old {
                entry,
                keep: (limit.min(be) - bs) as usize,
            },
            _ => Base::Zero,
        };
        // The block's content is written later (`write_data`), possibly without the core
        // lock (`crate::digest::parallel`); a new block is unreachable until the inode is
        // published, and a block of an extent is rewritten with what the log says (a
        // crash before the digest's end repeats it).
        let r = fb / HUGE_BLOCKS;
        let nb = if let Some(&(_, first)) = fresh.iter().find(|f| f.0 == r) {
            first + fb % HUGE_BLOCKS
        } else if let Some(first) = in_extent(sh, old, fb, keep_blocks)? {
            inplace = true;
            let nb = first + fb % HUGE_BLOCKS;
            // The block keeps its whole old content: only the pieces are written.
            if let Base::Old { entry, keep } = base {
                if entry == nb && keep == BLOCK_SIZE {
                    base = Base::Here;
                }
            }
            nb
        } else {
            let nb = sh.alloc_block(w)?;
            changes.push((fb, nb));
            small.push(fb);
            nb
        };
        w.bytes += BLOCK_SIZE_U64;
        data.push(DataWrite {
            blk: nb,
            base,
            pieces,
        });
    }
    // The blocks of a new extent the batch does not write are zeroed.
    for &(r, first) in &fresh {
        let mut written = [false; HUGE_BLOCKS as usize];
        let at = touched.partition_point(|&b| b < r * HUGE_BLOCKS);
        for &b in touched[at..].iter().take_while(|&&b| b / HUGE_BLOCKS == r) {
            written[(b % HUGE_BLOCKS) as usize] = true;
        }
        for k in 0..HUGE_BLOCKS {
            if !written[k as usize] {
                data.push(DataWrite {
                    blk: first + k,
                    base: Base::Zero,
                    pieces: Vec::new(),
                });
                w.bytes += BLOCK_SIZE_U64;
            }
        }
        changes.push((r * HUGE_BLOCKS, huge_entry(first)));
        sh.superpages.to_collapse.push(first);
        sh.superpages.placed += 1;
        if (written.iter().filter(|&&x| x).count() as u64) < sh.superpages.demote_blocks {
            // Filled below the demotion threshold (a promotion threshold under it).
            sh.superpages.note_sparse(ino, r);
        }
    }
    inplace |= punch_in_extents(sh, ino, old, plan, keep_blocks, data, &changes)?;
    if inplace {
        sh.superpages.note_inplace(ino);
    }
    sh.superpages.note_written(ino, small.into_iter());
    changes.sort_unstable_by_key(|c| c.0);
    if !inplace && fresh.is_empty() && t.is_none() && plan.holes.is_empty() {
        if let Some(leaf) = maptree::append_leaf(sh, old, &changes)? {
            // An append into the leaf holding the file's end: its entries are written
            // in place at the publish (`maptree::append_leaf` says why that is safe);
            // the leaf is not copied.
            w.bytes += maptree::queue_append(w, leaf, &changes);
            new.blocks = old.blocks + changes.len() as u64;
            return Ok(());
        }
    }
    add_holes(sh, old, plan, keep_blocks, &mut changes)?;
    let r = maptree::update(
        sh,
        w,
        old.map_root,
        old.map_height,
        &changes,
        keep_blocks,
        true,
    )?;
    new.map_root = r.root;
    new.map_height = r.height;
    new.blocks = (old.blocks as i64 + r.delta).max(0) as u64;
    Ok(())
}

/// The first block of the superpage extent holding file block `fb` of `old`, if it
/// lies in one and below the truncation point `keep_blocks` (a block at or past it is
/// dropped by the truncation: a new write there takes a new block).
fn in_extent(sh: &Shared, old: &Inode, fb: u64, keep_blocks: u64) -> io::Result<Option<u64>> {
    if fb >= keep_blocks {
        return Ok(None);
    }
    sh.area.huge_of(old, fb)
}

/// The 2 MiB ranges of `touched` (sorted) that the batch writes to at least the
/// promotion threshold and that hold nothing yet in `old` (or only what the truncation
/// drops), each with a new extent for it (its blocks are `w`'s allocations).
fn fresh_extents(
    sh: &mut Shared,
    w: &mut Work,
    old: &Inode,
    touched: &[u64],
    keep_blocks: u64,
) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    if !sh.superpages.enabled {
        return Ok(out);
    }
    let mut i = 0;
    while i < touched.len() {
        let r = touched[i] / HUGE_BLOCKS;
        let j = i + touched[i..].partition_point(|&b| b / HUGE_BLOCKS == r);
        let (s, e) = (r * HUGE_BLOCKS, (r + 1) * HUGE_BLOCKS);
        let empty = s >= keep_blocks || sh.area.next_block(old, s, e, true)?.is_none();
        if (j - i) as u64 >= sh.superpages.promote_blocks && empty {
            match sh.alloc_extent(w) {
                Some(first) => out.push((r, first)),
                None => {
                    sh.superpages.short = true;
                    break;
                }
            }
        }
        i = j;
    }
    Ok(out)
}

/// Holes punched into superpage extents (below the truncation point, in blocks the
/// batch does not write) are zeroed in place: the extent stays whole and its range
/// becomes a demotion candidate. Returns whether any was.
fn punch_in_extents(
    sh: &mut Shared,
    ino: u64,
    old: &Inode,
    plan: &InodePlan<'_>,
    keep_blocks: u64,
    data: &mut Vec<DataWrite<'_>>,
    changes: &[(u64, u64)],
) -> io::Result<bool> {
    let mut any = false;
    if plan.holes.is_empty() {
        return Ok(false);
    }
    let mut written: std::collections::HashSet<u64> = data.iter().map(|d| d.blk).collect();
    let changed: std::collections::HashSet<u64> = changes.iter().map(|c| c.0).collect();
    for &(s, e) in &plan.holes {
        let mut b = s;
        while b < e.min(keep_blocks) {
            let Some(first) = sh.area.huge_of(old, b)? else {
                b = (b / HUGE_BLOCKS + 1) * HUGE_BLOCKS;
                continue;
            };
            let blk = first + b % HUGE_BLOCKS;
            if !changed.contains(&b) && written.insert(blk) {
                data.push(DataWrite {
                    blk,
                    base: Base::Zero,
                    pieces: Vec::new(),
                });
                sh.superpages.note_sparse(ino, b / HUGE_BLOCKS);
                any = true;
            }
            b += 1;
        }
    }
    Ok(any)
}

/// The file blocks a batch writes (in order): those its pending data covers, and the
/// partial block at a truncation point `t` below the old size (zeroed past it).
fn touched_blocks(
    sh: &Shared,
    old: &Inode,
    plan: &InodePlan<'_>,
    t: Option<u64>,
) -> io::Result<Vec<u64>> {
    let mut touched: Vec<u64> = Vec::new();
    for (&s, p) in plan.pending.pieces() {
        for b in s / BLOCK_SIZE_U64..=(p.end - 1) / BLOCK_SIZE_U64 {
            if touched.last() != Some(&b) {
                touched.push(b);
            }
        }
    }
    if let Some(t) = t {
        let tb = t / BLOCK_SIZE_U64;
        if t % BLOCK_SIZE_U64 != 0 && sh.area.block_of(old, tb)?.is_some() {
            if let Err(pos) = touched.binary_search(&tb) {
                touched.insert(pos, tb);
            }
        }
    }
    Ok(touched)
}

/// Punched blocks the batch did not write again become holes in the map: `changes`
/// (file block, new block; sorted) gains `(block, 0)` for each.
fn add_holes(
    sh: &Shared,
    old: &Inode,
    plan: &InodePlan<'_>,
    keep_blocks: u64,
    changes: &mut Vec<(u64, u64)>,
) -> io::Result<()> {
    let rewritten = changes.len();
    for &(s, e) in &plan.holes {
        let mut b = s;
        while let Some(d) = sh.area.next_block(old, b, e.min(keep_blocks), true)? {
            if let Some(first) = sh.area.huge_of(old, d)? {
                // Zeroed in place (`punch_in_extents`).
                debug_assert_eq!(first % HUGE_BLOCKS, 0);
                b = (d / HUGE_BLOCKS + 1) * HUGE_BLOCKS;
                continue;
            }
            if changes[..rewritten]
                .binary_search_by_key(&d, |c| c.0)
                .is_err()
            {
                changes.push((d, 0));
            }
            b = d + 1;
        }
    }
    if changes.len() > rewritten {
        changes.sort_unstable_by_key(|c| c.0);
        changes.dedup_by_key(|c| c.0);
    }
    Ok(())
}

pub(crate) enum Effect {
    Created,
    Updated,
    Freed,
}

/// A data block a digest writes (a new one, or one of an extent in place): its base
/// content overlaid with pieces of the batch (offset in the block, bytes). Written with
/// non-temporal stores by [`write_data`] before the publishing fence.
pub(crate) struct DataWrite<'a> {
    pub(super) blk: u64,
    pub(super) base: Base,
    pub(super) pieces: Vec<(usize, &'a [u8])>,
}

/// What a new data block holds where the batch's pieces do not cover it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Base {
    Zero,
    /// The old block (its map entry, any tier): its first `keep` bytes, zeros after
    /// them (a truncation inside the block).
    Old {
        entry: u64,
        keep: usize,
    },
    /// The block itself, whole (a block of an existing extent, rewritten in place): only
    /// the pieces are written, the rest is already what it must hold.
    Here,
}

/// Write the new data blocks of a digest (no fence: the publish fence orders them, and
/// must run on the same thread).
pub(crate) fn write_data(area: &cairn_area::Area, data: &[DataWrite<'_>]) -> io::Result<()> {
    let map = area.map();
    let mut buf = vec![0u8; BLOCK_SIZE];
    for d in data {
        let off = (d.blk * BLOCK_SIZE_U64) as usize;
        if let (Base::Zero, [(0, whole)]) = (&d.base, &d.pieces[..]) {
            if whole.len() == BLOCK_SIZE {
                map.write_nt(off, whole)?;
                continue;
            }
        }
        match d.base {
            Base::Here => {
                for &(o, p) in &d.pieces {
                    map.write_nt(off + o, p)?;
                }
                continue;
            }
            Base::Old { entry, keep } => {
                area.read_leaf(entry, &mut buf)?;
                buf[keep..].fill(0);
            }
            Base::Zero => buf.fill(0),
        }
        for &(o, p) in &d.pieces {
            buf[o..o + p.len()].copy_from_slice(p);
        }
        map.write_nt(off, &buf)?;
    }
    Ok(())
}

/// What step 4 produced: blocks allocated and retired, map nodes and buckets written
/// and written back, the new data blocks still to write, the inodes to publish.
pub(crate) struct Applied<'b> {
    pub w: Work,
    pub data: Vec<DataWrite<'b>>,
    pub(super) publish: Vec<(u64, Inode, Effect)>,
    pub(super) noops: u64,
}

/// Step 4: apply out of place (allocation, map nodes, directory buckets; data blocks are
/// only allocated: see [`write_data`]). On failure every allocated block is given back.
pub(crate) fn apply_batch<'b>(
    sh: &mut Shared,
    pl: &Planned<'b>,
) -> Result<Applied<'b>, DigestError> {
    let (plan, checked) = (&pl.plan, &pl.checked);
    let mut w = Work::default();
    let mut data = Vec::new();
    let mut publish: Vec<(u64, Inode, Effect)> = Vec::new();
    let mut noops = 0u64;
    let applied = (|| -> io::Result<()> {
        for (&ino, p) in &plan.inodes {
            match p.life {
                Life::Live => {
                    let fresh = p.created;
                    if fresh && p.base_live {
                        retire_all(sh, &mut w, &p.base)?;
                    }
                    let old = if fresh { Inode::default() } else { p.base };
                    let mut new = Inode {
                        attrs: p.attrs,
                        generation: if fresh {
                            p.base.generation + 1
                        } else {
                            p.base.generation
                        },
                        ..old
                    };
                    match p.attrs.kind {
                        Kind::Dir => {
                            new.attrs.size = old.attrs.size;
                            if let Some(ch) = checked.dir_changes.get(&ino) {
                                noops += dirhash::apply(sh, &mut w, &old, &mut new, ch)?;
                            }
                        }
                        _ => {
                            let keep = if fresh { None } else { p.keep };
                            apply_file(sh, ino, &mut w, &old, &mut new, p, keep, &mut data)?;
                        }
                    }
                    publish.push((
                        ino,
                        new,
                        if fresh {
                            Effect::Created
                        } else {
                            Effect::Updated
                        },
                    ));
                }
                _ if p.base_live => {
                    retire_all(sh, &mut w, &p.base)?;
                    let free = Inode {
                        generation: p.base.generation,
                        ..Default::default()
                    };
                    publish.push((ino, free, Effect::Freed));
                }
                _ => {}
            }
        }
        Ok(())
    })();
    if let Err(e) = applied {
        sh.rollback(&w);
        return Err(DigestError::Failed(e));
    }
    Ok(Applied {
        w,
        data,
        publish,
        noops,
    })
}

/// Step 5: fence, publish the inodes, persist the slot head, retire, advance the epoch,
/// count. Every block of `a` (including its data blocks) must be written and written
/// back by the calling thread before.
pub(crate) fn publish_batch(
    sh: &mut Shared,
    slot: u32,
    span: Span,
    pl: &Planned<'_>,
    a: Applied<'_>,
) -> Result<Outcome, DigestError> {
    let Applied {
        mut w,
        publish,
        noops,
        ..
    } = a;
    let (plan, checked) = (&pl.plan, &pl.checked);
    let Span {
        head,
        end,
        end_seq,
        txns,
    } = span;
    maptree::write_appends(sh, &w)?;
    cairn_media::fence();
    for (ino, inode, _) in &publish {
        sh.write_inode(*ino, inode)?;
        w.bytes += cairn_format::inode::INODE_BYTES as u64;
    }
    cairn_media::fence();
    for (ino, _, eff) in &publish {
        match eff {
            Effect::Created => sh.inodes.mark_used(*ino),
            Effect::Freed => sh.inodes.mark_free(*ino),
            Effect::Updated => {}
        }
    }
    // Inodes the batch both created and freed (a temporary file) never reach the area:
    // their numbers go back to the free pool.
    for (&ino, p) in &plan.inodes {
        if p.created && !p.base_live && !matches!(p.life, Life::Live) {
            sh.inodes.unreserve(slot, ino);
        }
    }
    // Persist the head, retire, advance the epoch, count.
    sh.set_slot_head(
        slot,
        SlotHead {
            head_lsn: end,
            head_seq: end_seq,
            ..head
        },
    )?;
    let (head_lsn, head_seq) = (end, end_seq);
    sh.retire_and_advance(std::mem::take(&mut w.retired))?;
    if cfg!(debug_assertions) {
        for (ino, inode, eff) in &publish {
            if !matches!(eff, Effect::Freed) {
                let r = crate::store::check::published_inode(sh, *ino, inode);
                assert!(
                    r.is_ok(),
                    "after a digest of slot {slot}: {}",
                    r.unwrap_err()
                );
            }
        }
        let r = crate::store::check::allocation(sh);
        assert!(
            r.is_ok(),
            "after a digest of slot {slot}: {}",
            r.unwrap_err()
        );
    }
    let records = plan.nrec as u64;
    let skipped = checked.survivors.iter().filter(|s| !**s).count() as u64 + noops;
    let out = Outcome {
        head_lsn,
        head_seq,
        charge: plan.charge,
        txns,
        records,
        skipped,
        log_bytes: end - head.head_lsn,
        shared_bytes: w.bytes,
        created: publish
            .iter()
            .filter(|p| matches!(p.2, Effect::Created))
            .map(|p| p.0)
            .collect(),
    };
    // The half-applied batch a crash may have left is behind the head now; once every
    // such slot is past it, inodes still unnamed are garbage.
    if sh.replaying.remove(&slot) && sh.replaying.is_empty() {
        crate::store::recovery::free_unreachable(sh)?;
    }
    let c = &mut sh.counters;
    c.records_digested += records;
    c.records_skipped += skipped;
    c.log_bytes_written += out.log_bytes;
    c.shared_bytes_written += out.shared_bytes;
    c.digests += 1;
    sh.persist_counters()?;
    Ok(out)
}
