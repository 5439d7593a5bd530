//! Compaction of the NVM tier (Ingens' proactive batched compaction, run when needed):
//! when no 2 MiB extent is free while the tier's free space is fragmented — Ingens'
//! free-memory fragmentation index above [`FMFI_LIMIT`] — and a placement or promotion
//! wanted an extent, a round moves the 4 KiB file blocks of the emptiest, coldest
//! chunks to other NVM blocks, freeing those chunks whole. The move is a migration
//! round within NVM (`crate::tiers::migrate`, `RoundKind::Compact`): copied without the
//! core lock under an epoch hold, switched per file where the map still names the
//! copied block, the old blocks freed after the epoch. Chunks that hold anything but
//! regular files' 4 KiB data blocks and the map nodes above them (directory buckets,
//! symlink targets, blocks waiting for their epoch) are not emptied.

use crate::store::shared::Shared;
use crate::tiers::migrate::Move;
use cairn_format::inode::Kind;
use cairn_format::map::{coverage, entry_tier, is_huge, HUGE_BLOCKS};
use std::collections::HashMap;
use std::io;

/// Most blocks one round moves (Ingens: 100 MB per round; here 16 MiB, a fraction of
/// the default rate of promotion and compaction).
pub(crate) const ROUND_MAX: u64 = 4096;

/// Free blocks a round leaves for the map nodes its switch writes.
const SLACK: u64 = 64;

/// Ingens' threshold of the free-memory fragmentation index.
pub(crate) const FMFI_LIMIT: f64 = 0.8;

/// Ingens' free-memory fragmentation index of the NVM tier for 2 MiB requests: the
/// share of free blocks that lie outside free extents (0 when nothing is free).
pub(crate) fn fmfi(sh: &Shared) -> f64 {
    let free = sh.blocks.free_count();
    if free == 0 {
        return 0.0;
    }
    (free - sh.blocks.free_extents() * HUGE_BLOCKS) as f64 / free as f64
}

/// Whether a compaction round is due: an extent was wanted and none is free, at least
/// an extent's worth of blocks is free, and the free space is fragmented.
pub(crate) fn needed(sh: &Shared) -> bool {
    sh.superpages.enabled
        && sh.superpages.short
        && sh.blocks.free_extents() == 0
        && sh.blocks.free_count() >= 2 * HUGE_BLOCKS
        && fmfi(sh) > FMFI_LIMIT
}

/// The moves of a round (at most `want` blocks, whole chunks, as many as the free
/// blocks outside them can take) and the
/// first blocks of the chunks they empty, emptiest first, then coldest (least recently
/// written). A partly used whole chunk can be emptied when every block in use in it is
/// a regular file's 4 KiB data block (moved by the round) or a node of such a file's
/// map above a data block of the chunk (copied by the copy-on-write update that
/// switches that block).
pub(crate) fn select(sh: &mut Shared, want: u64) -> io::Result<(Vec<Move>, Vec<u64>)> {
    let firsts: HashMap<u64, u64> = sh
        .blocks
        .chunk_usage()
        .iter()
        .enumerate()
        .filter(|(_, &u)| u > 0 && (u as u64) < HUGE_BLOCKS)
        .map(|(c, &u)| (sh.blocks.chunk_first(c), u as u64))
        .collect();
    if firsts.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    // Per chunk: its moves, the blocks of it the round empties, the latest write.
    let g = sh.recency.grain(0);
    let mut found: HashMap<u64, (Vec<Move>, u64, u64)> = HashMap::new();
    for ino in 1..sh.layout.inode_count {
        if !sh.inodes.is_used(ino) {
            continue;
        }
        let Ok(inode) = sh.area.read_inode(ino) else {
            continue;
        };
        if inode.attrs.kind != Kind::File || inode.map_root == 0 {
            continue;
        }
        let mut w = Walk {
            sh,
            firsts: &firsts,
            found: &mut found,
            ino,
            grain: g,
        };
        if inode.map_height == 0 {
            // A direct map: its one block has no node above it.
            w.leaf(0, inode.map_root)?;
        } else {
            w.node(inode.map_root, inode.map_height, 0)?;
        }
    }
    let mut cands: Vec<(u64, u64, u64)> = found
        .iter()
        .filter(|(c, (_, emptied, _))| firsts.get(c) == Some(emptied))
        .map(|(&c, (m, _, hot))| (m.len() as u64, *hot, c))
        .collect();
    cands.sort_unstable();
    // The copies go to free blocks outside the victims (and the switch's map nodes
    // need a few more).
    let mut room = sh.blocks.free_count().saturating_sub(SLACK);
    let (mut moves, mut victims) = (Vec::new(), Vec::new());
    for (n, _, c) in cands {
        let held = HUGE_BLOCKS - firsts[&c];
        if moves.len() as u64 + n > want || moves.len() as u64 + n + held > room {
            break;
        }
        room -= held;
        moves.extend(found.remove(&c).map(|x| x.0).unwrap_or_default());
        victims.push(c);
    }
    Ok((moves, victims))
}

/// A walk of one file's map for [`select`].
struct Walk<'a> {
    sh: &'a Shared,
    firsts: &'a HashMap<u64, u64>,
    found: &'a mut HashMap<u64, (Vec<Move>, u64, u64)>,
    ino: u64,
    grain: u64,
}

impl Walk<'_> {
    /// Data block entry `e` of file block `fb`: a move if it lies in a candidate chunk
    /// (which it returns).
    fn leaf(&mut self, fb: u64, e: u64) -> io::Result<Option<u64>> {
        let e = self.sh.check_leaf(e, "map entry")?;
        let c = e / HUGE_BLOCKS * HUGE_BLOCKS;
        if entry_tier(e) != 0 || !self.firsts.contains_key(&c) {
            return Ok(None);
        }
        let hot = self.sh.recency.get(0, self.ino, fb / self.grain);
        let f = self.found.entry(c).or_default();
        f.0.push(Move {
            ino: self.ino,
            fblk: fb,
            old: e,
        });
        f.1 += 1;
        f.2 = f.2.max(hot);
        Ok(Some(c))
    }

    /// Visit node `blk` at `level` (covering file blocks from `base`); returns the
    /// candidate chunks holding data blocks below it.
    fn node(&mut self, blk: u64, level: u8, base: u64) -> io::Result<Vec<u64>> {
        let blk = self.sh.check_ptr(blk, "map node")?;
        let n = self.sh.read_node(blk)?;
        let span = coverage(level - 1);
        let mut below: Vec<u64> = Vec::new();
        for (i, &e) in n.iter().enumerate() {
            if e == 0 || (level == 2 && is_huge(e)) {
                continue;
            }
            let fb = base + i as u64 * span;
            if level > 1 {
                for c in self.node(e, level - 1, fb)? {
                    if !below.contains(&c) {
                        below.push(c);
                    }
                }
                continue;
            }
            if let Some(c) = self.leaf(fb, e)? {
                if !below.contains(&c) {
                    below.push(c);
                }
            }
        }
        // This node is copied when a data block below it moves: it leaves its chunk
        // if that chunk is emptied.
        let c = blk / HUGE_BLOCKS * HUGE_BLOCKS;
        if below.contains(&c) {
            self.found.entry(c).or_default().1 += 1;
        }
        Ok(below)
    }
}

/// Mark the free blocks of the chunks `victims` in use (so that the round's copies go
/// elsewhere); the caller frees them again once it allocated.
pub(crate) fn hold_free(sh: &mut Shared, victims: &[u64]) -> Vec<u64> {
    let mut held = Vec::new();
    for &first in victims {
        for b in first..first + HUGE_BLOCKS {
            if sh.blocks.mark_used(b) {
                held.push(b);
            }
        }
    }
    held
}
