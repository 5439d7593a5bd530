//! Segments (SpaceJMP, `cairn-sj`) for unmodified programs (docs/SPACEJMP.md, "Programs
//! that map segment files").
//!
//! * `cairn run --vas NAME -- CMD` sets `CAIRN_SJ_VAS`: at start-up the library attaches
//!   that address space and switches the main thread into it ([`init_from_env`]).
//! * A shared `mmap` of a segment's file is the segment at its base (attached to the
//!   calling thread's address space if the process does not have it mapped yet), not a
//!   new mapping ([`map`]). `munmap` of it changes nothing (the segment stays attached).
//! * `msync` of an address in a segment commits the address space that holds it
//!   ([`commit_at`]): durable and visible to others when it returns, all or nothing.
//! * When the thread that attached or mapped a segment ends (the main thread: at exit),
//!   its address space and those holding the segments `mmap` handed out are committed, or
//!   their stores dropped with `CAIRN_SJ_EXIT=abort` (`--vas-abort-on-exit`); a process
//!   killed before drops them. This runs as a thread-local destructor registered after
//!   `cairn-sj`'s own thread state, so it runs before that state is gone.

use crate::state::err;
use cairn_sj::{prot, CommitMode, SegId, SpaceJmp};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Segment ranges handed out by `mmap`: `(base, len)`.
static RANGES: parking_lot::Mutex<Vec<(usize, usize)>> = parking_lot::Mutex::new(Vec::new());
/// `RANGES.len()`, so that `munmap` and `msync` of other memory cost one load.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Commits (or drops) at the end of the thread that holds it.
struct AtEnd;

impl Drop for AtEnd {
    fn drop(&mut self) {
        finish();
    }
}

thread_local! {
    static AT_END: AtEnd = const { AtEnd };
}

fn sj() -> io::Result<Arc<SpaceJmp>> {
    if let Some(sj) = SpaceJmp::global() {
        return Ok(sj);
    }
    SpaceJmp::with_fs((*crate::state::fs()?).clone())
}

/// Arm the calling thread's [`AtEnd`] (after `cairn-sj` has set up its thread state:
/// thread-local destructors run last registered, first run).
fn arm() {
    AT_END.with(|_| {});
}

/// `CAIRN_SJ_VAS`: attach it and switch the calling (main) thread into it.
pub fn init_from_env() -> io::Result<()> {
    let Some(name) = std::env::var_os("CAIRN_SJ_VAS").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let name = name.to_string_lossy().into_owned();
    let sj = sj()?;
    let vid = sj.vas_find(&name)?;
    let vh = sj.vas_attach(vid, CommitMode::Snapshot)?;
    sj.switch_to(vh, true, true)?;
    arm();
    Ok(())
}

/// A shared mapping of Cairn file `f` (inode `ino`): `None` if it is not a segment, else
/// the segment's base (see the module's documentation).
pub fn map(
    f: &cairn::File,
    ino: u64,
    addr: usize,
    len: usize,
    write: bool,
    fixed: bool,
    off: i64,
) -> Option<io::Result<usize>> {
    let header = cairn_sj::segment::read_header(f, "").ok()?;
    Some((|| {
        if off != 0 || len as u64 > header.len {
            return Err(err(
                libc::EINVAL,
                format!(
                    "mmap of a segment: from offset 0, at most its length ({:#x})",
                    header.len
                ),
            ));
        }
        if fixed && addr as u64 != header.base {
            return Err(err(
                libc::EINVAL,
                format!("mmap of a segment: it lives at {:#x}", header.base),
            ));
        }
        let p = if write { prot::RW } else { prot::READ };
        let (base, _) = sj()?.seg_mapped(SegId(ino), p)?;
        let base = base as usize;
        let mut r = RANGES.lock();
        if !r.contains(&(base, len)) {
            r.push((base, len));
        }
        COUNT.store(r.len(), Ordering::Release);
        arm();
        Ok(base)
    })())
}

/// Whether `[addr, addr + len)` lies in a segment `mmap` handed out.
pub fn holds(addr: usize, len: usize) -> bool {
    COUNT.load(Ordering::Acquire) != 0
        && RANGES
            .lock()
            .iter()
            .any(|&(b, l)| addr >= b && addr.saturating_add(len) <= b + l)
}

/// `munmap` of a segment range: forgotten (the segment stays attached and mapped).
pub fn unmap(addr: usize, len: usize) {
    let mut r = RANGES.lock();
    r.retain(|&(b, l)| !(addr <= b && b + l <= addr.saturating_add(len)));
    COUNT.store(r.len(), Ordering::Release);
}

/// `msync` in a segment: commit the address space that holds `addr`.
pub fn commit_at(addr: usize) -> io::Result<()> {
    sj()?.commit_at(addr as u64).map(|_| ())
}

/// Commit (or drop) the stores of the ending thread's address space and of every address
/// space holding a segment `mmap` handed out.
fn finish() {
    let Some(sj) = SpaceJmp::global() else {
        return;
    };
    let abort = std::env::var_os("CAIRN_SJ_EXIT").is_some_and(|v| v == "abort");
    let mut result = if abort {
        sj.abort()
    } else {
        sj.commit().map(|_| ())
    };
    if !abort {
        for (base, _) in RANGES.lock().clone() {
            result = result.and(sj.commit_at(base as u64).map(|_| ()));
        }
    }
    if let Err(e) = result {
        eprintln!("cairn-preload: at exit: committing segments: {e}");
    }
    // Back to the primary: nothing is left for the thread state's own end to drop.
    let _ = sj.switch_to(cairn_sj::Vh::PRIMARY, true, !abort);
}
