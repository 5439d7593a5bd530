//! Consistent reads of the shared area.
//!
//! Published map nodes, data blocks and directory buckets never change (the daemon
//! writes new ones and frees old ones only after every reader has left the epoch), so a
//! reader that holds an epoch can copy them freely. Inodes are updated in place under a
//! seqlock and are read with [`Area::read_inode`], which retries until it gets a stable
//! copy. Every pointer read from the media is checked before it is followed: a corrupt
//! image gives `EIO`, never a panic or an out-of-bounds access.

use crate::cache::BlockCache;
use crate::error::fs_err;
use crate::tier::{FileTier, TierDevice};
use cairn_format::dir::{self, Entry};
use cairn_format::inode::{current_copy, read_ok, Inode, Kind, COPY_BYTES, COPY_OFF, INODE_BYTES};
use cairn_format::map::{self, entry_block, entry_tier, ENTRY_FLAGS};
use cairn_format::slot::{SlotHead, LEASE_GEN_OFF, PUBLISHED_HEAD_OFF};
use cairn_format::superblock::{state, Layout, Superblock};
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use cairn_media::Mapping;
use std::fs::File;
use std::io;
use std::time::{Duration, Instant};

/// Longest overflow chain followed before a directory is declared corrupt.
const MAX_CHAIN: usize = 1 << 20;

fn eio(msg: impl Into<String>) -> io::Error {
    fs_err(libc::EIO, msg)
}

/// A mapped NVM tier: superblock, layout and the read operations; plus the lower tiers'
/// devices, read with `pread` (see [`Area::attach_tiers`]).
pub struct Area {
    map: Mapping,
    sb: Superblock,
    /// SSD, HDD and remote, when the store has them and they were attached.
    tiers: [Option<Box<dyn TierDevice>>; 3],
    /// DRAM cache of lower-tier blocks ([`Area::set_cache`]).
    cache: Option<BlockCache>,
    /// Read-ahead, in blocks, on a sequential miss.
    readahead: u64,
    /// The block a sequential reader would miss next (the end of the last miss).
    next_miss: std::sync::atomic::AtomicU64,
    /// Every slot's log file, mapped by [`Area::attach_logs`] (format version 7, the
    /// daemon and fsck; empty otherwise).
    logs: Vec<Mapping>,
}

impl Area {
    /// Map the whole NVM file (read-only for clients, read-write for the daemon) and
    /// validate its superblock. The daemon's writable mapping is pre-faulted once, so that
    /// digests do not take a page fault on every block they first touch.
    pub fn open(file: &File, writable: bool) -> io::Result<Area> {
        let len = file.metadata()?.len();
        if len < 2 * BLOCK_SIZE_U64 {
            return Err(eio(format!(
                "NVM file of {len} bytes is too small to be a Cairn tier"
            )));
        }
        let map = Mapping::new(file, 0, len as usize, writable, writable)?;
        let mut b = vec![0u8; BLOCK_SIZE];
        map.read(0, &mut b)?;
        let sb = Superblock::decode(&b, len).map_err(|e| {
            // Say whether the copy (format version 4) could restore it.
            let copy = cairn_format::superblock::copy_block_of(len);
            let intact = map.read(copy as usize * BLOCK_SIZE, &mut b).is_ok()
                && Superblock::decode_copy(&b, len).is_ok();
            eio(if intact {
                format!(
                    "{e}; its copy in block {copy} is intact: `cairn fsck --repair` restores it"
                )
            } else {
                e.to_string()
            })
        })?;
        map.read(BLOCK_SIZE, &mut b)?;
        cairn_format::superblock::check_state(&b).map_err(|e| eio(e.to_string()))?;
        Ok(Area {
            map,
            sb,
            tiers: [None, None, None],
            cache: None,
            readahead: 1,
            next_miss: Default::default(),
            logs: Vec::new(),
        })
    }

    /// Map every slot's log file (`cairn_format::superblock::Layout::slot_files`, named
    /// [`crate::store::slot_log_path`] after `nvm_path`), read-write for the daemon and a
    /// repair, read-only for a check. Their pages are not pre-faulted: a log's memory is
    /// touched by its client. Nothing to do for a store whose logs are in the NVM file.
    pub fn attach_logs(&mut self, nvm_path: &std::path::Path, writable: bool) -> io::Result<()> {
        let l = *self.layout();
        if !l.slot_files {
            return Ok(());
        }
        let mut logs = Vec::with_capacity(l.nslots as usize);
        for slot in 0..l.nslots {
            let path = crate::store::slot_log_path(nvm_path, slot);
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(writable)
                .open(&path)
                .map_err(|e| {
                    fs_err(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        format!(
                            "cannot open the log file {} of slot {slot}: {e}",
                            path.display()
                        ),
                    )
                })?;
            let len = f.metadata()?.len();
            if len != l.slot_file_bytes() {
                return Err(eio(format!(
                    "the log file {} of slot {slot} is {len} bytes, the store's logs are {}",
                    path.display(),
                    l.slot_file_bytes()
                )));
            }
            logs.push(Mapping::new(&f, 0, len as usize, writable, false)?);
        }
        self.logs = logs;
        Ok(())
    }

    /// The mapping holding `slot`'s client page and ring, and the offset of the client
    /// page in it (the ring follows one block later): the slot's own file, or the NVM
    /// file for a store of format version 6 or older.
    pub fn slot_log(&self, slot: u32) -> (&Mapping, usize) {
        let l = self.layout();
        assert!(slot < l.nslots, "slot {slot} out of range");
        if !l.slot_files {
            return (&self.map, l.client_page_off(slot) as usize);
        }
        assert!(
            !self.logs.is_empty(),
            "the slots' log files are not mapped (Area::attach_logs)"
        );
        (&self.logs[slot as usize], 0)
    }

    /// The mapping holding `slot`'s ring, and the ring's offset in it ([`Area::slot_log`]:
    /// one block after the client page).
    pub fn slot_ring(&self, slot: u32) -> (&Mapping, usize) {
        let (m, page) = self.slot_log(slot);
        (m, page + BLOCK_SIZE)
    }

    /// Open the store's local lower tiers (`paths[0]` SSD, `paths[1]` HDD, from
    /// `cairn.toml`), read-only or read-write, and check that each is the tier of this
    /// store the superblock describes; and take `remote` as the remote tier's device
    /// (whoever made it checked it: `cairn_remote`, or the daemon for a client).
    pub fn attach_tiers(
        &mut self,
        paths: [Option<&std::path::Path>; 2],
        remote: Option<Box<dyn TierDevice>>,
        writable: bool,
    ) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        for (i, path) in paths.into_iter().enumerate() {
            let tier = i as u8 + 1;
            let name = map::TIER_NAMES[tier as usize];
            let Some(g) = self.sb.layout.tier(tier).copied() else {
                continue;
            };
            let Some(path) = path else {
                return Err(eio(format!(
                    "the store has an {name} tier but cairn.toml names no {name}_path"
                )));
            };
            let t = FileTier::open(tier, path, writable)?;
            let mut h = vec![0u8; BLOCK_SIZE];
            t.file()
                .read_exact_at(&mut h, 0)
                .map_err(|e| eio(format!("{name} tier {}: {e}", path.display())))?;
            cairn_format::tier::check_header(&h, tier, &self.sb.uuid, &g)
                .map_err(|e| eio(format!("{name} tier {}: {}", path.display(), e.0)))?;
            self.tiers[i] = Some(Box::new(t));
        }
        if self.sb.layout.tier(map::TIER_REMOTE).is_some() {
            self.tiers[2] = Some(remote.ok_or_else(|| {
                eio("the store has a remote tier but cairn.toml names no remote")
            })?);
        }
        Ok(())
    }

    /// Cache up to `bytes` of lower-tier data in DRAM, and read `readahead` bytes ahead
    /// when a miss continues the previous one (0 bytes: no cache).
    pub fn set_cache(&mut self, bytes: u64, readahead: u64) {
        self.cache = BlockCache::new(bytes);
        self.readahead = (readahead / BLOCK_SIZE_U64).max(1);
    }

    /// The lower-tier cache, if any (its counters).
    pub fn cache(&self) -> Option<&BlockCache> {
        self.cache.as_ref()
    }

    /// Copy `dst.len()` bytes at `off` of the lower-tier block entry `e` through the
    /// cache; `want` is how many blocks the caller reads from here on. A miss reads the
    /// blocks the caller wants, or the read-ahead window when it continues the previous
    /// miss, within the block's segment.
    fn read_cached(
        &self,
        c: &BlockCache,
        e: u64,
        off: usize,
        dst: &mut [u8],
        want: u64,
    ) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let (tier, blk) = (entry_tier(e), entry_block(e));
        let g = self
            .layout()
            .tier(tier)
            .copied()
            .ok_or_else(|| eio(format!("map entry {e:#x}: no such tier")))?;
        let seg = g.segment_of(blk);
        let gen = self.segment_gen(tier, seg)?;
        if c.get(e, gen, off, dst) {
            return Ok(());
        }
        let sequential = self.next_miss.load(Relaxed) == e;
        let window = if sequential {
            self.readahead
        } else {
            want.clamp(1, self.readahead)
        };
        let n = window.min((seg + 1) * g.segment_blocks - blk);
        let mut buf = cairn_media::AlignedBuf::zeroed(n as usize * BLOCK_SIZE);
        self.read_tier(tier, blk * BLOCK_SIZE_U64, &mut buf)?;
        for (i, b) in buf.chunks_exact(BLOCK_SIZE).enumerate() {
            c.put(e + i as u64, gen, b);
        }
        c.stats.blocks_read.fetch_add(n, Relaxed);
        self.next_miss.store(e + n, Relaxed);
        dst.copy_from_slice(&buf[off..off + dst.len()]);
        Ok(())
    }

    /// The device of lower tier `tier` (1 = SSD, 2 = HDD, 3 = remote), if attached.
    pub fn tier(&self, tier: u8) -> Option<&dyn TierDevice> {
        match tier {
            1..=3 => self.tiers[tier as usize - 1].as_deref(),
            _ => None,
        }
    }

    /// The `gen` word of segment `seg` of lower tier `tier` (`cairn_format::tier`).
    pub fn segment_gen(&self, tier: u8, seg: u64) -> io::Result<u64> {
        self.map
            .load_u64(self.layout().seg_entry_off(tier, seg) as usize)
    }

    pub fn map(&self) -> &Mapping {
        &self.map
    }
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }
    pub fn layout(&self) -> &Layout {
        &self.sb.layout
    }

    /// A field of the daemon state block (see `cairn_format::superblock::state`).
    pub fn state_field(&self, field: usize) -> io::Result<u64> {
        self.map.load_u64(BLOCK_SIZE + field)
    }

    /// The global reclamation epoch.
    pub fn global_epoch(&self) -> io::Result<u64> {
        self.state_field(state::EPOCH)
    }

    /// Read inode `ino` consistently. The daemon never writes the copy the sequence word
    /// names, so this only retries if the daemon finished one update and started the next
    /// while the copy was being read. A free inode decodes with `Kind::Free`.
    pub fn read_inode(&self, ino: u64) -> io::Result<Inode> {
        let l = self.layout();
        if !l.ino_valid(ino) {
            return Err(eio(format!("inode number {ino} out of range")));
        }
        let off = l.inode_off(ino) as usize;
        let mut b = [0u8; COPY_BYTES];
        let start = Instant::now();
        loop {
            let s1 = self.map.load_u64(off)?;
            self.map.read(off + COPY_OFF[current_copy(s1)], &mut b)?;
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            let s2 = self.map.load_u64(off)?;
            if read_ok(s1, s2) {
                return Inode::decode_copy(&b).map_err(|e| eio(format!("inode {ino}: {e}")));
            }
            if start.elapsed() > Duration::from_secs(2) {
                return Err(eio(format!("inode {ino} keeps changing under the reader")));
            }
            std::hint::spin_loop();
        }
    }

    /// The sequence word of inode `ino`: it grows with every update the daemon
    /// publishes (odd while one is in progress).
    pub fn inode_seq(&self, ino: u64) -> io::Result<u64> {
        let l = self.layout();
        if !l.ino_valid(ino) {
            return Err(eio(format!("inode number {ino} out of range")));
        }
        self.map.load_u64(l.inode_off(ino) as usize)
    }

    /// Raw bytes of inode `ino` (for the daemon, the only writer; decode with
    /// `Inode::decode`, which picks the current copy).
    pub fn read_inode_raw(&self, ino: u64, b: &mut [u8; INODE_BYTES]) -> io::Result<()> {
        let l = self.layout();
        if !l.ino_valid(ino) {
            return Err(eio(format!("inode number {ino} out of range")));
        }
        self.map.read(l.inode_off(ino) as usize, b)
    }

    fn check_ptr(&self, blk: u64, what: &str) -> io::Result<u64> {
        if blk & ENTRY_FLAGS != 0 || !self.layout().data_block_valid(blk) {
            return Err(eio(format!(
                "{what}: block pointer {blk:#x} outside the data region"
            )));
        }
        Ok(blk)
    }

    fn check_leaf(&self, e: u64) -> io::Result<u64> {
        if !self.layout().leaf_valid(e) {
            return Err(eio(format!(
                "map entry {e:#x} is neither an NVM data block nor a lower-tier block"
            )));
        }
        Ok(e)
    }

    /// The first block of the superpage extent a level-2 entry `e` names.
    pub fn check_huge(&self, e: u64) -> io::Result<u64> {
        if !self.layout().huge_valid(e) {
            return Err(eio(format!(
                "map entry {e:#x} is not a 2 MiB-aligned extent of the data region"
            )));
        }
        Ok(map::huge_first(e))
    }

    /// Read `buf.len()` bytes at byte `off` of lower tier `tier` (one read per segment
    /// the range touches; direct I/O where the device allows it and `buf`, `off` and the
    /// length are 4 KiB aligned).
    pub fn read_tier(&self, tier: u8, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let name = map::TIER_NAMES[tier.min(3) as usize];
        let (Some(dev), Some(g)) = (self.tier(tier), self.layout().tier(tier).copied()) else {
            return Err(eio(format!("the {name} tier is not attached")));
        };
        let seg_bytes = g.segment_bytes();
        let mut done = 0;
        while done < buf.len() {
            let at = off + done as u64;
            let seg = at / seg_bytes;
            let n = ((seg + 1) * seg_bytes - at).min((buf.len() - done) as u64) as usize;
            let gen = self.segment_gen(tier, seg)?;
            dev.read(seg, gen, at, &mut buf[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Copy the data block a file-map leaf entry `e` names (any tier) into `buf`.
    pub fn read_leaf(&self, e: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_leaf(e)?;
        match entry_tier(e) {
            0 => self.read_block(e, buf),
            t => self.read_tier(t, entry_block(e) * BLOCK_SIZE_U64, &mut buf[..BLOCK_SIZE]),
        }
    }

    /// Copy block `blk` (a data-region block) into `buf` (4096 bytes).
    pub fn read_block(&self, blk: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_ptr(blk, "read")?;
        self.map
            .read((blk * BLOCK_SIZE_U64) as usize, &mut buf[..BLOCK_SIZE])
    }

    /// The map entry `idx` of node `node`.
    pub fn node_entry(&self, node: u64, idx: usize) -> io::Result<u64> {
        self.check_ptr(node, "map node")?;
        self.map
            .load_u64((node * BLOCK_SIZE_U64) as usize + idx * 8)
    }

    /// The leaf entry of file block `fblk` of `inode` (an NVM block number, or a
    /// lower-tier entry: `cairn_format::map::entry_tier`), or `None` for a hole.
    pub fn block_of(&self, inode: &Inode, fblk: u64) -> io::Result<Option<u64>> {
        if inode.map_height == 0 && inode.map_root != 0 {
            // A direct map: the root is file block 0's entry.
            return if fblk == 0 {
                Ok(Some(self.check_leaf(inode.map_root)?))
            } else {
                Ok(None)
            };
        }
        if inode.map_root == 0 || inode.map_height == 0 || fblk >= map::coverage(inode.map_height) {
            return Ok(None);
        }
        let mut node = self.check_ptr(inode.map_root, "map root")?;
        for level in (1..=inode.map_height).rev() {
            let e = self.node_entry(node, map::index_at(fblk, level))?;
            if e == 0 {
                return Ok(None);
            }
            if level == 2 && map::is_huge(e) {
                return Ok(Some(self.check_huge(e)? + map::index_at(fblk, 1) as u64));
            }
            node = if level == 1 {
                self.check_leaf(e)?
            } else {
                self.check_ptr(e, "map entry")?
            };
        }
        Ok(Some(node))
    }

    /// The level-2 entry of `inode`'s map that covers file block `fblk` (the leaf node
    /// or superpage entry of its 2 MiB range; for a map of height 1, its root), or
    /// `None` (a hole).
    pub fn range_entry(&self, inode: &Inode, fblk: u64) -> io::Result<Option<u64>> {
        let h = inode.map_height;
        if inode.map_root == 0 || h == 0 || fblk >= map::coverage(h) {
            return Ok(None);
        }
        if h == 1 {
            // The root is the leaf node of range 0.
            return Ok(Some(self.check_ptr(inode.map_root, "map root")?));
        }
        let mut node = self.check_ptr(inode.map_root, "map root")?;
        for level in (3..=h).rev() {
            let e = self.node_entry(node, map::index_at(fblk, level))?;
            if e == 0 {
                return Ok(None);
            }
            node = self.check_ptr(e, "map entry")?;
        }
        let e = self.node_entry(node, map::index_at(fblk, 2))?;
        Ok((e != 0).then_some(e))
    }

    /// The first block of the superpage extent holding file block `fblk` of `inode`, if
    /// it lies in one.
    pub fn huge_of(&self, inode: &Inode, fblk: u64) -> io::Result<Option<u64>> {
        match self.range_entry(inode, fblk)? {
            Some(e) if map::is_huge(e) => Ok(Some(self.check_huge(e)?)),
            _ => Ok(None),
        }
    }

    /// The first file block in `[from, end)` of `inode` that holds data (`data`) or is a
    /// hole (`!data`), or `None`. Absent subtrees of the map are skipped whole, so a
    /// sparse file is searched in time proportional to its map, not its size.
    pub fn next_block(
        &self,
        inode: &Inode,
        from: u64,
        end: u64,
        data: bool,
    ) -> io::Result<Option<u64>> {
        if from >= end {
            return Ok(None);
        }
        let h = inode.map_height;
        if h == 0 && inode.map_root != 0 {
            // A direct map: file block 0 holds data, every other is a hole.
            self.check_leaf(inode.map_root)?;
            let first = if data { 0 } else { from.max(1) };
            return Ok((first >= from && first < end).then_some(first));
        }
        if inode.map_root == 0 || h == 0 || from >= map::coverage(h) {
            return Ok((!data).then_some(from));
        }
        let root = self.check_ptr(inode.map_root, "map root")?;
        match self.scan_map(root, h, 0, from, end, data)? {
            Some(b) => Ok(Some(b)),
            // Past the map's reach everything is a hole.
            None if !data && map::coverage(h) < end => Ok(Some(from.max(map::coverage(h)))),
            None => Ok(None),
        }
    }

    /// [`Area::next_block`] within node `node` at `level`, which covers file blocks from
    /// `base`.
    fn scan_map(
        &self,
        node: u64,
        level: u8,
        base: u64,
        from: u64,
        end: u64,
        data: bool,
    ) -> io::Result<Option<u64>> {
        let span = map::coverage(level - 1);
        for idx in ((from.max(base) - base) / span) as usize..map::FANOUT as usize {
            let first = base + idx as u64 * span;
            if first >= end {
                break;
            }
            let at = from.max(first);
            let e = self.node_entry(node, idx)?;
            let found = if e == 0 {
                (!data).then_some(at)
            } else if level == 2 && map::is_huge(e) {
                // A superpage extent holds every block it covers.
                self.check_huge(e)?;
                data.then_some(at)
            } else if level == 1 {
                self.check_leaf(e)?;
                data.then_some(at)
            } else {
                let child = self.check_ptr(e, "map entry")?;
                self.scan_map(child, level - 1, first, at, end, data)?
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Read file data at `off` into `buf`, bounded by the inode's size; holes read as
    /// zeros. Returns the number of bytes read.
    pub fn read_file(&self, inode: &Inode, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        self.read_file_with(inode, off, buf, &mut |_| {})
    }

    /// [`Area::read_file`], calling `on_lower(file_block)` for the first block of each
    /// 4 MiB chunk of the file it reads from a lower tier (LibFS's read hints).
    pub fn read_file_with(
        &self,
        inode: &Inode,
        off: u64,
        buf: &mut [u8],
        on_lower: &mut dyn FnMut(u64),
    ) -> io::Result<usize> {
        let size = inode.attrs.size;
        if off >= size {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - off) as usize;
        let mut done = 0usize;
        let mut next = None;
        let mut hinted = u64::MAX;
        while done < n {
            let pos = off + done as u64;
            let fblk = pos / BLOCK_SIZE_U64;
            let in_blk = (pos % BLOCK_SIZE_U64) as usize;
            let mut chunk = (BLOCK_SIZE - in_blk).min(n - done);
            let e = match next.take() {
                Some(e) => e,
                None => self.block_of(inode, fblk)?,
            };
            match e {
                Some(b) if entry_tier(b) == 0 => self.map.read(
                    (b * BLOCK_SIZE_U64) as usize + in_blk,
                    &mut buf[done..done + chunk],
                )?,
                Some(b) if entry_tier(b) != 0 && fblk / 1024 != hinted => {
                    hinted = fblk / 1024;
                    on_lower(fblk);
                    next = Some(Some(b));
                    continue;
                }
                Some(b) if self.cache.is_some() => {
                    let want = ((in_blk + n - done) as u64).div_ceil(BLOCK_SIZE_U64);
                    let c = self.cache.as_ref().unwrap();
                    self.read_cached(c, b, in_blk, &mut buf[done..done + chunk], want)?;
                }
                Some(b) => {
                    // A lower tier: one read for the run of blocks that follow each
                    // other on the device too.
                    let mut last = b;
                    while done + chunk < n {
                        let e =
                            self.block_of(inode, fblk + ((in_blk + chunk) / BLOCK_SIZE) as u64)?;
                        if e != Some(last + 1) {
                            next = Some(e);
                            break;
                        }
                        last += 1;
                        chunk = (chunk + BLOCK_SIZE).min(n - done);
                    }
                    let at = entry_block(b) * BLOCK_SIZE_U64 + in_blk as u64;
                    self.read_tier(entry_tier(b), at, &mut buf[done..done + chunk])?;
                }
                None => buf[done..done + chunk].fill(0),
            }
            done += chunk;
        }
        Ok(n)
    }

    /// Look `name` up in directory `d`.
    pub fn dir_lookup(&self, d: &Inode, name: &[u8]) -> io::Result<Option<(u64, Kind)>> {
        if d.attrs.kind != Kind::Dir {
            return Err(fs_err(libc::ENOTDIR, "lookup in a non-directory"));
        }
        let b = dir::bucket_of(dir::hash(name), d.dir_level, d.dir_split);
        let Some(mut blk) = self.block_of(d, b)? else {
            return Ok(None);
        };
        let mut buf = vec![0u8; BLOCK_SIZE];
        for _ in 0..MAX_CHAIN {
            self.read_block(blk, &mut buf)?;
            let (found, next) = dir::find_in_block(&buf, name).map_err(|e| eio(e.to_string()))?;
            if found.is_some() || next == 0 {
                return Ok(found);
            }
            blk = next;
        }
        Err(eio("directory bucket chain too long (cycle?)"))
    }

    /// All entries of bucket `bucket` of directory `d`, and the blocks of its chain.
    pub fn dir_bucket(&self, d: &Inode, bucket: u64) -> io::Result<(Vec<Entry>, Vec<u64>)> {
        let mut entries = Vec::new();
        let mut blocks = Vec::new();
        let Some(mut blk) = self.block_of(d, bucket)? else {
            return Ok((entries, blocks));
        };
        let mut buf = vec![0u8; BLOCK_SIZE];
        loop {
            if blocks.len() >= MAX_CHAIN {
                return Err(eio("directory bucket chain too long (cycle?)"));
            }
            self.read_block(blk, &mut buf)?;
            let bb = dir::BucketBlock::decode(&buf).map_err(|e| eio(e.to_string()))?;
            blocks.push(blk);
            entries.extend(bb.entries);
            if bb.next == 0 {
                return Ok((entries, blocks));
            }
            blk = bb.next;
        }
    }

    /// Every entry of directory `d` (bucket order).
    pub fn dir_list(&self, d: &Inode) -> io::Result<Vec<Entry>> {
        if d.attrs.kind != Kind::Dir {
            return Err(fs_err(libc::ENOTDIR, "list of a non-directory"));
        }
        let mut out = Vec::with_capacity(d.dir_entries.min(1 << 20) as usize);
        let n = dir::bucket_count(d.dir_level, d.dir_split);
        for b in 0..n {
            out.extend(self.dir_bucket(d, b)?.0);
        }
        Ok(out)
    }

    /// The current durable head record of a log slot.
    pub fn slot_head(&self, slot: u32) -> io::Result<Option<(SlotHead, usize)>> {
        let mut e = [0u8; 96];
        self.map
            .read(self.layout().slot_entry_off(slot) as usize, &mut e)?;
        Ok(SlotHead::current(&e))
    }

    /// The advisory head the daemon publishes for the slot's client.
    pub fn published_head(&self, slot: u32) -> io::Result<u64> {
        self.map
            .load_u64((self.layout().slot_entry_off(slot) + PUBLISHED_HEAD_OFF) as usize)
    }

    /// Sleep until the published head of `slot` moves from `seen`, at most `timeout`
    /// (a futex on its low word, which the daemon wakes at each publish). May return
    /// early: callers read the head again.
    pub fn wait_published_head(
        &self,
        slot: u32,
        seen: u64,
        timeout: std::time::Duration,
    ) -> io::Result<()> {
        let off = (self.layout().slot_entry_off(slot) + PUBLISHED_HEAD_OFF) as usize;
        // Little-endian: the low word comes first.
        self.map.wait_u32(off, seen as u32, timeout)
    }

    /// Offset (in the mapping) of the slot's lease generation word (PROTOCOL.md,
    /// "Leases"): load it with `map().load_u64`.
    pub fn lease_gen_off(&self, slot: u32) -> usize {
        (self.layout().slot_entry_off(slot) + LEASE_GEN_OFF) as usize
    }
}
