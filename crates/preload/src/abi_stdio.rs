//! Stdio streams on Cairn files. glibc's `FILE` functions do their I/O through internal
//! calls this library cannot interpose, so a stream on a Cairn descriptor is made with
//! `fopencookie`, whose read/write/seek/close go through the interposed calls.
//! `stdin`/`stdout`/`stderr` are swapped for such streams while descriptor 0/1/2 is a
//! Cairn file (at start-up after `exec`, and around `dup2` as shells redirect).
//! SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{cbytes, route, run, Route};
use crate::maps::FILES;
use crate::real;
use crate::state::err;
use crate::table;
use libc::{c_char, c_int, c_void, off64_t, size_t, ssize_t, FILE};
use parking_lot::Mutex;
use std::io;

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

/// A cookie is the descriptor, plus this bit when closing the stream must leave the
/// descriptor open (the swapped standard streams).
const BORROWED: usize = 1 << 32;

fn fd_of(cookie: *mut c_void) -> c_int {
    (cookie as usize & 0xffff_ffff) as c_int
}

unsafe extern "C" fn ck_read(c: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    unsafe { crate::abi_fd::read(fd_of(c), buf as *mut c_void, n) }
}

unsafe extern "C" fn ck_write(c: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    let r = unsafe { crate::abi_fd::write(fd_of(c), buf as *const c_void, n) };
    // glibc treats a short count as an error; 0 with nothing written too.
    if r < 0 {
        -1
    } else {
        r
    }
}

unsafe extern "C" fn ck_seek(c: *mut c_void, pos: *mut off64_t, whence: c_int) -> c_int {
    let r = unsafe { crate::abi_fd::lseek64(fd_of(c), *pos, whence) };
    if r < 0 {
        return -1;
    }
    unsafe { *pos = r };
    0
}

unsafe extern "C" fn ck_close(c: *mut c_void) -> c_int {
    let fd = fd_of(c);
    if let Some(m) = FILES.lock().as_mut() {
        m.retain(|_, v| *v != fd);
    }
    if c as usize & BORROWED != 0 {
        return 0;
    }
    unsafe { crate::abi_fd::close(fd) }
}

/// A stream on Cairn descriptor `fd` with stdio `mode`.
unsafe fn cookie_stream(fd: c_int, mode: *const c_char, borrowed: bool) -> *mut FILE {
    let io = CookieIo {
        read: Some(ck_read),
        write: Some(ck_write),
        seek: Some(ck_seek),
        close: Some(ck_close),
    };
    let cookie = (fd as u32 as usize | if borrowed { BORROWED } else { 0 }) as *mut c_void;
    let f = unsafe { fopencookie(cookie, mode, io) };
    if !f.is_null() {
        FILES
            .lock()
            .get_or_insert_with(Default::default)
            .insert(f as usize, fd);
    }
    f
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    match unsafe { route(libc::AT_FDCWD, path) } {
        Err(e) => crate::state::fail("fopen", e),
        Ok(Route::Cairn(cp)) => crate::abi::cairn_or_host(
            "fopen",
            || {
                let fl = crate::ops::mode_flags(unsafe { cbytes(mode) }.unwrap_or(b""))?;
                let fd = crate::ops::open(&cp, fl, 0o666)?;
                let f = unsafe { cookie_stream(fd, mode, false) };
                if f.is_null() {
                    let e = io::Error::last_os_error();
                    unsafe { crate::abi_fd::close(fd) };
                    return Err(e);
                }
                Ok(f)
            },
            |h| unsafe { real::fopen64(h, mode) },
        ),
        Ok(r) => unsafe { real::fopen64(r.host_ptr(path), mode) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe { fopen64(path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if !table::is_cairn(fd) {
        return unsafe { real::fdopen(fd, mode) };
    }
    unsafe { cookie_stream(fd, mode, false) }
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    f: *mut FILE,
) -> *mut FILE {
    match unsafe { route(libc::AT_FDCWD, path) } {
        Ok(Route::Cairn(_)) => run("freopen", || {
            Err(err(
                libc::ENOTSUP,
                "freopen onto a Cairn path is not supported (use fopen)",
            ))
        }),
        Ok(r) => {
            if let Some(m) = FILES.lock().as_mut() {
                m.remove(&(f as usize));
            }
            unsafe { real::freopen64(r.host_ptr(path), mode, f) }
        }
        Err(e) => crate::state::fail("freopen", e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    f: *mut FILE,
) -> *mut FILE {
    unsafe { freopen64(path, mode, f) }
}

fn cookie_fd(f: *mut FILE) -> Option<c_int> {
    FILES
        .lock()
        .as_ref()
        .and_then(|m| m.get(&(f as usize)).copied())
}

#[no_mangle]
pub unsafe extern "C" fn fileno(f: *mut FILE) -> c_int {
    match cookie_fd(f) {
        Some(fd) => fd,
        None => unsafe { real::fileno(f) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fileno_unlocked(f: *mut FILE) -> c_int {
    match cookie_fd(f) {
        Some(fd) => fd,
        None => unsafe { real::fileno_unlocked(f) },
    }
}

/// The standard streams this library replaced: the originals, by descriptor.
static SWAPPED: Mutex<[usize; 3]> = Mutex::new([0; 3]);

/// SAFETY: reads or writes one of glibc's standard stream variables.
unsafe fn std_var(fd: c_int) -> *mut *mut FILE {
    match fd {
        0 => std::ptr::addr_of_mut!(stdin),
        1 => std::ptr::addr_of_mut!(stdout),
        _ => std::ptr::addr_of_mut!(stderr),
    }
}

/// Descriptor 0, 1 or 2 changed: give its standard stream a Cairn stream while it is a
/// Cairn file, and its own back afterwards.
pub fn std_stream_changed(fd: c_int) {
    if !(0..=2).contains(&fd) {
        return;
    }
    let mut sw = SWAPPED.lock();
    let i = fd as usize;
    // SAFETY: the standard stream variables are valid `FILE *`s; they are flushed before
    // being replaced, and the replaced one is kept to be put back.
    unsafe {
        let var = std_var(fd);
        if table::is_cairn(fd) {
            if sw[i] != 0 {
                return;
            }
            let mode: &[u8] = if fd == 0 { b"r\0" } else { b"a\0" };
            let cur = *var;
            libc::fflush(cur);
            let f = cookie_stream(fd, mode.as_ptr() as *const c_char, true);
            if f.is_null() {
                return;
            }
            if fd == 2 {
                libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0);
            }
            sw[i] = cur as usize;
            *var = f;
        } else if sw[i] != 0 {
            // The Cairn stream is left open (it does not own the descriptor).
            libc::fflush(*var);
            *var = sw[i] as *mut FILE;
            sw[i] = 0;
        }
    }
}
