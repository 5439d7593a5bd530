//! Recency and heat, kept in DRAM only (as in Strata): per tier, the last time each
//! chunk of file data (1 MiB in NVM, 4 MiB below by default) was written by a digest or
//! moved into the tier, and how often clients read the chunks of the lower tiers (the
//! read hints they leave in their client pages), which makes them worth promoting.

use super::migrate::Move;
use super::select::leaves_of;
use crate::store::shared::Shared;
use crate::util::now_ns;
use cairn_format::inode::Kind;
use cairn_format::map::entry_tier;
use std::collections::HashMap;
use std::io;

/// When each chunk of file data was last used, per tier (a logical clock), and how
/// often clients read the chunks of the lower tiers (their hints).
#[derive(Debug)]
pub(crate) struct Recency {
    /// Chunk size per tier, in blocks (`recency_grain_nvm_kib`, `recency_grain_ssd_kib`
    /// in `cairn.toml`: 1 MiB in NVM, 4 MiB below by default).
    grains: [u64; 3],
    tick: u64,
    last: HashMap<(u8, u64, u64), u64>,
    /// (tier, inode, chunk) -> (reads hinted, time of the last one in ns).
    reads: HashMap<(u8, u64, u64), (u32, i64)>,
    /// Per slot: how many of its hints were consumed.
    tails: HashMap<u32, u64>,
}

/// Reads of a lower-tier chunk (within [`HEAT_WINDOW_NS`] of each other) that make it
/// worth promoting.
const PROMOTE_READS: u32 = 4;
/// A chunk not read for this long starts counting again (30 s).
const HEAT_WINDOW_NS: i64 = 30_000_000_000;

/// Consume the read hints the clients of `slots` wrote into their client pages since
/// the last call (`cairn_format::slot::client_page`). Hints are untrusted: each names an
/// inode and a file block, and counts only if that block of a live regular file is in a
/// lower tier now. A client that wrote more hints than its ring holds lost the oldest.
pub(crate) fn drain_hints(sh: &mut Shared, slots: &[u32]) {
    use cairn_format::slot::client_page::{HINT_BASE, HINT_HEAD, HINT_SLOTS};
    let now = now_ns();
    for &slot in slots {
        let (page, cp) = sh.area.slot_log(slot);
        let Ok(head) = page.load_u64(cp + HINT_HEAD as usize) else {
            continue;
        };
        let tail = sh.recency.tails.get(&slot).copied().unwrap_or(0);
        // A reset client page (new client) starts again from 0.
        let tail = if head < tail { 0 } else { tail };
        let from = tail.max(head.saturating_sub(HINT_SLOTS));
        for n in from..head {
            let off = cp + (HINT_BASE + (n % HINT_SLOTS) * 16) as usize;
            let (Ok(ino), Ok(fblk)) = (page.load_u64(off), page.load_u64(off + 8)) else {
                continue;
            };
            if !sh.layout.ino_valid(ino) || !sh.inodes.is_used(ino) {
                continue;
            }
            let Ok(inode) = sh.inode(ino) else { continue };
            if inode.attrs.kind != Kind::File {
                continue;
            }
            let Ok(Some(e)) = sh.area.block_of(&inode, fblk) else {
                continue;
            };
            let tier = entry_tier(e);
            if tier == 0 {
                continue;
            }
            let r = sh
                .recency
                .reads
                .entry((tier, ino, fblk / sh.recency.grain(tier)))
                .or_insert((0, now));
            if now - r.1 > HEAT_WINDOW_NS {
                r.0 = 0;
            }
            *r = (r.0.saturating_add(1), now);
            sh.recency.touch(tier, ino, fblk, fblk);
        }
        sh.recency.tails.insert(slot, head);
    }
}

/// The blocks of the chunks of tier `from` clients read most (at least
/// [`PROMOTE_READS`] times), at most `max`; their counts are forgotten.
pub(super) fn select_hot(sh: &mut Shared, from: u8, max: u64) -> io::Result<Vec<Move>> {
    let now = now_ns();
    sh.recency.reads.retain(|_, v| now - v.1 <= HEAT_WINDOW_NS);
    let mut hot: Vec<(u32, u64, u64)> = sh
        .recency
        .reads
        .iter()
        .filter(|(k, v)| k.0 == from && v.0 >= PROMOTE_READS && now - v.1 <= HEAT_WINDOW_NS)
        .map(|(k, v)| (v.0, k.1, k.2))
        .collect();
    hot.sort_by(|a, b| b.cmp(a));
    let g = sh.recency.grain(from);
    let mut out = Vec::new();
    for (_, ino, chunk) in hot {
        if out.len() as u64 >= max {
            break;
        }
        sh.recency.reads.remove(&(from, ino, chunk));
        let range = chunk * g..(chunk + 1) * g;
        let v = leaves_of(sh, ino, &mut |fb, e| {
            range.contains(&fb) && entry_tier(e) == from
        })?;
        let room = (max - out.len() as u64) as usize;
        out.extend(
            v.into_iter()
                .take(room)
                .map(|(fblk, old)| Move { ino, fblk, old }),
        );
    }
    Ok(out)
}

impl Default for Recency {
    fn default() -> Recency {
        Recency::new(1024, 4096)
    }
}

impl Recency {
    /// Chunks of `nvm_kib` in NVM and `lower_kib` in the lower tiers (at least 4 KiB).
    pub(crate) fn new(nvm_kib: u64, lower_kib: u64) -> Recency {
        let b = |kib: u64| (kib / 4).max(1);
        Recency {
            grains: [b(nvm_kib), b(lower_kib), b(lower_kib)],
            tick: 0,
            last: HashMap::new(),
            reads: HashMap::new(),
            tails: HashMap::new(),
        }
    }

    /// The chunk size of `tier`, in blocks.
    pub(crate) fn grain(&self, tier: u8) -> u64 {
        self.grains[tier.min(2) as usize]
    }

    /// File blocks `first..=last` of `ino` in `tier` were just used.
    pub(crate) fn touch(&mut self, tier: u8, ino: u64, first: u64, last: u64) {
        self.tick += 1;
        let g = self.grain(tier);
        for c in first / g..=last / g {
            self.last.insert((tier, ino, c), self.tick);
        }
    }

    pub(crate) fn get(&self, tier: u8, ino: u64, chunk: u64) -> u64 {
        self.last.get(&(tier, ino, chunk)).copied().unwrap_or(0)
    }

    /// Forget the recency of the chunks of `tier` not in `keep` (inode, chunk): they
    /// hold nothing there any more.
    pub(crate) fn forget_except(&mut self, tier: u8, keep: &std::collections::HashSet<(u64, u64)>) {
        self.last
            .retain(|&(t, ino, c), _| t != tier || keep.contains(&(ino, c)));
    }

    /// Whether a chunk of `tier` was read often enough to be promoted.
    pub(crate) fn has_hot(&self, tier: u8) -> bool {
        self.reads
            .iter()
            .any(|(k, v)| k.0 == tier && v.0 >= PROMOTE_READS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recency_chunks() {
        let mut r = Recency::new(1024, 4096);
        assert_eq!((r.grain(0), r.grain(1), r.grain(2)), (256, 1024, 1024));
        r.touch(0, 7, 0, 600);
        assert_eq!(r.get(0, 7, 2), r.get(0, 7, 0));
        assert_eq!(r.get(0, 7, 3), 0, "never used: the coldest");
        r.touch(0, 7, 300, 300);
        assert!(r.get(0, 7, 1) > r.get(0, 7, 0));
    }
}
