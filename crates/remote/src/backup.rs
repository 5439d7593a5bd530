//! Backups of a whole store in a pool (docs/REMOTE.md, "Backup and restore").
//!
//! A backup is a *manifest*, the object `cairn.<uuid>.backup` (JSON), naming the objects
//! that hold everything a store needs besides its remote tier: the NVM file in chunks of
//! [`NVM_CHUNK`] bytes, the segments in use of its local lower tiers, and the files of
//! its directory that are not rebuilt (`cairn.toml`, the extended attributes' journal,
//! the segment registry); and listing the remote tier's segments in use, whose own
//! objects are kept while the manifest is the newest. The manifest is written last, with
//! one `write_full`, so a backup exists whole or not at all; the objects of the previous
//! one it no longer names are removed after it.
//!
//! Objects are immutable once written: an NVM chunk is `cairn.<uuid>.backup.nvm.<i>.<seq>`
//! (the backup that first had its bytes), a local segment
//! `cairn.<uuid>.backup.<tier>.<seg>.<gen>.<chunk>` (a generation's bytes never change),
//! a file `cairn.<uuid>.backup.file.<name>.<seq>`. So a backup uploads only what changed
//! since the previous one.

use crate::pool::{Pool, Slice, IO_THREADS};
use cairn_area::{errno_of, fs_err};
use serde::{Deserialize, Serialize};
use std::io;

/// Bytes of the NVM file per chunk object.
pub const NVM_CHUNK: u64 = 16 << 20;

/// Manifest format version.
pub const MANIFEST_VERSION: u32 = 1;

/// One object of a backup and what it must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// Empty: `len` zero bytes, in no object.
    pub object: String,
    pub len: u64,
    /// crc32c of its bytes.
    pub crc: u32,
}

/// A segment of a local lower tier in a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentCopy {
    pub tier: u8,
    pub seg: u64,
    pub gen: u64,
    pub pieces: Vec<Piece>,
}

/// A backup (see the module's text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// The store's uuid, in hex.
    pub uuid: String,
    /// 1 for the store's first backup, then one more each time.
    pub seq: u64,
    /// When the snapshot was taken (ns since the Unix epoch): the backup holds every
    /// write acknowledged before it.
    pub taken_ns: i64,
    pub nvm_size: u64,
    /// The NVM file, chunk by chunk.
    pub nvm: Vec<Piece>,
    /// The local lower tiers' segments in use.
    pub segments: Vec<SegmentCopy>,
    /// The remote tier's segments in use: (segment, generation).
    pub remote: Vec<(u64, u64)>,
    /// Files of the store directory, by name.
    pub files: Vec<(String, Piece)>,
}

impl Manifest {
    /// Every object the backup names.
    pub fn objects(&self) -> impl Iterator<Item = &str> {
        self.nvm
            .iter()
            .chain(self.segments.iter().flat_map(|s| s.pieces.iter()))
            .chain(self.files.iter().map(|(_, p)| p))
            .map(|p| p.object.as_str())
            .filter(|o| !o.is_empty())
    }

    /// Bytes of the backup's objects (zeros held in none not counted).
    pub fn bytes(&self) -> u64 {
        self.nvm
            .iter()
            .chain(self.segments.iter().flat_map(|s| s.pieces.iter()))
            .chain(self.files.iter().map(|(_, p)| p))
            .filter(|p| !p.object.is_empty())
            .map(|p| p.len)
            .sum()
    }
}

/// The manifest's object for store `uuid` (hex).
pub fn manifest_object(uuid: &str) -> String {
    format!("cairn.{uuid}.backup")
}

/// The whole of object `name`, if it exists.
pub fn get(pool: &Pool, name: &str) -> io::Result<Option<Vec<u8>>> {
    let Some(len) = pool.size(name)? else {
        return Ok(None);
    };
    let mut buf = vec![0u8; len as usize];
    let n = pool.read(name, 0, &mut buf)?;
    buf.truncate(n);
    Ok(Some(buf))
}

/// A backup's objects on their way into the pool: written [`IO_THREADS`] at a time
/// (each a copy of its bytes), so that an upload keeps the pool's I/O threads busy. A
/// piece is in the pool only once [`Uploads::finish`] returned.
pub struct Uploads<'p> {
    pool: &'p Pool,
    queued: Vec<(String, Slice)>,
    /// Objects and bytes written so far.
    pub written: (u64, u64),
}

impl<'p> Uploads<'p> {
    pub fn new(pool: &'p Pool) -> Uploads<'p> {
        Uploads {
            pool,
            queued: Vec::new(),
            written: (0, 0),
        }
    }

    /// Write `data` as object `name` (no object if it is all zeros), and what the
    /// manifest says of it.
    pub fn put(&mut self, name: String, data: &[u8]) -> io::Result<Piece> {
        let zeros = data.iter().all(|&b| b == 0);
        let p = Piece {
            object: if zeros { String::new() } else { name },
            len: data.len() as u64,
            crc: cairn_format::crc(data),
        };
        if !zeros {
            self.queued.push((p.object.clone(), Slice::copy_of(data)));
            if self.queued.len() >= IO_THREADS {
                self.flush()?;
            }
        }
        Ok(p)
    }

    fn flush(&mut self) -> io::Result<()> {
        let batch = std::mem::take(&mut self.queued);
        let bytes: u64 = batch.iter().map(|(_, s)| s.range.len() as u64).sum();
        let n = batch.len() as u64;
        self.pool.put_many(batch)?;
        self.written = (self.written.0 + n, self.written.1 + bytes);
        Ok(())
    }

    /// Write what is still queued: every piece handed out is in the pool after this.
    pub fn finish(mut self) -> io::Result<(u64, u64)> {
        self.flush()?;
        Ok(self.written)
    }
}

/// The bytes `p` names, checked against its length and crc (`EIO` if they differ, a
/// missing object `ENOENT`).
pub fn fetch(pool: &Pool, p: &Piece) -> io::Result<Vec<u8>> {
    if p.object.is_empty() {
        return Ok(vec![0; p.len as usize]);
    }
    let data = get(pool, &p.object)?.ok_or_else(|| {
        fs_err(
            libc::ENOENT,
            format!("object {} of the backup is missing", p.object),
        )
    })?;
    if data.len() as u64 != p.len || cairn_format::crc(&data) != p.crc {
        return Err(fs_err(
            libc::EIO,
            format!(
                "object {} of the backup is damaged ({} bytes, crc {:08x}; the manifest \
                 says {} bytes, crc {:08x})",
                p.object,
                data.len(),
                cairn_format::crc(&data),
                p.len,
                p.crc
            ),
        ));
    }
    Ok(data)
}

/// The newest backup of store `uuid` (hex) in `pool`, if any.
pub fn read_manifest(pool: &Pool, uuid: &str) -> io::Result<Option<Manifest>> {
    let name = manifest_object(uuid);
    let Some(b) = get(pool, &name)? else {
        return Ok(None);
    };
    let m: Manifest = serde_json::from_slice(&b)
        .map_err(|e| fs_err(libc::EIO, format!("backup manifest {name}: {e}")))?;
    if m.version != MANIFEST_VERSION || m.uuid != uuid {
        return Err(fs_err(
            libc::EIO,
            format!(
                "backup manifest {name}: version {} of store {} (expected version \
                 {MANIFEST_VERSION} of {uuid})",
                m.version, m.uuid
            ),
        ));
    }
    Ok(Some(m))
}

/// Make `m` the store's newest backup.
pub fn write_manifest(pool: &Pool, m: &Manifest) -> io::Result<()> {
    let b = serde_json::to_vec(m).map_err(|e| fs_err(libc::EIO, e.to_string()))?;
    pool.put(&manifest_object(&m.uuid), &b)
}

/// The stores with a backup in `pool`: their newest manifests.
pub fn list(pool: &Pool) -> io::Result<Vec<Manifest>> {
    let mut out = Vec::new();
    for name in pool.list("cairn.")? {
        let Some(uuid) = name
            .strip_prefix("cairn.")
            .and_then(|r| r.strip_suffix(".backup"))
        else {
            continue;
        };
        if uuid.contains('.') {
            continue;
        }
        match read_manifest(pool, uuid) {
            Ok(Some(m)) => out.push(m),
            Ok(None) => {}
            Err(e) if errno_of(&e) == libc::EIO => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_by_key(|m| std::cmp::Reverse(m.taken_ns));
    Ok(out)
}

/// The store's uuid in hex, as object names spell it.
pub fn uuid_hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The object a running daemon of store `uuid` rewrites every few seconds, so that a
/// restore elsewhere can tell the store is not lost.
pub fn alive_object(uuid: &str) -> String {
    format!("cairn.{uuid}.alive")
}

/// Say that the store runs: now, and `who` (host, pid, directory).
pub fn heartbeat(pool: &Pool, uuid: &str, who: &str) -> io::Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    pool.put(&alive_object(uuid), format!("{now} {who}").as_bytes())
}

/// The last heartbeat of store `uuid`: when (ns since the Unix epoch) and who.
pub fn last_heartbeat(pool: &Pool, uuid: &str) -> io::Result<Option<(i64, String)>> {
    let Some(b) = get(pool, &alive_object(uuid))? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&b);
    let (ns, who) = text.split_once(' ').unwrap_or((&text, ""));
    Ok(ns.parse().ok().map(|ns| (ns, who.to_string())))
}
