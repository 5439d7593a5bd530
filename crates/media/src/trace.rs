//! Persistence tracing for the power-failure simulator (`crates/crashsim`).
//!
//! Off unless a process is started with `CAIRN_PM_TRACE=<trace file>` (or calls
//! [`start`]); then every store into a [`crate::Mapping`] (plain, non-temporal, atomic),
//! every cache-line write-back and every fence of every process sharing that file is
//! appended to it, in one global order. Off, each primitive pays one relaxed load and a
//! predictable branch ([`on`]), plus the source-location argument `#[track_caller]`
//! passes.
//!
//! # The trace file
//!
//! A file of `capacity` bytes made by [`create`] (sparse, normally on `/dev/shm`). Its
//! first 4 KiB hold three `u64`s: the append position (atomic; records start at 4096),
//! the capacity and an overflow flag (set when a record did not fit: the trace is then
//! incomplete and the simulator refuses it). A record reserves its place with one
//! `fetch_add` on the append position, which is also its place in the global order, so
//! the order is the order in which the events became visible to other processes: a store
//! is traced after it is made, a fence after it completed.
//!
//! Each record is 8-byte aligned: a `u64` header written last (release), `len` in its low
//! 32 bits (whole record, header included) and the kind in bits 32..40, then the body:
//!
//! | kind | body |
//! |------|------|
//! | `STORE`, `NT_STORE` | tid `u32`, site `u32`, dev `u64`, ino `u64`, offset `u64`, length `u64`, bytes (padded to 8) |
//! | `FLUSH` | tid, site, dev, ino, offset, length |
//! | `FENCE` | tid, site |
//! | `MARK` | tid, label `u32`, value `u64` (a workload's call boundaries) |
//! | `SITE` | site `u32`, 0 `u32`, the site's `file:line` (padded) |
//! | `FILE_WRITE` | as `STORE`: a `pwrite` to a host file (a lower tier) |
//! | `FILE_SYNC` | tid, site, dev, ino: an `fdatasync` of that file |
//!
//! Offsets are offsets in the file (dev, ino) that was mapped, not in the mapping. A site
//! is the source location of the call (`#[track_caller]`), so a simulator can drop the
//! write-backs or fences of one line of code (fault injection) and name what it dropped.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::panic::Location;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// Record kinds.
pub const STORE: u8 = 1;
pub const NT_STORE: u8 = 2;
pub const FLUSH: u8 = 3;
pub const FENCE: u8 = 4;
pub const MARK: u8 = 5;
pub const SITE: u8 = 6;
pub const FILE_WRITE: u8 = 7;
pub const FILE_SYNC: u8 = 8;

/// Where records start.
pub const DATA_START: u64 = 4096;
/// Header fields.
pub const HDR_TAIL: usize = 0;
pub const HDR_CAPACITY: usize = 8;
pub const HDR_OVERFLOW: usize = 16;

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

struct Sink {
    ptr: *mut u8,
    capacity: u64,
    sites: Mutex<std::collections::HashSet<u32>>,
}

// SAFETY: the sink's memory is a shared file mapping written only through atomics (the
// header) and through disjoint ranges reserved by `fetch_add` (the records).
unsafe impl Send for Sink {}
// SAFETY: as above.
unsafe impl Sync for Sink {}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Whether tracing is on in this process (the first call reads `CAIRN_PM_TRACE`).
#[inline]
pub fn on() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => init_from_env(),
    }
}

#[cold]
fn init_from_env() -> bool {
    match std::env::var_os("CAIRN_PM_TRACE") {
        Some(p) if !p.is_empty() => {
            // Off while the trace file itself is mapped (`start` sets it on).
            STATE.store(OFF, Ordering::Relaxed);
            match start(Path::new(&p)) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!(
                        "cairn: CAIRN_PM_TRACE={}: cannot trace: {e}",
                        Path::new(&p).display()
                    );
                    false
                }
            }
        }
        _ => {
            STATE.store(OFF, Ordering::Relaxed);
            false
        }
    }
}

/// Make an empty trace file of `capacity` bytes (sparse).
pub fn create(path: &Path, capacity: u64) -> io::Result<()> {
    if capacity < 2 * DATA_START {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "trace capacity too small",
        ));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.set_len(capacity)?;
    let mut hdr = [0u8; 24];
    hdr[HDR_TAIL..HDR_TAIL + 8].copy_from_slice(&DATA_START.to_le_bytes());
    hdr[HDR_CAPACITY..HDR_CAPACITY + 8].copy_from_slice(&capacity.to_le_bytes());
    std::os::unix::fs::FileExt::write_all_at(&f, &hdr, 0)
}

/// Start tracing this process into the trace file at `path` (made by [`create`]). Once
/// on, tracing stays on for the life of the process.
pub fn start(path: &Path) -> io::Result<()> {
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let capacity = f.metadata()?.len();
    let map = crate::Mapping::new(&f, 0, capacity as usize, true, false)?;
    let stored = map.load_u64(HDR_CAPACITY)?;
    if stored != capacity {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a trace file (capacity {stored}, size {capacity})"),
        ));
    }
    let ptr = map.as_ptr();
    // The sink lives as long as the process: the mapping is never unmapped.
    std::mem::forget(map);
    let _ = SINK.set(Sink {
        ptr,
        capacity,
        sites: Mutex::new(Default::default()),
    });
    STATE.store(ON, Ordering::SeqCst);
    Ok(())
}

/// The traced identity of a mapped file: device, inode and the file offset of the
/// mapping's first byte (zeros when tracing is off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin {
    pub dev: u64,
    pub ino: u64,
    pub base: u64,
}

impl Origin {
    pub(crate) fn of(file: &File, base: u64) -> Origin {
        if !on() {
            return Origin::default();
        }
        match file.metadata() {
            Ok(m) => Origin {
                dev: m.dev(),
                ino: m.ino(),
                base,
            },
            Err(_) => Origin::default(),
        }
    }
}

fn tid() -> u32 {
    thread_local! {
        static TID: u32 = {
            // SAFETY: gettid has no arguments and cannot fail.
            (unsafe { libc::syscall(libc::SYS_gettid) }) as u32
        };
    }
    TID.with(|t| *t)
}

/// A stable 32-bit name of a source location (FNV-1a of `file:line`).
fn site_id(loc: &Location<'_>) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in loc.file().bytes().chain(loc.line().to_le_bytes()) {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// Reserve `len` bytes (a multiple of 8) and fill them with `fill` (which gets the body,
/// after the header); then publish the header.
fn append(kind: u8, len: usize, fill: impl FnOnce(&mut [u8])) {
    let Some(s) = SINK.get() else { return };
    // SAFETY: the header is in the first page of the mapping, 8-aligned; every process
    // uses atomics on it.
    let tail = unsafe { &*(s.ptr.add(HDR_TAIL) as *const AtomicU64) };
    let at = tail.fetch_add(len as u64, Ordering::SeqCst);
    if at + len as u64 > s.capacity {
        // SAFETY: as above.
        let ov = unsafe { &*(s.ptr.add(HDR_OVERFLOW) as *const AtomicU64) };
        ov.store(1, Ordering::SeqCst);
        return;
    }
    let mut body = vec![0u8; len - 8];
    fill(&mut body);
    // SAFETY: `at..at+len` was reserved for this record alone by the fetch_add above and
    // lies inside the mapping (checked against the capacity).
    unsafe {
        std::ptr::copy_nonoverlapping(body.as_ptr(), s.ptr.add(at as usize + 8), body.len());
        let h = &*(s.ptr.add(at as usize) as *const AtomicU64);
        h.store(len as u64 | (kind as u64) << 32, Ordering::Release);
    }
}

fn put(b: &mut [u8], at: usize, v: &[u8]) -> usize {
    b[at..at + v.len()].copy_from_slice(v);
    at + v.len()
}

/// Name `loc` in the trace (once per process) and return its id.
fn site(loc: &Location<'_>) -> u32 {
    let id = site_id(loc);
    let Some(s) = SINK.get() else { return id };
    let fresh = s.sites.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
    if fresh {
        let name = format!("{}:{}", loc.file(), loc.line());
        append(SITE, 16 + pad8(name.len()), |b| {
            let at = put(b, 0, &id.to_le_bytes());
            put(b, at + 4, name.as_bytes());
        });
    }
    id
}

/// Trace a store (`nt`: non-temporal) of `data` at `off` of the mapping of `o`.
pub(crate) fn store(o: &Origin, off: usize, data: &[u8], nt: bool, loc: &Location<'_>) {
    let kind = if nt { NT_STORE } else { STORE };
    record_write(kind, o, off, data, loc);
}

/// Trace a `pwrite` of `data` at `off` of `file`.
pub(crate) fn file_write(file: &File, off: u64, data: &[u8], loc: &Location<'_>) {
    let o = Origin::of(file, 0);
    record_write(FILE_WRITE, &o, off as usize, data, loc);
}

/// Trace an `fdatasync` of `file`.
pub(crate) fn file_sync(file: &File, loc: &Location<'_>) {
    let o = Origin::of(file, 0);
    let site = site(loc);
    append(FILE_SYNC, 32, |b| {
        let mut at = put(b, 0, &tid().to_le_bytes());
        at = put(b, at, &site.to_le_bytes());
        at = put(b, at, &o.dev.to_le_bytes());
        put(b, at, &o.ino.to_le_bytes());
    });
}

fn record_write(kind: u8, o: &Origin, off: usize, data: &[u8], loc: &Location<'_>) {
    let site = site(loc);
    append(kind, 48 + pad8(data.len()), |b| {
        let mut at = put(b, 0, &tid().to_le_bytes());
        at = put(b, at, &site.to_le_bytes());
        at = put(b, at, &o.dev.to_le_bytes());
        at = put(b, at, &o.ino.to_le_bytes());
        at = put(b, at, &(o.base + off as u64).to_le_bytes());
        at = put(b, at, &(data.len() as u64).to_le_bytes());
        put(b, at, data);
    });
}

/// Trace a write-back of `off..off+len` of the mapping of `o`.
pub(crate) fn flush(o: &Origin, off: usize, len: usize, loc: &Location<'_>) {
    let site = site(loc);
    append(FLUSH, 48, |b| {
        let mut at = put(b, 0, &tid().to_le_bytes());
        at = put(b, at, &site.to_le_bytes());
        at = put(b, at, &o.dev.to_le_bytes());
        at = put(b, at, &o.ino.to_le_bytes());
        at = put(b, at, &(o.base + off as u64).to_le_bytes());
        put(b, at, &(len as u64).to_le_bytes());
    });
}

/// Trace a fence of the calling thread.
pub(crate) fn fence(loc: &Location<'_>) {
    let site = site(loc);
    append(FENCE, 16, |b| {
        let at = put(b, 0, &tid().to_le_bytes());
        put(b, at, &site.to_le_bytes());
    });
}

/// Put a mark in the trace (a workload's call boundaries: label and value are the
/// workload's own). Nothing when tracing is off.
pub fn mark(label: u32, value: u64) {
    if !on() {
        return;
    }
    append(MARK, 24, |b| {
        let mut at = put(b, 0, &tid().to_le_bytes());
        at = put(b, at, &label.to_le_bytes());
        put(b, at, &value.to_le_bytes());
    });
}
