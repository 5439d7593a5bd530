//! Inodes: 256 bytes each in the inode table, holding two 120-byte copies (A at 8, B at
//! 128) and a sequence word at 0 that says which copy is current: copy
//! `(seq >> 1) & 1`. The daemon updates an inode by storing `seq + 1` (odd: "writing the
//! other copy"), writing and persisting the other copy, then storing `seq + 2`. The current
//! copy is never written in place, so a crash at any instruction leaves a valid inode
//! (the old copy, which the log replay brings up to date), and readers never wait: see
//! [`read_ok`]. Each copy has its own crc32c.

use crate::{bad, crc, le, Result};

/// Bytes of an inode.
pub const INODE_BYTES: usize = 256;
/// Bytes of one copy.
pub const COPY_BYTES: usize = 120;
/// Offsets of copies A and B within the inode.
pub const COPY_OFF: [usize; 2] = [8, 128];
/// Offset of the crc32c within a copy (it covers the bytes before it).
const CRC_OFF: usize = 116;

/// The copy a reader that saw sequence word `seq` must read (for an odd `seq`, the old
/// copy: the other one is being written).
pub fn current_copy(seq: u64) -> usize {
    ((seq >> 1) & 1) as usize
}

/// Whether a copy read between sequence words `s1` (before) and `s2` (after) is intact:
/// the writer did not start writing that copy in between.
pub fn read_ok(s1: u64, s2: u64) -> bool {
    if s1 & 1 == 0 {
        s2 <= s1 + 2
    } else {
        s2 <= s1 + 1
    }
}
/// Inode format version.
pub const INODE_VERSION: u16 = 1;

/// What an inode is. `Free` is an unused table entry (all zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Kind {
    #[default]
    Free = 0,
    File = 1,
    Dir = 2,
    Symlink = 3,
    /// Special files (format version 3): no data, no map.
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            0 => Kind::Free,
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            4 => Kind::Fifo,
            5 => Kind::Socket,
            6 => Kind::CharDev,
            7 => Kind::BlockDev,
            _ => return None,
        })
    }
    /// The kind whose `S_IFMT` bits are `mode & 0o170000` (`None`: not a file type).
    pub fn from_mode(mode: u32) -> Option<Kind> {
        [
            Kind::File,
            Kind::Dir,
            Kind::Symlink,
            Kind::Fifo,
            Kind::Socket,
            Kind::CharDev,
            Kind::BlockDev,
        ]
        .into_iter()
        .find(|k| k.mode_bits() == mode & 0o170000)
    }
    /// Whether inodes of this kind hold bytes (a map of data blocks): files and symlinks.
    pub fn has_data(self) -> bool {
        matches!(self, Kind::File | Kind::Symlink)
    }
    /// Whether this is a device node (its inode carries a device number).
    pub fn is_device(self) -> bool {
        matches!(self, Kind::CharDev | Kind::BlockDev)
    }
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::Free => 0,
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
            Kind::Fifo => 0o010000,
            Kind::Socket => 0o140000,
            Kind::CharDev => 0o020000,
            Kind::BlockDev => 0o060000,
        }
    }
}

/// Attributes every record that changes an inode carries in full (absolute post-state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    pub kind: Kind,
    /// Permission bits only (`0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub btime: i64,
    /// Parent directory (directories only; 0 otherwise).
    pub parent: u64,
    /// Device number, Linux's `dev_t` encoding (device nodes only; 0 otherwise). On media
    /// it shares the parent's slot: see [`Attrs::slot`].
    pub rdev: u64,
}

impl Attrs {
    /// The 8-byte field inodes and `INODE_SET` records keep for the parent of a directory
    /// and the device number of a device node (no inode has both).
    pub fn slot(&self) -> u64 {
        if self.kind.is_device() {
            self.rdev
        } else {
            self.parent
        }
    }
    /// Set the parent or device number from a decoded slot (after `kind`).
    pub fn set_slot(&mut self, v: u64) {
        if self.kind.is_device() {
            self.rdev = v;
        } else {
            self.parent = v;
        }
    }
}

/// A decoded inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inode {
    pub attrs: Attrs,
    /// Bumped each time the inode number is reused.
    pub generation: u64,
    /// Root block of the map (0: no map), and its height (0..=4).
    pub map_root: u64,
    pub map_height: u8,
    /// Directories: linear-hashing level and split pointer, and the entry count.
    pub dir_level: u8,
    pub dir_split: u64,
    pub dir_entries: u64,
    /// Data-region blocks owned by this inode (data, map nodes, buckets), for `st_blocks`.
    pub blocks: u64,
    /// It may have extended attributes (kept by the daemon, not here): a reader that sees
    /// `false` knows it has none without asking. Byte 113, bit 0.
    pub xattrs: bool,
}

impl Inode {
    /// Encode one copy (120 bytes).
    pub fn encode_copy(&self) -> [u8; COPY_BYTES] {
        let mut b = [0u8; COPY_BYTES];
        let a = &self.attrs;
        le::put_u16(&mut b, 0, INODE_VERSION);
        b[2] = a.kind as u8;
        b[3] = self.dir_level;
        le::put_u32(&mut b, 4, a.perm);
        le::put_u32(&mut b, 8, a.uid);
        le::put_u32(&mut b, 12, a.gid);
        le::put_u64(&mut b, 16, self.generation);
        le::put_u64(&mut b, 24, a.nlink);
        le::put_u64(&mut b, 32, a.size);
        le::put_i64(&mut b, 40, a.atime);
        le::put_i64(&mut b, 48, a.mtime);
        le::put_i64(&mut b, 56, a.ctime);
        le::put_i64(&mut b, 64, a.btime);
        le::put_u64(&mut b, 72, self.map_root);
        le::put_u64(&mut b, 80, self.dir_split);
        le::put_u64(&mut b, 88, self.dir_entries);
        le::put_u64(&mut b, 96, a.slot());
        le::put_u64(&mut b, 104, self.blocks);
        b[112] = self.map_height;
        b[113] = self.xattrs as u8;
        let c = crc(&b[..CRC_OFF]);
        le::put_u32(&mut b, CRC_OFF, c);
        b
    }

    /// Decode and validate one copy. An all-zero copy decodes as a never-used inode.
    pub fn decode_copy(b: &[u8]) -> Result<Inode> {
        if b.len() < COPY_BYTES {
            return bad("inode: short");
        }
        if b[..COPY_BYTES].iter().all(|&x| x == 0) {
            return Ok(Inode::default());
        }
        if crc(&b[..CRC_OFF]) != le::u32(b, CRC_OFF) {
            return bad("inode: checksum mismatch");
        }
        if le::u16(b, 0) != INODE_VERSION {
            return bad("inode: unsupported version");
        }
        let Some(kind) = Kind::from_u8(b[2]) else {
            return bad("inode: bad kind");
        };
        let perm = le::u32(b, 4);
        let map_height = b[112];
        if perm & !0o7777 != 0
            || map_height > crate::map::MAX_HEIGHT
            || b[113] & !1 != 0
            || b[114..116] != [0, 0]
        {
            return bad("inode: bad mode, map height or flags");
        }
        let mut attrs = Attrs {
            kind,
            perm,
            uid: le::u32(b, 8),
            gid: le::u32(b, 12),
            nlink: le::u64(b, 24),
            size: le::u64(b, 32),
            atime: le::i64(b, 40),
            mtime: le::i64(b, 48),
            ctime: le::i64(b, 56),
            btime: le::i64(b, 64),
            ..Attrs::default()
        };
        attrs.set_slot(le::u64(b, 96));
        let special = !kind.has_data() && kind != Kind::Dir && kind != Kind::Free;
        if special && (attrs.size != 0 || le::u64(b, 72) != 0 || map_height != 0) {
            return bad("inode: a special file with data");
        }
        Ok(Inode {
            attrs,
            generation: le::u64(b, 16),
            map_root: le::u64(b, 72),
            map_height,
            dir_level: b[3],
            dir_split: le::u64(b, 80),
            dir_entries: le::u64(b, 88),
            blocks: le::u64(b, 104),
            xattrs: b[113] & 1 != 0,
        })
    }

    /// A whole 256-byte inode holding this inode as copy A with sequence word 0 (mkfs).
    pub fn encode(&self) -> [u8; INODE_BYTES] {
        let mut b = [0u8; INODE_BYTES];
        b[COPY_OFF[0]..COPY_OFF[0] + COPY_BYTES].copy_from_slice(&self.encode_copy());
        b
    }

    /// Decode a whole 256-byte inode: the copy its sequence word names (for an odd word,
    /// left by a writer that stopped mid-update, the old copy).
    pub fn decode(b: &[u8]) -> Result<Inode> {
        if b.len() < INODE_BYTES {
            return bad("inode: short");
        }
        let off = COPY_OFF[current_copy(le::u64(b, 0))];
        Inode::decode_copy(&b[off..off + COPY_BYTES])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn roundtrip(kind in 1u8..=7, perm in 0u32..0o7777, size: u64, nlink: u64, t: i64,
                     root: u64, h in 0u8..=4, gen: u64, xattrs: bool, slot: u64) {
            let kind = Kind::from_u8(kind).unwrap();
            let data = kind.has_data() || kind == Kind::Dir;
            let dev = kind.is_device();
            let ino = Inode {
                attrs: Attrs { kind, perm, uid: 5, gid: 6, nlink,
                    size: if data { size } else { 0 }, atime: t, mtime: t ^ 1, ctime: 3,
                    btime: 4, parent: if dev { 0 } else { slot }, rdev: if dev { slot } else { 0 } },
                generation: gen, map_root: if data { root } else { 0 },
                map_height: if data { h } else { 0 }, dir_level: 3, dir_split: 2,
                dir_entries: 11, blocks: 12, xattrs,
            };
            prop_assert_eq!(Inode::decode(&ino.encode()).unwrap(), ino);
        }
    }

    #[test]
    fn special_files_carry_no_data() {
        for kind in [Kind::Fifo, Kind::Socket, Kind::CharDev, Kind::BlockDev] {
            let mut i = Inode {
                attrs: Attrs {
                    kind,
                    nlink: 1,
                    ..Default::default()
                },
                ..Default::default()
            };
            assert!(Inode::decode(&i.encode()).is_ok());
            i.attrs.size = 1;
            assert!(Inode::decode(&i.encode()).is_err(), "{kind:?} with a size");
            i.attrs.size = 0;
            i.map_root = 7;
            assert!(Inode::decode(&i.encode()).is_err(), "{kind:?} with a map");
        }
        assert_eq!(Kind::from_mode(0o010644), Some(Kind::Fifo));
        assert_eq!(Kind::from_mode(0o170000), None);
    }

    #[test]
    fn zero_is_free_and_flip_is_detected() {
        assert_eq!(Inode::decode(&[0u8; 256]).unwrap().attrs.kind, Kind::Free);
        let i = Inode {
            attrs: Attrs {
                kind: Kind::File,
                nlink: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut b = i.encode();
        b[40] ^= 1;
        assert!(Inode::decode(&b).is_err());
        // Copy B is current once the sequence word says so; an odd word keeps copy A.
        let mut b = i.encode();
        let j = Inode { generation: 9, ..i };
        b[128..248].copy_from_slice(&j.encode_copy());
        b[0] = 1;
        assert_eq!(Inode::decode(&b).unwrap(), i);
        b[0] = 2;
        assert_eq!(Inode::decode(&b).unwrap(), j);
    }

    #[test]
    fn readers_accept_only_untouched_copies() {
        assert!(read_ok(4, 4) && read_ok(4, 5) && read_ok(4, 6) && !read_ok(4, 7));
        assert!(read_ok(5, 6) && !read_ok(5, 7));
    }
}
