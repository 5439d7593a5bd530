//! Cairn LibFS: the client side of the Cairn file system and its Rust API, which mirrors
//! `std::fs` (`cairn::Fs`, [`File`], [`OpenOptions`], [`Metadata`], [`ReadDir`], …).
//!
//! An [`Fs`] is one client of a store's daemon (`cairnd`, started automatically when
//! none runs). Every call that changes the file system appends **one transaction** to the
//! client's private operation log in NVM and is durable when it returns (written, written
//! back, one fence). Reads merge a DRAM overlay of what the daemon has not digested yet
//! with the shared area, which clients map read-only.
//!
//! Semantics worth knowing:
//! * Paths are inside the store, absolute or relative to its root; symlinks are followed
//!   (40 at most, then `ELOOP`) except in the last component of `symlink_metadata`,
//!   `read_link`, `remove_file`, `rename`, `hard_link` and `symlink`.
//! * Errors are `io::Error`s built with `cairn_area::fs_err`: `cairn_area::errno_of(&e)`
//!   gives the POSIX errno, and `e.kind()` matches what `std` would give.
//! * `noatime`: reads never update the access time.
//! * A file unlinked (or replaced by `rename`) while this process has it open keeps its
//!   inode until the last `File` handle closes; only then is `nlink = 0` logged. If the
//!   process dies first, the inode stays allocated without a name. A file another
//!   process unlinks while this one has it open is pinned by the daemon until this
//!   process closes it or dies (ARCHITECTURE.md, "Unlinked while open").
//! * Writes larger than a quarter of the log are split into several transactions, each
//!   atomic on its own.
//! * Advisory locks across processes, the kernel's (on a lock file per inode): [`File::lock`],
//!   [`File::unlock`], [`File::get_lock`] (POSIX or OFD record locks, [`LockKind`]) and
//!   [`File::flock`]; see the [`lock`] module for the exact semantics (owners, the
//!   POSIX close rule, release when a process dies, `EDEADLK`, timeouts).
//! * Processes share files through leases taken lazily from the daemon (PROTOCOL.md,
//!   "Leases"): a call that starts after another process's call returned sees its
//!   effects; threads of one process see each other's updates at once.

#![forbid(unsafe_code)]

mod conn;
pub mod extents;
mod file;
mod fs;
mod handles;
mod leases;
pub mod lock;
mod log;
mod meta;
mod ordmap;
mod overlay;
pub mod path;
mod ring;
mod tier;
mod view;

pub use conn::set_daemon_binary;
pub use file::{File, OpenOptions};
pub use fs::mapobj::{map_object_files, MapMut, MapObject, MAP_OBJECT_DIR};
pub use fs::special::{
    cairn_mounts, major_minor, makedev, mount_fsname, rendezvous_files, unescape_mountinfo,
    CairnMount,
};
pub use fs::At;
pub use lock::{FlockOp, LockInfo, LockKind, LockType};
pub use meta::{DirEntry, FileType, Metadata, Permissions, ReadDir};
pub use overlay::{InoHasher, InoMap};
pub use view::Map;

use cairn_area::{fs_err, StoreDir};
use cairn_proto::{Request, Response, StatusReport, XattrOp};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// A client of a Cairn store. `Send + Sync`: share it between threads by reference or
/// in an `Arc`. Dropping the last `Fs` (and its `File`s) says goodbye to the daemon,
/// which digests the log and releases the client's slot. Clones share the client.
#[derive(Debug, Clone)]
pub struct Fs {
    inner: Arc<fs::Inner>,
}

fn is_default_store(explicit: Option<&Path>) -> bool {
    explicit.is_none() && std::env::var_os("CAIRN_STORE").is_none_or(|s| s.is_empty())
}

/// Where a path-taking call looks: a path (`&str`, `Path`, `PathBuf`, …), resolved from
/// the store's root, or an [`At`]: a path relative to a directory given by its inode
/// number (the `*at` calls; absolute paths still start at the root).
pub trait Loc {
    fn at(&self) -> At<'_>;
}

impl<P: AsRef<Path> + ?Sized> Loc for P {
    fn at(&self) -> At<'_> {
        At::root(self.as_ref())
    }
}

impl Loc for At<'_> {
    fn at(&self) -> At<'_> {
        *self
    }
}

impl Fs {
    /// Open the existing store at `store`, starting its daemon if none runs.
    pub fn open(store: impl AsRef<Path>) -> io::Result<Fs> {
        let inner = Arc::new(fs::Inner::open(StoreDir::new(store.as_ref()), false)?);
        fs::Inner::start_upcalls(&inner)?;
        Ok(Fs { inner })
    }

    /// Open `store` if given, else `$CAIRN_STORE`, else the default store (which is
    /// created on first use).
    pub fn open_store(store: Option<&Path>) -> io::Result<Fs> {
        let create = is_default_store(store);
        let inner = Arc::new(fs::Inner::open(StoreDir::resolve(store), create)?);
        fs::Inner::start_upcalls(&inner)?;
        Ok(Fs { inner })
    }

    /// In a child process after `fork(2)`: give up this client, inherited from the
    /// parent, without disturbing it. The descriptors it shares with the parent (daemon
    /// connections, slot lock) are closed; nothing is said to the daemon. Afterwards
    /// neither this `Fs` nor any of its `File`s may be used or dropped: leak them all
    /// (`std::mem::forget`). The child opens its own `Fs` to go on.
    pub fn abandon_after_fork(&self) {
        self.inner.abandon();
    }

    /// The process changed its credentials (`setuid`, `setgid`, `setgroups`, …): check
    /// its calls with the new ones from now on, here and in the daemon (which reads them
    /// from the kernel). What it logged before is digested with the old ones first; what
    /// it has open stays usable, as on Linux. The shim calls this after every successful
    /// change. An error means the daemon could not be told; this client uses the new
    /// credentials anyway.
    pub fn credentials_changed(&self) -> io::Result<()> {
        self.inner.credentials_changed()
    }

    /// The uid, gid and supplementary groups this client checks permissions with.
    pub fn credentials(&self) -> (u32, u32, Vec<u32>) {
        let c = self.inner.cred();
        (c.uid, c.gid, c.groups.clone())
    }

    /// Say where the store's root appears in the namespace of the processes using this
    /// client (the shim's prefix, such as `/cairn`), or `None` (the default: the store
    /// is the whole namespace). With a root set, resolving a path that follows an
    /// absolute symbolic link to a path outside the prefix, or `..` at the store's root,
    /// fails with `EXDEV` carrying the host path to go on with
    /// ([`cairn_area::error::elsewhere_path`]), and an absolute target under the prefix
    /// resolves inside the store, as the kernel would resolve both. `EINVAL` for a
    /// prefix that is not absolute or has `.`/`..` components.
    pub fn set_link_root(&self, prefix: Option<&std::path::Path>) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let root = match prefix {
            None => None,
            Some(p) => Some(
                path::LinkRoot::new(p.as_os_str().as_bytes()).ok_or_else(|| {
                    fs_err(
                        libc::EINVAL,
                        format!("link root {}: not an absolute path of names", p.display()),
                    )
                })?,
            ),
        };
        *self
            .inner
            .link_root
            .write()
            .unwrap_or_else(|p| p.into_inner()) = root;
        Ok(())
    }

    /// Whether a descriptor this client holds open (daemon connections, slot lock, the
    /// NVM file, POSIX lock descriptors) is in `[first, last]`, or `None` if another
    /// thread is using one of them right now. A program about to close descriptors
    /// (`close`, `dup2` over one, `closefrom`) asks, and gives the client up first if
    /// one of them is among them ([`Fs::abandon_after_fork`] says how). Allocates
    /// nothing and never waits.
    pub fn holds_descriptor_in(&self, first: usize, last: usize) -> Option<bool> {
        self.inner.holds_descriptor_in(first, last)
    }

    /// Change the umask this client applies to the files and directories it creates
    /// (read from the process when the `Fs` was opened); for callers that track
    /// `umask(2)`, such as the `LD_PRELOAD` library.
    pub fn set_umask(&self, mask: u32) {
        self.inner
            .umask
            .store(mask & 0o777, std::sync::atomic::Ordering::Relaxed);
    }

    /// The store's UUID (from its superblock): host objects of the store carry it in
    /// their names (`cairn_area::host`).
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.area.superblock().uuid
    }

    /// The NVM tier file (for mapping digested data in place: [`File::map_plan`]).
    pub fn nvm_path(&self) -> &Path {
        &self.inner.nvm_path
    }

    /// A new read-only descriptor of the NVM tier file (a duplicate of this client's:
    /// the process may not be allowed to open the file by [`Fs::nvm_path`], after
    /// dropping its privileges, say), close-on-exec.
    pub fn nvm_file(&self) -> io::Result<std::fs::File> {
        self.inner.nvm.try_clone()
    }

    /// The store directory.
    pub fn store_dir(&self) -> &Path {
        self.inner.store_dir()
    }

    /// Create a directory (mode `0o777` minus the umask).
    pub fn create_dir(&self, p: impl Loc) -> io::Result<()> {
        self.inner.create_dir(p.at(), 0o777)
    }

    /// Create a directory with `mode` minus the umask (`mkdir(2)`), in one transaction.
    pub fn create_dir_mode(&self, p: impl Loc, mode: u32) -> io::Result<()> {
        self.inner.create_dir(p.at(), mode)
    }

    /// Create a directory and all missing parents; existing directories are fine.
    pub fn create_dir_all(&self, p: impl Loc) -> io::Result<()> {
        self.inner.create_dir_all(p.at())
    }

    /// `mknod(2)`: make a regular file (file type 0 or `S_IFREG`), FIFO (`S_IFIFO`),
    /// Unix-domain socket inode (`S_IFSOCK`) or, as root, a character or block device node
    /// (`S_IFCHR`, `S_IFBLK`; `rdev` from [`makedev`]) with `mode & 0o7777` minus the umask.
    /// `S_IFDIR` is `EPERM` (use `create_dir`), `S_IFLNK` and unknown types `EINVAL`.
    pub fn mknod(&self, p: impl Loc, mode: u32, rdev: u64) -> io::Result<()> {
        self.inner.mknod(p.at(), mode, rdev)
    }

    /// `mkfifo(3)`: make a FIFO with `mode` minus the umask.
    pub fn mkfifo(&self, p: impl Loc, mode: u32) -> io::Result<()> {
        self.inner.mknod(p.at(), libc::S_IFIFO | (mode & 0o7777), 0)
    }

    /// Open a FIFO or device node (following symlinks) with `open(2)` `flags`: a host
    /// descriptor of the FIFO's pipe (every process opening the same Cairn FIFO gets the
    /// same pipe; the open blocks for the other end as on Linux) or of the host device its
    /// numbers name. Cairn's permission bits are checked first. A socket is `ENXIO`, any
    /// other file `EINVAL`. `docs/ARCHITECTURE.md`, "Special files".
    pub fn open_special(&self, p: impl Loc, flags: i32) -> io::Result<std::os::fd::OwnedFd> {
        self.inner.open_special(p.at(), flags)
    }

    /// Bind the Unix-domain socket `fd` to the Cairn path `p` (`bind(2)`): makes the
    /// socket inode (mode `0o777` minus the umask, as Linux) and binds `fd` to its host
    /// address. `EADDRINUSE` if `p` exists.
    pub fn bind_unix(&self, p: impl Loc, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
        let p = p.at();
        let (host, made) = self.inner.bind_socket(p, 0o777)?;
        if let Err(e) = cairn_media::sys::bind_unix(fd, &host) {
            if made {
                let _ = self.inner.remove_file(p);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The host address (`sockaddr_un` path) a `connect` to the socket bound at Cairn
    /// path `p` must use. `ECONNREFUSED` if `p` is not a socket, `EACCES` without write
    /// permission on it.
    pub fn socket_address(&self, p: impl Loc) -> io::Result<PathBuf> {
        self.inner.socket_address(p.at())
    }

    /// Remove the host rendezvous of FIFOs and sockets whose inodes are gone (left by a
    /// crash between an unlink and its clean-up); `cairn stop` does this. Returns how
    /// many were removed.
    pub fn remove_stale_rendezvous(&self) -> io::Result<usize> {
        self.inner.remove_stale_rendezvous()
    }

    /// The entries of a directory (without `.` and `..`).
    pub fn read_dir(&self, p: impl Loc) -> io::Result<ReadDir> {
        let p = p.at();
        let entries = self
            .inner
            .read_dir_entries(p)?
            .into_iter()
            .map(|(name, ino, kind)| DirEntry {
                fs: self.inner.clone(),
                base: p.dir,
                dir: p.path.to_path_buf(),
                name,
                ino,
                kind,
            })
            .collect::<Vec<_>>();
        Ok(ReadDir {
            entries: entries.into_iter(),
        })
    }

    /// Remove a file or symlink (not a directory: `EISDIR`).
    pub fn remove_file(&self, p: impl Loc) -> io::Result<()> {
        self.inner.remove_file(p.at())
    }

    /// Remove an empty directory.
    pub fn remove_dir(&self, p: impl Loc) -> io::Result<()> {
        self.inner.remove_dir(p.at())
    }

    /// Remove a directory and everything below it (symlinks are removed, not followed).
    /// Not atomic: one transaction per removed entry.
    pub fn remove_dir_all(&self, p: impl Loc) -> io::Result<()> {
        self.inner.remove_dir_all(p.at())
    }

    /// Rename atomically; replaces a file, or an empty directory when moving a directory.
    pub fn rename(&self, from: impl Loc, to: impl Loc) -> io::Result<()> {
        self.inner.rename(from.at(), to.at(), false, false)
    }

    /// Rename only if `to` does not exist (`renameat2` with `RENAME_NOREPLACE`: `EEXIST`
    /// otherwise), atomically.
    pub fn rename_noreplace(&self, from: impl Loc, to: impl Loc) -> io::Result<()> {
        self.inner.rename(from.at(), to.at(), true, false)
    }

    /// Swap two existing entries atomically (`renameat2` with `RENAME_EXCHANGE`); they
    /// may be of different types.
    pub fn rename_exchange(&self, a: impl Loc, b: impl Loc) -> io::Result<()> {
        self.inner.rename(a.at(), b.at(), false, true)
    }

    /// Make `link` a new name of `original` (not a directory; `original` is not followed
    /// if it is a symlink).
    pub fn hard_link(&self, original: impl Loc, link: impl Loc) -> io::Result<()> {
        self.inner.hard_link(original.at(), link.at())
    }

    /// Make `link` a symbolic link to `target` (stored as given, resolved when used).
    pub fn symlink(&self, target: impl AsRef<Path>, link: impl Loc) -> io::Result<()> {
        self.inner.symlink(target.as_ref(), link.at())
    }

    /// The target of a symbolic link.
    pub fn read_link(&self, p: impl Loc) -> io::Result<PathBuf> {
        self.inner.read_link(p.at())
    }

    /// The value of extended attribute `name` (`getxattr`; `lgetxattr` unless `follow`).
    /// `ENODATA` if it has none. Names are `user.*`, `trusted.*` (root) or `security.*`;
    /// the rules are Linux's (ARCHITECTURE.md, "Extended attributes").
    pub fn get_xattr(&self, p: impl Loc, name: &[u8], follow: bool) -> io::Result<Vec<u8>> {
        let op = XattrOp::Get {
            name: name.to_vec(),
        };
        match self.inner.xattr(p.at(), follow, op)? {
            Response::XattrValue(v) => Ok(v),
            r => Err(conn::response_error("getxattr", r)),
        }
    }

    /// The names of the extended attributes the caller may see (`listxattr`), sorted.
    pub fn list_xattr(&self, p: impl Loc, follow: bool) -> io::Result<Vec<Vec<u8>>> {
        match self.inner.xattr(p.at(), follow, XattrOp::List)? {
            Response::XattrNames(v) => Ok(v),
            r => Err(conn::response_error("listxattr", r)),
        }
    }

    /// Set extended attribute `name` (`setxattr`): durable when this returns. `flags`:
    /// 0, `libc::XATTR_CREATE` (`EEXIST` if it exists) or `libc::XATTR_REPLACE`
    /// (`ENODATA` if it does not). Values up to 64 KiB (`E2BIG`); an inode holds up to
    /// 68 KiB of names and values (`ENOSPC`).
    pub fn set_xattr(
        &self,
        p: impl Loc,
        name: &[u8],
        value: &[u8],
        flags: i32,
        follow: bool,
    ) -> io::Result<()> {
        if flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            return Err(fs_err(libc::EINVAL, "setxattr: unknown flags"));
        }
        let op = XattrOp::Set {
            name: name.to_vec(),
            value: value.to_vec(),
            flags: flags as u32,
        };
        match self.inner.xattr(p.at(), follow, op)? {
            Response::Ok => Ok(()),
            r => Err(conn::response_error("setxattr", r)),
        }
    }

    /// Remove extended attribute `name` (`removexattr`; `ENODATA` if there is none).
    pub fn remove_xattr(&self, p: impl Loc, name: &[u8], follow: bool) -> io::Result<()> {
        let op = XattrOp::Remove {
            name: name.to_vec(),
        };
        match self.inner.xattr(p.at(), follow, op)? {
            Response::Ok => Ok(()),
            r => Err(conn::response_error("removexattr", r)),
        }
    }

    /// Metadata, following symlinks.
    pub fn metadata(&self, p: impl Loc) -> io::Result<Metadata> {
        self.inner.metadata(p.at())
    }

    /// Metadata of the path itself (a symlink is not followed).
    pub fn symlink_metadata(&self, p: impl Loc) -> io::Result<Metadata> {
        self.inner.symlink_metadata(p.at())
    }

    /// Change the permission bits (owner or root).
    pub fn set_permissions(&self, p: impl Loc, perm: Permissions) -> io::Result<()> {
        self.inner.set_permissions(p.at(), perm.mode())
    }

    /// Change the owner and/or group (`chown`; `None`: unchanged): the owner needs root,
    /// the group root or the owner being a member of it. Symlinks are followed.
    pub fn set_owner(&self, p: impl Loc, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        self.inner.set_owner(p.at(), true, uid, gid)
    }

    /// [`Fs::set_owner`] of a symlink itself (`lchown`).
    pub fn set_symlink_owner(
        &self,
        p: impl Loc,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        self.inner.set_owner(p.at(), false, uid, gid)
    }

    /// Set the access and/or modification time (`None`: unchanged; owner or root).
    pub fn set_times(
        &self,
        p: impl Loc,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> io::Result<()> {
        self.times(p.at(), true, atime, mtime)
    }

    /// Set both times to now (`utimensat` with NULL times, `touch`): the owner, root or
    /// anyone with write permission may (else `EACCES`). `follow`: a final symlink is
    /// followed.
    pub fn touch(&self, p: impl Loc, follow: bool) -> io::Result<()> {
        let now = Some(meta::now_ns());
        self.inner.set_times(p.at(), follow, now, now, true)
    }

    /// [`Fs::set_times`] of a symlink itself (`utimensat` with `AT_SYMLINK_NOFOLLOW`).
    pub fn set_symlink_times(
        &self,
        p: impl Loc,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> io::Result<()> {
        self.times(p.at(), false, atime, mtime)
    }

    fn times(
        &self,
        p: At<'_>,
        follow: bool,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> io::Result<()> {
        let (a, m) = (atime.map(meta::time_ns), mtime.map(meta::time_ns));
        self.inner.set_times(p, follow, a, m, false)
    }

    /// The whole contents of a file.
    pub fn read(&self, p: impl Loc) -> io::Result<Vec<u8>> {
        let p = p.at();
        let f = File::open(self, p)?;
        let m = f.metadata()?;
        if m.is_dir() {
            return Err(fs_err(
                libc::EISDIR,
                format!("read {}: is a directory", p.display()),
            ));
        }
        let len = m.len();
        let mut buf = vec![0u8; len as usize];
        let mut done = 0;
        while done < buf.len() {
            let n = f.read_at(&mut buf[done..], done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Create (or truncate) a file and write all of `data` to it (a write cut short,
    /// by `ENOSPC` for example, is continued, so the error is returned).
    pub fn write(&self, p: impl Loc, data: impl AsRef<[u8]>) -> io::Result<()> {
        let f = File::create(self, p)?;
        let data = data.as_ref();
        let mut done = 0;
        while done < data.len() {
            match f.write_at(&data[done..], done as u64)? {
                0 => return Err(fs_err(libc::EIO, "write: no progress")),
                n => done += n,
            }
        }
        Ok(())
    }

    /// Whether the path exists (following symlinks).
    pub fn exists(&self, p: impl Loc) -> bool {
        self.metadata(p).is_ok()
    }

    /// Metadata of inode `ino` (`ENOENT` if it is free).
    pub fn metadata_ino(&self, ino: u64) -> io::Result<Metadata> {
        self.inner.metadata_ino(ino)
    }

    /// The daemon's status report.
    pub fn status(&self) -> io::Result<StatusReport> {
        self.inner.status()
    }

    /// This client's cache of lower-tier data: hits, misses and blocks read from the
    /// devices (misses and read-ahead); `None` without lower tiers or cache.
    pub fn read_cache_stats(&self) -> Option<(u64, u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.inner.area.cache()?.stats;
        Some((
            s.hits.load(Relaxed),
            s.misses.load(Relaxed),
            s.blocks_read.load(Relaxed),
        ))
    }

    /// Call `hook` whenever this client loses the lease on an inode (`Some(ino)`: another
    /// client is about to change it) or every lease (`None`: the daemon expired this
    /// client, or restarted and did not keep them), before the daemon is told: whatever
    /// the hook caches about those inodes is from then on possibly stale. The FUSE mount
    /// drops the kernel's cached attributes with it. The hook runs on the upcall thread or
    /// inside an operation, with the client's state locked: it must not call into this
    /// `Fs`. `None` removes it.
    pub fn on_lease_lost(&self, hook: Option<Box<dyn Fn(Option<u64>) + Send + Sync>>) {
        self.inner.set_lease_lost_hook(hook);
    }

    /// Fold every map object of the store that no process maps (write back its changed
    /// pages and remove it; `docs/ARCHITECTURE.md`, "Shared mappings"): `cairn stop`
    /// does this before stopping the daemon. Returns the number folded.
    pub fn fold_map_objects(&self) -> io::Result<usize> {
        self.inner.fold_all()
    }

    /// Digest this client's log now and wait for it (never needed for durability).
    pub fn digest(&self) -> io::Result<()> {
        self.inner.digest()
    }

    /// Segments (crate `cairn-sj`; PROTOCOL.md, "Segment registry"): ask the daemon for
    /// the address range the reservation names. This client's log is digested first, so
    /// the daemon sees the segment's file. Returns the base.
    pub fn sj_reserve(&self, r: cairn_proto::SjReservation) -> io::Result<u64> {
        match self.inner.daemon_call(&Request::SjReserve(r), true)? {
            Response::SjReserved { base } => Ok(base),
            r => Err(conn::response_error("reserving a segment range", r)),
        }
    }

    /// Give back the range of segment file `ino`/`gen` (it is being removed).
    pub fn sj_release(&self, ino: u64, gen: u64) -> io::Result<()> {
        match self
            .inner
            .daemon_call(&Request::SjRelease { ino, gen }, true)?
        {
            Response::Ok => Ok(()),
            r => Err(conn::response_error("releasing a segment range", r)),
        }
    }

    /// Have the daemon remove the resident copy of segment `ino`/`gen` (and with `undo`
    /// its undo log): the segment was removed, or this process may write it and nobody
    /// has it attached (else `EBUSY`).
    pub fn sj_drop(&self, ino: u64, gen: u64, undo: bool) -> io::Result<()> {
        match self
            .inner
            .daemon_call(&Request::SjDrop { ino, gen, undo }, true)?
        {
            Response::Ok => Ok(()),
            r => Err(conn::response_error("dropping a resident copy", r)),
        }
    }

    /// The segment registry's ranges, sorted by base.
    pub fn sj_ranges(&self) -> io::Result<Vec<cairn_proto::SjRange>> {
        match self.inner.daemon_call(&Request::SjRanges, false)? {
            Response::SjRanges(r) => Ok(r),
            r => Err(conn::response_error("listing segment ranges", r)),
        }
    }
}

/// The status of the daemon of `store` (else `$CAIRN_STORE`, else the default store),
/// without registering as a client; starts the daemon if none runs.
pub fn daemon_status(store: Option<&Path>) -> io::Result<StatusReport> {
    let create = is_default_store(store);
    let dir = StoreDir::resolve(store);
    let mut c = conn::Conn::connect(&dir, create)?;
    match c.roundtrip(&Request::Status)? {
        Response::Status(r) => Ok(r),
        r => Err(conn::response_error("status", r)),
    }
}

/// Ask the daemon of `store` to take a backup of the whole store now, into the pool
/// `remote` (`ceph:POOL`; `None`: the store's), and wait for it.
pub fn daemon_backup(
    store: Option<&Path>,
    remote: Option<&str>,
) -> io::Result<cairn_proto::BackupReport> {
    let dir = StoreDir::resolve(store);
    let mut c = conn::Conn::connect(&dir, is_default_store(store))?;
    match c.roundtrip(&Request::Backup {
        remote: remote.map(str::to_string),
    })? {
        Response::BackedUp(r) => Ok(r),
        r => Err(conn::response_error("backup", r)),
    }
}

/// Ask the daemon of `store` to move up to `max_bytes` of the coldest data of tier
/// `from` (0 = NVM, 1 = SSD, 2 = HDD) to tier `to`, the one below it the store has, in
/// whole segments, without registering as a client. Returns the bytes moved and the
/// bytes of `from` still in use.
pub fn daemon_migrate(
    store: Option<&Path>,
    from: u8,
    to: u8,
    max_bytes: u64,
) -> io::Result<(u64, u64)> {
    let dir = StoreDir::resolve(store);
    let mut c = conn::Conn::connect(&dir, false)?;
    match c.roundtrip(&Request::Migrate {
        from,
        to,
        max_bytes,
    })? {
        Response::Migrated { bytes, used_bytes } => Ok((bytes, used_bytes)),
        r => Err(conn::response_error("migrate", r)),
    }
}

/// Ask the daemon for one cleaning round on lower tier `tier` (1 = SSD, 2 = HDD).
/// Returns the bytes moved (0: no two partly dead segments fit in one) and the bytes of
/// the tier in use.
pub fn daemon_clean(store: Option<&Path>, tier: u8) -> io::Result<(u64, u64)> {
    let dir = StoreDir::resolve(store);
    let mut c = conn::Conn::connect(&dir, false)?;
    match c.roundtrip(&Request::Clean { tier })? {
        Response::Migrated { bytes, used_bytes } => Ok((bytes, used_bytes)),
        r => Err(conn::response_error("clean", r)),
    }
}

/// Stop the daemon of the store cleanly (it digests every log first) if it runs, and
/// wait until it has exited (up to 30 s).
pub fn daemon_shutdown(store: Option<&Path>) -> io::Result<()> {
    let dir = StoreDir::resolve(store);
    let Ok(mut c) = conn::Conn::connect_only(&dir) else {
        return Ok(()); // Not running.
    };
    let pid = c.peer_pid();
    match c.roundtrip(&Request::Shutdown) {
        Ok(Response::Ok) => {}
        Ok(r) => return Err(conn::response_error("shutdown", r)),
        // The daemon closed the connection while stopping.
        Err(_) => {}
    }
    // Wait until the daemon lock is free (the daemon has stopped) and its process has
    // exited (so that, say, its binary may be replaced at once).
    let deadline = Instant::now() + Duration::from_secs(30);
    let lock_path = dir.daemon_lock_path();
    loop {
        let unlocked = match std::fs::File::open(&lock_path) {
            Ok(f) => {
                let free = cairn_media::sys::flock_exclusive(&f, true).is_ok();
                if free {
                    let _ = cairn_media::sys::flock_unlock(&f);
                }
                free
            }
            Err(_) => true,
        };
        if unlocked && !pid.is_some_and(cairn_media::owner::running) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(fs_err(
                libc::ETIMEDOUT,
                format!(
                    "the daemon of {} did not exit within 30 s after Shutdown",
                    dir.path.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_sync() {
        assert_send_sync::<Fs>();
        assert_send_sync::<File>();
        assert_send_sync::<DirEntry>();
    }
}
