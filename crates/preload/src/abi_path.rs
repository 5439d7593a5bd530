//! Calls that take paths. SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{both_cairn, empty_path, fd_call, fill_stat, ok0, path_call, route, run, Route};
use crate::ops::{self, CPath};
use crate::real;
use crate::state::err;
use crate::table;
use libc::{c_char, c_int, c_uint, mode_t, size_t, ssize_t};
use std::io;
use std::time::SystemTime;

pub(crate) const FDCWD: c_int = libc::AT_FDCWD;

// ---- open -------------------------------------------------------------------------------

/// The mode argument is read only with `O_CREAT` or `O_TMPFILE` (as C's `va_arg`).
fn mode_of(flags: c_int, mode: c_uint) -> u32 {
    if flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE {
        mode
    } else {
        0
    }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    unsafe {
        path_call(
            "open",
            dirfd,
            path,
            |p| real::openat64(dirfd, p, flags, mode),
            |cp| ops::open(cp, flags, mode_of(flags, mode)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    unsafe { openat64(dirfd, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    unsafe { openat64(FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    unsafe { openat64(FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    unsafe { openat64(FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    unsafe { openat64(FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { openat64(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe { openat64(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    unsafe {
        openat64(
            FDCWD,
            path,
            libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
            mode,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { creat64(path, mode) }
}

// ---- stat ---------------------------------------------------------------------------------

unsafe fn stat_at(
    op: &str,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    if unsafe { empty_path(path, flags) } && table::is_cairn(dirfd) {
        return fd_call(
            op,
            dirfd,
            || unsafe { real::fstatat64(dirfd, path, st, flags) },
            |o| {
                fill_stat!(unsafe { &mut *st }, &ops::fstat(&o)?);
                Ok(0)
            },
        );
    }
    unsafe {
        path_call(
            op,
            dirfd,
            path,
            |p| real::fstatat64(dirfd, p, st, flags),
            |cp| {
                let m = ops::stat(cp, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
                fill_stat!(&mut *st, &ops::stat_of(&m));
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_at("fstatat", dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_at("fstatat", dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("stat", FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("stat", FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("lstat", FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("lstat", FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

// The pre-2.33 glibc entry points that old binaries call.
#[no_mangle]
pub unsafe extern "C" fn __xstat64(_v: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("stat", FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __xstat(_v: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("stat", FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    _v: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
) -> c_int {
    unsafe { stat_at("lstat", FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat(_v: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat_at("lstat", FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _v: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_at("fstatat", dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _v: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { stat_at("fstatat", dirfd, path, st, flags) }
}

pub fn fill_statfs(st: &mut libc::statfs64) -> io::Result<c_int> {
    let (blocks, free, files, ffree) = ops::statfs()?;
    // SAFETY: statfs64 is plain old data; all-zero is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.f_type = 0xca1_4e5 as _;
    st.f_bsize = ops::BLOCK as _;
    st.f_frsize = ops::BLOCK as _;
    st.f_blocks = blocks;
    st.f_bfree = free;
    st.f_bavail = free;
    st.f_files = files;
    st.f_ffree = ffree;
    st.f_namelen = 255;
    Ok(0)
}

pub fn fill_statvfs(st: &mut libc::statvfs64) -> io::Result<c_int> {
    let (blocks, free, files, ffree) = ops::statfs()?;
    // SAFETY: statvfs64 is plain old data; all-zero is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.f_bsize = ops::BLOCK as _;
    st.f_frsize = ops::BLOCK as _;
    st.f_blocks = blocks;
    st.f_bfree = free;
    st.f_bavail = free;
    st.f_files = files;
    st.f_ffree = ffree;
    st.f_favail = ffree;
    st.f_namemax = 255;
    Ok(0)
}

#[no_mangle]
pub unsafe extern "C" fn statfs64(path: *const c_char, st: *mut libc::statfs64) -> c_int {
    unsafe {
        path_call(
            "statfs",
            FDCWD,
            path,
            |p| real::statfs64(p, st),
            |cp| {
                ops::stat(cp, true)?;
                fill_statfs(&mut *st)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn statfs(path: *const c_char, st: *mut libc::statfs64) -> c_int {
    unsafe { statfs64(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn statvfs64(path: *const c_char, st: *mut libc::statvfs64) -> c_int {
    unsafe {
        path_call(
            "statvfs",
            FDCWD,
            path,
            |p| real::statvfs64(p, st),
            |cp| {
                ops::stat(cp, true)?;
                fill_statvfs(&mut *st)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn statvfs(path: *const c_char, st: *mut libc::statvfs64) -> c_int {
    unsafe { statvfs64(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    unsafe {
        path_call(
            "access",
            dirfd,
            path,
            |p| real::faccessat(dirfd, p, mode, flags),
            |cp| {
                let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
                ok0(ops::access(cp, mode, flags & libc::AT_EACCESS != 0, follow))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    unsafe { faccessat(FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    unsafe {
        path_call(
            "euidaccess",
            FDCWD,
            path,
            |p| real::euidaccess(p, mode),
            |cp| ok0(ops::access(cp, mode, true, true)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    unsafe { euidaccess(path, mode) }
}

// ---- names ----------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    unsafe {
        path_call(
            "unlink",
            dirfd,
            path,
            |p| real::unlinkat(dirfd, p, flags),
            |cp| ok0(ops::unlink(cp, flags & libc::AT_REMOVEDIR != 0)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    unsafe { unlinkat(FDCWD, path, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    unsafe { unlinkat(FDCWD, path, libc::AT_REMOVEDIR) }
}

/// `remove`: `unlink`, or `rmdir` for a directory (glibc calls these internally).
#[no_mangle]
pub unsafe extern "C" fn remove(path: *const c_char) -> c_int {
    unsafe {
        path_call(
            "remove",
            FDCWD,
            path,
            |p| real::remove(p),
            |cp| {
                let dir = ops::stat(cp, false)?.is_dir();
                ok0(ops::unlink(cp, dir))
            },
        )
    }
}

/// Two-path calls: both on Cairn, both on the host, or `EXDEV`.
unsafe fn two_paths(
    op: &str,
    fd1: c_int,
    p1: *const c_char,
    fd2: c_int,
    p2: *const c_char,
    host: impl FnOnce(*const c_char, *const c_char) -> c_int,
    cairn: impl FnOnce(&CPath, &CPath) -> io::Result<()>,
) -> c_int {
    // A NULL name is `EFAULT` (the host would look the other one up first, and not
    // find a Cairn path).
    if p1.is_null() || p2.is_null() {
        return crate::state::fail(op, err(libc::EFAULT, "bad address (NULL path)"));
    }
    let (a, b) = match unsafe { (route(fd1, p1), route(fd2, p2)) } {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return crate::state::fail(op, e),
    };
    match both_cairn(&a, &b) {
        None => host(a.host_ptr(p1), b.host_ptr(p2)),
        Some(Err(e)) => crate::state::fail(op, e),
        Some(Ok(())) => match (&a, &b) {
            (Route::Cairn(x), Route::Cairn(y)) => run(op, || ok0(cairn(x, y))),
            _ => unreachable!("both on Cairn"),
        },
    }
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    fd1: c_int,
    from: *const c_char,
    fd2: c_int,
    to: *const c_char,
    fl: c_uint,
) -> c_int {
    unsafe {
        two_paths(
            "rename",
            fd1,
            from,
            fd2,
            to,
            |a, b| real::renameat2(fd1, a, fd2, b, fl),
            |a, b| ops::rename(a, b, fl),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    fd1: c_int,
    from: *const c_char,
    fd2: c_int,
    to: *const c_char,
) -> c_int {
    unsafe {
        two_paths(
            "rename",
            fd1,
            from,
            fd2,
            to,
            |a, b| real::renameat(fd1, a, fd2, b),
            |a, b| ops::rename(a, b, 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    unsafe {
        two_paths(
            "rename",
            FDCWD,
            from,
            FDCWD,
            to,
            |a, b| real::rename(a, b),
            |a, b| ops::rename(a, b, 0),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn linkat(
    fd1: c_int,
    from: *const c_char,
    fd2: c_int,
    to: *const c_char,
    fl: c_int,
) -> c_int {
    // `linkat(AT_FDCWD, "/proc/self/fd/N", …, AT_SYMLINK_FOLLOW)` of a Cairn descriptor
    // (how programs name an `O_TMPFILE` file) is `linkat(N, "", …, AT_EMPTY_PATH)`.
    if fl & libc::AT_SYMLINK_FOLLOW != 0 {
        if let Some(n) = unsafe { proc_fd(from) }.filter(|&n| table::is_cairn(n)) {
            return unsafe { linkat(n, c"".as_ptr(), fd2, to, libc::AT_EMPTY_PATH) };
        }
    }
    // `AT_EMPTY_PATH`: a new name for the file `fd1` is open on.
    if unsafe { empty_path(from, fl) } && table::is_cairn(fd1) {
        return fd_call(
            "link",
            fd1,
            || unsafe { real::linkat(fd1, from, fd2, to, fl) },
            |o| match unsafe { route(fd2, to) }? {
                Route::Cairn(cp) => ops::link_fd(&o, &cp).map(|()| 0),
                _ => Err(err(
                    libc::EXDEV,
                    "link: between Cairn and another file system",
                )),
            },
        );
    }
    unsafe {
        two_paths(
            "link",
            fd1,
            from,
            fd2,
            to,
            |a, b| real::linkat(fd1, a, fd2, b, fl),
            |a, b| ops::link(a, b, fl & libc::AT_SYMLINK_FOLLOW != 0),
        )
    }
}

/// `N` when `p` is `/proc/self/fd/N` or `/proc/<this pid>/fd/N`.
///
/// SAFETY: `p` is NULL or a string argument of a C call.
unsafe fn proc_fd(p: *const c_char) -> Option<c_int> {
    let b = unsafe { crate::abi::user_cstr(p) }.ok().flatten()?;
    let rest = b.strip_prefix(b"/proc/")?;
    let (who, n) = std::str::from_utf8(rest).ok()?.split_once("/fd/")?;
    if who != "self" && who.parse::<u32>().ok()? != std::process::id() {
        return None;
    }
    n.parse().ok()
}

#[no_mangle]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    unsafe {
        two_paths(
            "link",
            FDCWD,
            from,
            FDCWD,
            to,
            |a, b| real::link(a, b),
            |a, b| ops::link(a, b, false),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    unsafe {
        path_call(
            "symlink",
            dirfd,
            path,
            |p| real::symlinkat(target, dirfd, p),
            |cp| {
                let t = crate::abi::user_cstr(target)?
                    .ok_or_else(|| err(libc::EFAULT, "symlink: NULL target"))?;
                ok0(ops::symlink(t, cp))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    unsafe { symlinkat(target, FDCWD, path) }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
) -> ssize_t {
    unsafe {
        path_call(
            "readlink",
            dirfd,
            path,
            |p| real::readlinkat(dirfd, p, buf, n),
            |cp| {
                let t = ops::readlink(cp)?;
                let k = t.len().min(n);
                std::ptr::copy_nonoverlapping(t.as_ptr(), buf as *mut u8, k);
                Ok(k as ssize_t)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t {
    unsafe { readlinkat(FDCWD, path, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __readlink_chk(
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
    _l: size_t,
) -> ssize_t {
    unsafe { readlinkat(FDCWD, path, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __readlinkat_chk(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    n: size_t,
    _l: size_t,
) -> ssize_t {
    unsafe { readlinkat(dirfd, path, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    unsafe {
        path_call(
            "mkdir",
            dirfd,
            path,
            |p| real::mkdirat(dirfd, p, mode),
            |cp| ok0(ops::mkdir(cp, mode)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mkdirat(FDCWD, path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: libc::dev_t,
) -> c_int {
    unsafe {
        path_call(
            "mknod",
            dirfd,
            path,
            |p| real::mknodat(dirfd, p, mode, dev),
            |cp| ok0(ops::mknod(cp, mode, dev)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    unsafe { mknodat(FDCWD, path, mode, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    unsafe {
        path_call(
            "mkfifo",
            dirfd,
            path,
            |p| real::mkfifoat(dirfd, p, mode),
            |cp| ok0(ops::mknod(cp, libc::S_IFIFO | (mode & 0o7777), 0)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { mkfifoat(FDCWD, path, mode) }
}

/// glibc before 2.33 exported `mknod` as this wrapper (`ver` is `_MKNOD_VER`).
#[no_mangle]
pub unsafe extern "C" fn __xmknodat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    if dev.is_null() {
        return crate::state::fail("mknod", err(libc::EFAULT, "mknod: null device pointer"));
    }
    // SAFETY: `dev` is non-null and points to a dev_t, as the caller promises.
    unsafe { mknodat(dirfd, path, mode, *dev) }
}

#[no_mangle]
pub unsafe extern "C" fn __xmknod(
    ver: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    unsafe { __xmknodat(ver, FDCWD, path, mode, dev) }
}

// ---- attributes -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    fl: c_int,
) -> c_int {
    unsafe {
        path_call(
            "chmod",
            dirfd,
            path,
            |p| real::fchmodat(dirfd, p, mode, fl),
            |cp| ok0(ops::chmod(cp, mode, fl & libc::AT_SYMLINK_NOFOLLOW == 0)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    unsafe { fchmodat(FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    fl: c_int,
) -> c_int {
    if unsafe { empty_path(path, fl) } && table::is_cairn(dirfd) {
        return unsafe { crate::abi_fd::fchown(dirfd, uid, gid) };
    }
    unsafe {
        path_call(
            "chown",
            dirfd,
            path,
            |p| real::fchownat(dirfd, p, uid, gid, fl),
            |cp| {
                ok0(ops::chown(
                    cp,
                    uid,
                    gid,
                    fl & libc::AT_SYMLINK_NOFOLLOW == 0,
                ))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    unsafe { fchownat(FDCWD, path, uid, gid, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    unsafe { fchownat(FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

/// The two times of a `utimensat` argument (NULL: both now), and whether both are now
/// (a "touch", which write permission allows).
pub unsafe fn times_of(ts: *const libc::timespec) -> io::Result<ops::Times> {
    if ts.is_null() {
        let now = SystemTime::now();
        return Ok((Some(now), Some(now), true));
    }
    let t = unsafe { std::slice::from_raw_parts(ts, 2) };
    let touch = t[0].tv_nsec == libc::UTIME_NOW && t[1].tv_nsec == libc::UTIME_NOW;
    Ok((
        ops::time_arg(t[0].tv_sec, t[0].tv_nsec)?,
        ops::time_arg(t[1].tv_sec, t[1].tv_nsec)?,
        touch,
    ))
}

/// `timeval[2]` as `timespec[2]` (NULL stays NULL).
pub unsafe fn timespecs_of(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    let t = unsafe { std::slice::from_raw_parts(tv, 2) };
    let c = |v: &libc::timeval| libc::timespec {
        tv_sec: v.tv_sec,
        tv_nsec: v.tv_usec * 1000,
    };
    Some([c(&t[0]), c(&t[1])])
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    ts: *const libc::timespec,
    fl: c_int,
) -> c_int {
    if path.is_null() && table::is_cairn(dirfd) {
        // Linux's utimensat(fd, NULL, ...) is futimens(fd, ...).
        return unsafe { crate::abi_fd::futimens(dirfd, ts) };
    }
    unsafe {
        path_call(
            "utimensat",
            dirfd,
            path,
            |p| real::utimensat(dirfd, p, ts, fl),
            |cp| {
                ok0(ops::set_times(
                    cp,
                    times_of(ts)?,
                    fl & libc::AT_SYMLINK_NOFOLLOW == 0,
                ))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    unsafe {
        path_call(
            "utimes",
            FDCWD,
            path,
            |p| real::utimes(p, tv),
            |cp| {
                let ts = timespecs_of(tv);
                let t = times_of(ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()))?;
                ok0(ops::set_times(cp, t, true))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    unsafe {
        path_call(
            "lutimes",
            FDCWD,
            path,
            |p| real::lutimes(p, tv),
            |cp| {
                let ts = timespecs_of(tv);
                let t = times_of(ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()))?;
                ok0(ops::set_times(cp, t, false))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, t: *const libc::utimbuf) -> c_int {
    unsafe {
        path_call(
            "utime",
            FDCWD,
            path,
            |p| real::utime(p, t),
            |cp| {
                let times = if t.is_null() {
                    times_of(std::ptr::null())?
                } else {
                    let t = &*t;
                    (
                        ops::time_arg(t.actime, 0)?,
                        ops::time_arg(t.modtime, 0)?,
                        false,
                    )
                };
                ok0(ops::set_times(cp, times, true))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: libc::off64_t) -> c_int {
    unsafe {
        path_call(
            "truncate",
            FDCWD,
            path,
            |p| real::truncate64(p, len),
            |cp| ok0(ops::truncate(cp, len)),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: libc::off64_t) -> c_int {
    unsafe { truncate64(path, len) }
}

// ---- pathconf -------------------------------------------------------------------------------------

fn pathconf_value(name: c_int) -> io::Result<libc::c_long> {
    Ok(match name {
        libc::_PC_NAME_MAX => 255,
        libc::_PC_PATH_MAX => 4096,
        libc::_PC_LINK_MAX => 65000,
        libc::_PC_PIPE_BUF => 4096,
        libc::_PC_FILESIZEBITS => 64,
        libc::_PC_SYMLINK_MAX => 4095,
        libc::_PC_NO_TRUNC | libc::_PC_CHOWN_RESTRICTED => 1,
        libc::_PC_REC_XFER_ALIGN | libc::_PC_ALLOC_SIZE_MIN | libc::_PC_REC_MIN_XFER_SIZE => {
            ops::BLOCK as _
        }
        _ => return Err(err(libc::EINVAL, "pathconf: not known for Cairn")),
    })
}

#[no_mangle]
pub unsafe extern "C" fn pathconf(path: *const c_char, name: c_int) -> libc::c_long {
    unsafe {
        path_call(
            "pathconf",
            FDCWD,
            path,
            |p| real::pathconf(p, name),
            |cp| {
                ops::stat(cp, true)?;
                pathconf_value(name)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn fpathconf(fd: c_int, name: c_int) -> libc::c_long {
    if !table::is_cairn(fd) {
        return unsafe { real::fpathconf(fd, name) };
    }
    run("fpathconf", || pathconf_value(name))
}
