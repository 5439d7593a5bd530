//! Calls on descriptors: data, positions, sync, sizes, metadata, dup, fcntl, locks.
//! SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{
    fd_call, fill_stat, fill_statx, give_bytes, inode_path, ok0, run, slice, slice_mut, xattr_name,
};
use crate::ops;
use crate::real::{self, set_errno};
use crate::state::err;
use crate::table::{self, Ofd};
use libc::{c_int, c_uint, c_void, iovec, off64_t, size_t, ssize_t};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    match table::remove(fd) {
        None => {
            table::template_gone(fd as usize, fd as usize);
            unsafe { real::close(fd) }
        }
        Some(o) => {
            let r = unsafe { real::close(fd) };
            let e = real::errno();
            run("close", || {
                ops::closed(o);
                Ok(0)
            });
            set_errno(e);
            r
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::read(fd, buf, n) };
    }
    fd_call(
        "read",
        fd,
        || unsafe { real::read(fd, buf, n) },
        |o| ops::read(fd, &o, unsafe { slice_mut(buf, n) }).map(|n| n as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    _buflen: size_t,
) -> ssize_t {
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::write(fd, buf, n) };
    }
    fd_call(
        "write",
        fd,
        || unsafe { real::write(fd, buf, n) },
        |o| ops::write(fd, &o, unsafe { slice(buf, n) }).map(|n| n as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::pread64(fd, buf, n, off) };
    }
    fd_call(
        "pread",
        fd,
        || unsafe { real::pread64(fd, buf, n, off) },
        |o| ops::pread(&o, unsafe { slice_mut(buf, n) }, off).map(|n| n as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    _l: size_t,
) -> ssize_t {
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off64_t,
    _l: size_t,
) -> ssize_t {
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    off: off64_t,
) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::pwrite64(fd, buf, n, off) };
    }
    fd_call(
        "pwrite",
        fd,
        || unsafe { real::pwrite64(fd, buf, n, off) },
        |o| ops::pwrite(&o, unsafe { slice(buf, n) }, off).map(|n| n as ssize_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pwrite64(fd, buf, n, off) }
}

/// The buffers of an iovec array. SAFETY: `iov` holds `cnt` valid entries.
unsafe fn iovecs<'a>(iov: *const iovec, cnt: c_int) -> io::Result<Vec<&'a mut [u8]>> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(err(libc::EINVAL, "bad iovec count"));
    }
    let v = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    Ok(v.iter()
        .map(|e| unsafe { slice_mut(e.iov_base, e.iov_len) })
        .collect())
}

/// Gather an iovec array into one buffer (one atomic write); a single buffer is used
/// as it is. SAFETY: as `iovecs`.
unsafe fn gathered<'a>(iov: *const iovec, cnt: c_int) -> io::Result<std::borrow::Cow<'a, [u8]>> {
    let bufs = unsafe { iovecs(iov, cnt) }?;
    if bufs.len() == 1 {
        let b: &'a [u8] = bufs.into_iter().next().expect("one");
        return Ok(std::borrow::Cow::Borrowed(b));
    }
    Ok(std::borrow::Cow::Owned(bufs.concat()))
}

unsafe fn readv_any(
    op: &str,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: Option<off64_t>,
) -> ssize_t {
    fd_call(
        op,
        fd,
        || unsafe {
            match off {
                None => real::readv(fd, iov, cnt),
                Some(o) => real::preadv64(fd, iov, cnt, o),
            }
        },
        |o| {
            let mut bufs = unsafe { iovecs(iov, cnt) }?;
            ops::readv(fd, &o, &mut bufs, off).map(|n| n as ssize_t)
        },
    )
}

unsafe fn writev_any(
    op: &str,
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: Option<off64_t>,
) -> ssize_t {
    fd_call(
        op,
        fd,
        || unsafe {
            match off {
                None => real::writev(fd, iov, cnt),
                Some(o) => real::pwritev64(fd, iov, cnt, o),
            }
        },
        |o| {
            let data = unsafe { gathered(iov, cnt) }?;
            match off {
                None => ops::write(fd, &o, &data),
                Some(off) => ops::pwrite(&o, &data, off),
            }
            .map(|n| n as ssize_t)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    unsafe { readv_any("readv", fd, iov, cnt, None) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    unsafe { writev_any("writev", fd, iov, cnt, None) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { readv_any("preadv", fd, iov, cnt, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t {
    unsafe { preadv64(fd, iov, cnt, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { writev_any("pwritev", fd, iov, cnt, Some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { pwritev64(fd, iov, cnt, off) }
}

/// `preadv2`/`pwritev2`: offset -1 means the position; the flags (hints such as
/// `RWF_DSYNC`) change nothing on Cairn, where every write is durable at return.
#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    fl: c_int,
) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::preadv64v2(fd, iov, cnt, off, fl) };
    }
    unsafe { readv_any("preadv2", fd, iov, cnt, (off != -1).then_some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    fl: c_int,
) -> ssize_t {
    unsafe { preadv64v2(fd, iov, cnt, off, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    fl: c_int,
) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::pwritev64v2(fd, iov, cnt, off, fl) };
    }
    unsafe { writev_any("pwritev2", fd, iov, cnt, (off != -1).then_some(off)) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    fl: c_int,
) -> ssize_t {
    unsafe { pwritev64v2(fd, iov, cnt, off, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    if !table::is_cairn(fd) {
        return unsafe { real::lseek64(fd, off, whence) };
    }
    fd_call(
        "lseek",
        fd,
        || unsafe { real::lseek64(fd, off, whence) },
        |o| ops::lseek(fd, &o, off, whence).map(|p| p as off64_t),
    )
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    unsafe { lseek64(fd, off, whence) }
}

/// Every Cairn call is durable when it returns: the sync calls have nothing to do.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some(o) = table::get(fd) {
        return sync_mapped(&o);
    }
    unsafe { real::fsync(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some(o) = table::get(fd) {
        return sync_mapped(&o);
    }
    unsafe { real::fdatasync(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn sync_file_range(fd: c_int, off: off64_t, n: off64_t, fl: c_uint) -> c_int {
    if let Some(o) = table::get(fd) {
        return sync_mapped(&o);
    }
    unsafe { real::sync_file_range(fd, off, n, fl) }
}

/// `fsync` and friends on a Cairn descriptor: every write is already durable; the
/// file's shared mappings are written back (`File::sync_all`).
fn sync_mapped(o: &Ofd) -> c_int {
    if o.dir || (!o.read && !o.write) {
        return 0;
    }
    run("fsync", || o.file()?.sync_all().map(|()| 0))
}

#[no_mangle]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    if table::is_cairn(fd) {
        return 0;
    }
    unsafe { real::syncfs(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::ftruncate64(fd, len) };
    }
    fd_call(
        "ftruncate",
        fd,
        || unsafe { real::ftruncate64(fd, len) },
        |o| ok0(ops::ftruncate(&o, len)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off64_t) -> c_int {
    unsafe { ftruncate64(fd, len) }
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fallocate64(fd, mode, off, len) };
    }
    fd_call(
        "fallocate",
        fd,
        || unsafe { real::fallocate64(fd, mode, off, len) },
        |o| ok0(ops::fallocate(&o, mode, off, len)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { fallocate64(fd, mode, off, len) }
}

/// Returns the error number instead of setting errno.
#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::posix_fallocate64(fd, off, len) };
    }
    let r = unsafe { fallocate64(fd, 0, off, len) };
    if r == 0 {
        0
    } else {
        real::errno()
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { posix_fallocate64(fd, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    if table::is_cairn(fd) {
        return 0;
    }
    unsafe { real::posix_fadvise64(fd, off, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(
    fd: c_int,
    off: off64_t,
    len: off64_t,
    advice: c_int,
) -> c_int {
    unsafe { posix_fadvise64(fd, off, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn readahead(fd: c_int, off: off64_t, n: size_t) -> ssize_t {
    if table::is_cairn(fd) {
        return 0;
    }
    unsafe { libc::syscall(libc::SYS_readahead, fd, off, n) as ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fstat64(fd, st) };
    }
    fd_call(
        "fstat",
        fd,
        || unsafe { real::fstat64(fd, st) },
        |o| {
            fill_stat!(unsafe { &mut *st }, &ops::fstat(&o)?);
            Ok(0)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat64) -> c_int {
    unsafe { fstat64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::__fxstat64(ver, fd, st) };
    }
    unsafe { fstat64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    unsafe { __fxstat64(ver, fd, st) }
}

/// `fstatfs`/`fstatvfs` of a Cairn descriptor: the store's numbers.
#[no_mangle]
pub unsafe extern "C" fn fstatfs64(fd: c_int, st: *mut libc::statfs64) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fstatfs64(fd, st) };
    }
    run("fstatfs", || {
        crate::abi_path::fill_statfs(unsafe { &mut *st })
    })
}

#[no_mangle]
pub unsafe extern "C" fn fstatfs(fd: c_int, st: *mut libc::statfs64) -> c_int {
    unsafe { fstatfs64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, st: *mut libc::statvfs64) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fstatvfs64(fd, st) };
    }
    run("fstatvfs", || {
        crate::abi_path::fill_statvfs(unsafe { &mut *st })
    })
}

#[no_mangle]
pub unsafe extern "C" fn fstatvfs(fd: c_int, st: *mut libc::statvfs64) -> c_int {
    unsafe { fstatvfs64(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fchmod(fd, mode) };
    }
    fd_call(
        "fchmod",
        fd,
        || unsafe { real::fchmod(fd, mode) },
        |o| ok0(ops::chmod(&inode_path(&o), mode, true)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fchown(fd, uid, gid) };
    }
    fd_call(
        "fchown",
        fd,
        || unsafe { real::fchown(fd, uid, gid) },
        |o| ok0(ops::chown(&inode_path(&o), uid, gid, true)),
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, ts: *const libc::timespec) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::futimens(fd, ts) };
    }
    fd_call(
        "futimens",
        fd,
        || unsafe { real::futimens(fd, ts) },
        |o| {
            let t = unsafe { crate::abi_path::times_of(ts) }?;
            ok0(ops::set_times(&inode_path(&o), t, true))
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::futimes(fd, tv) };
    }
    let ts = unsafe { crate::abi_path::timespecs_of(tv) };
    unsafe { futimens(fd, ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr())) }
}

/// Whether `e` says that `o` is a directory removed while open: Cairn frees its inode at
/// once (Linux keeps it while open), and its attributes with it.
fn removed_dir(o: &Ofd, e: &io::Error) -> bool {
    o.dir && crate::state::errno_of(e) == libc::ENOENT
}

/// `fgetxattr`: on a directory removed while open, `ENODATA` for a valid name (as for
/// `fstat`, which answers from what `open` saw, the descriptor stays usable; LibFS
/// checks the name before the inode).
fn fgetxattr_of(o: &Ofd, name: &[u8]) -> io::Result<Vec<u8>> {
    ops::getxattr(&inode_path(o), name, true).map_err(|e| {
        if removed_dir(o, &e) {
            err(
                libc::ENODATA,
                "fgetxattr: the directory was removed, with its attributes",
            )
        } else {
            e
        }
    })
}

/// `flistxattr`: empty on a directory removed while open.
fn flistxattr_of(o: &Ofd) -> io::Result<Vec<u8>> {
    match ops::listxattr(&inode_path(o), true) {
        Err(e) if removed_dir(o, &e) => Ok(Vec::new()),
        r => r,
    }
}

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(
    fd: c_int,
    name: *const libc::c_char,
    v: *mut c_void,
    n: size_t,
) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::fgetxattr(fd, name, v, n) };
    }
    fd_call(
        "fgetxattr",
        fd,
        || unsafe { real::fgetxattr(fd, name, v, n) },
        |o| unsafe {
            let value = fgetxattr_of(&o, xattr_name(name)?)?;
            give_bytes(&value, v, n)
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const libc::c_char,
    v: *const c_void,
    n: size_t,
    fl: c_int,
) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fsetxattr(fd, name, v, n, fl) };
    }
    fd_call(
        "fsetxattr",
        fd,
        || unsafe { real::fsetxattr(fd, name, v, n, fl) },
        |o| unsafe {
            ok0(ops::setxattr(
                &inode_path(&o),
                xattr_name(name)?,
                slice(v, n),
                fl,
                true,
            ))
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, l: *mut libc::c_char, n: size_t) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::flistxattr(fd, l, n) };
    }
    fd_call(
        "flistxattr",
        fd,
        || unsafe { real::flistxattr(fd, l, n) },
        |o| unsafe { give_bytes(&flistxattr_of(&o)?, l as *mut c_void, n) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const libc::c_char) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fremovexattr(fd, name) };
    }
    fd_call(
        "fremovexattr",
        fd,
        || unsafe { real::fremovexattr(fd, name) },
        |o| unsafe { ok0(ops::removexattr(&inode_path(&o), xattr_name(name)?, true)) },
    )
}

// ---- dup and fcntl --------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = unsafe { real::dup(fd) };
    if r >= 0 {
        if let Some(o) = table::get(fd) {
            table::insert(r, o);
        }
    }
    r
}

/// After the kernel made `new` a copy of `old`: the table follows (and a Cairn file
/// `new` referred to loses a descriptor).
fn duped(old: c_int, new: c_int) {
    table::template_gone(new as usize, new as usize);
    let prev = match table::get(old) {
        Some(o) => table::insert(new, o),
        None => table::remove(new),
    };
    if let Some(p) = prev {
        run("dup2", || {
            ops::closed(p);
            Ok(0)
        });
    }
    crate::abi_stdio::std_stream_changed(new);
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new {
        duped(old, new);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, fl: c_int) -> c_int {
    let r = unsafe { real::dup3(old, new, fl) };
    if r >= 0 {
        duped(old, new);
    }
    r
}

fn lock_type(t: c_int) -> Option<Option<cairn::LockType>> {
    match t as c_int {
        libc::F_RDLCK => Some(Some(cairn::LockType::Read)),
        libc::F_WRLCK => Some(Some(cairn::LockType::Write)),
        libc::F_UNLCK => Some(None),
        _ => None,
    }
}

/// A `struct flock` range as `(start, len)` from the description's position/size.
fn lock_range(fd: c_int, o: &Ofd, fl: &libc::flock64) -> io::Result<(u64, u64)> {
    let base: i64 = match fl.l_whence as c_int {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => ops::lseek(fd, o, 0, libc::SEEK_CUR)? as i64,
        libc::SEEK_END => ops::fstat(o)?.size as i64,
        _ => return Err(err(libc::EINVAL, "fcntl: bad l_whence")),
    };
    let mut start = base
        .checked_add(fl.l_start)
        .ok_or_else(|| err(libc::EOVERFLOW, "fcntl: lock range"))?;
    let mut len = fl.l_len;
    if len < 0 {
        start += len;
        len = -len;
    }
    if start < 0 {
        return Err(err(libc::EINVAL, "fcntl: lock range starts before 0"));
    }
    Ok((start as u64, len as u64))
}

fn fcntl_lock(fd: c_int, o: &Arc<Ofd>, cmd: c_int, arg: usize) -> io::Result<c_int> {
    let fl = unsafe { &mut *(arg as *mut libc::flock64) };
    let kind = match cmd {
        libc::F_SETLK | libc::F_SETLKW | libc::F_GETLK => cairn::LockKind::Posix,
        _ => cairn::LockKind::Ofd,
    };
    let typ =
        lock_type(fl.l_type as c_int).ok_or_else(|| err(libc::EINVAL, "fcntl: bad l_type"))?;
    let (start, len) = lock_range(fd, o, fl)?;
    if o.dir || (!o.read && !o.write) {
        return Err(err(
            libc::EBADF,
            "fcntl: locks need a regular file open for reading or writing",
        ));
    }
    let f = o.file()?;
    if kind == cairn::LockKind::Posix {
        table::mark_posix_locked(o.ino);
    }
    match cmd {
        libc::F_GETLK | libc::F_OFD_GETLK => {
            let t = typ.ok_or_else(|| err(libc::EINVAL, "fcntl: F_GETLK with F_UNLCK"))?;
            match f.get_lock(kind, t, start, len)? {
                None => fl.l_type = libc::F_UNLCK as _,
                Some(c) => {
                    fl.l_type = match c.typ {
                        cairn::LockType::Read => libc::F_RDLCK,
                        cairn::LockType::Write => libc::F_WRLCK,
                    } as _;
                    fl.l_whence = libc::SEEK_SET as _;
                    fl.l_start = c.start as i64;
                    fl.l_len = c.len as i64;
                    fl.l_pid = c.pid;
                }
            }
            Ok(0)
        }
        _ => {
            let wait = cmd == libc::F_SETLKW || cmd == libc::F_OFD_SETLKW;
            match typ {
                None => f.unlock(kind, start, len)?,
                Some(t) => f.lock(kind, t, start, len, wait)?,
            }
            Ok(0)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::fcntl64(fd, cmd, arg) };
    }
    let Some(o) = table::get(fd) else {
        return unsafe { real::fcntl64(fd, cmd, arg) };
    };
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let r = unsafe { real::fcntl64(fd, cmd, arg) };
            if r >= 0 {
                table::insert(r, o);
            }
            r
        }
        libc::F_GETFL => {
            let acc = match (o.read, o.write) {
                (true, true) => libc::O_RDWR,
                (false, true) => libc::O_WRONLY,
                (false, false) => libc::O_PATH,
                _ => libc::O_RDONLY,
            };
            let append = if o.append.load(Ordering::Relaxed) {
                libc::O_APPEND
            } else {
                0
            };
            let dir = if o.dir { libc::O_DIRECTORY } else { 0 };
            acc | append | dir | libc::O_LARGEFILE
        }
        libc::F_SETFL => {
            // O_APPEND is the flag that matters; O_NONBLOCK, O_DIRECT, O_NOATIME are
            // accepted and change nothing (the placeholder keeps them for F_GETFL users).
            o.append
                .store(arg as c_int & libc::O_APPEND != 0, Ordering::Relaxed);
            unsafe { real::fcntl64(fd, cmd, arg) }
        }
        libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW
        | libc::F_OFD_GETLK => run("fcntl", || fcntl_lock(fd, &o, cmd, arg)),
        libc::F_GETFD | libc::F_SETFD => unsafe { real::fcntl64(fd, cmd, arg) },
        libc::F_ADD_SEALS
        | libc::F_GET_SEALS
        | libc::F_SETLEASE
        | libc::F_GETLEASE
        | libc::F_NOTIFY => run("fcntl", || {
            Err(err(libc::EINVAL, "fcntl: not supported on a Cairn file"))
        }),
        _ => unsafe { real::fcntl64(fd, cmd, arg) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    unsafe { fcntl64(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    if !table::is_cairn(fd) {
        return unsafe { real::flock(fd, op) };
    }
    fd_call(
        "flock",
        fd,
        || unsafe { real::flock(fd, op) },
        |o| {
            let nb = op & libc::LOCK_NB != 0;
            let op = match op & !libc::LOCK_NB {
                libc::LOCK_SH => cairn::FlockOp::Shared,
                libc::LOCK_EX => cairn::FlockOp::Exclusive,
                libc::LOCK_UN => cairn::FlockOp::Unlock,
                _ => return Err(err(libc::EINVAL, "flock: bad operation")),
            };
            if o.dir || (!o.read && !o.write) {
                return Err(err(libc::EBADF, "flock: not supported on this descriptor"));
            }
            ok0(o.file()?.flock(op, nb))
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const libc::c_char,
    flags: c_int,
    mask: c_uint,
    st: *mut libc::statx,
) -> c_int {
    if unsafe { crate::abi::empty_path(path, flags) } && table::is_cairn(dirfd) {
        return fd_call(
            "statx",
            dirfd,
            || unsafe { real::statx(dirfd, path, flags, mask, st) },
            |o| {
                fill_statx(unsafe { &mut *st }, &ops::fstat(&o)?);
                Ok(0)
            },
        );
    }
    unsafe {
        crate::abi::path_call(
            "statx",
            dirfd,
            path,
            |p| real::statx(dirfd, p, flags, mask, st),
            |cp| {
                let m = ops::stat(cp, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
                fill_statx(&mut *st, &ops::stat_of(&m));
                Ok(0)
            },
        )
    }
}

// ---- descriptors moving between files --------------------------------------------------

/// One side of a copy between descriptors that involves a Cairn file (the kernel cannot
/// see Cairn data, so such copies run here, through a buffer).
enum End {
    Cairn(c_int, Arc<Ofd>),
    Host(c_int),
}

impl End {
    fn of(fd: c_int) -> End {
        match table::get(fd) {
            Some(o) => End::Cairn(fd, o),
            None => End::Host(fd),
        }
    }

    /// Read into `buf` at `off`, or at the descriptor's position (moving it).
    fn read(&self, buf: &mut [u8], off: Option<u64>) -> io::Result<usize> {
        match (self, off) {
            (End::Cairn(_, o), Some(off)) => ops::pread(o, buf, off as i64),
            (End::Cairn(fd, o), None) => ops::read(*fd, o, buf),
            // SAFETY: `buf` is a Rust buffer of `buf.len()` bytes.
            (End::Host(fd), Some(off)) => host_io(unsafe {
                real::pread64(
                    *fd,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    off as off64_t,
                )
            }),
            // SAFETY: as above.
            (End::Host(fd), None) => {
                host_io(unsafe { real::read(*fd, buf.as_mut_ptr() as *mut c_void, buf.len()) })
            }
        }
    }

    /// Write `buf` at `off`, or at the descriptor's position; the bytes written (a host
    /// socket or pipe may take fewer).
    fn write(&self, buf: &[u8], off: Option<u64>) -> io::Result<usize> {
        match (self, off) {
            (End::Cairn(_, o), Some(off)) => ops::pwrite(o, buf, off as i64),
            (End::Cairn(fd, o), None) => ops::write(*fd, o, buf),
            // SAFETY: `buf` is a Rust buffer of `buf.len()` bytes.
            (End::Host(fd), Some(off)) => host_io(unsafe {
                real::pwrite64(
                    *fd,
                    buf.as_ptr() as *const c_void,
                    buf.len(),
                    off as off64_t,
                )
            }),
            // SAFETY: as above.
            (End::Host(fd), None) => {
                host_io(unsafe { real::write(*fd, buf.as_ptr() as *const c_void, buf.len()) })
            }
        }
    }

    fn is_pipe(&self) -> bool {
        let End::Host(fd) = self else {
            return false;
        };
        // SAFETY: fstat into a local buffer.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        let r = unsafe { real::fstat64(*fd, &mut st) };
        r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    }
}

fn host_io(r: ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Copy up to `n` bytes from `src` (at `*src_off` if given, which moves; else at its
/// position) to `dst` (likewise), through a buffer; the bytes copied. Stops at the end
/// of the source, or when the destination takes fewer bytes than offered (a full
/// socket or pipe: the source moves only by what was written). An error after some
/// bytes were copied returns the count, as the kernel's copies do.
fn copy_through(
    src: &End,
    src_off: Option<&mut u64>,
    dst: &End,
    dst_off: Option<&mut u64>,
    n: usize,
) -> io::Result<usize> {
    const CHUNK: usize = 256 << 10;
    let mut buf = vec![0u8; CHUNK.min(n.max(1))];
    let (mut so, mut dof) = (src_off, dst_off);
    let mut done = 0usize;
    while done < n {
        let want = buf.len().min(n - done);
        let r = src.read(&mut buf[..want], so.as_deref().copied());
        let got = match r {
            Ok(0) => break,
            Ok(k) => k,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        };
        let mut put = 0;
        while put < got {
            match dst.write(&buf[put..got], dof.as_deref().map(|o| *o + put as u64)) {
                Ok(0) => break,
                Ok(k) => put += k,
                Err(_) if done + put > 0 => break,
                Err(e) => return Err(e),
            }
        }
        if let Some(o) = so.as_deref_mut() {
            *o += put as u64;
        } else if put < got {
            // The source's position moved past bytes the destination did not take.
            if let End::Cairn(fd, o) = src {
                let _ = ops::lseek(*fd, o, -((got - put) as i64), libc::SEEK_CUR);
            }
        }
        if let Some(o) = dof.as_deref_mut() {
            *o += put as u64;
        }
        done += put;
        if put < got || got < want {
            break;
        }
    }
    Ok(done)
}

/// The offset behind a caller's `off64_t *` (`None`: NULL, use the position).
/// SAFETY: `p` is NULL or points to a valid `off64_t`.
unsafe fn offset_arg(p: *mut off64_t) -> io::Result<Option<u64>> {
    if p.is_null() {
        return Ok(None);
    }
    let v = unsafe { *p };
    u64::try_from(v)
        .map(Some)
        .map_err(|_| err(libc::EINVAL, "negative offset"))
}

/// Run a copy with the caller's offset pointers, writing the moved offsets back.
/// SAFETY: `p1` and `p2` are NULL or point to valid `off64_t`s.
unsafe fn copy_with_offsets(
    op: &str,
    src: End,
    p1: *mut off64_t,
    dst: End,
    p2: *mut off64_t,
    n: usize,
) -> ssize_t {
    run(op, || {
        let (mut a, mut b) = unsafe { (offset_arg(p1)?, offset_arg(p2)?) };
        let done = copy_through(&src, a.as_mut(), &dst, b.as_mut(), n)?;
        // SAFETY: the pointers were checked above (NULL, or valid).
        unsafe {
            if let Some(a) = a {
                *p1 = a as off64_t;
            }
            if let Some(b) = b {
                *p2 = b as off64_t;
            }
        }
        Ok(done as ssize_t)
    })
}

/// `copy_file_range` with a Cairn file on either side (to or from the host too) copies
/// through a buffer; only host to host goes to the kernel.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd1: c_int,
    o1: *mut off64_t,
    fd2: c_int,
    o2: *mut off64_t,
    n: size_t,
    fl: c_uint,
) -> ssize_t {
    if !table::is_cairn(fd1) && !table::is_cairn(fd2) {
        return unsafe { real::copy_file_range(fd1, o1, fd2, o2, n, fl) };
    }
    let (src, dst) = (End::of(fd1), End::of(fd2));
    let checked = run("copy_file_range", || {
        if fl != 0 {
            return Err(err(libc::EINVAL, "copy_file_range: flags must be 0"));
        }
        for (e, write) in [(&src, false), (&dst, true)] {
            if let End::Cairn(_, o) = e {
                if o.dir {
                    return Err(err(libc::EISDIR, "copy_file_range: a directory"));
                }
                if (write && !o.write) || (!write && !o.read) {
                    return Err(err(libc::EBADF, "copy_file_range: wrong access mode"));
                }
                if write && o.append.load(Ordering::Relaxed) {
                    return Err(err(libc::EBADF, "copy_file_range: O_APPEND destination"));
                }
            }
        }
        if let (End::Cairn(_, a), End::Cairn(_, b)) = (&src, &dst) {
            if a.ino == b.ino {
                // Linux refuses overlapping ranges of one file.
                let pos = |p: *mut off64_t, o: &Ofd, fd: c_int| -> io::Result<u64> {
                    // SAFETY: NULL or a valid pointer (the caller's contract).
                    match unsafe { offset_arg(p)? } {
                        Some(v) => Ok(v),
                        None => ops::lseek(fd, o, 0, libc::SEEK_CUR),
                    }
                };
                let (x, y) = (pos(o1, a, fd1)?, pos(o2, b, fd2)?);
                if x < y.saturating_add(n as u64) && y < x.saturating_add(n as u64) {
                    return Err(err(
                        libc::EINVAL,
                        "copy_file_range: overlapping ranges of one file",
                    ));
                }
            }
        }
        Ok(0)
    });
    if checked < 0 {
        return -1;
    }
    unsafe { copy_with_offsets("copy_file_range", src, o1, dst, o2, n) }
}

/// `sendfile` from a Cairn file (to a socket, a pipe or any file) copies through a
/// buffer; to a Cairn file from the host likewise.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut off64_t,
    n: size_t,
) -> ssize_t {
    if !table::is_cairn(out) && !table::is_cairn(inp) {
        return unsafe { real::sendfile64(out, inp, off, n) };
    }
    let (src, dst) = (End::of(inp), End::of(out));
    if let End::Cairn(_, o) = &src {
        if o.dir || !o.read {
            return run("sendfile", || {
                Err(err(libc::EBADF, "sendfile: source not open for reading"))
            });
        }
    }
    unsafe { copy_with_offsets("sendfile", src, off, dst, std::ptr::null_mut(), n) }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    unsafe { sendfile64(out, inp, off, n) }
}

/// `splice` between a Cairn file and a pipe copies through a buffer (one side must be a
/// pipe, whose offset must be NULL, as Linux requires).
#[no_mangle]
pub unsafe extern "C" fn splice(
    fd1: c_int,
    o1: *mut off64_t,
    fd2: c_int,
    o2: *mut off64_t,
    n: size_t,
    fl: c_uint,
) -> ssize_t {
    if !table::is_cairn(fd1) && !table::is_cairn(fd2) {
        return unsafe { real::splice(fd1, o1, fd2, o2, n, fl) };
    }
    let (src, dst) = (End::of(fd1), End::of(fd2));
    let (pipe_in, pipe_out) = (src.is_pipe(), dst.is_pipe());
    if !pipe_in && !pipe_out {
        return run("splice", || {
            Err(err(libc::EINVAL, "splice: neither descriptor is a pipe"))
        });
    }
    if (pipe_in && !o1.is_null()) || (pipe_out && !o2.is_null()) {
        return run("splice", || {
            Err(err(libc::ESPIPE, "splice: offset given for a pipe"))
        });
    }
    unsafe { copy_with_offsets("splice", src, o1, dst, o2, n) }
}

// `ioctl` requests answered for Cairn files (`linux/fs.h`, `asm-generic/ioctls.h`).
const FIGETBSZ: libc::c_ulong = 2;
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
const FS_IOC32_GETFLAGS: libc::c_ulong = 0x8004_6601;
const FS_IOC32_SETFLAGS: libc::c_ulong = 0x4004_6602;
const FICLONE: libc::c_ulong = 0x4004_9409;
const FICLONERANGE: libc::c_ulong = 0x4020_940d;
const FIDEDUPERANGE: libc::c_ulong = 0xc018_9436;
const FS_IOC_FIEMAP: libc::c_ulong = 0xc020_660b;

/// `ioctl` on a Cairn descriptor: requests about the descriptor itself (close-on-exec,
/// non-blocking, async) go to its placeholder; `FIONREAD` (bytes from the position to
/// the end), `FIGETBSZ` (4096) and `FS_IOC_GETFLAGS` (no flags) answer as ext4 would;
/// `FS_IOC_SETFLAGS` accepts only no flags; reflinks and `FIEMAP` are `EOPNOTSUPP`;
/// everything else is `ENOTTY` (not a terminal, no such request), as on a file system
/// without it. (The C prototype is variadic; the third argument, when there is one, is
/// one register on x86-64 as for a fixed argument.)
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int {
    let Some(o) = table::get(fd) else {
        return unsafe { real::ioctl(fd, req, arg) };
    };
    match req {
        libc::FIOCLEX | libc::FIONCLEX | libc::FIONBIO | libc::FIOASYNC => {
            return unsafe { real::ioctl(fd, req, arg) };
        }
        _ => {}
    }
    let put_int = |v: c_int| -> io::Result<c_int> {
        if arg.is_null() {
            return Err(err(libc::EFAULT, "ioctl: NULL argument"));
        }
        // SAFETY: the request's argument is a pointer to an int (the caller's contract).
        unsafe { *(arg as *mut c_int) = v };
        Ok(0)
    };
    run("ioctl", || match req {
        libc::FIONREAD if !o.dir => {
            let size = o.file()?.metadata()?.len();
            let pos = ops::lseek(fd, &o, 0, libc::SEEK_CUR)?;
            put_int(size.saturating_sub(pos).min(c_int::MAX as u64) as c_int)
        }
        FIGETBSZ => put_int(4096),
        FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => put_int(0),
        FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
            if arg.is_null() {
                return Err(err(libc::EFAULT, "ioctl: NULL argument"));
            }
            // SAFETY: as `put_int`.
            match unsafe { *(arg as *const c_int) } {
                0 => Ok(0),
                _ => Err(err(
                    libc::EOPNOTSUPP,
                    "ioctl FS_IOC_SETFLAGS: Cairn files have no inode flags",
                )),
            }
        }
        FICLONE | FICLONERANGE | FIDEDUPERANGE => Err(err(
            libc::EOPNOTSUPP,
            "ioctl: reflinks are not supported on Cairn (copy instead)",
        )),
        FS_IOC_FIEMAP => Err(err(
            libc::EOPNOTSUPP,
            "ioctl FIEMAP: not supported on Cairn",
        )),
        _ => Err(err(libc::ENOTTY, "ioctl: not supported on a Cairn file")),
    })
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, fl: c_int) -> c_int {
    let r = unsafe { real::close_range(first, last, fl) };
    if r == 0 && fl & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        table::template_gone(first as usize, last as usize);
        for o in table::remove_range(first as usize, last as usize) {
            run("close_range", || {
                ops::closed(o);
                Ok(0)
            });
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(first: c_int) {
    unsafe { real::closefrom(first) };
    table::template_gone(first.max(0) as usize, usize::MAX);
    for o in table::remove_range(first.max(0) as usize, usize::MAX) {
        run("closefrom", || {
            ops::closed(o);
            Ok(0)
        });
    }
}
