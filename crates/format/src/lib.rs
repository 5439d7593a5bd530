//! Cairn's on-media format as pure code: every structure the NVM tier holds, with its
//! encoder and a validating decoder. Nothing here does I/O, so all of it can be unit
//! tested and fuzzed. The byte layouts are specified in `docs/FORMAT.md`.

#![forbid(unsafe_code)]

pub mod alloc;
pub mod dir;
pub mod inode;
pub mod log;
pub mod map;
pub mod perm;
pub mod sj;
pub mod slot;
pub mod superblock;
pub mod tier;
pub mod xattr;

/// Size of a block in every region of the NVM tier.
pub const BLOCK_SIZE: usize = 4096;
/// `BLOCK_SIZE` as a `u64`.
pub const BLOCK_SIZE_U64: u64 = BLOCK_SIZE as u64;
/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;
/// Longest file name in bytes.
pub const NAME_MAX: usize = 255;
/// Most hard links to one file (ext4's limit): one more link is `EMLINK`.
pub const LINK_MAX: u64 = 65_000;
/// Largest file size (2^48 bytes: four levels of 512-way map nodes of 4 KiB blocks).
pub const MAX_FILE_SIZE: u64 = 1 << 48;

/// A decoding failure: the bytes are not a valid structure of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "format error: {}", self.0)
    }
}

impl std::error::Error for FormatError {}

/// Result of decoding.
pub type Result<T> = std::result::Result<T, FormatError>;

pub(crate) fn bad<T>(msg: impl Into<String>) -> Result<T> {
    Err(FormatError(msg.into()))
}

/// crc32c (Castagnoli) of `data`: every checksum of the store, the key-value store and
/// the backups.
pub fn crc(data: &[u8]) -> u32 {
    crc_append(0, data)
}

/// The crc32c of the bytes `crc` was computed over followed by `data`.
pub fn crc_append(crc: u32, data: &[u8]) -> u32 {
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

/// Little-endian field access on byte slices. Callers check lengths first.
pub(crate) mod le {
    pub fn u16(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
    }
    pub fn u32(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }
    pub fn u64(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }
    pub fn i64(b: &[u8], off: usize) -> i64 {
        i64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }
    pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_i64(b: &mut [u8], off: usize, v: i64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Validate a file name: 1..=255 bytes, no `/`, no NUL, not `.` or `..`.
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name != b"."
        && name != b".."
        && !name.iter().any(|&c| c == b'/' || c == 0)
}

/// Round `v` up to a multiple of `align` (a power of two).
pub const fn align_up(v: u64, align: u64) -> u64 {
    (v + align - 1) & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every checksum on the media is CRC-32C: the standard check value, a value written
    /// by the earlier implementation (the `crc32c` crate), and appending in pieces of any
    /// length and alignment equals one pass (stores written before still verify).
    #[test]
    fn crc_is_crc32c_in_one_pass_or_in_pieces() {
        assert_eq!(crc(b"123456789"), 0xe306_9283);
        assert_eq!(crc(b""), 0);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 300) as u8).collect();
        assert_eq!(crc(&data), 0x685e_6fe8, "as the crc32c crate computed it");
        for (from, len) in [(0, 0), (1, 7), (3, 28), (8, 100), (5, 4096), (0, 20_000)] {
            let d = &data[from..from + len];
            let whole = crc(d);
            for cut in [0, 1.min(len), len / 3, len / 2, len.saturating_sub(1), len] {
                assert_eq!(
                    crc_append(crc(&d[..cut]), &d[cut..]),
                    whole,
                    "{from} {len} {cut}"
                );
            }
        }
    }
}
