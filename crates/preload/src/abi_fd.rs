//! Calls on descriptors: data, positions, sync, sizes, metadata, dup, fcntl, locks.
//! SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{fd_call, fill_stat, fill_statx, inode_path, ok0, run, slice, slice_mut};
use crate::ops;
use crate::real::{self, set_errno};
use crate::state::{self, err};
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
            state::step_aside_for(fd);
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
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe {
        real::syscall6(
            libc::SYS_readahead,
            [fd as libc::c_long, off, n as libc::c_long, 0, 0, 0],
        ) as ssize_t
    }
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
    if old != new && !table::is_cairn(new) {
        state::step_aside_for(new);
    }
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new {
        duped(old, new);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, fl: c_int) -> c_int {
    if old != new && !table::is_cairn(new) {
        state::step_aside_for(new);
    }
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
        // As Linux: no event asked for (`DN_MULTISHOT` alone, or 0) removes this
        // descriptor's notification, which a Cairn file never has, and succeeds; events
        // on anything but a directory are `ENOTDIR`; on a directory they are refused
        // below (not supported).
        libc::F_NOTIFY if (arg as u32) & !DN_MULTISHOT == 0 => 0,
        libc::F_NOTIFY if !o.dir => run("fcntl", || {
            Err(err(libc::ENOTDIR, "fcntl F_NOTIFY: not a directory"))
        }),
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

/// `<fcntl.h>`'s `DN_MULTISHOT` (the `libc` crate lacks it): keep a directory
/// notification after its first signal.
const DN_MULTISHOT: u32 = 0x8000_0000;

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

// ---- ioctl and closing ranges -----------------------------------------------------------

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
    if fl & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && first <= last {
        state::step_aside(first as usize, last as usize);
    }
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
    state::step_aside(first.max(0) as usize, usize::MAX);
    unsafe { real::closefrom(first) };
    table::template_gone(first.max(0) as usize, usize::MAX);
    for o in table::remove_range(first.max(0) as usize, usize::MAX) {
        run("closefrom", || {
            ops::closed(o);
            Ok(0)
        });
    }
}
