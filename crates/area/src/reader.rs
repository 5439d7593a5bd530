//! Consistent reads of the shared area.
//!
//! Published map nodes, data blocks and directory buckets never change (the daemon
//! writes new ones and frees old ones only after every reader has left the epoch), so a
//! reader that holds an epoch can copy them freely. Inodes are updated in place under a
//! seqlock and are read with [`Area::read_inode`], which retries until it gets a stable
//! copy. Every pointer read from the media is checked before it is followed: a corrupt
//! image gives `EIO`, never a panic or an out-of-bounds access.

use crate::error::fs_err;
use cairn_format::dir::{self, Entry};
use cairn_format::inode::{current_copy, read_ok, Inode, Kind, COPY_BYTES, COPY_OFF, INODE_BYTES};
use cairn_format::map::{self, ENTRY_FLAGS};
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

/// A mapped NVM tier: superblock, layout and the read operations.
pub struct Area {
    map: Mapping,
    sb: Superblock,
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
        let sb = Superblock::decode(&b, len).map_err(|e| eio(e.to_string()))?;
        map.read(BLOCK_SIZE, &mut b)?;
        cairn_format::superblock::check_state(&b).map_err(|e| eio(e.to_string()))?;
        Ok(Area { map, sb })
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

    /// The block holding file block `fblk` of `inode`, or `None` for a hole.
    pub fn block_of(&self, inode: &Inode, fblk: u64) -> io::Result<Option<u64>> {
        if inode.map_root == 0 || inode.map_height == 0 || fblk >= map::coverage(inode.map_height) {
            return Ok(None);
        }
        let mut node = self.check_ptr(inode.map_root, "map root")?;
        for level in (1..=inode.map_height).rev() {
            let e = self.node_entry(node, map::index_at(fblk, level))?;
            if e == 0 {
                return Ok(None);
            }
            node = self.check_ptr(e, "map entry")?;
        }
        Ok(Some(node))
    }

    /// Read file data at `off` into `buf`, bounded by the inode's size; holes read as
    /// zeros. Returns the number of bytes read.
    pub fn read_file(&self, inode: &Inode, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let size = inode.attrs.size;
        if off >= size {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - off) as usize;
        let mut done = 0usize;
        while done < n {
            let pos = off + done as u64;
            let fblk = pos / BLOCK_SIZE_U64;
            let in_blk = (pos % BLOCK_SIZE_U64) as usize;
            let chunk = (BLOCK_SIZE - in_blk).min(n - done);
            match self.block_of(inode, fblk)? {
                Some(b) => self.map.read(
                    (b * BLOCK_SIZE_U64) as usize + in_blk,
                    &mut buf[done..done + chunk],
                )?,
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

    /// Offset (in the mapping) of the slot's lease generation word (PROTOCOL.md,
    /// "Leases"): load it with `map().load_u64`.
    pub fn lease_gen_off(&self, slot: u32) -> usize {
        (self.layout().slot_entry_off(slot) + LEASE_GEN_OFF) as usize
    }
}
