//! `libcairn_sj.so`: the C interface of SpaceJMP on Cairn (`include/cairn/sj.h`,
//! docs/SPACEJMP.md). Each function turns C arguments into `cairn_sj` calls and errors
//! into a return value of -1, 0 or NULL with `errno` set and a message for
//! `sj_strerror`.
//!
//! This is an ABI layer: its `unsafe` is limited to reading the C strings and buffers
//! callers pass, setting `errno`, and calling the C function of `sj_vas_call` in the
//! helper process, each with a `SAFETY:` note.

use cairn_area::{errno_of, fs_err};
use cairn_sj::{CommitMode, InHelper, SegId, SpaceJmp, Target, VasCtl, VasId, Vh};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::sync::{Arc, Mutex};

type SjSid = u64;
type SjVid = u64;
type SjVh = i32;

const SJ_CURRENT: SjVid = u64::MAX;
const SJ_EXPLICIT: c_int = 1;
const SJ_VAS_ADD: c_int = 1;
const SJ_VAS_REMOVE: c_int = 2;
const SJ_VAS_SET_PROT: c_int = 3;

thread_local! {
    static MESSAGE: RefCell<CString> = RefCell::new(CString::default());
}

/// The store `sj_open` chose.
static STORE: Mutex<Option<String>> = Mutex::new(None);

fn set_errno(n: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno, always valid.
    unsafe { *libc::__errno_location() = n };
}

/// Record `e` for `sj_strerror` and in `errno`.
fn fail(e: io::Error) {
    let n = errno_of(&e);
    let text = cairn_area::error::message(&e);
    MESSAGE.with(|m| *m.borrow_mut() = CString::new(text.replace('\0', " ")).unwrap_or_default());
    set_errno(n);
}

/// `Ok` value or the error value `bad`, the error recorded.
fn ret<T>(r: io::Result<T>, bad: T) -> T {
    r.unwrap_or_else(|e| {
        fail(e);
        bad
    })
}

fn sj() -> io::Result<Arc<SpaceJmp>> {
    let store = STORE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    SpaceJmp::open(store.as_deref().map(std::path::Path::new))
}

/// A C string argument.
fn text<'a>(p: *const c_char, what: &str) -> io::Result<&'a str> {
    if p.is_null() {
        return Err(fs_err(libc::EINVAL, format!("{what}: NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string (the header's contract) that
    // lives for the call; it is only read.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| fs_err(libc::EINVAL, format!("{what}: not UTF-8")))
}

#[no_mangle]
pub extern "C" fn sj_open(store: *const c_char) -> c_int {
    let r = text(store, "store").and_then(|s| {
        if SpaceJmp::global().is_some() {
            return Err(fs_err(libc::EBUSY, "sj_open: a store is in use already"));
        }
        *STORE.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.to_string());
        sj().map(|_| 0)
    });
    ret(r, -1)
}

#[no_mangle]
pub extern "C" fn sj_seg_alloc(
    name: *const c_char,
    base: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
) -> SjSid {
    let r = text(name, "name").and_then(|n| {
        let base = (!base.is_null()).then_some(base as u64);
        sj()?
            .seg_alloc(n, base, len as u64, prot as u32, flags as u32, 0o640)
            .map(|s| s.0)
    });
    ret(r, 0)
}

#[no_mangle]
pub extern "C" fn sj_seg_find(name: *const c_char) -> SjSid {
    ret(
        text(name, "name").and_then(|n| sj()?.seg_find(n).map(|s| s.0)),
        0,
    )
}

#[no_mangle]
pub extern "C" fn sj_seg_free(name: *const c_char) -> c_int {
    ret(
        text(name, "name").and_then(|n| sj()?.seg_free(n).map(|()| 0)),
        -1,
    )
}

fn target(vid: SjVid) -> Target {
    if vid == SJ_CURRENT {
        Target::Current
    } else {
        Target::Vas(VasId(vid))
    }
}

#[no_mangle]
pub extern "C" fn sj_seg_attach(vid: SjVid, sid: SjSid, prot: c_int) -> c_int {
    ret(
        sj().and_then(|s| {
            s.seg_attach(target(vid), SegId(sid), prot as u32)
                .map(|()| 0)
        }),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_seg_detach(vid: SjVid, sid: SjSid) -> c_int {
    ret(
        sj().and_then(|s| s.seg_detach(target(vid), SegId(sid)).map(|()| 0)),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_vas_create(name: *const c_char, mode: libc::mode_t) -> SjVid {
    ret(
        text(name, "name").and_then(|n| sj()?.vas_create(n, mode).map(|v| v.0)),
        0,
    )
}

#[no_mangle]
pub extern "C" fn sj_vas_find(name: *const c_char) -> SjVid {
    ret(
        text(name, "name").and_then(|n| sj()?.vas_find(n).map(|v| v.0)),
        0,
    )
}

#[no_mangle]
pub extern "C" fn sj_vas_clone(vid: SjVid, name: *const c_char) -> SjVid {
    ret(
        text(name, "name").and_then(|n| sj()?.vas_clone(VasId(vid), n).map(|v| v.0)),
        0,
    )
}

#[no_mangle]
pub extern "C" fn sj_vas_ctl(cmd: c_int, vid: SjVid, sid: SjSid, prot: c_int) -> c_int {
    let op = match cmd {
        SJ_VAS_ADD => VasCtl::Add {
            seg: SegId(sid),
            prot: prot as u32,
        },
        SJ_VAS_REMOVE => VasCtl::Remove { seg: SegId(sid) },
        SJ_VAS_SET_PROT => VasCtl::SetProt {
            seg: SegId(sid),
            prot: prot as u32,
        },
        _ => {
            fail(fs_err(
                libc::EINVAL,
                format!("sj_vas_ctl: unknown command {cmd}"),
            ));
            return -1;
        }
    };
    ret(sj().and_then(|s| s.vas_ctl(VasId(vid), op).map(|_| 0)), -1)
}

#[no_mangle]
pub extern "C" fn sj_vas_attach(vid: SjVid, flags: c_int) -> SjVh {
    let mode = if flags & SJ_EXPLICIT != 0 {
        CommitMode::Explicit
    } else {
        CommitMode::Snapshot
    };
    ret(
        sj().and_then(|s| s.vas_attach(VasId(vid), mode).map(|vh| vh.0 as SjVh)),
        -1,
    )
}

fn handle(vh: SjVh) -> io::Result<Vh> {
    u32::try_from(vh)
        .map(Vh)
        .map_err(|_| fs_err(libc::EBADF, format!("handle {vh}: not attached")))
}

#[no_mangle]
pub extern "C" fn sj_vas_detach(vh: SjVh) -> c_int {
    ret(
        handle(vh).and_then(|vh| sj()?.vas_detach(vh).map(|()| 0)),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_vas_switch(vh: SjVh) -> c_int {
    ret(
        handle(vh).and_then(|vh| sj()?.switch_to(vh, true, true).map(|()| 0)),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_vas_try_switch(vh: SjVh) -> c_int {
    ret(
        handle(vh).and_then(|vh| sj()?.switch_to(vh, false, true).map(|()| 0)),
        -1,
    )
}

/// A C function `sj_vas_call` runs in a helper.
type SjCallFn = extern "C" fn(*mut c_void, usize) -> i64;

/// Bytes ahead of the caller's in a helper call: the C function and an errno word.
const CALL_HEAD: usize = 16;

/// The helper side of `sj_vas_call`: switch in, run the C function on the caller's
/// bytes, switch back (as `sj_vas_switch` does both ways).
fn c_call(h: &InHelper, buf: &mut [u8]) -> i64 {
    let (head, user) = buf.split_at_mut(CALL_HEAD);
    let bits = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let fail = |head: &mut [u8], e: &io::Error| {
        head[8..16].copy_from_slice(&i64::from(errno_of(e)).to_le_bytes());
    };
    if let Err(e) = h.sj().switch_to(h.vh(), true, true) {
        fail(head, &e);
        return -1;
    }
    // SAFETY: `sj_vas_call` stored a non-null `SjCallFn` of this program image, and the
    // helper is a fork of that program, so the pointer is valid here.
    let f = unsafe { std::mem::transmute::<usize, SjCallFn>(bits as usize) };
    let r = f(user.as_mut_ptr().cast(), user.len());
    if let Err(e) = h.sj().switch_to(Vh::PRIMARY, true, true) {
        fail(head, &e);
    }
    r
}

// A C entry point: its pointer arguments are the header's contract, not Rust's `unsafe`.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn sj_vas_call(
    vh: SjVh,
    f: Option<SjCallFn>,
    buf: *mut c_void,
    len: usize,
    result: *mut i64,
) -> c_int {
    let r = (|| -> io::Result<i64> {
        let f = f.ok_or_else(|| fs_err(libc::EINVAL, "sj_vas_call: NULL function"))?;
        if buf.is_null() && len > 0 {
            return Err(fs_err(libc::EINVAL, "sj_vas_call: NULL buffer"));
        }
        let vh = handle(vh)?;
        let mut b = vec![0u8; CALL_HEAD + len];
        b[..8].copy_from_slice(&(f as usize as u64).to_le_bytes());
        if len > 0 {
            // SAFETY: the caller passes `len` readable and writable bytes at `buf` (the
            // header's contract); they are copied in and, after the call, back.
            unsafe {
                std::ptr::copy_nonoverlapping(buf.cast::<u8>(), b[CALL_HEAD..].as_mut_ptr(), len)
            };
        }
        let r = sj()?.vas_call(vh, c_call, &mut b)?;
        if len > 0 {
            // SAFETY: as above.
            unsafe {
                std::ptr::copy_nonoverlapping(b[CALL_HEAD..].as_ptr(), buf.cast::<u8>(), len)
            };
        }
        let errno = i64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        if errno != 0 {
            return Err(fs_err(
                errno as i32,
                "sj_vas_call: switching the helper into the address space, or back, failed",
            ));
        }
        Ok(r)
    })();
    ret(
        r.map(|v| {
            if !result.is_null() {
                // SAFETY: a non-null `result` points to an int64_t of the caller's.
                unsafe { *result = v };
            }
            0
        }),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_malloc(sid: SjSid, n: usize) -> *mut c_void {
    ret(
        sj().and_then(|s| s.alloc(SegId(sid), n as u64))
            .map(|a| a as *mut c_void),
        std::ptr::null_mut(),
    )
}

#[no_mangle]
pub extern "C" fn sj_free(p: *mut c_void) {
    if !p.is_null() {
        ret(sj().and_then(|s| s.free(p as u64)), ());
    }
}

#[no_mangle]
pub extern "C" fn sj_root(sid: SjSid, name: *const c_char) -> *mut c_void {
    let r = text(name, "name").and_then(|n| sj()?.root(SegId(sid), n));
    match r {
        Ok(Some(a)) => a as *mut c_void,
        Ok(None) => {
            set_errno(0);
            std::ptr::null_mut()
        }
        Err(e) => {
            fail(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn sj_set_root(sid: SjSid, name: *const c_char, p: *mut c_void) -> c_int {
    ret(
        text(name, "name").and_then(|n| sj()?.set_root(SegId(sid), n, p as u64).map(|()| 0)),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_commit() -> c_int {
    ret(sj().and_then(|s| s.commit().map(|_| 0)), -1)
}

#[no_mangle]
pub extern "C" fn sj_abort() -> c_int {
    ret(sj().and_then(|s| s.abort().map(|()| 0)), -1)
}

#[no_mangle]
pub extern "C" fn sj_tx_add(p: *mut c_void, n: usize) -> c_int {
    ret(
        sj().and_then(|s| s.tx_add(p as u64, n as u64).map(|()| 0)),
        -1,
    )
}

#[no_mangle]
pub extern "C" fn sj_strerror() -> *const c_char {
    MESSAGE.with(|m| m.borrow().as_ptr())
}
