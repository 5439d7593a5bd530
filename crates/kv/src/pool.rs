//! The pool file: created (fully allocated) or opened, mapped whole (2 MiB aligned, so
//! that each segment can be one huge page: `cairn_media::huge`), its segments collapsed
//! into huge folios where the kernel allows.

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
    _file: File,
}

impl Pool {
    /// Open the pool at `path`, creating it with `size` bytes (rounded down to whole
    /// segments) if it does not exist.
    pub fn open(path: &Path, size: u64) -> io::Result<Pool> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
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
            let pool = Pool {
                map,
                header,
                _file: file,
            };
            pool.collapse_all();
            return Ok(pool);
        }
        let map = Mapping::new(&file, 0, len as usize, true, false)?;
        let mut b = vec![0u8; 64];
        map.read(0, &mut b)?;
        let header = PoolHeader::decode(&b, len).map_err(|e| invalid(e.0))?;
        let pool = Pool {
            map,
            header,
            _file: file,
        };
        pool.collapse_all();
        Ok(pool)
    }

    /// Back every segment with a huge folio where the kernel allows (best effort).
    fn collapse_all(&self) {
        if cairn_media::huge::refusal().is_some() {
            return;
        }
        for s in 0..self.header.segments {
            if self
                .map
                .collapse((s * SEGMENT_BYTES) as usize, SEGMENT_BYTES as usize)
                .is_err()
            {
                break;
            }
        }
    }

    /// Byte offset of segment `s`.
    pub fn seg_off(s: u64) -> usize {
        (s * SEGMENT_BYTES) as usize
    }
}
