//! Where a lower tier's segments live. A lower tier (SSD, HDD) is written only in whole
//! segments (a migration or cleaning round writes one, durable before any map names its
//! blocks), read by block, and discarded a whole segment at a time once every block of it
//! is dead. [`TierDevice`] is that contract; [`FileTier`] keeps the segments in a file or
//! block device of this machine. Every call names the segment and the generation it was
//! written under (its NVM segment-table word), so that a device keeping segments as
//! separate objects never confuses a reused segment with its old contents.

use crate::fs_err;
use cairn_format::map::TIER_NAMES;
use cairn_format::BLOCK_SIZE_U64;
use std::fs::File;
use std::io;
use std::path::Path;

/// A lower tier's storage.
/// A buffer a round's copy is read into, shared with a device's I/O threads
/// ([`TierDevice::write_segment_shared`]).
pub type SharedBuf = std::sync::Arc<cairn_media::AlignedBuf>;

pub trait TierDevice: Send + Sync {
    /// Read `buf.len()` bytes at byte `off` of the tier, all inside segment `seg`, which
    /// was written under generation `gen`.
    fn read(&self, seg: u64, gen: u64, off: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Write `data` at byte `off`, the start of segment `seg` (generation `gen`); durable
    /// when it returns.
    fn write_segment(&self, seg: u64, gen: u64, off: u64, data: &[u8]) -> io::Result<()>;

    /// [`TierDevice::write_segment`] of `data[..len]`, for a device that hands the data
    /// to threads of its own: they keep the buffer as long as they need it, with no
    /// copy (a write given up on after a timeout may still be running).
    fn write_segment_shared(
        &self,
        seg: u64,
        gen: u64,
        off: u64,
        data: &SharedBuf,
        len: usize,
    ) -> io::Result<()> {
        self.write_segment(seg, gen, off, &data[..len])
    }

    /// Segment `seg` (`len` bytes at `off`, last written under `gen`) holds nothing any
    /// more: its space may be given back. Losing this is harmless (the segment is
    /// rewritten whole before it is read again).
    fn discard(&self, seg: u64, gen: u64, off: u64, len: u64) -> io::Result<()>;
}

/// A lower tier in a file or block device: `pread`, with direct I/O where the file
/// system or device allows it and the buffer, offset and length are 4 KiB aligned;
/// a segment written with one write and `fdatasync`; a discard punches a hole (or
/// `BLKDISCARD`s a device).
#[derive(Debug)]
pub struct FileTier {
    /// 1 = SSD, 2 = HDD (for messages and the device emulation of `cairn_media`).
    tier: u8,
    file: File,
    /// The same opened with `O_DIRECT`, if allowed.
    direct: Option<File>,
}

impl FileTier {
    /// Open lower tier `tier` at `path`, read-only or read-write.
    pub fn open(tier: u8, path: &Path, writable: bool) -> io::Result<FileTier> {
        let name = TIER_NAMES[tier.min(2) as usize];
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .map_err(|e| {
                fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("cannot open the {name} tier {}: {e}", path.display()),
                )
            })?;
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(writable)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        };
        Ok(FileTier { tier, file, direct })
    }

    fn name(&self) -> &'static str {
        TIER_NAMES[self.tier.min(2) as usize]
    }

    /// The file, for reading its header.
    pub fn file(&self) -> &File {
        &self.file
    }
}

fn aligned(x: u64) -> bool {
    x.is_multiple_of(BLOCK_SIZE_U64)
}

impl TierDevice for FileTier {
    fn read(&self, _seg: u64, _gen: u64, off: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let (f, how) = match &self.direct {
            Some(d)
                if aligned(off) && aligned(buf.len() as u64) && aligned(buf.as_ptr() as u64) =>
            {
                (d, "direct read")
            }
            _ => (&self.file, "read"),
        };
        f.read_exact_at(buf, off).map_err(|e| {
            fs_err(
                libc::EIO,
                format!("{how} of the {} tier at {off}: {e}", self.name()),
            )
        })?;
        cairn_media::emulate::read(self.tier, buf.len());
        Ok(())
    }

    fn write_segment(&self, seg: u64, _gen: u64, off: u64, data: &[u8]) -> io::Result<()> {
        let f = match &self.direct {
            Some(d)
                if aligned(off) && aligned(data.len() as u64) && aligned(data.as_ptr() as u64) =>
            {
                d
            }
            _ => &self.file,
        };
        cairn_media::emulate::write(self.tier, data.len());
        cairn_media::file::write_all_at(f, data, off)
            .and_then(|()| cairn_media::file::sync_data(f))
            .map_err(|e| {
                fs_err(
                    libc::EIO,
                    format!("write of segment {seg} of the {} tier: {e}", self.name()),
                )
            })
    }

    fn discard(&self, _seg: u64, _gen: u64, off: u64, len: u64) -> io::Result<()> {
        cairn_media::file::discard(&self.file, off, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_tier_reads_what_a_segment_wrote_and_discards_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ssd.img");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(4 << 20).unwrap();
        let t = FileTier::open(1, &p, true).unwrap();
        let data = cairn_media::AlignedBuf::zeroed(1 << 20);
        let mut data = data;
        data.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        t.write_segment(1, 7, 1 << 20, &data).unwrap();
        // Aligned (direct where allowed) and unaligned reads agree.
        let mut a = cairn_media::AlignedBuf::zeroed(8192);
        t.read(1, 7, (1 << 20) + 4096, &mut a).unwrap();
        assert_eq!(&a[..], &data[4096..4096 + 8192]);
        let mut b = vec![0u8; 100];
        t.read(1, 7, (1 << 20) + 5, &mut b).unwrap();
        assert_eq!(&b[..], &data[5..105]);
        t.discard(1, 7, 1 << 20, 1 << 20).unwrap();
        t.read(1, 7, (1 << 20) + 5, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0), "a hole reads as zeros");
        // Past the end: an error naming the tier.
        let e = t.read(1, 7, 8 << 20, &mut b).unwrap_err();
        assert!(e.to_string().contains("ssd tier"), "{e}");
    }
}
