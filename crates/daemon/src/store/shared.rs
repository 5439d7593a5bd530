//! The write side of the shared area. Only the daemon writes the shared area, and only
//! through this state: the mapping, the DRAM allocators, the epoch retire lists and the
//! digest counters.

use crate::store::alloc::{BlockAlloc, InodeAlloc};
use crate::tiers::TierAlloc;
use crate::util::eio;
use cairn_area::{fs_err, Area};
use cairn_format::inode::{current_copy, Inode, Kind, COPY_BYTES, COPY_OFF, INODE_BYTES};
use cairn_format::map::{entry_block, entry_tier, ENTRY_FLAGS, FANOUT};
use cairn_format::slot::{client_page, SlotHead, LEASE_GEN_OFF, OWNER_PID_OFF, PUBLISHED_HEAD_OFF};
use cairn_format::superblock::{state, Layout};
use cairn_format::{BLOCK_SIZE, BLOCK_SIZE_U64};
use cairn_media::Mapping;
use cairn_proto::DigestCounters;
use std::collections::VecDeque;
use std::io;

/// The blocks one digest (or one freeing) allocated and retired. On failure the
/// allocated blocks go straight back to the allocator (they were never published); on
/// success the retired ones go to the epoch retire list.
#[derive(Debug, Default)]
pub(crate) struct Work {
    /// NVM blocks.
    pub allocated: Vec<u64>,
    /// NVM blocks and lower-tier leaf entries (`cairn_format::map::tier_entry`).
    pub retired: Vec<u64>,
    /// Bytes written to the shared area (blocks and inodes).
    pub bytes: u64,
    /// Map entries to write in place when the batch publishes, as (byte offset in the
    /// NVM file, entry): appends past the end of a file (`maptree::append_leaf`).
    pub in_place: Vec<(u64, u64)>,
}

/// A map node's 512 entries.
pub(crate) type Node = Box<[u64; FANOUT as usize]>;

/// The daemon's writable view of the shared area.
pub(crate) struct Shared {
    /// Shared with parallel digests' unlocked phases (`crate::digest::parallel`).
    pub area: std::sync::Arc<Area>,
    pub layout: Layout,
    pub blocks: BlockAlloc,
    pub inodes: InodeAlloc,
    /// Blocks unlinked from published structures, by the epoch they were retired in.
    pub retired: VecDeque<(u64, Vec<u64>)>,
    /// Digest counters (mirrored in the daemon state block).
    pub counters: DigestCounters,
    /// The digest's copy of a log batch, kept between digests.
    pub scratch: Vec<u8>,
    /// Credentials of each registered slot's client (permission checks, `crate::perm`).
    pub creds: std::collections::HashMap<u32, crate::perm::Cred>,
    /// Slots whose next batch a crashed daemon may have half applied (set at an unclean
    /// start, cleared by the slot's first digest): their batch is checked without the
    /// link-count rule, which a half-applied batch cannot pass (see `perm::check_batch`).
    pub replaying: std::collections::HashSet<u32>,
    /// Live inodes an unclean start found unnamed, kept until `replaying` empties
    /// (`recovery::free_unreachable`).
    pub unreachable: Vec<u64>,
    /// Pinned inodes: which clients (slots) have them open (learned from revocation
    /// answers and re-attaches). An unlink of a file pinned by another client keeps it,
    /// with `nlink = 0`, until the last pin goes (ARCHITECTURE.md, "Unlinked while open").
    pub pins: std::collections::HashMap<u64, std::collections::BTreeSet<u32>>,
    /// After a restart, until every live client re-attached with its pins: every unlink
    /// keeps its file (the sweep at the gate's closing frees those nobody pinned).
    pub keep_unlinked: bool,
    /// While `Some`, every inode number read through [`Shared::inode`] is recorded
    /// (the read set of a parallel digest's plan, `crate::digest::parallel`).
    pub reads: std::cell::RefCell<Option<std::collections::HashSet<u64>>>,
    /// The lower tiers the store has (SSD first).
    pub tiers: Vec<TierAlloc>,
    /// Another handle on the remote tier's device, if the store has one (its sweep
    /// and counters).
    pub remote: Option<cairn_remote::RadosTier>,
    /// Epochs held by the daemon's own readers (migration rounds copying blocks without
    /// the core lock): nothing retired in or after them is freed.
    pub held_epochs: Vec<u64>,
    /// Recency of file data per tier (`crate::tiers::migrate`).
    pub recency: crate::tiers::recency::Recency,
    /// Migration and cleaning traffic, per tier (mirrored in the daemon state block).
    pub traffic: [cairn_proto::TierTraffic; cairn_format::map::TIERS],
    /// Inodes (number, generation) that may have extended attributes (`crate::xattr`):
    /// every inode written gets its `xattrs` flag from here.
    pub xattr_inodes: std::collections::HashSet<(u64, u64)>,
    /// Superpage extents: candidates, counters, policy (`crate::superpage`).
    pub superpages: crate::superpage::Superpages,
}

impl Shared {
    /// Whether the client of `slot` pinned `ino` (it has the inode open).
    pub(crate) fn pinned_by(&self, ino: u64, slot: u32) -> bool {
        self.pins.get(&ino).is_some_and(|s| s.contains(&slot))
    }

    /// Wrap an opened area with its allocators.
    pub(crate) fn new(area: Area, blocks: BlockAlloc, inodes: InodeAlloc) -> Shared {
        let layout = *area.layout();
        let f = |o| area.state_field(o).unwrap_or(0);
        let traffic = std::array::from_fn(|t| {
            let f = |k: usize| f(state::traffic(t) + 8 * k);
            cairn_proto::TierTraffic {
                bytes_migrated_down: f(0),
                bytes_migrated_up: f(1),
                bytes_cleaned: f(2),
            }
        });
        let counters = DigestCounters {
            records_digested: f(state::RECORDS_DIGESTED),
            records_skipped: f(state::RECORDS_SKIPPED),
            log_bytes_written: f(state::LOG_BYTES_WRITTEN),
            shared_bytes_written: f(state::SHARED_BYTES_WRITTEN),
            digests: f(state::DIGESTS),
        };
        Shared {
            area: std::sync::Arc::new(area),
            layout,
            blocks,
            inodes,
            retired: VecDeque::new(),
            counters,
            scratch: Vec::new(),
            creds: Default::default(),
            replaying: Default::default(),
            unreachable: Vec::new(),
            pins: Default::default(),
            keep_unlinked: false,
            reads: Default::default(),
            tiers: (1..=cairn_format::superblock::LOWER_TIERS as u8)
                .filter_map(|t| layout.tier(t).map(|g| TierAlloc::new(t, *g)))
                .collect(),
            remote: None,
            held_epochs: Vec::new(),
            recency: Default::default(),
            traffic,
            xattr_inodes: Default::default(),
            superpages: Default::default(),
        }
    }

    /// The allocation state of lower tier `tier` (1 = SSD, 2 = HDD, 3 = remote).
    pub(crate) fn tier_mut(&mut self, tier: u8) -> Option<&mut TierAlloc> {
        self.tiers.iter_mut().find(|t| t.num == tier)
    }

    /// The allocation state of lower tier `tier`.
    pub(crate) fn tier(&self, tier: u8) -> Option<&TierAlloc> {
        self.tiers.iter().find(|t| t.num == tier)
    }

    /// Free a retired block or leaf entry of any tier; false if it was not in use.
    fn free_entry(&mut self, e: u64) -> bool {
        match entry_tier(e) {
            0 => self.blocks.free(e),
            t => self.tier_mut(t).is_some_and(|ta| ta.free(entry_block(e))),
        }
    }

    /// Trim the lower-tier segments that became empty (whole-segment discard).
    pub(crate) fn trim_empty_segments(&mut self) {
        for i in 0..self.tiers.len() {
            let segs = std::mem::take(&mut self.tiers[i].to_trim);
            let t = &self.tiers[i];
            let Some(dev) = self.area.tier(t.num) else {
                continue;
            };
            for s in segs {
                let len = t.geom.segment_bytes();
                // A failed trim wastes nothing: the segment is rewritten whole.
                if let Ok(gen) = self.area.segment_gen(t.num, s) {
                    let _ = dev.discard(s, gen, s * len, len);
                }
            }
        }
    }

    /// Persist the migration and cleaning counters in the daemon state block.
    pub(crate) fn persist_traffic(&self) -> io::Result<()> {
        for (t, c) in self.traffic.iter().enumerate() {
            for (k, v) in [c.bytes_migrated_down, c.bytes_migrated_up, c.bytes_cleaned]
                .into_iter()
                .enumerate()
            {
                self.map()
                    .store_u64(BLOCK_SIZE + state::traffic(t) + 8 * k, v)?;
            }
            self.map().persist(BLOCK_SIZE + state::traffic(t), 24)?;
        }
        Ok(())
    }

    pub(crate) fn map(&self) -> &Mapping {
        self.area.map()
    }

    /// Allocate one data block for `w`.
    pub(crate) fn alloc_block(&mut self, w: &mut Work) -> io::Result<u64> {
        let b = self.blocks.alloc();
        Self::taken(w, b)
    }

    /// `b`, a block just taken for `w`, or `ENOSPC`.
    fn taken(w: &mut Work, b: Option<u64>) -> io::Result<u64> {
        match b {
            Some(b) => {
                w.allocated.push(b);
                Ok(b)
            }
            None => Err(fs_err(
                libc::ENOSPC,
                "the NVM tier is full (no free data block)",
            )),
        }
    }

    /// Write one whole block `blk` (allocated by this digest) and write it back (no fence).
    /// Data blocks use non-temporal stores, metadata plain stores + write-back.
    pub(crate) fn write_block(
        &self,
        w: &mut Work,
        blk: u64,
        data: &[u8],
        nt: bool,
    ) -> io::Result<()> {
        debug_assert_eq!(data.len(), BLOCK_SIZE);
        let off = (blk * BLOCK_SIZE_U64) as usize;
        if nt {
            self.map().write_nt(off, data)?;
        } else {
            self.map().write(off, data)?;
            self.map().flush(off, data.len())?;
        }
        w.bytes += BLOCK_SIZE_U64;
        Ok(())
    }

    /// Allocate one metadata block (map node, directory bucket) for `w`: from the top of
    /// the data region (`BlockAlloc::alloc_meta`).
    pub(crate) fn alloc_meta_block(&mut self, w: &mut Work) -> io::Result<u64> {
        let b = self.blocks.alloc_meta();
        Self::taken(w, b)
    }

    /// Allocate and write a new metadata block.
    pub(crate) fn new_block(&mut self, w: &mut Work, data: &[u8], nt: bool) -> io::Result<u64> {
        let b = self.alloc_meta_block(w)?;
        self.write_block(w, b, data, nt)?;
        Ok(b)
    }

    /// Check a leaf entry of a file map (a data block of any tier).
    pub(crate) fn check_leaf(&self, e: u64, what: &str) -> io::Result<u64> {
        if !self.layout.leaf_valid(e) {
            return Err(eio(format!(
                "{what}: {e:#x} is neither an NVM data block nor a lower-tier block"
            )));
        }
        Ok(e)
    }

    /// Check a superpage entry read from a level-2 map node; its first block.
    pub(crate) fn check_huge(&self, e: u64) -> io::Result<u64> {
        self.area.check_huge(e)
    }

    /// Check a block pointer read from the media.
    pub(crate) fn check_ptr(&self, blk: u64, what: &str) -> io::Result<u64> {
        if blk & ENTRY_FLAGS != 0 || !self.layout.data_block_valid(blk) {
            return Err(eio(format!(
                "{what}: block pointer {blk:#x} outside the data region"
            )));
        }
        Ok(blk)
    }

    /// The entries of map node `blk`.
    pub(crate) fn read_node(&self, blk: u64) -> io::Result<Node> {
        let mut b = vec![0u8; BLOCK_SIZE];
        self.area.read_block(blk, &mut b)?;
        let mut n: Node = Box::new([0u64; FANOUT as usize]);
        for (i, e) in n.iter_mut().enumerate() {
            *e = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        }
        Ok(n)
    }

    /// Encode node entries into a block.
    pub(crate) fn encode_node(n: &[u64; FANOUT as usize]) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE];
        for (i, e) in n.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
        b
    }

    /// The inode as published (for the daemon, the only writer, no retry is needed; a
    /// corrupt inode is `EIO`).
    pub(crate) fn inode(&self, ino: u64) -> io::Result<Inode> {
        if let Some(r) = self.reads.borrow_mut().as_mut() {
            r.insert(ino);
        }
        let mut b = [0u8; INODE_BYTES];
        self.area.read_inode_raw(ino, &mut b)?;
        Inode::decode(&b).map_err(|e| eio(format!("inode {ino}: {e}")))
    }

    /// Publish inode `ino`: announce the update (odd sequence word), write and persist
    /// the copy that is not current, then flip the word to it and persist the word. The
    /// current copy is never written, so a crash anywhere leaves a valid inode (see
    /// `cairn_format::inode`). The word is made durable here, not left to the caller's
    /// next fence: the next update of the inode may run on another thread (another
    /// client's request), whose fence does not complete this thread's write-back, and
    /// it overwrites the copy that the durable word would still call current.
    pub(crate) fn write_inode(&self, ino: u64, inode: &Inode) -> io::Result<()> {
        if !self.layout.ino_valid(ino) {
            return Err(eio(format!("inode number {ino} out of range")));
        }
        let off = self.layout.inode_off(ino) as usize;
        let m = self.map();
        // An odd word left by a crash means its old copy is current: start from there.
        let base = m.load_u64(off)? & !1;
        let other = COPY_OFF[1 - current_copy(base)];
        let inode = Inode {
            xattrs: inode.attrs.kind != Kind::Free
                && self.xattr_inodes.contains(&(ino, inode.generation)),
            ..*inode
        };
        m.store_u64(off, base + 1)?;
        m.write(off + other, &inode.encode_copy())?;
        m.flush(off + other, COPY_BYTES)?;
        cairn_media::fence();
        m.store_u64(off, base + 2)?;
        m.persist(off, 8)
    }

    /// Give every block `w` allocated back (nothing of it was published).
    pub(crate) fn rollback(&mut self, w: &Work) {
        for &b in &w.allocated {
            self.blocks.free(b);
        }
    }

    /// The current global epoch.
    pub(crate) fn epoch(&self) -> u64 {
        self.area.global_epoch().unwrap_or(1).max(1)
    }

    /// Retire `blocks` in the current epoch, then advance the epoch (after a publish).
    pub(crate) fn retire_and_advance(&mut self, blocks: Vec<u64>) -> io::Result<()> {
        let e = self.epoch();
        for &b in &blocks {
            let t = entry_tier(b);
            if t != 0 {
                if let Some(ta) = self.tier_mut(t) {
                    ta.retire(entry_block(b));
                }
            }
        }
        if !blocks.is_empty() {
            self.retired.push_back((e, blocks));
        }
        let off = BLOCK_SIZE + state::EPOCH;
        debug_assert!(
            self.retired.iter().all(|(r, _)| *r <= e),
            "blocks retired in an epoch after the current one ({e})"
        );
        self.map().store_u64(off, e + 1)?;
        self.map().persist(off, 8)?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// Free every retired list no reader can still be using: every slot in `readers`
    /// publishes 0 or an epoch greater than the list's. With `force`, free everything.
    pub(crate) fn reclaim(&mut self, readers: &[u32], force: bool) -> u64 {
        let mut min_reader = self.held_epochs.iter().copied().min().unwrap_or(u64::MAX);
        if !force {
            for &s in readers {
                let (page, at) = self.area.slot_log(s);
                let e = page
                    .load_u64(at + client_page::READER_EPOCH as usize)
                    .unwrap_or(0);
                if e != 0 {
                    min_reader = min_reader.min(e);
                }
            }
        }
        let mut freed = 0;
        while let Some((e, _)) = self.retired.front() {
            if *e >= min_reader {
                break;
            }
            let (_, blocks) = self.retired.pop_front().unwrap();
            for b in blocks {
                if self.free_entry(b) {
                    freed += 1;
                }
            }
        }
        self.trim_empty_segments();
        freed
    }

    /// The current head of `slot` (an unreadable entry is `EIO`).
    pub(crate) fn slot_head(&self, slot: u32) -> io::Result<(SlotHead, usize)> {
        self.area
            .slot_head(slot)?
            .ok_or_else(|| eio(format!("slot {slot}: both head records are corrupt")))
    }

    /// Durably replace the head of `slot` (A/B: the non-current copy), then publish
    /// `published_head`.
    pub(crate) fn set_slot_head(&self, slot: u32, h: SlotHead) -> io::Result<SlotHead> {
        if cfg!(debug_assertions) {
            // A client's head only moves forward (a new client of the slot starts over).
            let cur = self.area.slot_head(slot)?.map(|x| x.0).unwrap_or_default();
            assert!(
                h.slot_gen != cur.slot_gen
                    || !cur.active
                    || (h.head_lsn >= cur.head_lsn && h.head_seq >= cur.head_seq),
                "slot {slot}: head moving back from {}/{} to {}/{}",
                cur.head_lsn,
                cur.head_seq,
                h.head_lsn,
                h.head_seq
            );
        }
        self.write_slot_head(slot, h)
    }

    /// Move the head of `slot` back (tests: the state a crash between a publish and its
    /// head leaves).
    #[cfg(test)]
    pub(crate) fn rewind_slot_head(&self, slot: u32, h: SlotHead) -> io::Result<SlotHead> {
        self.write_slot_head(slot, h)
    }

    fn write_slot_head(&self, slot: u32, mut h: SlotHead) -> io::Result<SlotHead> {
        let (cur, copy) = match self.area.slot_head(slot)? {
            Some(x) => x,
            None => (SlotHead::default(), 1),
        };
        h.gen = cur.gen + 1;
        let base = self.layout.slot_entry_off(slot) as usize;
        let off = base + SlotHead::next_copy_off(copy) as usize;
        self.map().write(off, &h.encode())?;
        self.map().persist(off, cairn_format::slot::HEAD_BYTES)?;
        let ph = base + PUBLISHED_HEAD_OFF as usize;
        self.map().store_u64(ph, h.head_lsn)?;
        self.map().persist(ph, 8)?;
        // A writer whose log is full sleeps on the head's low word
        // (`Area::wait_published_head`).
        self.map().wake_all(ph)?;
        Ok(h)
    }

    /// Record the owner pid of a slot (informational) and reset its client page.
    pub(crate) fn reset_client_page(&self, slot: u32, pid: u32) -> io::Result<()> {
        let (page, cp) = self.area.slot_log(slot);
        page.store_u64(cp + client_page::READER_EPOCH as usize, 0)?;
        page.store_u64(cp + client_page::PID as usize, pid as u64)?;
        page.store_u64(cp + client_page::HINT_HEAD as usize, 0)?;
        page.store_u64(cp + client_page::PRESSURE as usize, 0)?;
        page.persist(cp, 32)?;
        let o = (self.layout.slot_entry_off(slot) + OWNER_PID_OFF) as usize;
        self.map().store_u64(o, pid as u64)?;
        self.map().persist(o, 8)
    }

    /// Whether `slot`'s client says more than half of its log is undigested
    /// (`client_page::PRESSURE`; untrusted: it only decides how its own digests are cut).
    pub(crate) fn log_pressure(&self, slot: u32) -> bool {
        let (page, at) = self.area.slot_log(slot);
        page.load_u64(at + client_page::PRESSURE as usize)
            .is_ok_and(|v| v != 0)
    }

    /// Increment the slot's `lease_gen` word (its client drops every lease and cached
    /// state at its next call).
    pub(crate) fn bump_lease_gen(&self, slot: u32) -> io::Result<()> {
        let o = (self.layout.slot_entry_off(slot) + LEASE_GEN_OFF) as usize;
        let g = self.map().load_u64(o)?;
        self.map().store_u64(o, g.wrapping_add(1))?;
        self.map().persist(o, 8)
    }

    /// Store the counters in the daemon state block.
    pub(crate) fn persist_counters(&self) -> io::Result<()> {
        let c = &self.counters;
        let m = self.map();
        for (f, v) in [
            (state::RECORDS_DIGESTED, c.records_digested),
            (state::RECORDS_SKIPPED, c.records_skipped),
            (state::LOG_BYTES_WRITTEN, c.log_bytes_written),
            (state::SHARED_BYTES_WRITTEN, c.shared_bytes_written),
            (state::DIGESTS, c.digests),
        ] {
            m.store_u64(BLOCK_SIZE + f, v)?;
        }
        m.persist(BLOCK_SIZE + state::RECORDS_DIGESTED, 40)?;
        self.persist_superpage_counters()
    }

    /// Set a daemon state field durably.
    pub(crate) fn set_state(&self, field: usize, v: u64) -> io::Result<()> {
        self.map().store_u64(BLOCK_SIZE + field, v)?;
        self.map().persist(BLOCK_SIZE + field, 8)
    }
}
