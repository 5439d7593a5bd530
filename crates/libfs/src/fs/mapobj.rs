//! Shared mappings of Cairn files (`MAP_SHARED`): the map object.
//!
//! Every process that maps a file shared maps one host shared-memory file, the file's
//! *map object*, `/dev/shm/cairn-<store uuid>.map-<ino>-<generation>`. The kernel keeps
//! the mappings of all processes coherent (they are one page cache), the stores of a
//! process killed at any instruction stay in it, and a truncation below a mapped page
//! raises `SIGBUS` on access as on any Linux file system.
//!
//! While a file has a map object the object holds its current bytes, and the log plus
//! the shared area hold what was last *written back*. The rules (ARCHITECTURE.md,
//! "Shared mappings"):
//!
//! 1. The daemon alone creates an object (filled from the file) and removes it, and it
//!    hands out descriptors to it only after checking the client's permission on the
//!    file (`Request::MapObject`, PROTOCOL.md "Map objects"): read-write for the owner
//!    or a writer, read-only for a reader. The object is mode 0600, the daemon's, so
//!    nobody opens it by name, and the kernel keeps a client from writing the object of
//!    a file it may not write. Every client checks for the object when it is granted a
//!    lease ([`Inner::learn_object`]: a `stat` of its name, and a descriptor from the
//!    daemon if it exists), so a client holding any lease on a file knows whether it
//!    has an object. Creating one needs the write lease.
//! 2. A client that knows of an object reads the file's data from it, and writes both
//!    to its log (durable, as always) and to the object; `set_len` truncates both.
//! 3. Write-back (`msync`, `munmap`, `fsync`, exit, [`MapMut::flush`]): under the write
//!    lease, the object's pages that differ from the logged state are logged as
//!    `WRITE`s. From then on they are durable on the NVM tier like any write.
//! 4. Each process that maps the object holds a shared `flock` on it (inherited by a
//!    child after `fork`, dropped when the process dies). Whoever holds the write lease
//!    and can take the lock exclusively knows nobody maps it: it writes back and asks
//!    the daemon to remove the object, which takes the lock exclusively again first
//!    (a *fold*): at a process's last unmap, at the grant of a write lease (a mapper
//!    died without writing back), and at `cairn stop`.

use super::{Inner, Lease, State};
use crate::conn::response_error;
use cairn_area::host;
use cairn_area::{errno_of, fs_err};
use cairn_format::inode::Kind;
use cairn_media::sys;
use cairn_proto::{Request, Response};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

/// Where map objects live: the host's shared memory (tmpfs).
pub const MAP_OBJECT_DIR: &str = host::HOST_OBJECT_DIR;

/// Pages compared per step of a write-back.
const STEP: usize = 256 << 10;
const PAGE: usize = 4096;

/// The name prefix of a store's map objects.
pub(crate) fn object_prefix(uuid: &[u8; 16]) -> String {
    host::kind_prefix(uuid, "map")
}

fn object_path(uuid: &[u8; 16], ino: u64, gen: u64) -> PathBuf {
    host::object_path(uuid, host::MAP_KIND, ino, gen)
}

/// A process's attachment to a file's map object: a descriptor of the object from the
/// daemon, read-write if this client may write the file, holding a shared `flock` (the
/// mark that this process maps it). Map it with [`MapObject::file`] at the file offsets
/// of the mapping. Shared by all mappings of the file in the process; give it back with
/// [`crate::File::map_release`].
#[derive(Debug)]
pub struct MapObject {
    file: File,
    writable: bool,
    ino: u64,
    gen: u64,
}

impl MapObject {
    /// The object (the offsets of the file are the object's): open read-write if
    /// [`MapObject::writable`], else read-only.
    pub fn file(&self) -> &File {
        &self.file
    }
    /// Whether [`MapObject::file`] is open read-write.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl Inner {
    pub(super) fn uuid(&self) -> [u8; 16] {
        self.area.superblock().uuid
    }

    /// A descriptor of the map object of `ino`/`gen` from the daemon
    /// (`Request::MapObject`, after it digested our records): read-write if `write`
    /// and the daemon found that we may write the file (the second value says which),
    /// else read-only; made from the file first if it has none and `create`.
    fn object_fd(
        &self,
        st: &mut State,
        ino: u64,
        gen: u64,
        write: bool,
        create: bool,
    ) -> io::Result<(File, bool)> {
        let req = Request::MapObject {
            ino,
            gen,
            write,
            create,
            tail_lsn: st.log.tail(),
        };
        self.request_object(st, &req, "map object")
    }

    /// Send `req`, answered `MapObject { writable }` and one descriptor (of a map object
    /// or a segment's object): the descriptor and whether it is read-write.
    pub(super) fn request_object(
        &self,
        st: &mut State,
        req: &Request,
        what: &str,
    ) -> io::Result<(File, bool)> {
        match self.request_fds(st, req)? {
            (Response::MapObject { writable }, fds) if fds.len() == 1 => {
                let fd = fds.into_iter().next().expect("one descriptor");
                Ok((File::from(fd), writable))
            }
            (r, _) => Err(response_error(what, r)),
        }
    }

    /// At the grant of a lease on `ino` (state lock held): learn whether the file has a
    /// map object (a descriptor of it, for reads and, if we may write the file,
    /// writes), and with the write lease fold an object nobody maps any more (its
    /// mapper died before writing back). No object, the common case, costs a `stat`.
    pub(super) fn learn_object(&self, st: &mut State, ino: u64, write: bool) {
        st.objs.remove(&ino);
        let Ok((gen, attrs)) = self.attrs_held(st, ino) else {
            return;
        };
        if attrs.kind != Kind::File {
            return;
        }
        if std::fs::symlink_metadata(object_path(&self.uuid(), ino, gen)).is_err() {
            return;
        }
        let may_write = self.cred().owns_or_writes(&attrs);
        let Ok((f, _)) = self.object_fd(st, ino, gen, may_write, false) else {
            return;
        };
        st.objs.insert(ino, Arc::new(f));
        if write && st.leases.get(ino) == Some(Lease::Write) {
            // A fold that fails (a full store) leaves the object, and its bytes, for
            // the next one.
            let _ = self.fold(st, ino, gen);
        }
    }

    /// If nobody maps the map object of `ino`/`gen` (we take its lock exclusively),
    /// write it back and have the daemon remove it. Needs the write lease. Returns
    /// whether it was removed.
    fn fold(&self, st: &mut State, ino: u64, gen: u64) -> io::Result<bool> {
        match self.object_fd(st, ino, gen, false, false) {
            Ok((f, _)) => {
                match sys::flock_exclusive(&f, true) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) => return Err(e),
                }
                self.write_back(st, ino, &f, 0, u64::MAX)?;
                // Our lock goes with the descriptor; the daemon takes it again.
            }
            Err(e) if errno_of(&e) == libc::ENOENT => {
                st.objs.remove(&ino);
                return Ok(true);
            }
            // The file is gone (or is another file now): nothing to write back to.
            Err(e) if errno_of(&e) == libc::ESTALE => {}
            Err(e) => return Err(e),
        }
        match self.request(st, &Request::MapRemove { ino, gen })? {
            Response::Ok => {
                st.objs.remove(&ino);
                Ok(true)
            }
            Response::Error { errno, .. } if errno == libc::EBUSY => Ok(false),
            r => Err(response_error("map object removal", r)),
        }
    }

    /// Log the pages of `[off, off + len)` (within the file's size) whose bytes in
    /// object `obj` differ from the logged state (write lease held): runs of whole pages,
    /// the last one cut at the size. Not written to the object again, so a mapper's
    /// store racing with the write-back stays there. `EACCES` if a page differs and
    /// this client may not write the file (the daemon would refuse its log).
    fn write_back(
        &self,
        st: &mut State,
        ino: u64,
        obj: &File,
        off: u64,
        len: u64,
    ) -> io::Result<()> {
        let (_, attrs) = self.attrs_held(st, ino)?;
        let end = off.saturating_add(len).min(attrs.size);
        let (mut a, mut b) = (vec![0u8; STEP], vec![0u8; STEP]);
        let mut pos = off - off % PAGE as u64;
        while pos < end {
            let n = ((end - pos) as usize).min(STEP);
            read_full(obj, &mut a[..n], pos)?;
            self.read_logged(st, ino, pos, &mut b[..n])?;
            for (p, q) in dirty_runs(&a[..n], &b[..n]) {
                // The daemon's rule for `WRITE`: it would refuse the log otherwise.
                if !self.cred().owns_or_writes(&attrs) {
                    return Err(fs_err(
                        libc::EACCES,
                        format!(
                            "write-back of a shared mapping of inode {ino}: no write permission"
                        ),
                    ));
                }
                let (_, w) = self.write_logged(st, ino, Some(pos + p as u64), &a[p..q])?;
                if w < q - p {
                    return Err(fs_err(
                        libc::EIO,
                        "write-back of a shared mapping: short write",
                    ));
                }
            }
            pos += n as u64;
        }
        Ok(())
    }

    /// Attach to the map object of `ino`, creating it if the file has none: the object
    /// every `MAP_SHARED` mapping of the file maps; read-write if `write` and we may
    /// write the file (the daemon checks), else read-only. Takes the write lease.
    pub(crate) fn map_attach(&self, ino: u64, write: bool) -> io::Result<Arc<MapObject>> {
        self.run(|st| {
            self.need(st, ino, true)?;
            if st.leases.get(ino) == Some(Lease::Mediated) {
                return Err(fs_err(
                    libc::ENOTSUP,
                    "mmap MAP_SHARED: the file is in shared-write mode (shared_write in \
                     cairn.toml); it cannot be mapped shared until the mode ends",
                ));
            }
            let (gen, attrs) = self.attrs_held(st, ino)?;
            if attrs.kind != Kind::File {
                return Err(fs_err(libc::ENODEV, "mmap: not a regular file"));
            }
            if let Some(o) = st.attached.get(&ino).and_then(Weak::upgrade) {
                if o.gen == gen && st.objs.contains_key(&ino) && (o.writable || !write) {
                    return Ok(o);
                }
            }
            let (file, writable) = self.object_fd(st, ino, gen, write, true)?;
            sys::flock_shared(&file, false)?;
            if !st.objs.contains_key(&ino) {
                // A descriptor of its own: the attachment's lock must go with the
                // attachment.
                let (f, _) = self.object_fd(st, ino, gen, writable, false)?;
                st.objs.insert(ino, Arc::new(f));
            }
            let obj = Arc::new(MapObject {
                file,
                writable,
                ino,
                gen,
            });
            st.attached.insert(ino, Arc::downgrade(&obj));
            Ok(obj)
        })
    }

    /// A read-only descriptor of `obj` holding the shared lock of a mapping, for a
    /// read-only mapping (`mprotect` cannot make it writable).
    pub(crate) fn map_read_only(&self, obj: &MapObject) -> io::Result<File> {
        if !obj.writable {
            return obj.file.try_clone();
        }
        self.run(|st| {
            self.need(st, obj.ino, false)?;
            let (f, _) = self.object_fd(st, obj.ino, obj.gen, false, false)?;
            sys::flock_shared(&f, false)?;
            Ok(f)
        })
    }

    /// Write back `[off, off + len)` of `obj` (`msync`).
    pub(crate) fn map_sync(&self, obj: &MapObject, off: u64, len: u64) -> io::Result<()> {
        let ino = obj.ino;
        self.run(|st| {
            self.need(st, ino, true)?;
            let gen = match self.attrs_held(st, ino) {
                Ok((gen, _)) => gen,
                Err(e) if cairn_area::errno_of(&e) == libc::ENOENT => return Ok(()),
                Err(e) => return Err(e),
            };
            if gen != obj.gen {
                return Ok(());
            }
            self.write_back(st, ino, &obj.file, off, len)
        })
    }

    /// `fsync`: write back the map object of `ino`, if it has one (the dirty pages of
    /// every mapping of the file, as Linux's `fsync` writes back a file's mapped pages).
    pub(crate) fn sync_object(&self, ino: u64) -> io::Result<()> {
        self.run(|st| {
            self.need(st, ino, false)?;
            if !st.objs.contains_key(&ino) {
                return Ok(());
            }
            self.need(st, ino, true)?;
            let Some(o) = st.objs.get(&ino).cloned() else {
                return Ok(());
            };
            self.write_back(st, ino, &o, 0, u64::MAX)
        })
    }

    /// A process's mapping of `obj` is gone (written back by the caller, as far as it
    /// wanted). The last attachment in this process drops its lock and folds the object
    /// if no other process maps it.
    pub(crate) fn map_release(&self, obj: Arc<MapObject>) -> io::Result<()> {
        if Arc::strong_count(&obj) > 1 {
            return Ok(());
        }
        let (ino, gen) = (obj.ino, obj.gen);
        drop(obj);
        self.run(|st| {
            if st.attached.get(&ino).is_some_and(|w| w.strong_count() == 0) {
                st.attached.remove(&ino);
            }
            self.need(st, ino, true)?;
            self.fold(st, ino, gen).map(|_| ())
        })
    }

    /// Fold every map object of this store that nobody maps (`cairn stop` does this
    /// before stopping the daemon), and remove temporary objects of dead processes.
    /// Objects that are not the store's (`EACCES`) are skipped. Returns the number of
    /// objects folded.
    pub(crate) fn fold_all(&self) -> io::Result<usize> {
        let prefix = object_prefix(&self.uuid());
        let mut folded = 0;
        for e in std::fs::read_dir(MAP_OBJECT_DIR)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) {
                continue;
            }
            if let Some((_, pid)) = name.rsplit_once(".new-") {
                if pid.parse().is_ok_and(|p| !sys::pid_alive(p)) {
                    let _ = std::fs::remove_file(e.path());
                }
                continue;
            }
            let Some((ino, gen)) = host::parse_name(&name, &prefix) else {
                continue;
            };
            if !self.area.layout().ino_valid(ino) {
                continue;
            }
            match self.run(|st| {
                self.need(st, ino, true)?;
                self.fold(st, ino, gen)
            }) {
                Ok(true) => folded += 1,
                Ok(false) => {}
                // Not the store's (planted by another user, or made by an earlier
                // build): not used and left as it is, rather than keep the store from
                // stopping.
                Err(e) if errno_of(&e) == libc::EACCES => {}
                Err(e) => return Err(e),
            }
        }
        Ok(folded)
    }
}

/// The runs `[p, q)` of whole pages (the last one cut at the slices' end) where `a` and
/// `b` differ; adjacent pages make one run.
fn dirty_runs(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
    let n = a.len().min(b.len());
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut p = 0;
    while p < n {
        let e = (p + PAGE).min(n);
        if a[p..e] != b[p..e] {
            match runs.last_mut() {
                Some(r) if r.1 == p => r.1 = e,
                _ => runs.push((p, e)),
            }
        }
        p = e;
    }
    runs
}

/// The map objects (and temporary objects being filled) of the store in `store_dir`,
/// named by the UUID in its NVM file's superblock: whether `cairn stop` has any to fold,
/// and what is left behind when a store is deleted without `cairn stop`.
pub fn map_object_files(store_dir: &Path) -> io::Result<Vec<PathBuf>> {
    let uuid = host::store_uuid(store_dir)?;
    let prefix = object_prefix(&uuid);
    let mut out = host::list(&uuid);
    out.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
    });
    Ok(out)
}

/// Read exactly `buf.len()` bytes at `off` of `f`; bytes past its end read as zeros.
pub(super) fn read_full(f: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A shared, writable mapping of part of a Cairn file ([`crate::File::map_mut`]):
/// the Rust API's `mmap(MAP_SHARED)`. Every process mapping the file sees the others'
/// stores at once; [`MapMut::flush`] (or dropping it) makes them durable like a write.
/// Dropping it ignores errors (a full store: the stores stay in the map object for a
/// later write-back); call `flush` first to see them.
/// Access goes through copies and atomics, never Rust references (other processes may
/// change the bytes at any time).
pub struct MapMut {
    /// `None` once unmapped (in `drop`, before the object is given back: the mapping's
    /// pages hold the object's lock).
    map: Option<cairn_media::Mapping>,
    obj: Option<Arc<MapObject>>,
    fs: Arc<Inner>,
    off: u64,
}

impl MapMut {
    pub(crate) fn new(fs: Arc<Inner>, ino: u64, off: u64, len: usize) -> io::Result<MapMut> {
        if len == 0 || !off.is_multiple_of(PAGE as u64) {
            return Err(fs_err(
                libc::EINVAL,
                "map_mut: the length must be positive and the offset a multiple of 4096",
            ));
        }
        let obj = fs.map_attach(ino, true)?;
        let map = match cairn_media::Mapping::new(&obj.file, off, len, true, false) {
            Ok(m) => m,
            Err(e) => {
                let _ = fs.map_release(obj);
                return Err(e);
            }
        };
        Ok(MapMut {
            map: Some(map),
            obj: Some(obj),
            fs,
            off,
        })
    }

    fn map(&self) -> &cairn_media::Mapping {
        self.map.as_ref().expect("mapped until dropped")
    }
    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.map().len()
    }
    /// Whether the mapping is empty (never).
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
    /// Copy `buf.len()` bytes at `off` (from the mapping's start) into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> io::Result<()> {
        self.map().read(off, buf)
    }
    /// Store `data` at `off`.
    pub fn write(&self, off: usize, data: &[u8]) -> io::Result<()> {
        self.map().write(off, data)
    }
    /// Atomic 8-byte load at `off` (8-aligned).
    pub fn load_u64(&self, off: usize) -> io::Result<u64> {
        self.map().load_u64(off)
    }
    /// Atomic 8-byte store at `off` (8-aligned).
    pub fn store_u64(&self, off: usize, v: u64) -> io::Result<()> {
        self.map().store_u64(off, v)
    }
    /// Atomic 8-byte add at `off` (8-aligned); the previous value.
    pub fn fetch_add_u64(&self, off: usize, v: u64) -> io::Result<u64> {
        self.map().fetch_add_u64(off, v)
    }
    /// The mapping's first byte, for callers that manage access themselves.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map().as_ptr()
    }
    /// `msync`: the changed pages of the whole mapping are logged (durable) and visible
    /// to every reader of the file.
    pub fn flush(&self) -> io::Result<()> {
        self.flush_range(0, self.len())
    }
    /// `msync` of `[off, off + len)` of the mapping.
    pub fn flush_range(&self, off: usize, len: usize) -> io::Result<()> {
        match &self.obj {
            Some(o) => self
                .fs
                .map_sync(o, self.off + off as u64, len.min(self.len()) as u64),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for MapMut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapMut")
            .field("off", &self.off)
            .field("len", &self.map.as_ref().map_or(0, |m| m.len()))
            .finish()
    }
}

impl Drop for MapMut {
    fn drop(&mut self) {
        if let Some(o) = self.obj.take() {
            let len = self.len() as u64;
            let _ = self.fs.map_sync(&o, self.off, len);
            self.map = None;
            let _ = self.fs.map_release(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_changed_pages() {
        let b = vec![0u8; 3 * PAGE + 10];
        let mut a = b.clone();
        assert!(dirty_runs(&a, &b).is_empty());
        a[1] = 1;
        a[PAGE + 5] = 1;
        a[3 * PAGE + 9] = 1;
        assert_eq!(
            dirty_runs(&a, &b),
            vec![(0, 2 * PAGE), (3 * PAGE, 3 * PAGE + 10)]
        );
        a[PAGE + 5] = 0;
        assert_eq!(
            dirty_runs(&a, &b),
            vec![(0, PAGE), (3 * PAGE, 3 * PAGE + 10)]
        );
    }
}
