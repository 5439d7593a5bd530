//! The C entry points shared helpers. Every `extern "C"` function of the `abi_*`
//! modules is called by C code under the contract of the POSIX function it stands for:
//! pointers are valid for the sizes given, strings are NUL-terminated. That contract is
//! the SAFETY argument for turning raw arguments into slices and strings here.

use crate::ops::{self, CPath, Where};
use crate::real::Fail;
use crate::state::{self, err};
use crate::table::{self, Ofd};
use std::ffi::{CStr, CString};
use std::io;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

thread_local! {
    /// This thread is inside a Cairn operation (LibFS may start a daemon from it).
    static IN_CAIRN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is inside a Cairn operation: a process LibFS starts then (the
/// daemon) must not make the library digest (LibFS's own locks are held).
pub fn in_cairn() -> bool {
    IN_CAIRN.with(|c| c.get() > 0)
}

/// Run a Cairn operation: its value, or -1 / NULL with errno set. A panic is `EIO`.
pub fn run<T: Fail>(op: &str, f: impl FnOnce() -> io::Result<T>) -> T {
    IN_CAIRN.with(|c| c.set(c.get() + 1));
    let r = catch_unwind(AssertUnwindSafe(f));
    IN_CAIRN.with(|c| c.set(c.get() - 1));
    match r {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => state::fail(op, e),
        Err(_) => state::fail(
            op,
            err(libc::EIO, "internal error (panic) in cairn-preload"),
        ),
    }
}

const PAGE: usize = 4096;
/// A string argument of [`user_cstr`] this long or longer, its NUL included, is
/// `ENAMETOOLONG`, as the kernel answers for a path (`PATH_MAX`).
const MAX_USER_STRING: usize = libc::PATH_MAX as usize;

thread_local! {
    /// Pages this thread found readable lately (`usize::MAX`: none), valid while the
    /// process unmapped nothing since (the count of [`UNMAPS`] they were read at).
    static READABLE: std::cell::Cell<([usize; 4], u64)> =
        const { std::cell::Cell::new(([usize::MAX; 4], 0)) };
}

/// Mappings removed, moved or reprotected through this library (`munmap`, `mremap`,
/// `mprotect`): cached readable pages are forgotten.
static UNMAPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A mapping was removed, moved or reprotected.
pub fn mappings_changed() {
    UNMAPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the page at `page` (aligned) can be read: from this thread's cache, else by
/// having the kernel copy one byte of it (`process_vm_readv` on this process, which
/// answers `EFAULT` instead of faulting). A kernel that refuses the call itself (a
/// seccomp filter) is taken to mean "readable", the behaviour without this check.
fn page_readable(page: usize) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    let now = UNMAPS.load(Relaxed);
    let (mut pages, at) = READABLE.with(|c| c.get());
    if at == now && pages.contains(&page) {
        return true;
    }
    if at != now {
        pages = [usize::MAX; 4];
    }
    let mut byte = 0u8;
    let local = libc::iovec {
        iov_base: (&mut byte as *mut u8).cast(),
        iov_len: 1,
    };
    let remote = libc::iovec {
        iov_base: page as *mut libc::c_void,
        iov_len: 1,
    };
    // SAFETY: the kernel copies one byte from `page` of this process into `byte`
    // (valid for the call) or fails; nothing is read through a Rust reference.
    let r = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if r != 1 && crate::real::errno() == libc::EFAULT {
        return false;
    }
    pages.rotate_right(1);
    pages[0] = page;
    READABLE.with(|c| c.set((pages, now)));
    true
}

/// A string argument of a C call: `None` for NULL, `EFAULT` if it lies in memory the
/// process cannot read (as the kernel answers, where reading it would crash the
/// program), `ENAMETOOLONG` when it is `PATH_MAX` bytes long or longer with its NUL.
///
/// SAFETY: `p` is NULL, or its readable bytes up to a NUL are a string that outlives
/// the result (the caller's contract, except that the memory may be unreadable).
pub unsafe fn user_cstr<'a>(p: *const c_char) -> io::Result<Option<&'a [u8]>> {
    if p.is_null() {
        return Ok(None);
    }
    let start = p as usize;
    let mut page = start & !(PAGE - 1);
    loop {
        if !page_readable(page) {
            return Err(err(libc::EFAULT, "bad address (string argument)"));
        }
        let from = start.max(page);
        // SAFETY: `[from, page + PAGE)` lies in one readable page.
        let hit = unsafe { libc::memchr(from as *const libc::c_void, 0, page + PAGE - from) };
        if !hit.is_null() && hit as usize - start < MAX_USER_STRING {
            // SAFETY: every page from `start` to the NUL was found readable.
            let s = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), hit as usize - start) };
            return Ok(Some(s));
        }
        page += PAGE;
        if !hit.is_null() || page - start >= MAX_USER_STRING {
            return Err(err(
                libc::ENAMETOOLONG,
                "path argument of PATH_MAX (4096) bytes or more",
            ));
        }
    }
}

/// SAFETY: `p` is NULL or a NUL-terminated string that outlives the result.
pub unsafe fn cbytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        None
    } else {
        // SAFETY: see the function comment.
        Some(unsafe { CStr::from_ptr(p) }.to_bytes())
    }
}

/// Where a path argument goes.
pub enum Route {
    /// To the C library: the original pointer, or this rewritten path.
    Host(Option<CString>),
    Cairn(CPath),
}

impl Route {
    /// The pointer to give the C library (`orig` unless rewritten).
    pub fn host_ptr(&self, orig: *const c_char) -> *const c_char {
        match self {
            Route::Host(Some(c)) => c.as_ptr(),
            _ => orig,
        }
    }
}

/// SAFETY: `p` is NULL or a NUL-terminated string.
pub unsafe fn route(dirfd: c_int, p: *const c_char) -> io::Result<Route> {
    // SAFETY: see the function comment.
    let Some(b) = (unsafe { user_cstr(p) })? else {
        return Ok(Route::Host(None));
    };
    Ok(match ops::classify(dirfd, b)? {
        Where::Host(None) => Route::Host(None),
        Where::Host(Some(v)) => Route::Host(Some(
            CString::new(v).map_err(|_| err(libc::EINVAL, "path"))?,
        )),
        Where::Cairn(cp) => Route::Cairn(cp),
    })
}

/// A path call: to the C library (`host` with the pointer to use) or to Cairn.
///
/// SAFETY: `p` is NULL or a NUL-terminated string.
pub unsafe fn path_call<T: Fail>(
    op: &str,
    dirfd: c_int,
    p: *const c_char,
    host: impl FnOnce(*const c_char) -> T,
    cairn: impl FnOnce(&CPath) -> io::Result<T>,
) -> T {
    // SAFETY: see the function comment.
    match unsafe { route(dirfd, p) } {
        Ok(Route::Cairn(cp)) => cairn_or_host(op, || cairn(&cp), host),
        Ok(r) => host(r.host_ptr(p)),
        Err(e) => state::fail(op, e),
    }
}

/// Run the Cairn side of a path call; if the path led out of the store (a symbolic
/// link or `..`: `cairn_area::error::elsewhere`), the host's call (`host`) goes on with
/// the host path LibFS resolved.
pub fn cairn_or_host<T: Fail>(
    op: &str,
    cairn: impl FnOnce() -> io::Result<T>,
    host: impl FnOnce(*const c_char) -> T,
) -> T {
    let mut elsewhere = None;
    let r = run(op, || {
        cairn()
            .inspect_err(|e| elsewhere = cairn_area::error::elsewhere_path(e).map(<[u8]>::to_vec))
    });
    match elsewhere.map(CString::new) {
        Some(Ok(h)) => host(h.as_ptr()),
        _ => r,
    }
}

/// A call on a descriptor known to be Cairn's (else `host`).
pub fn fd_call<T: Fail>(
    op: &str,
    fd: c_int,
    host: impl FnOnce() -> T,
    cairn: impl FnOnce(Arc<Ofd>) -> io::Result<T>,
) -> T {
    match table::get(fd) {
        Some(o) => run(op, || cairn(o)),
        None => host(),
    }
}

/// `*at` calls with `AT_EMPTY_PATH` and an empty path act on `dirfd` itself.
///
/// SAFETY: `p` is NULL or a NUL-terminated string.
pub unsafe fn empty_path(p: *const c_char, flags: c_int) -> bool {
    // SAFETY: see the function comment.
    flags & libc::AT_EMPTY_PATH != 0
        && unsafe { user_cstr(p) }.is_ok_and(|b| b.is_some_and(|b| b.is_empty()))
}

/// A Cairn path naming the inode of a Cairn descriptor (for `f*` calls).
pub fn inode_path(o: &Ofd) -> CPath {
    CPath {
        dir: o.ino,
        path: Vec::new(),
        base: ops::Base::Unknown,
    }
}

/// Copy `s` into a caller's buffer of `n` bytes as a C string (`ERANGE` if too small).
///
/// SAFETY: `buf` is valid for `n` bytes.
pub unsafe fn copy_cstr(s: &[u8], buf: *mut c_char, n: usize) -> io::Result<()> {
    if s.len() + 1 > n {
        return Err(err(libc::ERANGE, "buffer too small"));
    }
    // SAFETY: `buf` holds `n >= s.len() + 1` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

/// Answer a `getxattr`/`listxattr`-style call: the length of `v` when `n` is 0 (a size
/// query), else `v` copied into `buf` (`ERANGE` if it does not fit).
///
/// SAFETY: `buf` is valid for `n` bytes.
pub unsafe fn give_bytes(v: &[u8], buf: *mut libc::c_void, n: usize) -> io::Result<isize> {
    if n != 0 {
        if v.len() > n {
            return Err(err(libc::ERANGE, "buffer too small for the answer"));
        }
        // SAFETY: `buf` holds `n >= v.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), buf as *mut u8, v.len()) };
    }
    Ok(v.len() as isize)
}

/// An attribute name argument (`EFAULT` if NULL).
///
/// SAFETY: `p` is NULL or a C string.
pub unsafe fn xattr_name<'a>(p: *const c_char) -> io::Result<&'a [u8]> {
    match unsafe { user_cstr(p) } {
        Ok(b) => b.ok_or_else(|| err(libc::EFAULT, "NULL attribute name")),
        // The kernel reads at most 256 bytes of a name: longer is `ERANGE`.
        Err(e) if crate::state::errno_of(&e) == libc::ENAMETOOLONG => {
            Err(err(libc::ERANGE, "attribute name too long"))
        }
        Err(e) => Err(e),
    }
}

/// A `malloc`ed copy of `s` as a C string (the caller frees it).
pub fn malloc_cstr(s: &[u8]) -> io::Result<*mut c_char> {
    // SAFETY: malloc of `len + 1` bytes, checked for NULL, then filled.
    unsafe {
        let p = libc::malloc(s.len() + 1) as *mut c_char;
        if p.is_null() {
            return Err(err(libc::ENOMEM, "out of memory"));
        }
        copy_cstr(s, p, s.len() + 1)?;
        Ok(p)
    }
}

/// Both paths of a two-path call must be on the same side (`EXDEV` otherwise).
pub fn both_cairn(a: &Route, b: &Route) -> Option<io::Result<()>> {
    match (a, b) {
        (Route::Cairn(_), Route::Cairn(_)) => Some(Ok(())),
        (Route::Host(_), Route::Host(_)) => None,
        _ => Some(Err(err(
            libc::EXDEV,
            "between Cairn and another file system",
        ))),
    }
}

/// SAFETY for the two below: `ptr` is valid for `len` bytes (or `len` is 0).
pub unsafe fn slice<'a>(ptr: *const libc::c_void, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: see above.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
}

pub unsafe fn slice_mut<'a>(ptr: *mut libc::c_void, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: see above.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
}

/// Fill any `stat`-shaped structure (`stat`, `stat64`: one layout on x86-64) from an
/// `ops::Stat`.
macro_rules! fill_stat {
    ($st:expr, $s:expr) => {{
        let s: &crate::ops::Stat = $s;
        let st = $st;
        st.st_dev = crate::ops::DEV as _;
        st.st_ino = s.ino as _;
        st.st_mode = s.mode as _;
        st.st_nlink = s.nlink as _;
        st.st_uid = s.uid;
        st.st_gid = s.gid;
        st.st_rdev = s.rdev as _;
        st.st_size = s.size as _;
        st.st_blksize = crate::ops::BLOCK as _;
        st.st_blocks = s.blocks as _;
        st.st_atime = s.atime.0 as _;
        st.st_atime_nsec = s.atime.1 as _;
        st.st_mtime = s.mtime.0 as _;
        st.st_mtime_nsec = s.mtime.1 as _;
        st.st_ctime = s.ctime.0 as _;
        st.st_ctime_nsec = s.ctime.1 as _;
    }};
}
pub(crate) use fill_stat;

pub fn fill_statx(st: &mut libc::statx, s: &ops::Stat) {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    st.stx_blksize = ops::BLOCK as u32;
    st.stx_nlink = s.nlink.min(u32::MAX as u64) as u32;
    st.stx_uid = s.uid;
    st.stx_gid = s.gid;
    st.stx_mode = s.mode as u16;
    st.stx_ino = s.ino;
    let (major, minor) = cairn::major_minor(s.rdev);
    st.stx_rdev_major = major as u32;
    st.stx_rdev_minor = minor as u32;
    st.stx_size = s.size;
    st.stx_blocks = s.blocks;
    let ts = |t: (i64, i64)| {
        // SAFETY: plain old data; all-zero is a valid value.
        let mut x: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        x.tv_sec = t.0;
        x.tv_nsec = t.1 as u32;
        x
    };
    st.stx_atime = ts(s.atime);
    st.stx_btime = ts(s.btime);
    st.stx_ctime = ts(s.ctime);
    st.stx_mtime = ts(s.mtime);
    st.stx_dev_major = (ops::DEV >> 8) as u32 & 0xfff;
    st.stx_dev_minor = (ops::DEV & 0xff) as u32;
}

pub fn ok0(r: io::Result<()>) -> io::Result<c_int> {
    r.map(|()| 0)
}
