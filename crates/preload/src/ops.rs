//! What each interposed call does to a Cairn file, in safe Rust over LibFS. The C entry
//! points (`abi_*.rs`) decide which paths and descriptors are Cairn's, convert the raw
//! arguments and call these.

use crate::paths;
use crate::state::{self, bytes_path, err};
use crate::table::{self, Dent, Ofd};
use cairn::{At, Fs, Metadata};
use std::ffi::CString;
use std::io;
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The device number Cairn files report (`st_dev`): fixed, and unlike any block device.
pub const DEV: u64 = 0xca100; // major 0xca1, minor 0
pub const BLOCK: u64 = 4096;

/// A path inside Cairn: relative paths start at directory inode `dir`.
#[derive(Debug, Clone)]
pub struct CPath {
    pub dir: u64,
    pub path: Vec<u8>,
    /// What `path` is relative to, host-visible (for [`CPath::host`]).
    pub base: Base,
}

/// The host-visible directory a Cairn path starts from.
#[derive(Debug, Clone)]
pub enum Base {
    /// The prefix (an absolute path).
    Prefix,
    /// A directory at this absolute, canonical path.
    Dir(Vec<u8>),
    Unknown,
}

impl CPath {
    /// The host-visible absolute path, read lexically, if its base is known (computed
    /// only when asked: opening a directory remembers it).
    pub fn host(&self) -> Option<Vec<u8>> {
        match &self.base {
            Base::Prefix => {
                let rel = self.path.strip_prefix(b"/").unwrap_or(&self.path);
                Some(paths::join_lexical(state::config().prefix(), rel))
            }
            Base::Dir(b) => Some(paths::join_lexical(b, &self.path)),
            Base::Unknown => None,
        }
    }

    pub fn at(&self) -> At<'_> {
        At {
            dir: self.dir,
            path: bytes_path(&self.path),
        }
    }
}

/// Where a path argument goes.
#[derive(Debug)]
pub enum Where {
    /// To the C library, as given (`None`) or rewritten to an absolute path (a relative
    /// path that climbs out of a Cairn current directory).
    Host(Option<Vec<u8>>),
    Cairn(CPath),
}

fn root_ino() -> u64 {
    At::root(bytes_path(b"/")).dir
}

/// Classify `path` relative to `dirfd` (`AT_FDCWD`: the current directory).
pub fn classify(dirfd: c_int, path: &[u8]) -> io::Result<Where> {
    let prefix = state::config().prefix();
    if path.starts_with(b"/") {
        return Ok(match paths::strip_prefix(path, prefix) {
            Some(rest) => Where::Cairn(CPath {
                dir: root_ino(),
                path: rest.to_vec(),
                base: Base::Prefix,
            }),
            None => Where::Host(None),
        });
    }
    let (dir, base) = if dirfd == libc::AT_FDCWD {
        match state::cwd() {
            None => return Ok(Where::Host(None)),
            Some(c) => (state::cwd_ino(&c)?, Some(c.path)),
        }
    } else {
        match table::get(dirfd) {
            None => return Ok(Where::Host(None)),
            Some(_) if path.is_empty() => {
                // `AT_EMPTY_PATH` is handled before; without it, as Linux.
                return Err(err(libc::ENOENT, "empty path"));
            }
            Some(o) if !o.dir => return Err(err(libc::ENOTDIR, "not a directory")),
            Some(o) => (o.ino, o.path.clone()),
        }
    };
    if path.is_empty() {
        return Err(err(libc::ENOENT, "empty path"));
    }
    if let Some(b) = &base {
        if paths::climbs_out(b, path, prefix) {
            return Ok(Where::Host(Some(paths::join_lexical(b, path))));
        }
    }
    Ok(Where::Cairn(CPath {
        dir,
        path: path.to_vec(),
        base: base.map_or(Base::Unknown, Base::Dir),
    }))
}

fn fs() -> io::Result<Arc<Fs>> {
    state::fs()
}

fn ofd_meta(o: &Ofd) -> io::Result<Metadata> {
    if o.dir || (!o.read && !o.write) {
        fs()?.metadata_ino(o.ino)
    } else {
        o.file()?.metadata()
    }
}

// ---- open / close ---------------------------------------------------------------

/// `open(path, flags, mode)` of a Cairn path: the new descriptor.
pub fn open(cp: &CPath, flags: c_int, mode: u32) -> io::Result<c_int> {
    let acc = flags & libc::O_ACCMODE;
    if acc == libc::O_ACCMODE {
        return Err(err(libc::EINVAL, "open: invalid access mode"));
    }
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        // An unnamed file in the directory `cp` (linkable unless O_EXCL).
        if acc == libc::O_RDONLY {
            return Err(err(
                libc::EINVAL,
                "open: O_TMPFILE needs O_WRONLY or O_RDWR",
            ));
        }
        let fs = fs()?;
        let f = cairn::OpenOptions::new()
            .read(acc == libc::O_RDWR)
            .write(true)
            .mode(mode & 0o7777)
            .tmpfile(&fs, cp.at(), flags & libc::O_EXCL == 0)?;
        let fd = table::placeholder(flags & libc::O_CLOEXEC != 0)?;
        table::insert(
            fd,
            Arc::new(Ofd::new_file(f, acc == libc::O_RDWR, true, false)),
        );
        return Ok(fd);
    }
    let path_only = flags & libc::O_PATH != 0;
    let (read, write) = if path_only {
        (false, false)
    } else {
        (acc != libc::O_WRONLY, acc != libc::O_RDONLY)
    };
    let create = flags & libc::O_CREAT != 0 && !path_only;
    let excl = create && flags & libc::O_EXCL != 0;
    let nofollow = flags & libc::O_NOFOLLOW != 0;
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let fs = fs()?;
    let at = cp.at();
    // O_PATH and O_NOFOLLOW are about the last component itself: looked at first.
    // Every other open resolves the path once, in LibFS.
    if path_only || (nofollow && !excl) {
        let m = if nofollow {
            fs.symlink_metadata(at)
        } else {
            fs.metadata(at)
        };
        match m {
            Ok(m) if m.is_symlink() && !path_only => {
                return Err(err(
                    libc::ELOOP,
                    "open: the last component is a symbolic link (O_NOFOLLOW)",
                ))
            }
            Ok(m) if path_only && m.is_dir() => return dir_fd(&fs, cp, &m, cloexec),
            Ok(_) if path_only && flags & libc::O_DIRECTORY != 0 => {
                return Err(err(libc::ENOTDIR, "open: not a directory (O_DIRECTORY)"))
            }
            Ok(m) if path_only => {
                let fd = table::placeholder(cloexec)?;
                table::insert(fd, Arc::new(Ofd::path_only(m.ino())));
                return Ok(fd);
            }
            Err(e) if !create => return Err(e),
            _ => {}
        }
    }
    let perm = mode & 0o7777;
    if !path_only && flags & libc::O_TRUNC != 0 {
        // Checked before the truncation (`O_RDONLY | O_TRUNC` truncates too); other
        // opens for writing, after the open below.
        if let Ok(m) = fs.metadata(at) {
            not_busy(&fs, &m)?;
        }
    }
    let f = match open_file(&fs, at, flags, perm) {
        Err(e) if crate::state::errno_of(&e) == libc::ENXIO => {
            // A FIFO or device: a host descriptor of its pipe or device, which the
            // program uses like any host descriptor.
            let special = fs.metadata(at).is_ok_and(|m| !m.is_file() && !m.is_dir());
            if !special {
                return Err(e);
            }
            if flags & libc::O_DIRECTORY != 0 {
                return Err(err(libc::ENOTDIR, "open: not a directory (O_DIRECTORY)"));
            }
            let keep = !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOFOLLOW);
            let fd = fs.open_special(at, flags & keep)?;
            return Ok(std::os::fd::IntoRawFd::into_raw_fd(fd));
        }
        r => r?,
    };
    let m = f.metadata()?;
    if m.is_dir() {
        if create {
            return Err(err(libc::EISDIR, "open: O_CREAT on a directory"));
        }
        // A directory's description needs no LibFS handle.
        drop(f);
        return dir_fd(&fs, cp, &m, cloexec);
    }
    if flags & libc::O_DIRECTORY != 0 {
        return Err(err(libc::ENOTDIR, "open: not a directory (O_DIRECTORY)"));
    }
    if write && flags & libc::O_TRUNC == 0 {
        not_busy(&fs, &m)?;
    }
    let fd = table::placeholder(cloexec)?;
    let append = flags & libc::O_APPEND != 0;
    table::insert(fd, Arc::new(Ofd::new_file(f, read, write, append)));
    Ok(fd)
}

/// The LibFS open of [`open`] (after `O_PATH` and `O_NOFOLLOW` were handled).
fn open_file(fs: &Fs, at: At<'_>, flags: c_int, perm: u32) -> io::Result<cairn::File> {
    let acc = flags & libc::O_ACCMODE;
    let (read, write) = (acc != libc::O_WRONLY, acc != libc::O_RDONLY);
    let create = flags & libc::O_CREAT != 0;
    let excl = create && flags & libc::O_EXCL != 0;
    let trunc = flags & libc::O_TRUNC != 0;
    Ok(if (create || trunc) && !write {
        // O_RDONLY | O_CREAT creates the file, O_RDONLY | O_TRUNC truncates it (with
        // write permission; a directory is `EISDIR`), as on Linux; then the handle
        // reads.
        drop(
            cairn::OpenOptions::new()
                .write(true)
                .create(create)
                .create_new(excl)
                .truncate(trunc)
                .mode(perm)
                .open(fs, at)?,
        );
        cairn::OpenOptions::new().read(true).open(fs, at)?
    } else {
        // LibFS opens a directory for reading (writing it is `EISDIR`).
        cairn::OpenOptions::new()
            .read(read)
            .write(write)
            .truncate(trunc)
            .create(create)
            .create_new(excl)
            .mode(perm)
            .open(fs, at)?
    })
}

/// A descriptor for directory `m`, opened at `cp`.
fn dir_fd(fs: &Fs, cp: &CPath, m: &Metadata, cloexec: bool) -> io::Result<c_int> {
    let host = cp.host().or_else(|| path_of_dir(fs, m.ino()).ok());
    let fd = table::placeholder(cloexec)?;
    table::insert(fd, Arc::new(Ofd::new_dir(m.ino(), host, Some(stat_of(m)))));
    Ok(fd)
}

/// After the placeholder of `fd` was closed: POSIX locks of the process on the inode
/// go with any close of it (the description itself closes with its last descriptor).
pub fn closed(o: Arc<Ofd>) {
    if !o.dir && table::posix_locked(o.ino) && table::still_open(&o) {
        if let Ok(f) = o.file() {
            let _ = f.unlock(cairn::LockKind::Posix, 0, 0);
        }
    }
    drop(o);
}

// ---- data ------------------------------------------------------------------------

fn readable(o: &Ofd) -> io::Result<&cairn::File> {
    if o.dir {
        return Err(err(libc::EISDIR, "read: is a directory"));
    }
    if !o.read {
        return Err(err(libc::EBADF, "read: not open for reading"));
    }
    o.file()
}

fn writable(o: &Ofd) -> io::Result<&cairn::File> {
    if !o.write {
        return Err(err(libc::EBADF, "write: not open for writing"));
    }
    o.file()
}

pub fn read(fd: c_int, o: &Ofd, buf: &mut [u8]) -> io::Result<usize> {
    let f = readable(o)?;
    o.with_pos(fd, |p| {
        let n = f.read_at(buf, p)?;
        Ok((n, p + n as u64))
    })
}

pub fn pread(o: &Ofd, buf: &mut [u8], off: i64) -> io::Result<usize> {
    let f = readable(o)?;
    let off = u64::try_from(off).map_err(|_| err(libc::EINVAL, "pread: negative offset"))?;
    f.read_at(buf, off)
}

/// Scatter read into `bufs` at `off` (`None`: the position).
pub fn readv(fd: c_int, o: &Ofd, bufs: &mut [&mut [u8]], off: Option<i64>) -> io::Result<usize> {
    let f = readable(o)?;
    let scatter = |start: u64, bufs: &mut [&mut [u8]]| -> io::Result<usize> {
        let mut total = 0usize;
        for b in bufs.iter_mut() {
            let n = f.read_at(b, start + total as u64)?;
            total += n;
            if n < b.len() {
                break;
            }
        }
        Ok(total)
    };
    match off {
        Some(off) => {
            let off =
                u64::try_from(off).map_err(|_| err(libc::EINVAL, "preadv: negative offset"))?;
            scatter(off, bufs)
        }
        None => o.with_pos(fd, |p| {
            let n = scatter(p, bufs)?;
            Ok((n, p + n as u64))
        }),
    }
}

pub fn write(fd: c_int, o: &Ofd, buf: &[u8]) -> io::Result<usize> {
    let f = writable(o)?;
    if buf.is_empty() {
        return Ok(0);
    }
    o.with_pos(fd, |p| {
        if o.append.load(std::sync::atomic::Ordering::Relaxed) {
            let end = f.append(buf)?;
            Ok((buf.len(), end))
        } else {
            let n = f.write_at(buf, p)?;
            Ok((n, p + n as u64))
        }
    })
}

/// `pwrite`: at `off`, or at the end on an `O_APPEND` description (as Linux).
pub fn pwrite(o: &Ofd, buf: &[u8], off: i64) -> io::Result<usize> {
    let f = writable(o)?;
    let off = u64::try_from(off).map_err(|_| err(libc::EINVAL, "pwrite: negative offset"))?;
    if buf.is_empty() {
        return Ok(0);
    }
    if o.append.load(std::sync::atomic::Ordering::Relaxed) {
        f.append(buf)?;
        Ok(buf.len())
    } else {
        f.write_at(buf, off)
    }
}

pub fn lseek(fd: c_int, o: &Ofd, off: i64, whence: c_int) -> io::Result<u64> {
    if o.dir {
        // A directory's position is an entry index: set or moved (as tmpfs does; the
        // end of a directory has no position).
        return o.with_pos(fd, |p| {
            let new = match whence {
                libc::SEEK_SET => Some(off),
                libc::SEEK_CUR => (p as i64).checked_add(off),
                _ => None,
            }
            .filter(|&n| n >= 0)
            .ok_or_else(|| err(libc::EINVAL, "lseek: bad position in a directory"))?;
            if new == 0 {
                *o.entries.lock() = None;
            }
            Ok((new as u64, new as u64))
        });
    }
    let size = || -> io::Result<u64> { Ok(ofd_meta(o)?.len()) };
    let to = |base: u64| -> io::Result<u64> {
        base.checked_add_signed(off)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| err(libc::EINVAL, "lseek: to a negative or overflowing position"))
    };
    o.with_pos(fd, |p| {
        let new = match whence {
            libc::SEEK_SET => to(0)?,
            libc::SEEK_CUR => to(p)?,
            libc::SEEK_END => to(size()?)?,
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                let off =
                    u64::try_from(off).map_err(|_| err(libc::ENXIO, "lseek: negative offset"))?;
                let f = o.file()?;
                if whence == libc::SEEK_DATA {
                    f.next_data(off)?
                } else {
                    f.next_hole(off)?
                }
            }
            _ => return Err(err(libc::EINVAL, "lseek: bad whence")),
        };
        Ok((new, new))
    })
}

pub fn ftruncate(o: &Ofd, len: i64) -> io::Result<()> {
    let len = u64::try_from(len).map_err(|_| err(libc::EINVAL, "ftruncate: negative length"))?;
    if o.dir || !o.write {
        return Err(err(libc::EINVAL, "ftruncate: not open for writing"));
    }
    o.file()?.set_len(len)
}

/// `fallocate`: blocks are allocated when data is digested, so mode 0 only extends the
/// size and `FALLOC_FL_KEEP_SIZE` does nothing; other modes are `EOPNOTSUPP`.
pub fn fallocate(o: &Ofd, mode: c_int, off: i64, len: i64) -> io::Result<()> {
    writable(o)?.fallocate(mode, off, len)
}

// ---- metadata --------------------------------------------------------------------

/// `fstat`. A directory removed while open is reported as it was when opened, with
/// no links (as Linux does); a file removed while open stays readable in LibFS.
pub fn fstat(o: &Ofd) -> io::Result<Stat> {
    match ofd_meta(o) {
        Ok(m) => Ok(stat_of(&m)),
        Err(e) if state::errno_of(&e) == libc::ENOENT && o.dir => match &*o.opened.lock() {
            Some(s) => Ok(Stat {
                nlink: 0,
                ..s.clone()
            }),
            None => Err(e),
        },
        Err(e) => Err(e),
    }
}

pub fn stat(cp: &CPath, follow: bool) -> io::Result<Metadata> {
    let fs = fs()?;
    if follow {
        fs.metadata(cp.at())
    } else {
        fs.symlink_metadata(cp.at())
    }
}

/// The `stat` fields of `m`, in a form the C entry points copy into any `stat` layout.
#[derive(Debug, Clone)]
pub struct Stat {
    pub ino: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    pub btime: (i64, i64),
    /// Device number of a device node (glibc's encoding).
    pub rdev: u64,
}

fn split_ns(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

pub fn stat_of(m: &Metadata) -> Stat {
    let btime = m
        .created()
        .duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_nanos() as i64))
        .unwrap_or((0, 0));
    Stat {
        ino: m.ino(),
        mode: m.mode(),
        rdev: m.rdev(),
        nlink: m.nlink(),
        uid: m.uid(),
        gid: m.gid(),
        size: m.len(),
        blocks: m.blocks(),
        atime: split_ns(m.atime_ns()),
        mtime: split_ns(m.mtime_ns()),
        ctime: split_ns(m.ctime_ns()),
        btime,
    }
}

/// `access`/`faccessat`: `mode` is `F_OK` or a mask of `R_OK`, `W_OK`, `X_OK`, checked
/// for the real (or, with `effective`, the effective) user and groups.
pub fn access(cp: &CPath, mode: c_int, effective: bool, follow: bool) -> io::Result<()> {
    let m = stat(cp, follow)?;
    if mode == libc::F_OK {
        return Ok(());
    }
    let (uid, gid) = ids(effective);
    let perm = m.mode() & 0o7777;
    let want = (mode & 7) as u32;
    if uid == 0 {
        // Root may read and write anything, and execute what anyone may (or a dir).
        if want & 1 != 0 && !m.is_dir() && perm & 0o111 == 0 {
            return Err(err(libc::EACCES, "access: no execute permission"));
        }
        return Ok(());
    }
    let bits = if m.uid() == uid {
        (perm >> 6) & 7
    } else if m.gid() == gid || in_groups(m.gid()) {
        (perm >> 3) & 7
    } else {
        perm & 7
    };
    if bits & want != want {
        return Err(err(libc::EACCES, "access: permission denied"));
    }
    Ok(())
}

fn ids(effective: bool) -> (u32, u32) {
    // SAFETY: these calls cannot fail and take no arguments.
    unsafe {
        if effective {
            (libc::geteuid(), libc::getegid())
        } else {
            (libc::getuid(), libc::getgid())
        }
    }
}

fn in_groups(g: u32) -> bool {
    let mut groups = [0 as libc::gid_t; 256];
    // SAFETY: the buffer holds `groups.len()` entries.
    let n = unsafe { libc::getgroups(groups.len() as c_int, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&g)
}

pub fn chmod(cp: &CPath, mode: u32, follow: bool) -> io::Result<()> {
    let fs = fs()?;
    if !follow && fs.symlink_metadata(cp.at())?.is_symlink() {
        return Err(err(
            libc::EOPNOTSUPP,
            "chmod: symbolic links have no mode of their own",
        ));
    }
    fs.set_permissions(cp.at(), cairn::Permissions::from_mode(mode & 0o7777))
}

/// Extended attributes: `Fs::get_xattr` and friends (the daemon keeps them).
pub fn getxattr(cp: &CPath, name: &[u8], follow: bool) -> io::Result<Vec<u8>> {
    fs()?.get_xattr(cp.at(), name, follow)
}

/// `listxattr`'s answer: the names, each ending in NUL.
pub fn listxattr(cp: &CPath, follow: bool) -> io::Result<Vec<u8>> {
    let names = fs()?.list_xattr(cp.at(), follow)?;
    Ok(names
        .into_iter()
        .flat_map(|mut n| {
            n.push(0);
            n
        })
        .collect())
}

pub fn setxattr(
    cp: &CPath,
    name: &[u8],
    value: &[u8],
    flags: c_int,
    follow: bool,
) -> io::Result<()> {
    fs()?.set_xattr(cp.at(), name, value, flags, follow)
}

pub fn removexattr(cp: &CPath, name: &[u8], follow: bool) -> io::Result<()> {
    fs()?.remove_xattr(cp.at(), name, follow)
}

pub fn chown(cp: &CPath, uid: u32, gid: u32, follow: bool) -> io::Result<()> {
    let id = |v: u32| (v != u32::MAX).then_some(v);
    let fs = fs()?;
    if follow {
        fs.set_owner(cp.at(), id(uid), id(gid))
    } else {
        fs.set_symlink_owner(cp.at(), id(uid), id(gid))
    }
}

/// A time of `utimensat`: `None` is `UTIME_OMIT`.
pub fn time_arg(sec: i64, nsec: i64) -> io::Result<Option<SystemTime>> {
    match nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(SystemTime::now())),
        0..=999_999_999 => {
            let t = if sec >= 0 {
                UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
            } else {
                UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs())
                    + Duration::from_nanos(nsec as u64)
            };
            Ok(Some(t))
        }
        _ => Err(err(libc::EINVAL, "utimensat: bad nanoseconds")),
    }
}

/// The times of a `utimensat`-like call: access and modification time (`None`: omitted),
/// and whether both are "now" (which write permission allows).
pub type Times = (Option<SystemTime>, Option<SystemTime>, bool);

pub fn set_times(cp: &CPath, (a, m, touch): Times, follow: bool) -> io::Result<()> {
    let fs = fs()?;
    if a.is_none() && m.is_none() {
        return if follow {
            fs.metadata(cp.at()).map(drop)
        } else {
            fs.symlink_metadata(cp.at()).map(drop)
        };
    }
    if touch {
        return fs.touch(cp.at(), follow);
    }
    if follow {
        fs.set_times(cp.at(), a, m)
    } else {
        fs.set_symlink_times(cp.at(), a, m)
    }
}

pub fn truncate(cp: &CPath, len: i64) -> io::Result<()> {
    let len = u64::try_from(len).map_err(|_| err(libc::EINVAL, "truncate: negative length"))?;
    let fs = fs()?;
    let f = cairn::OpenOptions::new().write(true).open(&fs, cp.at())?;
    not_busy(&fs, &f.metadata()?)?;
    f.set_len(len)
}

/// `ETXTBSY` if `m` is a program a process runs from its copy in memory (`execve`
/// here), as Linux refuses to write or truncate a running program. Only files with an
/// execute bit are looked for (a scan of `/proc`), and only processes this one may
/// inspect count (SHIM.md, "Limits").
fn not_busy(fs: &Fs, m: &Metadata) -> io::Result<()> {
    if m.is_file()
        && m.mode() & 0o111 != 0
        && cairn_area::host::text_busy(&fs.uuid(), m.ino(), m.generation())
    {
        return Err(err(
            libc::ETXTBSY,
            "a process runs this program: it cannot be written or truncated",
        ));
    }
    Ok(())
}

/// `statfs` numbers: (total blocks, free blocks, total inodes, free inodes).
pub fn statfs() -> io::Result<(u64, u64, u64, u64)> {
    let s = fs()?.status()?;
    let (cap, used) = s
        .tiers
        .iter()
        .fold((0, 0), |a, t| (a.0 + t.capacity_bytes, a.1 + t.used_bytes));
    Ok((
        cap / BLOCK,
        cap.saturating_sub(used) / BLOCK,
        s.inodes.capacity,
        s.inodes.capacity.saturating_sub(s.inodes.used),
    ))
}

// ---- names -------------------------------------------------------------------------

/// A directory at `cp` may be about to go (removed, or replaced by a rename): its open
/// descriptions keep its attributes as they are now, for `fstat`.
fn dir_may_go(fs: &Fs, cp: &CPath) {
    if let Ok(m) = fs.symlink_metadata(cp.at()) {
        if m.is_dir() {
            table::dir_removing(m.ino(), &stat_of(&m));
        }
    }
}

pub fn unlink(cp: &CPath, dir: bool) -> io::Result<()> {
    let fs = fs()?;
    if dir {
        dir_may_go(&fs, cp);
        fs.remove_dir(cp.at())
    } else {
        fs.remove_file(cp.at())
    }
}

pub fn rename(a: &CPath, b: &CPath, flags: u32) -> io::Result<()> {
    let fs = fs()?;
    match flags {
        0 => {
            dir_may_go(&fs, b);
            fs.rename(a.at(), b.at())
        }
        libc::RENAME_NOREPLACE => fs.rename_noreplace(a.at(), b.at()),
        libc::RENAME_EXCHANGE => fs.rename_exchange(a.at(), b.at()),
        _ => Err(err(libc::EINVAL, "renameat2: unsupported flags")),
    }
}

pub fn mkdir(cp: &CPath, mode: u32) -> io::Result<()> {
    fs()?.create_dir_mode(cp.at(), mode & 0o7777)
}

/// `mknod`: a regular file, FIFO, socket inode or (root) device node.
pub fn mknod(cp: &CPath, mode: u32, rdev: u64) -> io::Result<()> {
    fs()?.mknod(cp.at(), mode, rdev)
}

pub fn link(a: &CPath, b: &CPath, follow: bool) -> io::Result<()> {
    let fs = fs()?;
    if follow {
        let ino = fs.metadata(a.at())?.ino();
        fs.hard_link(At::inode(ino), b.at())
    } else {
        fs.hard_link(a.at(), b.at())
    }
}

/// `linkat(fd, "", …, AT_EMPTY_PATH)`: a new name `cp` for the file `o` is open on
/// (also an unnamed `O_TMPFILE` file's first).
pub fn link_fd(o: &Ofd, cp: &CPath) -> io::Result<()> {
    if o.dir {
        return Err(err(
            libc::EPERM,
            "link: hard links to directories are not allowed",
        ));
    }
    match o.file() {
        Ok(f) => f.link(cp.at()),
        Err(_) => fs()?.hard_link(At::inode(o.ino), cp.at()),
    }
}

pub fn symlink(target: &[u8], cp: &CPath) -> io::Result<()> {
    fs()?.symlink(bytes_path(target), cp.at())
}

pub fn readlink(cp: &CPath) -> io::Result<Vec<u8>> {
    let t = fs()?.read_link(cp.at())?;
    Ok(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()).to_vec())
}

// ---- directories -------------------------------------------------------------------

/// The inode of directory `ino`'s parent (the root is its own).
fn parent_of(fs: &Fs, ino: u64) -> io::Result<u64> {
    if ino == root_ino() {
        // (`..` at the root leads out of the store, to the prefix's parent.)
        return Ok(ino);
    }
    let p = At {
        dir: ino,
        path: bytes_path(b".."),
    };
    Ok(fs.metadata(p)?.ino())
}

/// The entries of directory `ino`, with `.` and `..` first.
pub fn list(ino: u64) -> io::Result<Vec<Dent>> {
    let fs = fs()?;
    let parent = parent_of(&fs, ino)?;
    let mut v = vec![
        Dent {
            ino,
            kind: libc::DT_DIR,
            name: b".".to_vec(),
        },
        Dent {
            ino: parent,
            kind: libc::DT_DIR,
            name: b"..".to_vec(),
        },
    ];
    for e in fs.read_dir(At::inode(ino))? {
        let e = e?;
        v.push(Dent {
            ino: e.ino(),
            kind: e
                .file_type()
                .map(|t| t.dirent_type())
                .unwrap_or(libc::DT_UNKNOWN),
            name: std::os::unix::ffi::OsStrExt::as_bytes(e.file_name().as_os_str()).to_vec(),
        });
    }
    Ok(v)
}

/// The host-visible absolute path of directory `ino`, found by walking `..` up to the
/// root and looking each directory up in its parent.
pub fn path_of_dir(fs: &Fs, mut ino: u64) -> io::Result<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = Vec::new();
    for _ in 0..4096 {
        let parent = parent_of(fs, ino)?;
        if parent == ino {
            let mut out = state::config().prefix().to_vec();
            for n in names.iter().rev() {
                out.push(b'/');
                out.extend_from_slice(n);
            }
            return Ok(out);
        }
        let name = fs
            .read_dir(At::inode(parent))?
            .filter_map(Result::ok)
            .find(|e| e.ino() == ino)
            .map(|e| std::os::unix::ffi::OsStrExt::as_bytes(e.file_name().as_os_str()).to_vec())
            .ok_or_else(|| err(libc::ENOENT, "getcwd: the directory was removed"))?;
        names.push(name);
        ino = parent;
    }
    Err(err(libc::ENAMETOOLONG, "getcwd: too deep"))
}

/// `chdir` into a Cairn directory.
pub fn chdir(cp: &CPath) -> io::Result<()> {
    let fs = fs()?;
    let m = fs.metadata(cp.at())?;
    if !m.is_dir() {
        return Err(err(libc::ENOTDIR, "chdir: not a directory"));
    }
    access(cp, libc::X_OK, true, true)?;
    let path = path_of_dir(&fs, m.ino())?;
    state::set_cwd(Some(state::Cwd { path, ino: m.ino() }));
    Ok(())
}

pub fn fchdir(o: &Ofd) -> io::Result<()> {
    if !o.dir {
        return Err(err(libc::ENOTDIR, "fchdir: not a directory"));
    }
    let path = path_of_dir(&*fs()?, o.ino)?;
    state::set_cwd(Some(state::Cwd { path, ino: o.ino }));
    Ok(())
}

/// `realpath` of a Cairn path: absolute, host-visible, no symlinks, `.` or `..`.
pub fn realpath(cp: &CPath) -> io::Result<Vec<u8>> {
    let fs = fs()?;
    let mut cur = cp.clone();
    for _ in 0..40 {
        let p = cur.path.clone();
        let trimmed: &[u8] = {
            let mut t = &p[..];
            while t.len() > 1 && t.ends_with(b"/") {
                t = &t[..t.len() - 1];
            }
            t
        };
        let (parent, name): (&[u8], &[u8]) = match trimmed.iter().rposition(|&b| b == b'/') {
            Some(0) => (b"/", &trimmed[1..]),
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => (b".", trimmed),
        };
        if name.is_empty() || name == b"." || name == b".." {
            let m = fs.metadata(cur.at())?;
            return if m.is_dir() {
                path_of_dir(&fs, m.ino())
            } else {
                Err(err(libc::ENOTDIR, "realpath: not a directory"))
            };
        }
        let pm = fs.metadata(At {
            dir: cur.dir,
            path: bytes_path(parent),
        })?;
        if !pm.is_dir() {
            return Err(err(libc::ENOTDIR, "realpath: not a directory"));
        }
        let last = At {
            dir: pm.ino(),
            path: bytes_path(name),
        };
        let m = fs.symlink_metadata(last)?;
        if m.is_symlink() {
            let t = fs.read_link(last)?;
            let t = std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()).to_vec();
            // An absolute target is the process's path: in the store under the prefix,
            // else the host's (which resolves the rest).
            let t = if t.starts_with(b"/") {
                match paths::strip_prefix(&t, state::config().prefix()) {
                    Some(inside) => inside.to_vec(),
                    None => return Err(cairn_area::error::elsewhere(t, "realpath")),
                }
            } else {
                t
            };
            cur = CPath {
                dir: pm.ino(),
                path: t,
                base: Base::Unknown,
            };
            continue;
        }
        if m.is_dir() {
            return path_of_dir(&fs, m.ino());
        }
        if trimmed.len() != p.len() {
            return Err(err(libc::ENOTDIR, "realpath: not a directory"));
        }
        let mut out = path_of_dir(&fs, pm.ino())?;
        out.push(b'/');
        out.extend_from_slice(name);
        return Ok(out);
    }
    Err(err(libc::ELOOP, "realpath: too many symbolic links"))
}

/// `open(2)` flags of an `fopen` mode (`r`, `w`, `a`, `+`, and `x`, `e`).
pub fn mode_flags(mode: &[u8]) -> io::Result<c_int> {
    let mut it = mode.iter();
    let mut fl = match it.next() {
        Some(b'r') => libc::O_RDONLY,
        Some(b'w') => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        Some(b'a') => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return Err(err(libc::EINVAL, "fopen: bad mode")),
    };
    for &c in it {
        match c {
            b'+' => fl = (fl & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => fl |= libc::O_EXCL,
            b'e' => fl |= libc::O_CLOEXEC,
            b',' => break,
            _ => {}
        }
    }
    Ok(fl)
}

/// How to run a program stored on Cairn (`execve` of a Cairn path).
pub enum ExecPlan {
    /// A `#!` script: run `interp` with these arguments before the script's path (as
    /// the kernel does: the interpreter, at most one argument from the `#!` line).
    Script {
        interp: Vec<u8>,
        arg: Option<Vec<u8>>,
    },
    /// An ELF binary: its bytes, to run from a sealed `memfd` named after it
    /// (`cairn_area::host::exec_memfd_name`).
    Elf { bytes: Vec<u8>, memfd_name: CString },
}

/// The largest program copied into memory to run (an ELF binary on Cairn).
const MAX_EXEC_BYTES: u64 = 1 << 30;

/// Decide how to run the Cairn file at `cp`: it must be a regular file the caller may
/// execute (`EACCES`) and read (the interpreter or the copy reads it); a `#!` line or an
/// ELF header (`ENOEXEC` otherwise, as the kernel answers).
pub fn exec_plan(cp: &CPath) -> io::Result<ExecPlan> {
    let m = stat(cp, true)?;
    if !m.is_file() {
        return Err(err(libc::EACCES, "execve: not a regular file"));
    }
    access(cp, libc::X_OK, true, true)?;
    let fs = fs()?;
    let f = cairn::File::open(&fs, cp.at())?;
    let mut head = [0u8; 256];
    let n = f.read_at(&mut head, 0)?;
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let blank = |b: &u8| *b == b' ' || *b == b'\t';
        let line: Vec<u8> = line.to_vec();
        let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
        let rest = &line[start..];
        let end = rest.iter().position(blank).unwrap_or(rest.len());
        let interp = rest[..end].to_vec();
        if interp.is_empty() {
            return Err(err(
                libc::ENOEXEC,
                "execve: a #! line without an interpreter",
            ));
        }
        let arg = rest[end..]
            .iter()
            .position(|b| !blank(b))
            .map(|i| {
                let a = &rest[end + i..];
                let j = a.iter().rposition(|b| !blank(b)).map_or(0, |j| j + 1);
                a[..j].to_vec()
            })
            .filter(|a| !a.is_empty());
        return Ok(ExecPlan::Script { interp, arg });
    }
    if head.starts_with(b"\x7fELF") {
        let size = m.len();
        if size > MAX_EXEC_BYTES {
            return Err(err(libc::ENOMEM, "execve: program larger than 1 GiB"));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        // From the start: `read_at` above left the position there.
        std::io::Read::read_to_end(&mut &f, &mut bytes)?;
        let name = cairn_area::host::exec_memfd_name(&fs.uuid(), m.ino(), m.generation());
        let memfd_name = CString::new(name).expect("no NUL");
        return Ok(ExecPlan::Elf { bytes, memfd_name });
    }
    Err(err(
        libc::ENOEXEC,
        "execve: neither a #! script nor an ELF binary",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(split_ns(1_500_000_000), (1, 500_000_000));
        assert_eq!(split_ns(-1), (-1, 999_999_999));
        assert!(time_arg(0, libc::UTIME_OMIT).unwrap().is_none());
        assert!(time_arg(0, 1_000_000_000).is_err());
        assert_eq!(
            time_arg(5, 7).unwrap().unwrap(),
            UNIX_EPOCH + Duration::new(5, 7)
        );
        assert_eq!(
            time_arg(-2, 500).unwrap().unwrap(),
            UNIX_EPOCH - Duration::new(1, 999_999_500)
        );
    }

    #[test]
    fn modes() {
        assert_eq!(mode_flags(b"r").unwrap(), libc::O_RDONLY);
        assert_eq!(mode_flags(b"rb+").unwrap(), libc::O_RDWR);
        assert_eq!(
            mode_flags(b"w").unwrap(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC
        );
        assert_eq!(
            mode_flags(b"a+e").unwrap(),
            libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC
        );
        assert_eq!(mode_flags(b"wx").unwrap() & libc::O_EXCL, libc::O_EXCL);
        assert!(mode_flags(b"q").is_err());
    }
}
