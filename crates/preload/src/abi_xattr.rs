//! Extended attributes, by path and by descriptor: Cairn keeps them in the daemon
//! (`ops`); host files go to the C library. SAFETY: see `abi.rs` (the POSIX contract of
//! each function).

use crate::abi::{fd_call, give_bytes, inode_path, ok0, path_call, slice, xattr_name};
use crate::abi_path::FDCWD;
use crate::ops;
use crate::real;
use crate::state::err;
use crate::table::{self, Ofd};
use libc::{c_char, c_int, c_void, size_t, ssize_t};
use std::io;

macro_rules! xattr_get {
    ($name:ident, $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            n: *const c_char,
            v: *mut c_void,
            sz: size_t,
        ) -> ssize_t {
            unsafe {
                path_call(
                    stringify!($name),
                    FDCWD,
                    path,
                    |p| real::$name(p, n, v, sz),
                    |cp| give_bytes(&ops::getxattr(cp, xattr_name(n)?, $follow)?, v, sz),
                )
            }
        }
    };
}
xattr_get!(getxattr, true);
xattr_get!(lgetxattr, false);

macro_rules! xattr_set {
    ($name:ident, $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            n: *const c_char,
            v: *const c_void,
            sz: size_t,
            fl: c_int,
        ) -> c_int {
            unsafe {
                path_call(
                    stringify!($name),
                    FDCWD,
                    path,
                    |p| real::$name(p, n, v, sz, fl),
                    |cp| ok0(ops::setxattr(cp, xattr_name(n)?, slice(v, sz), fl, $follow)),
                )
            }
        }
    };
}
xattr_set!(setxattr, true);
xattr_set!(lsetxattr, false);

macro_rules! xattr_list {
    ($name:ident, $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, l: *mut c_char, sz: size_t) -> ssize_t {
            unsafe {
                path_call(
                    stringify!($name),
                    FDCWD,
                    path,
                    |p| real::$name(p, l, sz),
                    |cp| give_bytes(&ops::listxattr(cp, $follow)?, l as *mut c_void, sz),
                )
            }
        }
    };
}
xattr_list!(listxattr, true);
xattr_list!(llistxattr, false);

macro_rules! xattr_remove {
    ($name:ident, $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, n: *const c_char) -> c_int {
            unsafe {
                path_call(
                    stringify!($name),
                    FDCWD,
                    path,
                    |p| real::$name(p, n),
                    |cp| ok0(ops::removexattr(cp, xattr_name(n)?, $follow)),
                )
            }
        }
    };
}
xattr_remove!(removexattr, true);
xattr_remove!(lremovexattr, false);

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
