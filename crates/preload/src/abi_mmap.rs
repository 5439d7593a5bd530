//! Memory mappings of Cairn files.
//!
//! A shared mapping (`MAP_SHARED`) maps the file's *map object* (LibFS,
//! `File::map_object`): one host shared-memory file per Cairn file that every process
//! mapping it maps, so all of them see each other's stores at once, and the stores of a
//! process that dies stay in it. At `msync`, `munmap` and exit the pages that differ from
//! the file are logged (durable); the last mapping in the process gives the object back
//! (`File::map_release`), which removes it once no process maps it.
//!
//! A private mapping (`MAP_PRIVATE`) is anonymous memory in which the pages whose data
//! are digested in the shared area map the NVM tier file in place (read-only file
//! descriptor: writes to a private mapping are copied on write), and the other pages
//! (logged and not digested yet, holes, the last partial page) are filled from the file.
//! A mapping in place pins its epoch, so its blocks are not reused until it is unmapped
//! (reclamation waits meanwhile); a child after `fork` gets copies instead, as it has
//! no pin of its own.
//! SAFETY: see `abi.rs`; tracked ranges are memory this library mapped and that is
//! still mapped (a range leaves the list before `munmap` unmaps it).

use crate::abi::{fd_call, run, slice, slice_mut};
use crate::maps::{MapKind, MapPin, Mapping, MAPS};
use crate::real;
use crate::state::err;
use crate::table::{self, Ofd};
use libc::{c_int, c_void, off64_t, size_t};
use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const PAGE: usize = 4096;

/// Tracked mappings: while 0, `munmap` and `msync` cost one load.
static TRACKED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread is inside the mapping code (whose allocations may `munmap`).
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

fn busy() -> bool {
    BUSY.with(|b| b.get())
}

/// Run `f` marked busy.
fn busy_run<T>(f: impl FnOnce() -> T) -> T {
    BUSY.with(|b| b.set(true));
    let r = f();
    BUSY.with(|b| b.set(false));
    r
}

/// The NVM tier file, open read-only: descriptor, device and inode (checked before use:
/// a program may have closed the descriptor).
static NVM: parking_lot::Mutex<Option<(c_int, u64, u64)>> = parking_lot::Mutex::new(None);

fn nvm_fd() -> io::Result<c_int> {
    let mut g = NVM.lock();
    if let Some((fd, dev, ino)) = *g {
        // SAFETY: fstat into a local buffer.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        if unsafe { real::fstat64(fd, &mut st) } == 0 && st.st_dev == dev && st.st_ino == ino {
            return Ok(fd);
        }
    }
    // A duplicate of the client's read-only descriptor: the process may not be allowed
    // to open the file by name.
    let fd = std::os::fd::IntoRawFd::into_raw_fd(crate::state::fs()?.nvm_file()?);
    // SAFETY: fstat into a local buffer.
    unsafe {
        let mut st: libc::stat64 = std::mem::zeroed();
        real::fstat64(fd, &mut st);
        *g = Some((fd, st.st_dev, st.st_ino));
    }
    Ok(fd)
}

/// Fill `mem` (the mapping's bytes from file offset `off`) from the file.
fn fill(f: &cairn::File, mem: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < mem.len() {
        let n = f.read_at(&mut mem[done..], off + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(())
}

fn map_cairn(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    o: Arc<Ofd>,
    off: off64_t,
) -> io::Result<*mut c_void> {
    if len == 0 || off < 0 || !(off as usize).is_multiple_of(PAGE) {
        return Err(err(libc::EINVAL, "mmap: bad length or offset"));
    }
    if o.dir {
        return Err(err(libc::ENODEV, "mmap: a directory"));
    }
    let kind = flags & 0x3;
    let shared = kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE;
    if !o.read || (shared && prot & libc::PROT_WRITE != 0 && !o.write) {
        return Err(err(
            libc::EACCES,
            "mmap: the descriptor's access does not allow this mapping",
        ));
    }
    let f = o.file()?;
    if shared {
        let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
        let write = prot & libc::PROT_WRITE != 0;
        let seg =
            busy_run(|| crate::segments::map(f, o.ino, addr as usize, len, write, fixed, off));
        if let Some(r) = seg {
            return r.map(|base| base as *mut c_void);
        }
        return map_shared(addr, len, prot, flags, o, off);
    }
    let size = f.metadata()?.len();
    let mut fl = (flags & !0x3 & !libc::MAP_SYNC) | libc::MAP_ANONYMOUS | libc::MAP_PRIVATE;
    let mut addr = addr;
    if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == 0
        && len >= cairn_media::huge::HUGE_PAGE
    {
        // Where the kernel chooses: an address congruent to the offset modulo 2 MiB, so
        // that superpage extents mapped in place below can use PMDs.
        if let Ok(at) = cairn_media::huge::reserve_aligned(len, off as u64) {
            addr = at as *mut c_void;
            fl |= libc::MAP_FIXED;
        }
    }
    // SAFETY: anonymous memory, at `addr` only as the caller asked (MAP_FIXED) or over
    // the reservation made just above for this mapping.
    let p = unsafe { real::mmap64(addr, len, libc::PROT_READ | libc::PROT_WRITE, fl, -1, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let filled = (size.saturating_sub(off as u64)).min(len as u64) as usize;
    let (plan, epoch) = if filled < PAGE {
        (Vec::new(), None)
    } else {
        f.map_plan(off as u64, filled / PAGE)?
    };
    let mut in_place = vec![false; plan.len()];
    if epoch.is_some() {
        let nvm = nvm_fd()?;
        for (i, j, start) in cairn::File::in_place_runs(&plan) {
            // SAFETY: replaces pages of the anonymous mapping made above, with a private
            // mapping of the NVM tier file (read-only descriptor) at a block boundary.
            let q = unsafe {
                real::mmap64(
                    (p as usize + i * PAGE) as *mut c_void,
                    (j - i) * PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    nvm,
                    start as off64_t,
                )
            };
            if q != libc::MAP_FAILED {
                in_place[i..j].iter_mut().for_each(|x| *x = true);
            }
        }
    }
    // The other pages (and the tail) are read from the file.
    // SAFETY: `p` is mapped readable and writable for `len >= filled` bytes.
    let mem = unsafe { slice_mut(p, filled) };
    let mut i = 0;
    while i * PAGE < filled {
        if in_place.get(i).copied().unwrap_or(false) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j * PAGE < filled && !in_place.get(j).copied().unwrap_or(false) {
            j += 1;
        }
        let end = (j * PAGE).min(filled);
        fill(f, &mut mem[i * PAGE..end], off as u64 + (i * PAGE) as u64)?;
        i = j;
    }
    if prot != libc::PROT_READ | libc::PROT_WRITE {
        // SAFETY: the range was mapped above.
        unsafe { real::mprotect(p, len, prot) };
    }
    if let Some(epoch) = epoch {
        let kind = MapKind::InPlace {
            pin: Arc::new(MapPin {
                ofd: o.clone(),
                epoch,
            }),
            prot,
        };
        track(p, len, off, o, kind);
    }
    Ok(p)
}

fn track(p: *mut c_void, len: usize, off: off64_t, ofd: Arc<Ofd>, kind: MapKind) {
    busy_run(|| {
        MAPS.lock().push(Mapping {
            addr: p as usize,
            len,
            off: off as u64,
            ofd,
            kind,
        })
    });
    TRACKED.fetch_add(1, Ordering::Release);
}

/// `MAP_SHARED`: map the file's map object with the caller's protection and flags.
fn map_shared(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    o: Arc<Ofd>,
    off: off64_t,
) -> io::Result<*mut c_void> {
    if flags & 0x3 == libc::MAP_SHARED_VALIDATE && flags & libc::MAP_SYNC != 0 {
        // As Linux answers for a file that is not on a DAX device: the map object is
        // host memory, so stores are not durable before `msync`.
        return Err(err(
            libc::EOPNOTSUPP,
            "mmap: MAP_SYNC is not supported on Cairn files (stores are durable at msync)",
        ));
    }
    let f = o.file()?;
    let obj = f.map_object()?;
    let fl = (flags & !0x3 & !libc::MAP_SYNC) | libc::MAP_SHARED;
    // A read-only description maps the object read-only, so that `mprotect` cannot
    // make the mapping writable (`EACCES`, as Linux).
    let ro = if o.write {
        None
    } else {
        match f.map_read_only(&obj) {
            Ok(r) => Some(r),
            Err(e) => {
                let _ = f.map_release(obj);
                return Err(e);
            }
        }
    };
    let fd = ro
        .as_ref()
        .map_or(obj.file().as_raw_fd(), |r| r.as_raw_fd());
    // SAFETY: a shared mapping of the map object (a descriptor valid for the call), at
    // `addr` only as the caller asked.
    let p = unsafe { real::mmap64(addr, len, prot, fl, fd, off) };
    drop(ro);
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        let _ = f.map_release(obj);
        return Err(e);
    }
    let write = o.write;
    track(p, len, off, o, MapKind::Shared { obj, write });
    Ok(p)
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS != 0 || !table::is_cairn(fd) {
        return unsafe { real::mmap64(addr, len, prot, flags, fd, off) };
    }
    let r = fd_call(
        "mmap",
        fd,
        || unsafe { real::mmap64(addr, len, prot, flags, fd, off) },
        |o| map_cairn(addr, len, prot, flags, o, off),
    );
    if r.is_null() {
        libc::MAP_FAILED
    } else {
        r
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    unsafe { mmap64(addr, len, prot, flags, fd, off) }
}

/// What an unmapped range leaves to give back once it is really unmapped: the shared
/// mappings that were (partly) in it, whose map objects' locks their pages hold.
type Gone = Vec<Mapping>;

/// Write back the tracked shared mappings overlapping `[addr, addr + len)`; with
/// `unmap`, also stop tracking that range and return the mappings it took, to give
/// back with [`release`] after the range is unmapped.
fn sync_range(addr: usize, len: usize, unmap: bool) -> (io::Result<()>, Gone) {
    let end = addr.saturating_add(len);
    busy_run(|| {
        let mut maps = MAPS.lock();
        let mut first_err = None;
        for m in maps.iter() {
            let MapKind::Shared { obj, write: true } = &m.kind else {
                continue;
            };
            let (a, b) = (m.addr.max(addr), (m.addr + m.len).min(end));
            if a < b {
                let foff = m.off + (a - m.addr) as u64;
                if let Err(e) = m
                    .ofd
                    .file()
                    .and_then(|f| f.map_sync(obj, foff, (b - a) as u64))
                {
                    first_err.get_or_insert(e);
                }
            }
        }
        if unmap {
            let mut kept = Vec::new();
            let mut gone = Vec::new();
            for m in maps.drain(..) {
                let mend = m.addr + m.len;
                if mend <= addr || m.addr >= end {
                    kept.push(m);
                    continue;
                }
                if m.addr < addr {
                    kept.push(Mapping {
                        addr: m.addr,
                        len: addr - m.addr,
                        off: m.off,
                        ofd: m.ofd.clone(),
                        kind: m.kind.piece(),
                    });
                }
                if mend > end {
                    kept.push(Mapping {
                        addr: end,
                        len: mend - end,
                        off: m.off + (end - m.addr) as u64,
                        ofd: m.ofd.clone(),
                        kind: m.kind.piece(),
                    });
                }
                gone.push(m);
            }
            TRACKED.store(kept.len(), Ordering::Release);
            *maps = kept;
            return (first_err.map_or(Ok(()), Err), gone);
        }
        (first_err.map_or(Ok(()), Err), Vec::new())
    })
}

/// Give back the map objects of unmapped shared mappings: the last mapping of an object
/// in this process folds it if no other process maps it (the mapping's pages hold the
/// object's lock, so this comes after `munmap`).
fn release(gone: Gone) -> io::Result<()> {
    busy_run(|| {
        let mut first_err = None;
        for m in gone {
            if let MapKind::Shared { obj, .. } = m.kind {
                if let Err(e) = m.ofd.file().and_then(|f| f.map_release(obj)) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    })
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    crate::abi::mappings_changed();
    if !busy() && crate::segments::holds(addr as usize, len) {
        // A segment stays attached and mapped at its base.
        busy_run(|| crate::segments::unmap(addr as usize, len));
        return 0;
    }
    if TRACKED.load(Ordering::Acquire) == 0 || busy() {
        return unsafe { real::munmap(addr, len) };
    }
    let (synced, gone) = sync_range(addr as usize, len, true);
    let u = unsafe { real::munmap(addr, len) };
    let e = real::errno();
    // As on Linux, `munmap` does not fail for the write-back (a full store): the stores
    // stay in the map object for a later write-back (`msync`, `fsync` or a fold, which
    // report such errors).
    if let Err(err) = synced.and(release(gone)) {
        if crate::state::config().log {
            eprintln!("cairn-preload: munmap: writing back: {err}");
        }
    }
    real::set_errno(e);
    u
}

#[no_mangle]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, fl: c_int) -> c_int {
    if !busy() && crate::segments::holds(addr as usize, len) {
        // A segment: one failure-atomic commit.
        return run("msync", || {
            busy_run(|| crate::segments::commit_at(addr as usize)).map(|()| 0)
        });
    }
    if TRACKED.load(Ordering::Acquire) == 0 || busy() {
        return unsafe { real::msync(addr, len, fl) };
    }
    let r = run("msync", || {
        sync_range(addr as usize, len, false).0.map(|()| 0)
    });
    if r < 0 {
        return r;
    }
    unsafe { real::msync(addr, len, fl) }
}

#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    fl: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    crate::abi::mappings_changed();
    if TRACKED.load(Ordering::Acquire) != 0 && !busy() {
        let (a, e) = (old as usize, old as usize + old_len);
        return busy_run(|| {
            let mut maps = MAPS.lock();
            let hit: Vec<usize> = (0..maps.len())
                .filter(|&i| maps[i].addr < e && a < maps[i].addr + maps[i].len)
                .collect();
            if hit.is_empty() {
                drop(maps);
                return unsafe { raw_mremap(old, old_len, new_len, fl, new_addr) };
            }
            // A whole shared mapping moves or changes size with the object underneath
            // it; anything else (a piece, a private mapping in place) is refused.
            let whole = hit.len() == 1
                && maps[hit[0]].addr == a
                && maps[hit[0]].len == old_len
                && matches!(maps[hit[0]].kind, MapKind::Shared { .. });
            if !whole {
                drop(maps);
                let _: c_int = run("mremap", || {
                    Err(err(
                        libc::EINVAL,
                        "mremap of part of a mapping of a Cairn file, or of a private one, is not supported",
                    ))
                });
                return libc::MAP_FAILED;
            }
            let p = unsafe { raw_mremap(old, old_len, new_len, fl, new_addr) };
            if p != libc::MAP_FAILED {
                maps[hit[0]].addr = p as usize;
                maps[hit[0]].len = new_len;
            }
            p
        });
    }
    unsafe { raw_mremap(old, old_len, new_len, fl, new_addr) }
}

/// The `mremap` system call.
unsafe fn raw_mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    fl: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe {
        real::syscall6(
            libc::SYS_mremap,
            [
                old as libc::c_long,
                old_len as libc::c_long,
                new_len as libc::c_long,
                fl as libc::c_long,
                new_addr as libc::c_long,
                0,
            ],
        ) as *mut c_void
    }
}

/// At exit: write back every tracked shared mapping and give back the map objects.
pub extern "C" fn flush_all_at_exit() {
    if TRACKED.load(Ordering::Acquire) != 0 && !busy() {
        // Shared mappings are written back and unmapped (their pages hold the map
        // objects' locks), so that the objects nobody else maps are folded now.
        let (synced, gone) = sync_range(0, usize::MAX, true);
        let mut shared = Vec::new();
        for m in gone {
            if matches!(m.kind, MapKind::Shared { .. }) {
                // SAFETY: a shared mapping this library made, untracked above; the
                // program is exiting (this handler runs after those it registered).
                unsafe { real::munmap(m.addr as *mut c_void, m.len) };
                shared.push(m);
            } else {
                // Mappings in place keep their pins to the end.
                std::mem::forget(m);
            }
        }
        if let Err(e) = synced.and(release(shared)) {
            if crate::state::config().log {
                eprintln!("cairn-preload: writing back shared mappings at exit: {e}");
            }
        }
    }
}

impl MapKind {
    /// The kind of a piece left by a partial `munmap` (sharing the pin).
    fn piece(&self) -> MapKind {
        match self {
            MapKind::Shared { obj, write } => MapKind::Shared {
                obj: obj.clone(),
                write: *write,
            },
            MapKind::InPlace { pin, prot } => MapKind::InPlace {
                pin: pin.clone(),
                prot: *prot,
            },
        }
    }
}

/// In the child after `fork`: mappings in place become copies (the pin is the
/// parent's: the blocks could be reused once the parent unmaps them).
pub fn copy_in_place_mappings() {
    let mut maps = MAPS.lock();
    let (in_place, kept): (Vec<Mapping>, Vec<Mapping>) = std::mem::take(&mut *maps)
        .into_iter()
        .partition(|m| matches!(m.kind, MapKind::InPlace { .. }));
    *maps = kept;
    TRACKED.store(maps.len(), Ordering::Release);
    drop(maps);
    for m in in_place {
        let MapKind::InPlace { prot, .. } = m.kind else {
            continue;
        };
        let a = m.addr as *mut c_void;
        // SAFETY: the range is a mapping this library made and the program still has
        // (tracked); it is read, replaced by anonymous memory at the same address and
        // filled again before the program runs on.
        unsafe {
            real::mprotect(a, m.len, libc::PROT_READ);
            let copy = slice(a, m.len).to_vec();
            let q = real::mmap64(
                a,
                m.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if q != libc::MAP_FAILED {
                slice_mut(a, m.len).copy_from_slice(&copy);
            }
            real::mprotect(a, m.len, prot);
        }
        // The pin and the description are the parent's client's: never released here.
        std::mem::forget(m);
    }
}
