//! Copy-on-write updates of file maps (the radix tree of `cairn_format::map`).
//!
//! A batch of changes (file block -> new block, or 0 for a hole) and a truncation point
//! are applied in one pass: every node on a changed path is copied once, changed, written
//! and written back; untouched subtrees are shared with the old tree; the tree grows when
//! a change lies beyond its coverage. Replaced nodes and (for files) replaced or dropped
//! data blocks are retired in the digest's `Work`, never modified in place.
//!
//! A map of one block, file block 0, is *direct* (height 0, the inode's root is that
//! block's entry): [`update`] makes it so and grows it back into a tree when needed.
//!
//! Superpage extents (`cairn_format::map::HUGE_FLAG`, level-2 entries of file maps) are
//! set by a change `(first file block of the 2 MiB range, huge entry)`, which replaces
//! whatever the range held (its leaf node and blocks are retired). A change of a single
//! block inside an extent, or a truncation inside it, splits it: a leaf node pointing
//! into the extent takes its place and the blocks replaced or dropped are retired one
//! by one (the rest of the extent stays in use, now as 4 KiB blocks).

use crate::store::shared::{Shared, Work};
use cairn_format::inode::{Inode, Kind};
use cairn_format::map::{
    coverage, height_for_blocks, huge_entry, is_huge, FANOUT, HUGE_BLOCKS, MAX_HEIGHT,
};
use cairn_format::BLOCK_SIZE_U64;
use std::io;

/// The new root of an updated map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MapResult {
    pub root: u64,
    pub height: u8,
    /// Change in blocks owned through the map: new nodes − retired nodes, and for maps
    /// that own their leaves also new leaf entries − retired leaf blocks.
    pub delta: i64,
}

/// Where a node's old entries come from.
#[derive(Debug, Clone, Copy)]
enum Src {
    /// No node (all holes).
    Empty,
    /// A published node.
    Node(u64),
    /// A superpage extent (first block) in place of a leaf node: entry `i` is
    /// `first + i`.
    Huge(u64),
    /// A node above the old root, created because the tree grows: entry 0 leads down to
    /// the old root of height `height`.
    Wrap { root: u64, height: u8 },
}

struct Ctx<'a> {
    sh: &'a mut Shared,
    w: &'a mut Work,
    /// File blocks `>= keep` are dropped unless a change sets them.
    keep: u64,
    /// Whether leaf entries are blocks owned by the map (files), retired when replaced.
    leaf_owned: bool,
    delta: i64,
}

/// Apply `changes` (sorted by file block, unique; 0 = hole) and drop file blocks `>= keep`
/// (`u64::MAX`: no truncation) on the map `root`/`height`. On a store of format version
/// 5 a map whose only block is file block 0 comes out *direct* (height 0, the root is
/// that block's entry: no map node; `cairn_format::map`).
pub(crate) fn update(
    sh: &mut Shared,
    w: &mut Work,
    root: u64,
    height: u8,
    changes: &[(u64, u64)],
    keep: u64,
    leaf_owned: bool,
) -> io::Result<MapResult> {
    if height == 0 && root != 0 {
        return update_direct(sh, w, root, changes, keep, leaf_owned);
    }
    if let [(0, e)] = changes {
        if root == 0 && *e != 0 && !is_huge(*e) && keep > 0 && sh.area.superblock().superpages() {
            // A new map of one block (a small file's first write): direct at once.
            return Ok(MapResult {
                root: *e,
                height: 0,
                delta: leaf_owned as i64,
            });
        }
    }
    let r = update_tree(sh, w, root, height, changes, keep, leaf_owned)?;
    make_direct(sh, w, r)
}

/// [`update`] of a direct map: its block becomes a change (unless a change or the
/// truncation replaces it) of an empty map.
fn update_direct(
    sh: &mut Shared,
    w: &mut Work,
    leaf: u64,
    changes: &[(u64, u64)],
    keep: u64,
    leaf_owned: bool,
) -> io::Result<MapResult> {
    let leaf = sh.check_leaf(leaf, "direct map entry")?;
    let mut ch = changes.to_vec();
    let mut delta = 0;
    if ch.first().is_some_and(|c| c.0 == 0) || keep == 0 {
        if leaf_owned {
            w.retired.push(leaf);
            delta -= 1;
        }
    } else {
        ch.insert(0, (0, leaf));
        if leaf_owned {
            // Counted as a new leaf entry below; it is not.
            delta -= 1;
        }
    }
    let r = update(sh, w, 0, 0, &ch, keep, leaf_owned)?;
    Ok(MapResult {
        delta: r.delta + delta,
        ..r
    })
}

/// A map of height 1 holding only file block 0 becomes direct (its node retired), on
/// stores whose format has direct maps (version 5).
fn make_direct(sh: &mut Shared, w: &mut Work, r: MapResult) -> io::Result<MapResult> {
    if r.height != 1 || r.root == 0 || !sh.area.superblock().superpages() {
        return Ok(r);
    }
    let n = sh.read_node(r.root)?;
    if n[0] == 0 || n[1..].iter().any(|&e| e != 0) {
        return Ok(r);
    }
    w.retired.push(r.root);
    Ok(MapResult {
        root: n[0],
        height: 0,
        delta: r.delta - 1,
    })
}

/// [`update`] of a map of nodes.
fn update_tree(
    sh: &mut Shared,
    w: &mut Work,
    root: u64,
    height: u8,
    changes: &[(u64, u64)],
    keep: u64,
    leaf_owned: bool,
) -> io::Result<MapResult> {
    debug_assert!(changes.windows(2).all(|p| p[0].0 < p[1].0));
    let (root, height) = if root == 0 || height == 0 {
        (0, 0)
    } else {
        (root, height.min(MAX_HEIGHT))
    };
    let need = changes
        .iter()
        .filter(|c| c.1 != 0)
        .map(|c| {
            let h = height_for_blocks(c.0 + 1);
            if is_huge(c.1) {
                debug_assert!(c.0.is_multiple_of(HUGE_BLOCKS));
                h.max(2)
            } else {
                h
            }
        })
        .max()
        .unwrap_or(0);
    if need > MAX_HEIGHT {
        return Err(crate::util::einval(
            "file block beyond the largest file size",
        ));
    }
    let h = need.max(height);
    if h == 0 {
        return Ok(MapResult {
            root: 0,
            height: 0,
            delta: 0,
        });
    }
    let src = if root == 0 {
        Src::Empty
    } else if h > height {
        Src::Wrap { root, height }
    } else {
        Src::Node(root)
    };
    // Holes beyond the coverage are already holes.
    let cov = coverage(h);
    let end = changes.partition_point(|c| c.0 < cov);
    let mut ctx = Ctx {
        sh,
        w,
        keep,
        leaf_owned,
        delta: 0,
    };
    let new_root = ctx.cow(src, h, 0, &changes[..end])?;
    Ok(MapResult {
        root: new_root,
        height: if new_root == 0 { 0 } else { h },
        delta: ctx.delta,
    })
}

impl Ctx<'_> {
    fn retire(&mut self, blk: u64) {
        self.w.retired.push(blk);
    }

    /// Retire a whole subtree (nodes and, if owned, leaves).
    fn retire_src(&mut self, src: Src, level: u8) -> io::Result<()> {
        match src {
            Src::Empty => Ok(()),
            Src::Wrap { root, height } => self.retire_src(Src::Node(root), height),
            Src::Huge(first) => {
                if self.leaf_owned {
                    for b in first..first + HUGE_BLOCKS {
                        self.retire(b);
                    }
                    self.delta -= HUGE_BLOCKS as i64;
                }
                Ok(())
            }
            Src::Node(b) => {
                let b = self.sh.check_ptr(b, "map node")?;
                let n = self.sh.read_node(b)?;
                for &e in n.iter().filter(|&&e| e != 0) {
                    if level == 2 && is_huge(e) {
                        let first = self.sh.check_huge(e)?;
                        self.retire_src(Src::Huge(first), 1)?;
                    } else if level == 1 {
                        if self.leaf_owned {
                            let e = self.sh.check_leaf(e, "map entry")?;
                            self.retire(e);
                            self.delta -= 1;
                        }
                    } else {
                        self.retire_src(Src::Node(e), level - 1)?;
                    }
                }
                self.retire(b);
                self.delta -= 1;
                Ok(())
            }
        }
    }

    fn cow(&mut self, src: Src, level: u8, base: u64, changes: &[(u64, u64)]) -> io::Result<u64> {
        let span = coverage(level);
        let trunc_here = self.keep < base.saturating_add(span);
        let cur = match src {
            Src::Node(b) => self.sh.check_ptr(b, "map node")?,
            _ => 0,
        };
        let wrap = matches!(src, Src::Wrap { .. });
        if let Src::Huge(first) = src {
            if changes.is_empty() && !trunc_here {
                return Ok(huge_entry(first));
            }
        }
        if changes.is_empty() && !trunc_here && !wrap {
            return Ok(cur);
        }
        let mut ents = match src {
            Src::Node(b) => self.sh.read_node(b)?,
            Src::Huge(first) => {
                // Split: a leaf node pointing into the extent takes its place.
                let mut n = Box::new([0u64; FANOUT as usize]);
                for (i, e) in n.iter_mut().enumerate() {
                    *e = first + i as u64;
                }
                n
            }
            _ => Box::new([0u64; FANOUT as usize]),
        };
        let mut changed = wrap;
        let child_span = coverage(level - 1);
        let mut ci = 0usize;
        for idx in 0..FANOUT as usize {
            let child_base = base + idx as u64 * child_span;
            let child_end = child_base + child_span;
            let end = ci + changes[ci..].partition_point(|c| c.0 < child_end);
            let cs = &changes[ci..end];
            ci = end;
            let beyond = child_base >= self.keep;
            let partial = !beyond && self.keep < child_end;
            if level == 1 {
                if cs.iter().any(|c| is_huge(c.1)) {
                    return Err(crate::util::eio(
                        "a superpage extent set together with a block of its range",
                    ));
                }
                let old = ents[idx];
                let new = match cs.last() {
                    Some(c) => c.1,
                    None if beyond => 0,
                    None => old,
                };
                if new != old {
                    if old != 0 && self.leaf_owned {
                        let old = self.sh.check_leaf(old, "map entry")?;
                        self.retire(old);
                        self.delta -= 1;
                    }
                    if new != 0 && self.leaf_owned {
                        self.delta += 1;
                    }
                    ents[idx] = new;
                    changed = true;
                }
                continue;
            }
            let child = match src {
                Src::Empty | Src::Huge(_) => Src::Empty,
                Src::Node(_) => match ents[idx] {
                    0 => Src::Empty,
                    e if level == 2 && is_huge(e) => Src::Huge(self.sh.check_huge(e)?),
                    e => Src::Node(e),
                },
                Src::Wrap { root, height } => {
                    if idx != 0 {
                        Src::Empty
                    } else if level - 1 == height {
                        Src::Node(root)
                    } else {
                        Src::Wrap { root, height }
                    }
                }
            };
            let child_ptr = match child {
                Src::Node(b) => b,
                Src::Huge(first) => huge_entry(first),
                _ => 0,
            };
            if level == 2 {
                if let [(fb, e)] = cs {
                    if is_huge(*e) {
                        // A superpage extent replaces the whole range.
                        debug_assert_eq!(*fb, child_base);
                        self.retire_src(child, 1)?;
                        if self.leaf_owned {
                            self.delta += HUGE_BLOCKS as i64;
                        }
                        ents[idx] = *e;
                        changed = true;
                        continue;
                    }
                }
            }
            let forced = matches!(child, Src::Wrap { .. });
            if cs.is_empty() && !beyond && !partial && !forced {
                if ents[idx] != child_ptr {
                    ents[idx] = child_ptr;
                    changed = true;
                }
                continue;
            }
            if cs.is_empty() && beyond {
                self.retire_src(child, level - 1)?;
                if ents[idx] != 0 {
                    ents[idx] = 0;
                    changed = true;
                }
                continue;
            }
            let new = self.cow(child, level - 1, child_base, cs)?;
            if new != ents[idx] {
                ents[idx] = new;
                changed = true;
            }
        }
        if !changed {
            return Ok(match src {
                Src::Huge(first) => huge_entry(first),
                _ => cur,
            });
        }
        if ents.iter().all(|&e| e == 0) {
            if cur != 0 {
                self.retire(cur);
                self.delta -= 1;
            }
            return Ok(0);
        }
        let data = Shared::encode_node(&ents);
        let nb = self.sh.new_block(self.w, &data, false)?;
        self.delta += 1;
        if cur != 0 {
            self.retire(cur);
            self.delta -= 1;
        }
        Ok(nb)
    }
}

/// Appends written into their leaf in place.
///
/// The one map change made in place: new blocks appended past the end of a regular
/// file, into the leaf node that holds the file's last block, at entries that are holes
/// up to the leaf's end. Nothing reads those entries while the inode says the file is
/// shorter (readers stop at its size; promotions compare the entries they copied), so
/// the digest writes them with the batch's data, before the fence that precedes the
/// inodes, and publishing the inode's new size makes them part of the file. A crash
/// before that publish leaves them set past the end, uncounted in the inode's blocks:
/// [`clear_unpublished_append`] clears them at the rebuild, and the replay of the log
/// writes them again. Anything else (a hole inside the file, a new leaf, a truncation,
/// an extent) is copied on write by [`update`].
pub(crate) fn append_leaf(
    sh: &Shared,
    old: &Inode,
    changes: &[(u64, u64)],
) -> io::Result<Option<u64>> {
    let (Some(&(first, _)), Some(&(last, _))) = (changes.first(), changes.last()) else {
        return Ok(None);
    };
    let Some(t) = tail_of(sh, old)? else {
        return Ok(None);
    };
    let leaf_base = t.end - t.idx as u64;
    if first < t.end
        || last >= leaf_base + FANOUT
        || changes.iter().any(|c| c.1 == 0 || is_huge(c.1))
    {
        return Ok(None);
    }
    debug_assert!(changes.windows(2).all(|p| p[0].0 < p[1].0));
    Ok(t.entries[t.idx..].iter().all(|&e| e == 0).then_some(t.leaf))
}

/// The leaf node that holds a file's last block, when the block after it is in the same
/// leaf: where an append may be written in place.
struct Tail {
    /// The file block after the last one, and its index in the leaf.
    end: u64,
    idx: usize,
    leaf: u64,
    entries: crate::store::shared::Node,
}

/// [`Tail`] of `inode`: a regular file whose map is a tree of nodes, not ending at a
/// leaf's end, whose last block's leaf exists (not a hole, not a superpage extent).
fn tail_of(sh: &Shared, inode: &Inode) -> io::Result<Option<Tail>> {
    if inode.attrs.kind != Kind::File || inode.map_root == 0 || inode.map_height == 0 {
        return Ok(None);
    }
    let end = inode.attrs.size.div_ceil(BLOCK_SIZE_U64);
    let idx = (end % FANOUT) as usize;
    if idx == 0 || end >= coverage(inode.map_height) {
        return Ok(None);
    }
    let leaf = match sh.area.range_entry(inode, end)? {
        Some(e) if !is_huge(e) => sh.check_ptr(e, "map node")?,
        _ => return Ok(None),
    };
    Ok(Some(Tail {
        end,
        idx,
        leaf,
        entries: sh.read_node(leaf)?,
    }))
}

/// Queue `changes`, checked by [`append_leaf`], to be written into `leaf` in place when
/// the batch publishes. Returns the bytes that costs the shared area (whole cache lines).
pub(crate) fn queue_append(w: &mut Work, leaf: u64, changes: &[(u64, u64)]) -> u64 {
    let base = leaf * BLOCK_SIZE_U64;
    let mut lines = 0;
    let mut last_line = u64::MAX;
    for &(fb, e) in changes {
        let off = base + (fb % FANOUT) * 8;
        if off / 64 != last_line {
            last_line = off / 64;
            lines += 1;
        }
        w.in_place.push((off, e));
    }
    lines * 64
}

/// Write the entries [`queue_append`] queued and write their lines back (the caller's
/// fence makes them durable, before any inode that counts them is published).
pub(crate) fn write_appends(sh: &Shared, w: &Work) -> io::Result<()> {
    let m = sh.area.map();
    for &(off, e) in &w.in_place {
        m.store_u64(off as usize, e)?;
    }
    let mut last_line = u64::MAX;
    for &(off, _) in &w.in_place {
        if off / 64 != last_line {
            last_line = off / 64;
            m.flush(off as usize, 8)?;
        }
    }
    Ok(())
}

/// The entries an append in place wrote past the end of `inode` whose inode a crash
/// kept from being published: the leaf and the entries' indices in it, or `None`. They
/// are told from an extent's (a leaf that replaced a superpage extent keeps its entries
/// past the end, counted) by the inode's block count: an unpublished append's are the
/// only ones it does not count.
pub(crate) fn unpublished_append(
    sh: &Shared,
    inode: &Inode,
) -> io::Result<Option<(u64, Vec<usize>)>> {
    let Some(t) = tail_of(sh, inode)? else {
        return Ok(None);
    };
    let set: Vec<usize> = (t.idx..FANOUT as usize)
        .filter(|&i| t.entries[i] != 0)
        .collect();
    if set.is_empty() {
        return Ok(None);
    }
    let owned = crate::store::recovery::owned_blocks(sh, inode)?.len() as u64;
    Ok((owned == inode.blocks + set.len() as u64).then_some((t.leaf, set)))
}

/// At a rebuild after a crash: clear the entries of an [`unpublished_append`] of
/// `inode` (the replay of the log appends again). Returns how many were cleared.
pub(crate) fn clear_unpublished_append(sh: &Shared, inode: &Inode) -> io::Result<u64> {
    let Some((leaf, set)) = unpublished_append(sh, inode)? else {
        return Ok(0);
    };
    let m = sh.area.map();
    for &i in &set {
        let off = (leaf * BLOCK_SIZE_U64) as usize + i * 8;
        m.store_u64(off, 0)?;
        m.flush(off, 8)?;
    }
    cairn_media::fence();
    Ok(set.len() as u64)
}

/// Visit every node (`on_node(block)`) and every leaf entry (`on_leaf(file_block, block)`)
/// of a map, checking every pointer.
pub(crate) fn walk(
    sh: &Shared,
    root: u64,
    height: u8,
    on_node: &mut dyn FnMut(u64),
    on_leaf: &mut dyn FnMut(u64, u64),
) -> io::Result<()> {
    if root == 0 {
        return Ok(());
    }
    if height == 0 {
        // A direct map: the root is file block 0's entry.
        on_leaf(0, sh.check_leaf(root, "direct map entry")?);
        return Ok(());
    }
    if height > MAX_HEIGHT {
        return Err(crate::util::eio("map height out of range"));
    }
    walk_node(sh, root, height, 0, on_node, on_leaf)
}

fn walk_node(
    sh: &Shared,
    blk: u64,
    level: u8,
    base: u64,
    on_node: &mut dyn FnMut(u64),
    on_leaf: &mut dyn FnMut(u64, u64),
) -> io::Result<()> {
    let blk = sh.check_ptr(blk, "map node")?;
    on_node(blk);
    let n = sh.read_node(blk)?;
    let child_span = coverage(level - 1);
    for (i, &e) in n.iter().enumerate() {
        if e == 0 {
            continue;
        }
        let fb = base + i as u64 * child_span;
        if level == 2 && is_huge(e) {
            let first = sh.check_huge(e)?;
            for k in 0..HUGE_BLOCKS {
                on_leaf(fb + k, first + k);
            }
        } else if level == 1 {
            on_leaf(fb, sh.check_leaf(e, "map entry")?);
        } else {
            walk_node(sh, e, level - 1, fb, on_node, on_leaf)?;
        }
    }
    Ok(())
}
