//! Inodes: 256 bytes each in the inode table, updated in place by the daemon under a
//! per-inode seqlock (the `seq` word at offset 0: odd while an update is in progress).
//! The crc32c at offset 252 covers bytes 8..252 and detects both corruption and an update
//! torn by a crash (which recovery repairs by replaying the log).

use crate::{bad, crc, le, Result};

/// Bytes of an inode.
pub const INODE_BYTES: usize = 256;
/// Offset of the crc32c.
const CRC_OFF: usize = 252;
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
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            0 => Kind::Free,
            1 => Kind::File,
            2 => Kind::Dir,
            3 => Kind::Symlink,
            _ => return None,
        })
    }
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::Free => 0,
            Kind::File => 0o100000,
            Kind::Dir => 0o040000,
            Kind::Symlink => 0o120000,
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
}

impl Inode {
    /// Encode into 256 bytes; `seq` is written as 0 (the daemon manages it in place).
    pub fn encode(&self) -> [u8; INODE_BYTES] {
        let mut b = [0u8; INODE_BYTES];
        let a = &self.attrs;
        le::put_u16(&mut b, 8, INODE_VERSION);
        b[10] = a.kind as u8;
        b[11] = self.dir_level;
        le::put_u32(&mut b, 12, a.perm);
        le::put_u32(&mut b, 16, a.uid);
        le::put_u32(&mut b, 20, a.gid);
        le::put_u64(&mut b, 24, self.generation);
        le::put_u64(&mut b, 32, a.nlink);
        le::put_u64(&mut b, 40, a.size);
        le::put_i64(&mut b, 48, a.atime);
        le::put_i64(&mut b, 56, a.mtime);
        le::put_i64(&mut b, 64, a.ctime);
        le::put_i64(&mut b, 72, a.btime);
        le::put_u64(&mut b, 80, self.map_root);
        b[88] = self.map_height;
        le::put_u64(&mut b, 96, self.dir_split);
        le::put_u64(&mut b, 104, self.dir_entries);
        le::put_u64(&mut b, 112, a.parent);
        le::put_u64(&mut b, 120, self.blocks);
        let c = crc(&b[8..CRC_OFF]);
        le::put_u32(&mut b, CRC_OFF, c);
        b
    }

    /// Whether the 256 bytes are an all-zero (never used) entry.
    pub fn is_zero(b: &[u8]) -> bool {
        b[8..].iter().all(|&x| x == 0)
    }

    /// Decode and validate. An all-zero entry decodes as a free inode.
    pub fn decode(b: &[u8]) -> Result<Inode> {
        if b.len() < INODE_BYTES {
            return bad("inode: short");
        }
        if Inode::is_zero(b) {
            return Ok(Inode::default());
        }
        if crc(&b[8..CRC_OFF]) != le::u32(b, CRC_OFF) {
            return bad("inode: checksum mismatch");
        }
        if le::u16(b, 8) != INODE_VERSION {
            return bad("inode: unsupported version");
        }
        let Some(kind) = Kind::from_u8(b[10]) else {
            return bad("inode: bad kind");
        };
        let perm = le::u32(b, 12);
        let map_height = b[88];
        if perm & !0o7777 != 0 || map_height > crate::map::MAX_HEIGHT {
            return bad("inode: bad mode or map height");
        }
        Ok(Inode {
            attrs: Attrs {
                kind,
                perm,
                uid: le::u32(b, 16),
                gid: le::u32(b, 20),
                nlink: le::u64(b, 32),
                size: le::u64(b, 40),
                atime: le::i64(b, 48),
                mtime: le::i64(b, 56),
                ctime: le::i64(b, 64),
                btime: le::i64(b, 72),
                parent: le::u64(b, 112),
            },
            generation: le::u64(b, 24),
            map_root: le::u64(b, 80),
            map_height,
            dir_level: b[11],
            dir_split: le::u64(b, 96),
            dir_entries: le::u64(b, 104),
            blocks: le::u64(b, 120),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn roundtrip(kind in 1u8..=3, perm in 0u32..0o7777, size: u64, nlink: u64, t: i64,
                     root: u64, h in 0u8..=4, gen: u64) {
            let ino = Inode {
                attrs: Attrs { kind: Kind::from_u8(kind).unwrap(), perm, uid: 5, gid: 6, nlink,
                    size, atime: t, mtime: t ^ 1, ctime: 3, btime: 4, parent: 9 },
                generation: gen, map_root: root, map_height: h, dir_level: 3, dir_split: 2,
                dir_entries: 11, blocks: 12,
            };
            prop_assert_eq!(Inode::decode(&ino.encode()).unwrap(), ino);
        }
    }

    #[test]
    fn zero_is_free_and_flip_is_detected() {
        assert_eq!(Inode::decode(&[0u8; 256]).unwrap().attrs.kind, Kind::Free);
        let mut b = Inode {
            attrs: Attrs {
                kind: Kind::File,
                nlink: 1,
                ..Default::default()
            },
            ..Default::default()
        }
        .encode();
        b[40] ^= 1;
        assert!(Inode::decode(&b).is_err());
    }
}
