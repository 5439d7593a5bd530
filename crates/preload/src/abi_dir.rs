//! Directory streams (`opendir` … `closedir`) and `getdents64` on Cairn directories.
//! SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{fd_call, run};
use crate::maps::{Stream, DIRS};
use crate::ops;
use crate::real;
use crate::real::{Ftw, FtwFn, Glob, GlobErr, NftwFn, ScanCompar, ScanFilter};
use crate::state::err;
use crate::table::{self, Dent};
use libc::{c_char, c_int, c_long, c_void, dirent64, size_t, ssize_t, DIR};
use std::io;

fn is_ours(d: *mut DIR) -> bool {
    !d.is_null()
        && DIRS
            .lock()
            .as_ref()
            .is_some_and(|m| m.contains_key(&(d as usize)))
}

/// A stream over Cairn directory descriptor `fd` (which it owns from now on).
fn new_stream(fd: c_int) -> io::Result<*mut DIR> {
    let o = table::get(fd).ok_or_else(|| err(libc::EBADF, "not a Cairn descriptor"))?;
    if !o.dir {
        return Err(err(libc::ENOTDIR, "fdopendir: not a directory"));
    }
    let entries = ops::list(o.ino)?;
    // SAFETY: dirent64 is plain old data; all-zero is a valid value.
    let ent: dirent64 = unsafe { std::mem::zeroed() };
    let b = Box::new(Stream {
        fd,
        entries,
        next: 0,
        ent,
    });
    let p = &*b as *const Stream as usize;
    DIRS.lock()
        .get_or_insert_with(Default::default)
        .insert(p, b);
    Ok(p as *mut DIR)
}

/// A stream over the Cairn directory at `cp`.
fn open_stream(cp: &ops::CPath) -> io::Result<*mut DIR> {
    let fd = ops::open(cp, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
    new_stream(fd).inspect_err(|_| {
        unsafe { crate::abi_fd::close(fd) };
    })
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    match unsafe { crate::abi::route(libc::AT_FDCWD, path) } {
        Err(e) => crate::state::fail("opendir", e),
        Ok(crate::abi::Route::Cairn(cp)) => crate::abi::cairn_or_host(
            "opendir",
            || open_stream(&cp),
            |h| unsafe { real::opendir(h) },
        ),
        Ok(r) => unsafe { real::opendir(r.host_ptr(path)) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut DIR {
    if !table::is_cairn(fd) {
        return unsafe { real::fdopendir(fd) };
    }
    run("fdopendir", || new_stream(fd))
}

/// The next entry into the stream's own `dirent64` (NULL at the end).
fn next_entry(d: *mut DIR) -> *mut dirent64 {
    let mut g = DIRS.lock();
    let Some(s) = g.as_mut().and_then(|m| m.get_mut(&(d as usize))) else {
        return std::ptr::null_mut();
    };
    let Some(e) = s.entries.get(s.next) else {
        return std::ptr::null_mut();
    };
    s.next += 1;
    fill_dirent(&mut s.ent, e, s.next as i64);
    &mut s.ent as *mut dirent64
}

fn fill_dirent(out: &mut dirent64, e: &Dent, off: i64) {
    out.d_ino = e.ino;
    out.d_off = off;
    out.d_type = e.kind;
    let n = e.name.len().min(out.d_name.len() - 1);
    for (i, &b) in e.name[..n].iter().enumerate() {
        out.d_name[i] = b as c_char;
    }
    out.d_name[n] = 0;
    out.d_reclen = std::mem::size_of::<dirent64>() as u16;
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut DIR) -> *mut dirent64 {
    if !is_ours(d) {
        return unsafe { real::readdir64(d) };
    }
    next_entry(d)
}

#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut DIR) -> *mut dirent64 {
    unsafe { readdir64(d) }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64_r(
    d: *mut DIR,
    e: *mut dirent64,
    r: *mut *mut dirent64,
) -> c_int {
    if !is_ours(d) {
        return unsafe { real::readdir64_r(d, e, r) };
    }
    let p = next_entry(d);
    unsafe {
        if p.is_null() {
            *r = std::ptr::null_mut();
        } else {
            std::ptr::copy_nonoverlapping(p, e, 1);
            *r = e;
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn readdir_r(d: *mut DIR, e: *mut dirent64, r: *mut *mut dirent64) -> c_int {
    unsafe { readdir64_r(d, e, r) }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    let s = DIRS.lock().as_mut().and_then(|m| m.remove(&(d as usize)));
    match s {
        None => unsafe { real::closedir(d) },
        Some(s) => unsafe { crate::abi_fd::close(s.fd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    if !is_ours(d) {
        unsafe { real::rewinddir(d) };
        return;
    }
    let fd = DIRS
        .lock()
        .as_ref()
        .and_then(|m| m.get(&(d as usize)).map(|s| s.fd));
    let Some(fd) = fd else { return };
    let ino = table::get(fd).map(|o| o.ino);
    let fresh = ino.and_then(|i| ops::list(i).ok());
    if let Some(s) = DIRS.lock().as_mut().and_then(|m| m.get_mut(&(d as usize))) {
        if let Some(f) = fresh {
            s.entries = f;
        }
        s.next = 0;
    }
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    if !is_ours(d) {
        return unsafe { real::telldir(d) };
    }
    DIRS.lock()
        .as_ref()
        .and_then(|m| m.get(&(d as usize)).map(|s| s.next as c_long))
        .unwrap_or(-1)
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, pos: c_long) {
    if !is_ours(d) {
        unsafe { real::seekdir(d, pos) };
        return;
    }
    if let Some(s) = DIRS.lock().as_mut().and_then(|m| m.get_mut(&(d as usize))) {
        s.next = pos.max(0) as usize;
    }
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut DIR) -> c_int {
    if !is_ours(d) {
        return unsafe { real::dirfd(d) };
    }
    DIRS.lock()
        .as_ref()
        .and_then(|m| m.get(&(d as usize)).map(|s| s.fd))
        .unwrap_or(-1)
}

/// `getdents64`: as many whole records as fit, from the description's position (an
/// entry index; the listing is read again when it starts at 0).
#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if !table::is_cairn(fd) {
        return unsafe { real::getdents64(fd, buf, n) };
    }
    fd_call(
        "getdents64",
        fd,
        || unsafe { real::getdents64(fd, buf, n) },
        |o| {
            if !o.dir {
                return Err(err(libc::ENOTDIR, "getdents64: not a directory"));
            }
            let out = unsafe { crate::abi::slice_mut(buf, n) };
            o.with_pos(fd, |pos| {
                let mut g = o.entries.lock();
                if pos == 0 || g.is_none() {
                    *g = Some(ops::list(o.ino)?);
                }
                let entries = g.as_ref().expect("listed above");
                let mut used = 0usize;
                let mut i = pos as usize;
                while let Some(e) = entries.get(i) {
                    let reclen = (19 + e.name.len() + 1).next_multiple_of(8);
                    if used + reclen > out.len() {
                        if used == 0 {
                            return Err(err(libc::EINVAL, "getdents64: buffer too small"));
                        }
                        break;
                    }
                    let r = &mut out[used..used + reclen];
                    r.fill(0);
                    r[0..8].copy_from_slice(&e.ino.to_ne_bytes());
                    r[8..16].copy_from_slice(&((i + 1) as i64).to_ne_bytes());
                    r[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
                    r[18] = e.kind;
                    r[19..19 + e.name.len()].copy_from_slice(&e.name);
                    used += reclen;
                    i += 1;
                }
                Ok((used as ssize_t, i as u64))
            })
        },
    )
}

// ---- scandir and glob: the C library's own use directory streams it does not export ----

/// `scandirat`: on a Cairn directory, its entries through this library's streams (each
/// a `malloc`ed `dirent64`, in a `malloc`ed array, as glibc returns them); otherwise the
/// C library's.
#[no_mangle]
pub unsafe extern "C" fn scandirat64(
    dirfd: c_int,
    dir: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    match unsafe { crate::abi::route(dirfd, dir) } {
        Err(e) => crate::state::fail("scandir", e),
        Ok(crate::abi::Route::Cairn(cp)) => crate::abi::cairn_or_host(
            "scandir",
            || {
                let d = open_stream(&cp)?;
                let r = unsafe { scan(d, list, filter, compar) };
                unsafe { closedir(d) };
                r
            },
            |h| unsafe { real::scandirat64(dirfd, h, list, filter, compar) },
        ),
        Ok(r) => unsafe { real::scandirat64(dirfd, r.host_ptr(dir), list, filter, compar) },
    }
}

/// The entries of stream `d` that pass `filter`, sorted with `compar`, into `*list`.
unsafe fn scan(
    d: *mut DIR,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> io::Result<c_int> {
    let size = std::mem::size_of::<dirent64>();
    let mut v: Vec<*mut dirent64> = Vec::new();
    let free_all = |v: &[*mut dirent64]| v.iter().for_each(|&p| unsafe { libc::free(p.cast()) });
    loop {
        let e = next_entry(d);
        if e.is_null() {
            break;
        }
        if filter.is_some_and(|f| unsafe { f(e) } == 0) {
            continue;
        }
        // SAFETY: a fresh allocation of one dirent64, filled from the stream's.
        let p = unsafe { libc::malloc(size) } as *mut dirent64;
        if p.is_null() {
            free_all(&v);
            return Err(err(libc::ENOMEM, "scandir: out of memory"));
        }
        unsafe { std::ptr::copy_nonoverlapping(e, p, 1) };
        v.push(p);
    }
    let bytes = v.len().max(1) * std::mem::size_of::<*mut dirent64>();
    // SAFETY: an array of `v.len()` pointers, filled below.
    let arr = unsafe { libc::malloc(bytes) } as *mut *mut dirent64;
    if arr.is_null() {
        free_all(&v);
        return Err(err(libc::ENOMEM, "scandir: out of memory"));
    }
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), arr, v.len()) };
    if let Some(c) = compar {
        // SAFETY: qsort over `v.len()` pointers with the caller's comparison, which takes
        // pointers to two elements, as scandir's contract says.
        unsafe {
            libc::qsort(
                arr.cast(),
                v.len(),
                std::mem::size_of::<*mut dirent64>(),
                Some(std::mem::transmute::<
                    unsafe extern "C" fn(*mut *const dirent64, *mut *const dirent64) -> c_int,
                    unsafe extern "C" fn(*const c_void, *const c_void) -> c_int,
                >(c)),
            )
        };
    }
    unsafe { *list = arr };
    Ok(v.len() as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn scandirat(
    dirfd: c_int,
    dir: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    unsafe { scandirat64(dirfd, dir, list, filter, compar) }
}

#[no_mangle]
pub unsafe extern "C" fn scandir64(
    dir: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    unsafe { scandirat64(libc::AT_FDCWD, dir, list, filter, compar) }
}

#[no_mangle]
pub unsafe extern "C" fn scandir(
    dir: *const c_char,
    list: *mut *mut *mut dirent64,
    filter: ScanFilter,
    compar: ScanCompar,
) -> c_int {
    unsafe { scandirat64(libc::AT_FDCWD, dir, list, filter, compar) }
}

/// glibc's `GLOB_ALTDIRFUNC`.
const GLOB_ALTDIRFUNC: c_int = 1 << 9;

/// Hand `glob` this library's directory and stat functions (unless the caller gave its
/// own), so that patterns reach into Cairn directories; host paths pass through them to
/// the C library unchanged.
unsafe fn with_our_dirs(flags: c_int, pglob: *mut Glob) -> c_int {
    if flags & GLOB_ALTDIRFUNC != 0 || pglob.is_null() {
        return flags;
    }
    // SAFETY: `pglob` is the caller's glob_t.
    unsafe {
        (*pglob).closedir = Some(closedir);
        (*pglob).readdir = Some(readdir64);
        (*pglob).opendir = Some(opendir);
        (*pglob).lstat = Some(crate::abi_path::lstat64);
        (*pglob).stat = Some(crate::abi_path::stat64);
    }
    flags | GLOB_ALTDIRFUNC
}

#[no_mangle]
pub unsafe extern "C" fn glob(
    pat: *const c_char,
    flags: c_int,
    errfunc: GlobErr,
    pglob: *mut Glob,
) -> c_int {
    unsafe { real::glob(pat, with_our_dirs(flags, pglob), errfunc, pglob) }
}

#[no_mangle]
pub unsafe extern "C" fn glob64(
    pat: *const c_char,
    flags: c_int,
    errfunc: GlobErr,
    pglob: *mut Glob,
) -> c_int {
    unsafe { real::glob64(pat, with_our_dirs(flags, pglob), errfunc, pglob) }
}

// ---- nftw and ftw: the C library's walk opens directories internally --------------------

// <ftw.h>: type flags, nftw flags, and FTW_ACTIONRETVAL's answers.
const FTW_F: c_int = 0;
const FTW_D: c_int = 1;
const FTW_DNR: c_int = 2;
const FTW_NS: c_int = 3;
const FTW_SL: c_int = 4;
const FTW_DP: c_int = 5;
const FTW_SLN: c_int = 6;
const FTW_PHYS: c_int = 1;
const FTW_CHDIR: c_int = 4;
const FTW_DEPTH: c_int = 8;
const FTW_ACTIONRETVAL: c_int = 16;
const FTW_STOP: c_int = 1;
const FTW_SKIP_SUBTREE: c_int = 2;
const FTW_SKIP_SIBLINGS: c_int = 3;

/// What the walk does after a callback.
enum Next {
    Go,
    SkipSubtree,
    SkipSiblings,
    Stop(c_int),
}

/// The walk's callback: path, its `stat`, its type flag, where its name starts.
type Visitor<'a> = dyn FnMut(&[u8], &libc::stat64, c_int, Ftw) -> c_int + 'a;

/// A walk of a Cairn tree with glibc's `nftw` semantics, through this library's own
/// `stat`, `lstat` and directory streams. Each directory is listed whole and closed
/// before its entries are visited, so `nopenfd` is never exceeded.
struct Walk<'a> {
    flags: c_int,
    /// `nftw` reports a dangling symlink as `FTW_SLN`; `ftw`, as `FTW_NS`.
    sln: bool,
    cb: &'a mut Visitor<'a>,
}

impl Walk<'_> {
    /// Call the callback; what to do next.
    fn call(&mut self, path: &[u8], st: &libc::stat64, typ: c_int, ftw: Ftw) -> Next {
        let r = (self.cb)(path, st, typ, ftw);
        if self.flags & FTW_ACTIONRETVAL == 0 {
            return if r == 0 { Next::Go } else { Next::Stop(r) };
        }
        match r {
            FTW_STOP => Next::Stop(r),
            FTW_SKIP_SUBTREE => Next::SkipSubtree,
            FTW_SKIP_SIBLINGS => Next::SkipSiblings,
            _ => Next::Go,
        }
    }

    /// Visit `path` (a NUL-free byte string) whose name starts at `base`, at `level`.
    fn visit(&mut self, path: &[u8], base: usize, level: c_int) -> io::Result<Next> {
        let c =
            std::ffi::CString::new(path).map_err(|_| err(libc::EINVAL, "nftw: NUL in a path"))?;
        // SAFETY: stat64 is plain old data; all-zero is a valid value.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        let phys = self.flags & FTW_PHYS != 0;
        let stat_ok = |st: &mut libc::stat64, follow: bool| unsafe {
            if follow {
                crate::abi_path::stat64(c.as_ptr(), st) == 0
            } else {
                crate::abi_path::lstat64(c.as_ptr(), st) == 0
            }
        };
        let typ = if stat_ok(&mut st, !phys) {
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => FTW_D,
                libc::S_IFLNK => FTW_SL,
                _ => FTW_F,
            }
        } else if level == 0 {
            return Err(io::Error::last_os_error());
        } else if self.sln
            && !phys
            && stat_ok(&mut st, false)
            && st.st_mode & libc::S_IFMT == libc::S_IFLNK
        {
            FTW_SLN
        } else {
            FTW_NS
        };
        let ftw = || Ftw {
            base: base as c_int,
            level,
        };
        if typ != FTW_D {
            return Ok(self.call(path, &st, typ, ftw()));
        }
        let entries = match ops::classify(libc::AT_FDCWD, path) {
            Ok(ops::Where::Cairn(cp)) => ops::open(&cp, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                .and_then(|fd| {
                    let o = table::get(fd);
                    let r = o.map_or(Ok(Vec::new()), |o| ops::list(o.ino));
                    unsafe { crate::abi_fd::close(fd) };
                    r
                }),
            _ => Err(err(libc::EXDEV, "nftw: the walk left Cairn")),
        };
        let Ok(entries) = entries else {
            return Ok(self.call(path, &st, FTW_DNR, ftw()));
        };
        if self.flags & FTW_DEPTH == 0 {
            match self.call(path, &st, FTW_D, ftw()) {
                Next::Go => {}
                Next::SkipSubtree => return Ok(Next::Go),
                other => return Ok(other),
            }
        }
        let mut child = path.to_vec();
        if !child.ends_with(b"/") {
            child.push(b'/');
        }
        let child_base = child.len();
        for e in entries.iter().filter(|e| e.name != b"." && e.name != b"..") {
            child.truncate(child_base);
            child.extend_from_slice(&e.name);
            match self.visit(&child, child_base, level + 1)? {
                Next::Go | Next::SkipSubtree => {}
                Next::SkipSiblings => break,
                stop @ Next::Stop(_) => return Ok(stop),
            }
        }
        if self.flags & FTW_DEPTH != 0 {
            return Ok(self.call(path, &st, FTW_DP, ftw()));
        }
        Ok(Next::Go)
    }
}

/// `nftw` (`sln`; `ftw` otherwise) on a Cairn path: 0 when the walk ends, the callback's
/// value when it stops it, -1 with `errno` when the start cannot be reached.
/// `FTW_CHDIR` is not supported on Cairn (`ENOTSUP`); `FTW_MOUNT` holds trivially (a
/// Cairn tree is one file system).
fn walk_cairn(
    op: &str,
    dir: *const c_char,
    flags: c_int,
    sln: bool,
    call: &mut Visitor<'_>,
) -> c_int {
    run(op, || {
        if flags & FTW_CHDIR != 0 {
            return Err(err(
                libc::ENOTSUP,
                "nftw: FTW_CHDIR is not supported on Cairn",
            ));
        }
        let path =
            unsafe { crate::abi::cbytes(dir) }.ok_or_else(|| err(libc::EFAULT, "NULL path"))?;
        let base = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
        let mut w = Walk {
            flags,
            sln,
            cb: call,
        };
        Ok(match w.visit(path, base, 0)? {
            Next::Stop(r) => r,
            _ => 0,
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nftw64(
    dir: *const c_char,
    f: NftwFn,
    nopenfd: c_int,
    flags: c_int,
) -> c_int {
    match unsafe { crate::abi::route(libc::AT_FDCWD, dir) } {
        Err(e) => crate::state::fail("nftw", e),
        Ok(crate::abi::Route::Cairn(_)) => {
            let Some(f) = f else {
                return crate::state::fail("nftw", err(libc::EINVAL, "NULL callback"));
            };
            walk_cairn("nftw", dir, flags, true, &mut |p, st, typ, mut ftw| {
                let c = std::ffi::CString::new(p).unwrap_or_default();
                unsafe { f(c.as_ptr(), st, typ, &mut ftw) }
            })
        }
        Ok(r) => unsafe { real::nftw64(r.host_ptr(dir), f, nopenfd, flags) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn nftw(
    dir: *const c_char,
    f: NftwFn,
    nopenfd: c_int,
    flags: c_int,
) -> c_int {
    unsafe { nftw64(dir, f, nopenfd, flags) }
}

/// `ftw`: `nftw` without flags, whose callback takes no `struct FTW`.
#[no_mangle]
pub unsafe extern "C" fn ftw64(dir: *const c_char, f: FtwFn, nopenfd: c_int) -> c_int {
    match unsafe { crate::abi::route(libc::AT_FDCWD, dir) } {
        Err(e) => crate::state::fail("ftw", e),
        Ok(crate::abi::Route::Cairn(_)) => {
            let Some(f) = f else {
                return crate::state::fail("ftw", err(libc::EINVAL, "NULL callback"));
            };
            walk_cairn("ftw", dir, 0, false, &mut |p, st, typ, _| {
                let c = std::ffi::CString::new(p).unwrap_or_default();
                unsafe { f(c.as_ptr(), st, typ) }
            })
        }
        Ok(r) => unsafe { real::ftw64(r.host_ptr(dir), f, nopenfd) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn ftw(dir: *const c_char, f: FtwFn, nopenfd: c_int) -> c_int {
    unsafe { ftw64(dir, f, nopenfd) }
}
