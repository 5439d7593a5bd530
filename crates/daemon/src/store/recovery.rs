//! Allocation state at start and stop: load the saved bitmaps after a clean stop, or
//! rebuild them by walking every inode reachable from the root (and free the orphans);
//! save them at a clean stop.

use crate::store::alloc::{Bitmap, BlockAlloc, InodeAlloc};
use crate::store::dirhash;
use crate::store::maptree;
use crate::store::shared::Shared;
use crate::tiers::TierAlloc;
use crate::util::eio;
use cairn_area::Area;
use cairn_format::inode::{Inode, Kind, INODE_BYTES};
use cairn_format::map::{entry_block, entry_tier};
use cairn_format::{alloc, BLOCK_SIZE_U64, ROOT_INO};
use std::io;

/// What a rebuild found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RebuildReport {
    pub inodes: u64,
    pub blocks: u64,
    /// Inodes that did not decode, freed.
    pub undecodable_freed: u64,
    /// Live inodes no directory names, kept until the logs are replayed (a batch the
    /// daemon died applying may name them again; `Shared::unreachable`):
    /// [`free_unreachable`] frees the rest.
    pub unnamed_kept: u64,
    pub seqlocks_fixed: u64,
    /// Map entries an append in place wrote past the end of a file whose inode a crash
    /// kept from being published, cleared (`maptree::clear_unpublished_append`).
    pub appends_cleared: u64,
    pub warnings: Vec<String>,
}

/// The allocation state saved at the last clean stop: NVM blocks, inodes, lower tiers.
pub(crate) type Saved = (BlockAlloc, InodeAlloc, Vec<TierAlloc>);

/// Load the allocation state saved at the last clean stop.
pub(crate) fn load(area: &Area) -> io::Result<Saved> {
    let l = area.layout();
    let m = area.map();
    let mut hdr = vec![0u8; cairn_format::BLOCK_SIZE];
    m.read((l.alloc_start * BLOCK_SIZE_U64) as usize, &mut hdr)?;
    let mut bm = vec![0u8; l.alloc_bitmap_bytes()];
    m.read(((l.alloc_start + 1) * BLOCK_SIZE_U64) as usize, &mut bm)?;
    alloc::check(&hdr, l.data_blocks, l.inode_count, &bm).map_err(|e| eio(e.0))?;
    let db = l.data_blocks.div_ceil(8) as usize;
    let ib = db + l.inode_count.div_ceil(8) as usize;
    let blocks =
        BlockAlloc::from_bitmap(l.data_start, Bitmap::from_bytes(&bm[..db], l.data_blocks));
    let inodes = InodeAlloc::from_bitmap(Bitmap::from_bytes(&bm[db..ib], l.inode_count));
    let mut tiers = Vec::new();
    let mut at = ib;
    for (i, g) in l.tiers.iter().enumerate() {
        let n = g.blocks().div_ceil(8) as usize;
        if g.present() {
            let live = Bitmap::from_bytes(&bm[at..at + n], g.blocks());
            tiers.push(TierAlloc::from_bitmap(i as u8 + 1, *g, live));
        }
        at += n;
    }
    Ok((blocks, inodes, tiers))
}

/// Save the allocation state (bitmaps first, then the header that checks them).
pub(crate) fn save(sh: &Shared) -> io::Result<()> {
    let l = &sh.layout;
    let mut bm = sh.blocks.bitmap().to_bytes();
    bm.extend_from_slice(&sh.inodes.bitmap().to_bytes());
    for t in &sh.tiers {
        bm.extend_from_slice(&t.bitmap().to_bytes());
    }
    let m = sh.map();
    let boff = ((l.alloc_start + 1) * BLOCK_SIZE_U64) as usize;
    m.write(boff, &bm)?;
    m.flush(boff, bm.len())?;
    cairn_media::fence();
    let hoff = (l.alloc_start * BLOCK_SIZE_U64) as usize;
    let hdr = alloc::encode_header(l.data_blocks, l.inode_count, &bm);
    m.write(hoff, &hdr)?;
    m.persist(hoff, hdr.len())
}

/// Make every inode's sequence word even. A daemon that died inside an update leaves it
/// odd; its old copy is the current one (the log replay redoes the update), so step back
/// to it.
pub(crate) fn fix_seqlocks(area: &Area) -> io::Result<u64> {
    let l = area.layout();
    let mut fixed = 0;
    for ino in 1..l.inode_count {
        let off = l.inode_off(ino) as usize;
        let s = area.map().load_u64(off)?;
        if s & 1 == 1 {
            area.map().store_u64(off, s - 1)?;
            area.map().persist(off, 8)?;
            fixed += 1;
        }
    }
    Ok(fixed)
}

/// Rebuild the allocation state by walking every inode reachable from the root: inodes,
/// map nodes, data blocks and directory bucket chains are in use, everything else is
/// free. Live inodes that are not reachable (orphans of a crash) are freed in place
/// (keeping their generation), except unlinked files (`nlink = 0`), which a client may
/// still have open: the daemon frees those when its restart gate closes.
pub(crate) fn rebuild(sh: &mut Shared) -> io::Result<RebuildReport> {
    let l = sh.layout;
    let mut rep = RebuildReport {
        seqlocks_fixed: fix_seqlocks(&sh.area)?,
        ..Default::default()
    };
    let mut a = Allocs {
        blocks: BlockAlloc::new(l.data_start, l.data_blocks),
        tiers: sh
            .tiers
            .iter()
            .map(|t| TierAlloc::new(t.num, t.geom))
            .collect(),
        inodes: InodeAlloc::new(l.inode_count),
    };
    let visited = mark_reachable(sh, &mut a, &mut rep)?;
    let unnamed = keep_unreachable(sh, &mut a, &visited, &mut rep)?;
    cairn_media::fence();
    rep.blocks = a.blocks.capacity() - a.blocks.free_count();
    sh.blocks = a.blocks;
    sh.inodes = a.inodes;
    sh.tiers = a.tiers;
    sh.retired.clear();
    rep.unnamed_kept = unnamed.len() as u64;
    sh.unreachable = unnamed;
    Ok(rep)
}

/// The allocators a rebuild fills.
struct Allocs {
    blocks: BlockAlloc,
    tiers: Vec<TierAlloc>,
    inodes: InodeAlloc,
}

/// Walk the tree from the root, marking every inode reached and every block its map
/// (and a directory's buckets) holds. Returns the inodes reached.
fn mark_reachable(sh: &Shared, a: &mut Allocs, rep: &mut RebuildReport) -> io::Result<Bitmap> {
    let l = sh.layout;
    let (blocks, tiers, inodes) = (&mut a.blocks, &mut a.tiers, &mut a.inodes);
    let mut visited = Bitmap::new(l.inode_count);
    let root = sh.inode(ROOT_INO)?;
    if root.attrs.kind != Kind::Dir {
        return Err(eio("the root inode is not a directory"));
    }
    let mut stack = vec![ROOT_INO];
    visited.set(ROOT_INO);
    let mut dup = 0u64;
    while let Some(ino) = stack.pop() {
        let inode = match sh.inode(ino) {
            Ok(i) => i,
            Err(e) => {
                rep.warnings
                    .push(format!("inode {ino}: {e} (its blocks are not accounted)"));
                inodes.mark_used(ino);
                continue;
            }
        };
        if inode.attrs.kind == Kind::Free {
            rep.warnings
                .push(format!("a directory entry names free inode {ino}"));
            continue;
        }
        inodes.mark_used(ino);
        rep.inodes += 1;
        let mut mark = |b: u64| {
            if !mark_in_use(blocks, tiers, b) {
                dup += 1;
            }
        };
        let r = match inode.attrs.kind {
            Kind::Dir => maptree::walk(
                sh,
                inode.map_root,
                inode.map_height,
                &mut mark,
                &mut |_, _| {},
            )
            .and_then(|()| {
                for b in dirhash::bucket_blocks(sh, &inode)? {
                    mark(b);
                }
                for e in sh.area.dir_list(&inode)? {
                    if l.ino_valid(e.ino) && !visited.get(e.ino) {
                        visited.set(e.ino);
                        stack.push(e.ino);
                    }
                }
                Ok(())
            }),
            _ => {
                match maptree::clear_unpublished_append(sh, &inode) {
                    Ok(0) => {}
                    Ok(n) => rep.appends_cleared += n,
                    Err(e) => rep.warnings.push(format!("inode {ino}: {e}")),
                }
                let mut leaves = Vec::new();
                let r = maptree::walk(
                    sh,
                    inode.map_root,
                    inode.map_height,
                    &mut mark,
                    &mut |_, b| leaves.push(b),
                );
                for b in leaves {
                    mark(b);
                }
                r
            }
        };
        if let Err(e) = r {
            rep.warnings.push(format!("inode {ino}: {e}"));
        }
    }
    if dup > 0 {
        rep.warnings
            .push(format!("{dup} blocks are referenced twice"));
    }
    Ok(visited)
}

/// Live inodes the walk did not reach: kept, with their blocks (see below); undecodable
/// ones are freed. Returns those kept that are not unlinked files (the replay of the
/// logs may name them again).
fn keep_unreachable(
    sh: &mut Shared,
    a: &mut Allocs,
    visited: &Bitmap,
    rep: &mut RebuildReport,
) -> io::Result<Vec<u64>> {
    let l = sh.layout;
    let (blocks, tiers, inodes) = (&mut a.blocks, &mut a.tiers, &mut a.inodes);
    // Orphans: live inodes nobody reaches.
    let mut raw = [0u8; INODE_BYTES];
    let mut unnamed = Vec::new();
    for ino in 2..l.inode_count {
        if visited.get(ino) {
            continue;
        }
        sh.area.read_inode_raw(ino, &mut raw)?;
        if raw.iter().all(|&b| b == 0) {
            continue;
        }
        match Inode::decode(&raw) {
            Ok(i) if i.attrs.kind != Kind::Free => {
                // Kept, with its blocks: an unlinked file (`nlink = 0`) until the restart
                // gate closes (the clients that re-attached have pinned the ones they
                // still have open, `sweep_orphans` frees the rest); any other until the
                // logs are replayed (a batch applied in part, such as a rename whose new
                // entry is not written yet, leaves live inodes unnamed, and the replay
                // names them again).
                inodes.mark_used(ino);
                let unlinked =
                    i.attrs.nlink == 0 && matches!(i.attrs.kind, Kind::File | Kind::Symlink);
                if unlinked {
                    rep.inodes += 1;
                } else {
                    unnamed.push(ino);
                }
                match maptree::clear_unpublished_append(sh, &i) {
                    Ok(n) => rep.appends_cleared += n,
                    Err(e) => rep.warnings.push(format!("unnamed inode {ino}: {e}")),
                }
                match owned_blocks(sh, &i) {
                    Ok(v) => v.into_iter().for_each(|b| {
                        mark_in_use(blocks, tiers, b);
                    }),
                    Err(e) => rep.warnings.push(format!("unnamed inode {ino}: {e}")),
                }
            }
            Ok(_) => {}
            Err(_) => {
                sh.write_inode(ino, &Inode::default())?;
                rep.undecodable_freed += 1;
            }
        }
    }
    Ok(unnamed)
}

/// Mark block or leaf entry `e` (of any tier) in use; false if it was already (or is
/// outside its tier).
pub(crate) fn mark_in_use(blocks: &mut BlockAlloc, tiers: &mut [TierAlloc], e: u64) -> bool {
    match entry_tier(e) {
        0 => blocks.mark_used(e),
        t => tiers
            .iter_mut()
            .find(|x| x.num == t)
            .is_some_and(|x| x.mark_used(entry_block(e))),
    }
}

/// Every block an inode owns: map nodes and leaves (files, symbolic links), map nodes
/// and bucket blocks (directories).
pub(crate) fn owned_blocks(sh: &Shared, inode: &Inode) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut leaves = Vec::new();
    maptree::walk(
        sh,
        inode.map_root,
        inode.map_height,
        &mut |b| out.push(b),
        &mut |_, b| leaves.push(b),
    )?;
    match inode.attrs.kind {
        Kind::Dir => out.extend(dirhash::bucket_blocks(sh, inode)?),
        Kind::File | Kind::Symlink => out.extend(leaves),
        _ => {}
    }
    Ok(out)
}

/// Free the inodes [`rebuild`] kept unnamed that are still unnamed once every log that
/// was there at the start is replayed (`sh.replaying` empty): with their blocks, as an
/// unclean start did before it kept them. Returns how many.
pub(crate) fn free_unreachable(sh: &mut Shared) -> io::Result<u64> {
    if sh.unreachable.is_empty() || !sh.replaying.is_empty() {
        return Ok(0);
    }
    let l = sh.layout;
    let mut named = Bitmap::new(l.inode_count);
    named.set(ROOT_INO);
    let mut stack = vec![ROOT_INO];
    while let Some(ino) = stack.pop() {
        let d = sh.inode(ino)?;
        if d.attrs.kind != Kind::Dir {
            continue;
        }
        for e in sh.area.dir_list(&d)? {
            if l.ino_valid(e.ino) && !named.get(e.ino) {
                named.set(e.ino);
                stack.push(e.ino);
            }
        }
    }
    let mut freed = 0;
    let mut retired = Vec::new();
    for ino in std::mem::take(&mut sh.unreachable) {
        if named.get(ino) {
            continue;
        }
        let inode = sh.inode(ino)?;
        if inode.attrs.kind == Kind::Free
            || (inode.attrs.nlink == 0 && inode.attrs.kind != Kind::Dir)
        {
            // Free already, or unlinked while open: the restart gate's sweep decides.
            continue;
        }
        retired.extend(owned_blocks(sh, &inode)?);
        cairn_media::fence();
        sh.write_inode(
            ino,
            &Inode {
                generation: inode.generation,
                ..Default::default()
            },
        )?;
        sh.inodes.mark_free(ino);
        freed += 1;
    }
    cairn_media::fence();
    sh.retire_and_advance(retired)?;
    Ok(freed)
}
