//! Directory streams (`opendir` … `closedir`) and `getdents64` on Cairn directories.
//! SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{fd_call, run};
use crate::maps::{Stream, DIRS};
use crate::ops;
use crate::real;
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

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    match unsafe { crate::abi::route(libc::AT_FDCWD, path) } {
        Err(e) => crate::state::fail("opendir", e),
        Ok(crate::abi::Route::Cairn(cp)) => run("opendir", || {
            let fd = ops::open(&cp, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
            new_stream(fd).inspect_err(|_| {
                unsafe { crate::abi_fd::close(fd) };
            })
        }),
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
