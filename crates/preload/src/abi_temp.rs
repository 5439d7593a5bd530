//! Temporary files: glibc's `mkstemp` family opens internally, so each is answered
//! here for templates in Cairn. SAFETY: see `abi.rs` (the POSIX contract of each
//! function).

use crate::abi::{route, Route};
use crate::abi_path::{mkdirat, openat64, FDCWD};
use crate::real;
use libc::{c_char, c_int};

/// Fill the `XXXXXX` before the last `suffix` bytes of `tmpl` and create it exclusively
/// with `create` (`EEXIST`: try another name).
unsafe fn mktemp_with(
    tmpl: *mut c_char,
    suffix: usize,
    mut create: impl FnMut(*const c_char) -> c_int,
) -> c_int {
    let len = unsafe { libc::strlen(tmpl) };
    if len < 6 + suffix {
        crate::real::set_errno(libc::EINVAL);
        return -1;
    }
    let x = unsafe { std::slice::from_raw_parts_mut(tmpl as *mut u8, len) };
    let at = len - suffix - 6;
    if &x[at..at + 6] != b"XXXXXX" {
        crate::real::set_errno(libc::EINVAL);
        return -1;
    }
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(7)
        ^ ((std::process::id() as u64) << 32);
    for _ in 0..10_000 {
        for c in &mut x[at..at + 6] {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *c = CHARS[(seed % CHARS.len() as u64) as usize];
        }
        let r = create(tmpl);
        if r >= 0 || crate::real::errno() != libc::EEXIST {
            return r;
        }
    }
    crate::real::set_errno(libc::EEXIST);
    -1
}

/// Is the template a Cairn path? (The directory part decides.)
unsafe fn template_is_cairn(tmpl: *const c_char) -> bool {
    matches!(unsafe { route(FDCWD, tmpl) }, Ok(Route::Cairn(_)))
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps64(tmpl: *mut c_char, sfx: c_int, fl: c_int) -> c_int {
    if !unsafe { template_is_cairn(tmpl) } {
        return unsafe { real::mkostemps64(tmpl, sfx, fl) };
    }
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | (fl & !libc::O_ACCMODE);
    unsafe {
        mktemp_with(tmpl, sfx.max(0) as usize, |p| {
            openat64(FDCWD, p, flags, 0o600)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps(tmpl: *mut c_char, sfx: c_int, fl: c_int) -> c_int {
    unsafe { mkostemps64(tmpl, sfx, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps64(tmpl: *mut c_char, sfx: c_int) -> c_int {
    unsafe { mkostemps64(tmpl, sfx, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps(tmpl: *mut c_char, sfx: c_int) -> c_int {
    unsafe { mkostemps64(tmpl, sfx, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp64(tmpl: *mut c_char, fl: c_int) -> c_int {
    unsafe { mkostemps64(tmpl, 0, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp(tmpl: *mut c_char, fl: c_int) -> c_int {
    unsafe { mkostemps64(tmpl, 0, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp64(tmpl: *mut c_char) -> c_int {
    unsafe { mkostemps64(tmpl, 0, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp(tmpl: *mut c_char) -> c_int {
    unsafe { mkostemps64(tmpl, 0, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdtemp(tmpl: *mut c_char) -> *mut c_char {
    if !unsafe { template_is_cairn(tmpl) } {
        return unsafe { real::mkdtemp(tmpl) };
    }
    let r = unsafe { mktemp_with(tmpl, 0, |p| mkdirat(FDCWD, p, 0o700)) };
    if r < 0 {
        std::ptr::null_mut()
    } else {
        tmpl
    }
}
