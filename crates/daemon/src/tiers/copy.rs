//! A round's data: its blocks read from where they are, written as one segment of the
//! destination tier (or into NVM blocks) and made durable, then the maps switched to
//! the copies and the round's books closed.

use super::migrate::{Dest, Move};
use crate::digest::parallel::CoreLock;
use crate::store::maptree;
use crate::store::shared::{Shared, Work};
use crate::util::eio;
use cairn_format::inode::{Inode, Kind};
use cairn_format::map::{entry_block, entry_tier, tier_entry, TIER_NAMES};
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use std::collections::{BTreeMap, HashSet};
use std::io;

/// The blocks of a round's moves, read in order into `buf` (one read per run of blocks
/// consecutive on a lower tier).
pub(super) fn read_moves(
    area: &cairn_area::Area,
    moves: &[Move],
    buf: &mut [u8],
) -> io::Result<()> {
    assert_eq!(buf.len(), moves.len() * BLOCK_SIZE, "one block per move");
    let mut i = 0;
    while i < moves.len() {
        let e = moves[i].old;
        if entry_tier(e) == 0 {
            area.read_leaf(e, &mut buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE])?;
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < moves.len() && moves[j].old == e + (j - i) as u64 {
            j += 1;
        }
        let at = entry_block(e) * BLOCK_SIZE_U64;
        area.read_tier(entry_tier(e), at, &mut buf[i * BLOCK_SIZE..j * BLOCK_SIZE])?;
        i = j;
    }
    Ok(())
}

/// Write a round's copy (`buf[..len]`) and make it durable: a segment in one go and
/// `fdatasync`ed (with direct I/O where the tier allows it; the remote tier's threads
/// take slices of `buf`), or NVM blocks with non-temporal stores and a fence.
pub(super) fn write_copy(
    area: &cairn_area::Area,
    to: u8,
    dest: &Dest,
    (buf, len): (&cairn_area::SharedBuf, usize),
) -> io::Result<()> {
    let name = TIER_NAMES[to as usize];
    match dest {
        Dest::Segment { seg, first } => {
            let dev = area
                .tier(to)
                .ok_or_else(|| eio(format!("the {name} tier is not attached")))?;
            let gen = area.segment_gen(to, *seg)?;
            dev.write_segment_shared(*seg, gen, first * BLOCK_SIZE_U64, buf, len)?;
        }
        Dest::Nvm(blocks) => {
            assert_eq!(len, blocks.len() * BLOCK_SIZE, "one block per move");
            for (i, &b) in blocks.iter().enumerate() {
                let data = &buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                area.map().write_nt((b * BLOCK_SIZE_U64) as usize, data)?;
            }
            cairn_media::fence();
        }
    }
    Ok(())
}

/// Switch, file by file, the map entries that still name the blocks a round copied to
/// their copies (one copy-on-write map update and inode write each), then retire the
/// old blocks and advance the epoch. Blocks of superpage extents are written in place
/// by digests: those of a file written so after the round began (`since`, the
/// in-place sequence then) stay. Returns the new entries now in use.
pub(super) fn switch_maps(
    sh: &mut Shared,
    to: u8,
    dest: &Dest,
    moves: &[Move],
    since: u64,
) -> io::Result<HashSet<u64>> {
    let new_entry = |i: usize| match dest {
        Dest::Segment { first, .. } => tier_entry(to, first + i as u64),
        Dest::Nvm(blocks) => blocks[i],
    };
    let mut by_ino: BTreeMap<u64, Vec<(usize, &Move)>> = BTreeMap::new();
    for (i, m) in moves.iter().enumerate() {
        by_ino.entry(m.ino).or_default().push((i, m));
    }
    let mut retired = Vec::new();
    let mut used = HashSet::new();
    for (ino, ms) in by_ino {
        let Ok(old) = sh.inode(ino) else { continue };
        if old.attrs.kind != Kind::File {
            continue;
        }
        let stale_extents = sh.superpages.written_in_place_since(ino, since);
        let mut changes = Vec::new();
        for &(i, m) in &ms {
            if sh.area.block_of(&old, m.fblk)? == Some(m.old)
                && !(stale_extents && sh.area.huge_of(&old, m.fblk)?.is_some())
            {
                changes.push((m.fblk, new_entry(i)));
            }
        }
        // The map update takes its changes in file order, once each (the rounds
        // choose blocks chunk by chunk, coldest or hottest first).
        changes.sort_unstable_by_key(|c| c.0);
        changes.dedup_by_key(|c| c.0);
        if changes.is_empty() {
            continue;
        }
        let mut w = Work::default();
        let r = match maptree::update(
            sh,
            &mut w,
            old.map_root,
            old.map_height,
            &changes,
            u64::MAX,
            true,
        ) {
            Ok(r) => r,
            Err(e) => {
                // No NVM block for a map node: this inode stays where it is.
                sh.rollback(&w);
                if cairn_area::errno_of(&e) == libc::ENOSPC {
                    continue;
                }
                return Err(e);
            }
        };
        cairn_media::fence();
        // Moving blocks one for one leaves the count alone, except where an extent is
        // split (its leaf node is new).
        let new = Inode {
            map_root: r.root,
            map_height: r.height,
            blocks: (old.blocks as i64 + r.delta).max(0) as u64,
            ..old
        };
        sh.write_inode(ino, &new)?;
        if to == 0 {
            // Data back in NVM may fill a range enough for a superpage extent.
            sh.superpages.note_written(ino, changes.iter().map(|c| c.0));
        }
        for &(f, e) in &changes {
            if let Some(t) = sh.tier_mut(to) {
                t.mark_used(entry_block(e));
            }
            used.insert(e);
            sh.recency.touch(to, ino, f, f);
        }
        sh.counters.shared_bytes_written += w.bytes;
        retired.extend(w.retired);
    }
    cairn_media::fence();
    sh.retire_and_advance(retired)?;
    Ok(used)
}

/// After a round: drop its epoch hold, give its destination segment back to the free
/// pool's bookkeeping or free the NVM blocks it did not publish, and reclaim what it
/// replaced (so that the caller sees the space; emptied segments are trimmed).
pub(super) fn finish_round(
    core: &CoreLock,
    to: u8,
    epoch: u64,
    dest: &Dest,
    r: &io::Result<(u64, HashSet<u64>)>,
) {
    let mut c = core.serial();
    let sh = &mut c.sh;
    // Only this round's hold (another round may hold the same epoch).
    if let Some(i) = sh.held_epochs.iter().position(|&e| e == epoch) {
        sh.held_epochs.swap_remove(i);
    }
    match dest {
        Dest::Segment { seg, .. } => {
            if let Some(t) = sh.tier_mut(to) {
                t.release_segment(*seg);
            }
        }
        Dest::Nvm(blocks) => {
            // Blocks whose switch did not happen were never published.
            let unused: Vec<u64> = match r {
                Ok((_, used)) => blocks
                    .iter()
                    .filter(|b| !used.contains(b))
                    .copied()
                    .collect(),
                Err(_) => blocks.clone(),
            };
            for b in unused {
                sh.blocks.free(b);
            }
        }
    }
    // What the round replaced can go now that its hold is gone (so that the caller
    // sees the space), and emptied segments are trimmed.
    c.reclaim();
}
