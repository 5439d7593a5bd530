//! Unix-domain sockets at Cairn paths: `bind`, `connect`, `sendto` and `sendmsg` with an
//! `AF_UNIX` address naming a Cairn path go to the socket's host address
//! (`Fs::bind_unix`, `Fs::socket_address`; ARCHITECTURE.md, "Special files"). Every
//! other address passes through.

use crate::abi::path_call;
use crate::real;
use libc::AT_FDCWD as FDCWD;
use libc::{c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::ffi::CString;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The filesystem path of an `AF_UNIX` address (not an abstract or unnamed one).
///
/// SAFETY: `addr` is NULL or points to `len` readable bytes.
unsafe fn unix_path(addr: *const sockaddr, len: socklen_t) -> Option<CString> {
    let off = std::mem::offset_of!(libc::sockaddr_un, sun_path);
    let len = (len as usize).min(std::mem::size_of::<libc::sockaddr_un>());
    if addr.is_null() || len <= off {
        return None;
    }
    // SAFETY: `addr` points to at least `len` > `off` bytes (the caller's contract).
    let b = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) };
    if c_int::from(u16::from_ne_bytes([b[0], b[1]])) != libc::AF_UNIX || b[off] == 0 {
        return None;
    }
    let p = &b[off..];
    let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
    CString::new(&p[..end]).ok()
}

/// A `sockaddr_un` for the host path `p`, and its length.
fn host_addr(p: &Path) -> io::Result<(libc::sockaddr_un, socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = p.as_os_str().as_bytes();
    if b.len() >= a.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + b.len() + 1;
    Ok((a, len as socklen_t))
}

/// Run `host` with the caller's address, or, for a Cairn path, with the host address
/// of the socket bound there.
///
/// SAFETY: `addr` is NULL or points to `len` readable bytes.
unsafe fn with_address<T: crate::real::Fail>(
    op: &str,
    addr: *const sockaddr,
    len: socklen_t,
    host: impl Fn(*const sockaddr, socklen_t) -> T,
) -> T {
    // SAFETY: see the function comment.
    let Some(p) = (unsafe { unix_path(addr, len) }) else {
        return host(addr, len);
    };
    // SAFETY: `p` is a NUL-terminated string.
    unsafe {
        path_call(
            op,
            FDCWD,
            p.as_ptr(),
            |_| host(addr, len),
            |cp| {
                let target = crate::state::fs()?.socket_address(cp.at())?;
                let (a, l) = host_addr(&target)?;
                Ok(host((&a as *const libc::sockaddr_un).cast(), l))
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller passes `len` readable bytes at `addr`.
    let Some(p) = (unsafe { unix_path(addr, len) }) else {
        return unsafe { real::bind(fd, addr, len) };
    };
    unsafe {
        path_call(
            "bind",
            FDCWD,
            p.as_ptr(),
            |_| real::bind(fd, addr, len),
            |cp| {
                // SAFETY: `fd` is the caller's open descriptor for the call.
                let sock = BorrowedFd::borrow_raw(fd);
                crate::state::fs()?.bind_unix(cp.at(), sock)?;
                Ok(0)
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller passes `len` readable bytes at `addr`.
    unsafe { with_address("connect", addr, len, |a, l| real::connect(fd, a, l)) }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    fl: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    // SAFETY: the caller passes `len` readable bytes at `addr`.
    unsafe {
        with_address("sendto", addr, len, |a, l| {
            real::sendto(fd, buf, n, fl, a, l)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, fl: c_int) -> ssize_t {
    if msg.is_null() {
        return unsafe { real::sendmsg(fd, msg, fl) };
    }
    // SAFETY: `msg` is non-null and points to a msghdr (the caller's contract).
    let m = unsafe { *msg };
    // SAFETY: the caller's msg_name points to msg_namelen readable bytes.
    unsafe {
        with_address("sendmsg", m.msg_name.cast(), m.msg_namelen, |a, l| {
            let mut m2 = m;
            m2.msg_name = a as *mut c_void;
            m2.msg_namelen = l;
            real::sendmsg(fd, &m2, fl)
        })
    }
}
