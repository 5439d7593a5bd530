//! `libcairn_kv.so`: the C interface of cairn-kv's shared store (`include/cairn/kv.h`,
//! docs/KV.md). Each function turns C arguments into `cairn_kv::Store` calls and errors
//! into -1 or NULL with `errno` set and a message for `cairn_kv_strerror`.
//!
//! This is an ABI layer: its `unsafe` is limited to reading the C strings and buffers
//! callers pass, writing the buffer `cairn_kv_get` fills, setting `errno`, and the
//! handle's box, each with a `SAFETY:` note.

use cairn_kv::{KvError, Options, Store};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

/// An open store (`cairn_kv *`).
pub struct CairnKv(Store);

thread_local! {
    static MESSAGE: RefCell<CString> = RefCell::new(CString::default());
}

/// The errno of `e`.
fn errno_of(e: &KvError) -> c_int {
    use std::io::ErrorKind as K;
    match e {
        KvError::Full | KvError::IndexFull => libc::ENOSPC,
        KvError::TooBig(_) => libc::EINVAL,
        KvError::Io(e) => e.raw_os_error().unwrap_or(match e.kind() {
            K::WouldBlock => libc::EWOULDBLOCK,
            K::Unsupported => libc::ENOTSUP,
            K::NotFound => libc::ENOENT,
            K::InvalidInput => libc::EINVAL,
            _ => libc::EIO,
        }),
    }
}

/// Record an error for `cairn_kv_strerror` and in `errno`.
fn fail(errno: c_int, text: String) {
    MESSAGE.with(|m| *m.borrow_mut() = CString::new(text.replace('\0', " ")).unwrap_or_default());
    // SAFETY: `__errno_location` returns the calling thread's errno, always valid.
    unsafe { *libc::__errno_location() = errno };
}

fn fail_kv(e: KvError) {
    fail(errno_of(&e), e.to_string());
}

/// The bytes `ptr..ptr + len` a caller passed (a null `ptr` is an empty slice only
/// with `len` 0).
fn bytes<'a>(ptr: *const c_void, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        return (len == 0).then_some(&[]);
    }
    // SAFETY: the caller passes `len` readable bytes at `ptr` (the header's contract),
    // not changed while the call runs.
    Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// The store behind a handle (`None` for NULL).
fn store<'a>(kv: *mut CairnKv) -> Option<&'a Store> {
    // SAFETY: a non-null handle is one `cairn_kv_open_shared` returned and
    // `cairn_kv_close` has not freed (the header's contract); the store is `Sync`.
    unsafe { kv.as_ref() }.map(|k| &k.0)
}

/// The pool a C argument names: a path, or a name without '/' in /dev/shm.
fn pool_path(pool: *const c_char) -> Option<PathBuf> {
    if pool.is_null() {
        return None;
    }
    // SAFETY: a non-null `pool` is a NUL-terminated string (the header's contract).
    let s = unsafe { CStr::from_ptr(pool) }.to_str().ok()?;
    if s.is_empty() {
        return None;
    }
    Some(if s.contains('/') {
        PathBuf::from(s)
    } else {
        PathBuf::from(format!("/dev/shm/{s}.pool"))
    })
}

#[no_mangle]
pub extern "C" fn cairn_kv_open_shared(pool: *const c_char, size: u64) -> *mut CairnKv {
    let Some(path) = pool_path(pool) else {
        fail(libc::EINVAL, "a pool is a path or a name".into());
        return std::ptr::null_mut();
    };
    let opts = Options {
        size: if size == 0 { 256 << 20 } else { size },
        ..Options::default()
    };
    match Store::open_shared(&path, &opts) {
        Ok(s) => Box::into_raw(Box::new(CairnKv(s))),
        Err(e) => {
            fail(errno_of(&e), format!("{}: {e}", path.display()));
            std::ptr::null_mut()
        }
    }
}

/// (Not `unsafe fn`: a C caller cannot mark a call; the header states the contract.)
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn cairn_kv_close(kv: *mut CairnKv) {
    if !kv.is_null() {
        // SAFETY: a non-null handle came from `Box::into_raw` in `cairn_kv_open_shared`
        // and is closed once (the header's contract).
        drop(unsafe { Box::from_raw(kv) });
    }
}

/// The store and key of a call, or -1 with `errno` set.
fn args<'a>(kv: *mut CairnKv, key: *const c_void, key_len: usize) -> Option<(&'a Store, &'a [u8])> {
    match (store(kv), bytes(key, key_len)) {
        (Some(s), Some(k)) => Some((s, k)),
        _ => {
            fail(libc::EINVAL, "a NULL store or key".into());
            None
        }
    }
}

#[no_mangle]
pub extern "C" fn cairn_kv_put(
    kv: *mut CairnKv,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
) -> c_int {
    let Some((s, k)) = args(kv, key, key_len) else {
        return -1;
    };
    let Some(v) = bytes(value, value_len) else {
        fail(libc::EINVAL, "a NULL value".into());
        return -1;
    };
    match s.put(k, v) {
        Ok(()) => 0,
        Err(e) => {
            fail_kv(e);
            -1
        }
    }
}

#[no_mangle]
pub extern "C" fn cairn_kv_get(
    kv: *mut CairnKv,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> isize {
    let Some((s, k)) = args(kv, key, key_len) else {
        return -1;
    };
    if buf.is_null() && cap > 0 {
        fail(libc::EINVAL, "a NULL buffer".into());
        return -1;
    }
    let copied = s.get_with(k, |v| {
        let n = v.len().min(cap);
        if n > 0 {
            // SAFETY: the caller passes `cap` writable bytes at `buf` (the header's
            // contract), which do not overlap the store's memory.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), buf.cast::<u8>(), n) };
        }
        v.len()
    });
    match copied {
        Ok(Some(n)) => n as isize,
        Ok(None) => {
            fail(libc::ENOENT, "no such key".into());
            -1
        }
        Err(e) => {
            fail_kv(e);
            -1
        }
    }
}

#[no_mangle]
pub extern "C" fn cairn_kv_del(kv: *mut CairnKv, key: *const c_void, key_len: usize) -> c_int {
    let Some((s, k)) = args(kv, key, key_len) else {
        return -1;
    };
    match s.delete(k) {
        Ok(was) => c_int::from(was),
        Err(e) => {
            fail_kv(e);
            -1
        }
    }
}

#[no_mangle]
pub extern "C" fn cairn_kv_len(kv: *mut CairnKv) -> u64 {
    store(kv).map_or(0, Store::len)
}

#[no_mangle]
pub extern "C" fn cairn_kv_strerror() -> *const c_char {
    MESSAGE.with(|m| m.borrow().as_ptr())
}
