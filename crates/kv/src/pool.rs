//! The pool file: created (fully allocated) or opened, mapped whole (2 MiB aligned, so
//! that each segment can be one huge page: `cairn_media::huge`), its segments collapsed
//! into huge folios where the kernel allows. A pool open in one process holds an
//! exclusive `flock` on its file; the processes of a shared store hold shared ones
//! (`crate::region`).

use crate::format::{PoolHeader, SEGMENT_BYTES};
use cairn_media::Mapping;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// An open pool.
pub struct Pool {
    pub map: Mapping,
    pub header: PoolHeader,
    pub(crate) file: File,
}

impl Pool {
    /// Open the pool at `path`, creating it with `size` bytes (rounded down to whole
    /// segments) if it does not exist. Fails with `WouldBlock` while another process
    /// has it open (after waiting a second: a child forked by the last user may hold
    /// the lock until it executes its program).
    pub fn open(path: &Path, size: u64) -> io::Result<Pool> {
        let file = Self::lock(path, Self::open_file(path)?)?;
        Self::on_file(file, size)
    }

    pub(crate) fn open_file(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    }

    /// `file`, opened at `path`, once it is locked (exclusively) and still the file at
    /// `path`. A file removed (or replaced) while this waited for its lock is not the
    /// pool any more: a store opened on it would write to a file nobody can open again,
    /// and lose everything at close. Then the file now at `path` is opened (created if
    /// there is none) and locked instead.
    fn lock(path: &Path, mut file: File) -> io::Result<File> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            match cairn_media::sys::flock_exclusive(&file, true) {
                Ok(()) if crate::region::is_at(&file, path)? => return Ok(file),
                Ok(()) => file = Self::open_file(path)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::WouldBlock,
                            format!("{}: the pool is open in another process", path.display()),
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A pool of `size` bytes in memory only (an unlinked file on `/dev/shm`): gone when
    /// the store is dropped.
    pub fn volatile(size: u64) -> io::Result<Pool> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/cairn-kv-volatile-{}-{n}",
            std::process::id()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        Self::on_file(file, size)
    }

    pub(crate) fn on_file(file: File, size: u64) -> io::Result<Pool> {
        let len = file.metadata()?.len();
        if len == 0 {
            let segments = size / SEGMENT_BYTES;
            if segments < 4 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("a pool needs at least 8 MiB (four 2 MiB segments), not {size} bytes"),
                ));
            }
            let bytes = segments * SEGMENT_BYTES;
            file.set_len(bytes)?;
            let map = Mapping::new(&file, 0, bytes as usize, true, false)?;
            let mut uuid = [0u8; 16];
            getrandom::getrandom(&mut uuid).map_err(|e| io::Error::other(e.to_string()))?;
            let header = PoolHeader { segments, uuid };
            let b = header.encode();
            map.write(0, &b)?;
            map.persist(0, b.len())?;
            let pool = Pool { map, header, file };
            return Ok(pool);
        }
        let map = Mapping::new(&file, 0, len as usize, true, false)?;
        let mut b = vec![0u8; 64];
        map.read(0, &mut b)?;
        let header = PoolHeader::decode(&b, len).map_err(|e| invalid(e.0))?;
        let pool = Pool { map, header, file };
        Ok(pool)
    }

    /// Back every segment but those `skip` names with a huge folio where the kernel
    /// allows (best effort; the kernel copies 2 MiB per segment, about 4 ms each here
    /// (4.8 s for 2.2 GB): the store runs this in a thread of its own after recovery).
    /// Stops early when `stop` says so.
    pub fn collapse_all(&self, skip: &dyn Fn(u64) -> bool, stop: &dyn Fn() -> bool) {
        if cairn_media::huge::refusal().is_some() {
            return;
        }
        for s in 0..self.header.segments {
            if stop() {
                return;
            }
            if !skip(s) && self.collapse(s).is_err() {
                break;
            }
        }
    }

    /// Back segment `s` with a huge folio (see [`Pool::collapse_all`]).
    pub fn collapse(&self, s: u64) -> io::Result<()> {
        self.map.collapse(Self::seg_off(s), SEGMENT_BYTES as usize)
    }

    /// Hand the memory of segment `s` back to the system (`fallocate` punching a hole:
    /// its bytes read as zeros, and take memory again when written).
    pub fn release(&self, s: u64) -> io::Result<()> {
        cairn_media::sys::discard(&self.file, s * SEGMENT_BYTES, SEGMENT_BYTES)
    }

    /// Bytes of the pool file the system holds (its allocated blocks).
    pub fn resident_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().map_or(0, |m| m.blocks() * 512)
    }

    /// Byte offset of segment `s`.
    pub fn seg_off(s: u64) -> usize {
        (s * SEGMENT_BYTES) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two stores opened on one path, the first removing the file before it lets go
    /// (tests sharing a pool's name did): the second, waiting for the lock on the file
    /// it opened, must not open the removed file (whatever it wrote there would be gone
    /// at its next opening) but the one now at the path.
    #[test]
    fn a_pool_removed_while_an_opener_waits_is_not_the_one_it_opens() {
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/cairn-kv-pool-removed-{}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let first = Pool::open(&path, 8 << 20).unwrap();
        // What the second opener holds while it waits.
        let waiting = Pool::open_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        drop(first);
        let file = Pool::lock(&path, waiting).unwrap();
        assert!(
            crate::region::is_at(&file, &path).unwrap(),
            "the removed file was opened"
        );
        let second = Pool::on_file(file, 8 << 20).unwrap();
        assert_eq!(second.header.segments, 4);
        // Locked: a third opener waits (and gives up after a second).
        let third = Pool::open(&path, 8 << 20).err().expect("a third open");
        assert_eq!(third.kind(), io::ErrorKind::WouldBlock);
        drop(second);
        std::fs::remove_file(&path).unwrap();
    }
}
