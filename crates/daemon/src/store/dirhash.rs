//! Directory updates by linear hashing (`cairn_format::dir`). A batch of name changes
//! for one directory is applied to DRAM copies of the touched buckets, buckets are split
//! while the load exceeds `SPLIT_LOAD`, and every touched bucket is rewritten into new
//! blocks (its chain packed by `pack_chain`); the directory's map is then updated copy-on-
//! write. Empty buckets are holes in the map (bucket blocks are created lazily).

use crate::store::maptree;
use crate::store::shared::{Shared, Work};
use cairn_format::dir::{self, BucketBlock, Entry, SPLIT_LOAD};
use cairn_format::inode::{Inode, Kind};
use cairn_format::BLOCK_SIZE_U64;
use std::collections::{BTreeMap, HashMap};
use std::io;

/// One name change: `ino == 0` removes the name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NameChange<'a> {
    pub name: &'a [u8],
    pub ino: u64,
    pub kind: Kind,
}

struct Bucket {
    entries: Vec<Entry>,
    old_chain: Vec<u64>,
    dirty: bool,
}

/// Apply `changes` to directory `old` (the published inode; a default inode for a new,
/// empty directory). `new` carries the attributes to publish; its map, level, split,
/// entry count, size (bucket blocks × 4 KiB) and block count are set here. Returns the
/// number of changes that had no effect (removing an absent name, setting an identical
/// entry).
pub(crate) fn apply(
    sh: &mut Shared,
    w: &mut Work,
    old: &Inode,
    new: &mut Inode,
    changes: &[NameChange<'_>],
) -> io::Result<u64> {
    let (mut level, mut split) = (old.dir_level, old.dir_split);
    if level >= 62 || split >= (1u64 << level) {
        return Err(crate::util::eio(format!(
            "directory with bad linear-hashing state (level {level}, split {split})"
        )));
    }
    let area = sh.area.clone();
    let mut bs = Buckets {
        area: &area,
        old,
        cache: HashMap::new(),
    };
    let mut entries = old.dir_entries;
    let mut noops = 0u64;
    for c in changes {
        let b = dir::bucket_of(dir::hash(c.name), level, split);
        let bk = bs.get(b)?;
        let pos = bk.entries.iter().position(|e| e.name == c.name);
        match (pos, c.ino) {
            (Some(p), 0) => {
                bk.entries.swap_remove(p);
                entries = entries.saturating_sub(1);
                bk.dirty = true;
            }
            (Some(p), ino) => {
                let e = &mut bk.entries[p];
                if e.ino != ino || e.kind != c.kind {
                    e.ino = ino;
                    e.kind = c.kind;
                    bk.dirty = true;
                } else {
                    noops += 1;
                }
            }
            (None, 0) => noops += 1,
            (None, ino) => {
                bk.entries.push(Entry {
                    name: c.name.to_vec(),
                    ino,
                    kind: c.kind,
                });
                entries += 1;
                bk.dirty = true;
            }
        }
    }
    while entries > SPLIT_LOAD.saturating_mul(dir::bucket_count(level, split)) && level < 62 {
        bs.split(&mut level, &mut split)?;
    }
    let Rewritten {
        map_changes,
        delta,
        bucket_blocks,
    } = write_buckets(sh, w, bs.cache, old.attrs.size / BLOCK_SIZE_U64)?;
    let r = maptree::update(
        sh,
        w,
        old.map_root,
        old.map_height,
        &map_changes,
        u64::MAX,
        false,
    )?;
    new.map_root = r.root;
    new.map_height = r.height;
    new.dir_level = level;
    new.dir_split = split;
    new.dir_entries = entries;
    new.attrs.size = bucket_blocks * BLOCK_SIZE_U64;
    new.blocks = (old.blocks as i64 + delta + r.delta).max(0) as u64;
    Ok(noops)
}

/// The buckets a batch touches, each read once from the published directory.
struct Buckets<'a> {
    area: &'a cairn_area::Area,
    old: &'a Inode,
    cache: HashMap<u64, Bucket>,
}

impl Buckets<'_> {
    /// Bucket `b` (read on first use; empty in a new directory).
    fn get(&mut self, b: u64) -> io::Result<&mut Bucket> {
        if let std::collections::hash_map::Entry::Vacant(v) = self.cache.entry(b) {
            let (entries, chain) = if self.old.map_root == 0 {
                (Vec::new(), Vec::new())
            } else {
                self.area.dir_bucket(self.old, b)?
            };
            v.insert(Bucket {
                entries,
                old_chain: chain,
                dirty: false,
            });
        }
        Ok(self.cache.get_mut(&b).expect("just inserted"))
    }

    /// One linear-hashing split: bucket `split` shares its entries with its new buddy
    /// `split + 2^level`, and the split point moves on (a level up when it wraps).
    fn split(&mut self, level: &mut u8, split: &mut u64) -> io::Result<()> {
        let b = *split;
        let nb = b + (1u64 << *level);
        self.get(nb)?;
        let moving = std::mem::take(&mut self.get(b)?.entries);
        *split += 1;
        if *split == 1u64 << *level {
            *level += 1;
            *split = 0;
        }
        let (lv, sp) = (*level, *split);
        let (stay, go): (Vec<Entry>, Vec<Entry>) = moving
            .into_iter()
            .partition(|e| dir::bucket_of(dir::hash(&e.name), lv, sp) == b);
        let bk = self.get(b)?;
        bk.entries = stay;
        bk.dirty = true;
        let nk = self.get(nb)?;
        nk.entries.extend(go);
        nk.dirty = true;
        Ok(())
    }
}

/// What [`write_buckets`] did.
struct Rewritten {
    /// (bucket, first block of its new chain; 0 for an emptied bucket).
    map_changes: Vec<(u64, u64)>,
    /// Blocks gained (negative: given back).
    delta: i64,
    /// Bucket blocks after.
    bucket_blocks: u64,
}

/// Rewrite the changed buckets, in bucket order (deterministic placement): new chains
/// written out of place, the old ones retired; `bucket_blocks`: the bucket blocks before.
fn write_buckets(
    sh: &mut Shared,
    w: &mut Work,
    cache: HashMap<u64, Bucket>,
    mut bucket_blocks: u64,
) -> io::Result<Rewritten> {
    let dirty: BTreeMap<u64, Bucket> = cache.into_iter().filter(|(_, b)| b.dirty).collect();
    let mut map_changes = Vec::with_capacity(dirty.len());
    let mut delta: i64 = 0;
    for (b, bk) in dirty {
        for &blk in &bk.old_chain {
            w.retired.push(blk);
        }
        delta -= bk.old_chain.len() as i64;
        bucket_blocks = bucket_blocks.saturating_sub(bk.old_chain.len() as u64);
        if bk.entries.is_empty() {
            map_changes.push((b, 0));
            continue;
        }
        let parts = dir::pack_chain(bk.entries);
        let mut blks = Vec::with_capacity(parts.len());
        for _ in 0..parts.len() {
            blks.push(sh.alloc_meta_block(w)?);
        }
        for (i, part) in parts.into_iter().enumerate() {
            let next = blks.get(i + 1).copied().unwrap_or(0);
            let data = BucketBlock {
                entries: part,
                next,
            }
            .encode();
            sh.write_block(w, blks[i], &data, false)?;
        }
        delta += blks.len() as i64;
        bucket_blocks += blks.len() as u64;
        map_changes.push((b, blks[0]));
    }
    Ok(Rewritten {
        map_changes,
        delta,
        bucket_blocks,
    })
}

/// Every block of directory `d`'s buckets (all chains).
pub(crate) fn bucket_blocks(sh: &Shared, d: &Inode) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    let mut firsts = Vec::new();
    maptree::walk(sh, d.map_root, d.map_height, &mut |_| {}, &mut |fb, _| {
        firsts.push(fb)
    })?;
    for b in firsts {
        out.extend(sh.area.dir_bucket(d, b)?.1);
    }
    Ok(out)
}

/// Every entry of directory `d` with the bucket it sits in; `mark` gets every bucket
/// block.
pub(crate) fn entries(
    sh: &Shared,
    d: &Inode,
    mark: &mut dyn FnMut(u64),
) -> io::Result<Vec<(u64, Entry)>> {
    let mut firsts = Vec::new();
    maptree::walk(sh, d.map_root, d.map_height, &mut |_| {}, &mut |fb, _| {
        firsts.push(fb)
    })?;
    let n = dir::bucket_count(d.dir_level, d.dir_split);
    let mut out = Vec::new();
    for b in firsts {
        if b >= n {
            return Err(crate::util::eio(format!(
                "bucket {b} beyond the {n} buckets of its level"
            )));
        }
        let (entries, blocks) = sh.area.dir_bucket(d, b)?;
        for blk in blocks {
            mark(blk);
        }
        out.extend(entries.into_iter().map(|e| (b, e)));
    }
    Ok(out)
}
