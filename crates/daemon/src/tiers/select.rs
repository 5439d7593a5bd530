//! Which blocks a round moves: the coldest chunks of a tier (migration), or the live
//! blocks of the segments with the best cost-benefit (cleaning and evacuation).

use super::migrate::Move;
use crate::store::maptree;
use crate::store::shared::Shared;
use crate::util::now_ns;
use cairn_format::inode::Kind;
use cairn_format::map::{entry_block, entry_tier};
use cairn_format::tier::SEG_WRITTEN_NS;
use std::collections::{BTreeMap, HashSet};
use std::io;

/// Every block of a regular file's map in the tier(s) `want` accepts, grouped by inode.
pub(super) fn file_blocks(
    sh: &Shared,
    want: &mut dyn FnMut(u64) -> bool,
) -> io::Result<BTreeMap<u64, Vec<(u64, u64)>>> {
    let mut out = BTreeMap::new();
    for ino in 1..sh.layout.inode_count {
        if !sh.inodes.is_used(ino) {
            continue;
        }
        let v = leaves_of(sh, ino, &mut |_, e| want(e))?;
        if !v.is_empty() {
            out.insert(ino, v);
        }
    }
    Ok(out)
}

/// The (file block, entry) leaves of regular file `ino` that `want` accepts (none if
/// it is not a readable regular file).
pub(super) fn leaves_of(
    sh: &Shared,
    ino: u64,
    want: &mut dyn FnMut(u64, u64) -> bool,
) -> io::Result<Vec<(u64, u64)>> {
    let mut v = Vec::new();
    let Ok(inode) = sh.inode(ino) else {
        return Ok(v);
    };
    if inode.attrs.kind != Kind::File {
        return Ok(v);
    }
    maptree::walk(
        sh,
        inode.map_root,
        inode.map_height,
        &mut |_| {},
        &mut |fb, e| {
            if want(fb, e) {
                v.push((fb, e));
            }
        },
    )?;
    Ok(v)
}

/// The coldest blocks of tier `from`, at most `max`, whole chunks first, none of those
/// in `busy` (other rounds copy them). Forgets the recency of chunks that no longer
/// hold blocks there.
pub(super) fn select_cold(
    sh: &mut Shared,
    from: u8,
    max: u64,
    busy: &HashSet<u64>,
) -> io::Result<Vec<Move>> {
    let all = file_blocks(sh, &mut |e| entry_tier(e) == from)?;
    let g = sh.recency.grain(from);
    // (recency, inode, chunk, its blocks)
    type Chunk = (u64, u64, u64, Vec<(u64, u64)>);
    let mut chunks: Vec<Chunk> = Vec::new();
    for (ino, blocks) in all {
        let mut cur: Option<(u64, Vec<(u64, u64)>)> = None;
        for (fb, e) in blocks {
            match &mut cur {
                Some((c, v)) if *c == fb / g => v.push((fb, e)),
                _ => {
                    if let Some((c, v)) = cur.take() {
                        chunks.push((sh.recency.get(from, ino, c), ino, c, v));
                    }
                    cur = Some((fb / g, vec![(fb, e)]));
                }
            }
        }
        if let Some((c, v)) = cur {
            chunks.push((sh.recency.get(from, ino, c), ino, c, v));
        }
    }
    let seen: HashSet<(u64, u64)> = chunks.iter().map(|c| (c.1, c.2)).collect();
    sh.recency.forget_except(from, &seen);
    chunks.sort_by_key(|c| (c.0, c.1, c.2));
    // NVM chunks are superpage extents or hold several (the grain is at least 2 MiB
    // with superpages, `Core::open`): an extent moves whole or not at all.
    let whole = from == 0 && sh.superpages.enabled;
    let mut out = Vec::new();
    for (_, ino, _, mut v) in chunks {
        v.retain(|(_, e)| !busy.contains(e));
        if whole && !out.is_empty() && out.len() + v.len() > max as usize {
            continue;
        }
        for (fblk, old) in v {
            if out.len() as u64 >= max {
                return Ok(out);
            }
            out.push(Move { ino, fblk, old });
        }
    }
    Ok(out)
}

/// Victim segments of lower tier `tier` ([`pick_victims`]: `room` blocks to fill, at
/// least `min` victims) and the live blocks they hold.
pub(super) fn select_victims(
    sh: &Shared,
    tier: u8,
    room: u64,
    min: usize,
) -> io::Result<Vec<Move>> {
    let Some(t) = sh.tier(tier) else {
        return Ok(Vec::new());
    };
    let now = now_ns().max(0) as u64;
    let cands: Vec<(u64, u64, f64)> = (1..t.geom.segments)
        .map(|s| {
            let off = sh.layout.seg_entry_off(tier, s) + SEG_WRITTEN_NS;
            let written = sh.map().load_u64(off as usize).unwrap_or(0);
            (s, t.seg_in_use(s), now.saturating_sub(written) as f64 / 1e9)
        })
        .collect();
    let victims: std::collections::HashSet<u64> =
        pick_victims(&cands, t.geom.segment_blocks, room, min)
            .into_iter()
            .collect();
    if victims.is_empty() {
        return Ok(Vec::new());
    }
    let geom = t.geom;
    let all = file_blocks(sh, &mut |e| {
        entry_tier(e) == tier && victims.contains(&geom.segment_of(entry_block(e)))
    })?;
    Ok(all
        .into_iter()
        .flat_map(|(ino, v)| {
            v.into_iter()
                .map(move |(fblk, old)| Move { ino, fblk, old })
        })
        .collect())
}

/// Victims among segments of `sb` blocks given as (segment, live blocks, age in
/// seconds): best cost-benefit first (Rosenblum and Ousterhout's `(1 − u) × age /
/// (1 + u)`, `u` the live fraction), as many as fit their live blocks into `room`
/// blocks (one segment of the tier they go to), and none unless at least `min`.
/// Cleaning compacts into the same tier (`room = sb`, `min = 2`: segments are written
/// once, so compacting one victim into one new segment gains nothing, and full
/// segments are no candidates); evacuation moves victims' blocks a tier down
/// (`min = 1`: any victim frees its segment). Empty segments are never victims.
pub(super) fn pick_victims(cands: &[(u64, u64, f64)], sb: u64, room: u64, min: usize) -> Vec<u64> {
    let mut scored: Vec<(f64, u64, u64)> = cands
        .iter()
        .filter(|c| c.1 > 0 && c.1 <= room && (min < 2 || c.1 < sb))
        .map(|&(s, live, age)| {
            let u = live as f64 / sb as f64;
            ((1.0 - u) * (age + 1.0) / (1.0 + u), s, live)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut victims = Vec::new();
    let mut total = 0;
    for (_, s, live) in scored {
        if total + live <= room {
            victims.push(s);
            total += live;
        }
    }
    if victims.len() < min {
        victims.clear();
    }
    victims
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn victims_by_cost_benefit_that_fit_one_segment() {
        // 100-block segments: (segment, live, age s).
        let c = [
            (1, 0, 50.0),   // empty: freed without cleaning
            (2, 100, 50.0), // full: nothing to gain
            (3, 10, 1.0),
            (4, 50, 100.0),
            (5, 30, 100.0),
            (6, 90, 1000.0),
        ];
        // Best first: 5 (30% live, old), then 6 (90% live but very old), 4, 3; 5 + 6 do
        // not fit in 100 blocks, 5 + 4 + 3 = 90 do.
        assert_eq!(pick_victims(&c, 100, 100, 2), vec![5, 4, 3]);
        // One that fits alone gains nothing by cleaning...
        let two = [(1, 60, 5.0), (2, 70, 5.0)];
        assert!(pick_victims(&two, 100, 100, 2).is_empty());
        // ...but evacuating it to the tier below frees its segment.
        assert_eq!(pick_victims(&two, 100, 100, 1), vec![1]);
        // Evacuation takes full segments too, and fills a bigger target segment.
        assert_eq!(pick_victims(&c, 100, 400, 1), vec![5, 6, 4, 3, 2]);
        assert!(pick_victims(&[], 100, 100, 2).is_empty());
        // Age breaks the tie between equal live fractions.
        assert_eq!(
            pick_victims(&[(1, 40, 1.0), (2, 40, 9.0)], 100, 100, 2),
            vec![2, 1]
        );
    }
}
