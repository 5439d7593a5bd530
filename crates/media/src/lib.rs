//! Cairn's media primitives: the only module with `unsafe` memory access.
//!
//! A [`Mapping`] is a shared memory mapping of (part of) the NVM tier file. Every write
//! to NVM goes through its methods (`write`, `write_nt`, `zero`, `store_u64`), and every
//! write-back through `flush` + [`fence`]. That single funnel is where a power-failure
//! simulator hooks in later. Persistence instructions run in every mode (also on the
//! tmpfs stand-in) so that the cost model stays honest: `clwb` when the CPU has it, else
//! `clflushopt`, else `clflush`; `sfence` to order.
//!
//! Reads of shared structures that another process may update concurrently use
//! [`Mapping::load_u64`] (atomic, acquire) or [`Mapping::read`] (byte copy) under the
//! protocol of the caller (seqlock or epoch) that makes the copy meaningful.

pub mod aligned;
pub mod emulate;
pub mod fixed;
pub mod helper;
pub mod huge;
pub mod owner;
pub mod trace;
pub mod view;
pub mod words;

pub use aligned::AlignedBuf;
pub use view::View;

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::panic::Location;
use std::sync::atomic::{fence as atomic_fence, AtomicU64, Ordering};
use std::sync::OnceLock;

/// Cache-line size assumed for write-back.
pub const CACHE_LINE: usize = 64;

/// A memory mapping of a byte range of a file.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    /// The mapped file, for the persistence trace.
    origin: trace::Origin,
}

// SAFETY: the mapping is plain shared memory; all access goes through methods that use
// raw-pointer copies or atomics, never Rust references to the mapped bytes, so sharing
// the handle between threads creates no aliasing of Rust references.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// Out-of-range access to a mapping (a corrupt pointer on media, never a bug to panic on).
fn oob(off: usize, len: usize, map_len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("access {off}+{len} outside the mapping of {map_len} bytes"),
    )
}

impl Mapping {
    /// Map `len` bytes of `file` at `offset` (a multiple of the page size), shared.
    /// `populate` pre-faults the pages (used for the log ring on the write fast path).
    pub fn new(
        file: &File,
        offset: u64,
        len: usize,
        writable: bool,
        populate: bool,
    ) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let mut flags = libc::MAP_SHARED;
        if populate {
            flags |= libc::MAP_POPULATE;
        }
        // A mapping of 2 MiB or more is placed so that its address is congruent to the
        // file offset modulo 2 MiB: a 2 MiB-aligned range of the file then lies at a
        // 2 MiB-aligned address, which the kernel can map with one PMD when the file's
        // pages there form a huge folio (`huge::collapse`).
        let at = if len >= huge::HUGE_PAGE {
            huge::reserve_aligned(len, offset)?
        } else {
            std::ptr::null_mut()
        };
        if !at.is_null() {
            flags |= libc::MAP_FIXED;
        }
        // SAFETY: either a fresh mapping chosen by the kernel (addr NULL), or `MAP_FIXED`
        // over `at`, a range this call just reserved (`huge::reserve_aligned`) and that
        // nothing else uses; the fd is valid for the duration of the call; errors are
        // checked below (the reservation is released on failure).
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                prot,
                flags,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if !at.is_null() {
                // SAFETY: the reservation made above, unused.
                unsafe { libc::munmap(at as *mut libc::c_void, len) };
            }
            return Err(e);
        }
        Ok(Mapping {
            ptr: p as *mut u8,
            len,
            writable,
            origin: trace::Origin::of(file, offset),
        })
    }

    /// `len` zeroed bytes of the process's own memory (a `memfd`, mapped shared: page
    /// aligned, as a file's mapping is, and handed back when dropped).
    pub fn anonymous(name: &str, len: usize) -> io::Result<Mapping> {
        let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
        let file = File::from(fd);
        file.set_len(len as u64)?;
        Mapping::new(&file, 0, len, true, false)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, by construction).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the mapping was made writable.
    pub fn writable(&self) -> bool {
        self.writable
    }

    #[inline]
    fn check(&self, off: usize, len: usize) -> io::Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(oob(off, len, self.len)),
        }
    }

    #[inline]
    fn check_write(&self, off: usize, len: usize) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "mapping is read-only",
            ));
        }
        self.check(off, len)
    }

    /// Copy `buf.len()` bytes at `off` into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> io::Result<()> {
        self.check(off, buf.len())?;
        // SAFETY: bounds checked above; the source is mapped memory of at least that
        // length and cannot overlap `buf` (a Rust-owned buffer, not inside the mapping).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) };
        emulate::read(0, buf.len());
        Ok(())
    }

    /// The bytes at `off..off + len`, in place (no copy). The mapping is shared memory,
    /// as with `memmap2`'s maps: the caller's own protocol (a lock, or epochs over
    /// records nobody rewrites) must keep writers out of the range while the slice is in
    /// use, or accept that it may read a mix of old and new bytes and validate after.
    pub fn bytes(&self, off: usize, len: usize) -> io::Result<&[u8]> {
        self.check(off, len)?;
        emulate::read(0, len);
        // SAFETY: bounds checked; the mapping lives as long as `self`, which the slice
        // borrows. Concurrent writers are excluded by the caller's protocol (above).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) })
    }

    /// Atomic 8-byte load (acquire) at `off` (must be 8-aligned).
    pub fn load_u64(&self, off: usize) -> io::Result<u64> {
        self.check(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned u64 load",
            ));
        }
        // SAFETY: in bounds and 8-aligned (the mapping is page aligned); AtomicU64 has the
        // layout of u64, and all concurrent writers use atomic stores too.
        Ok(unsafe { (*(self.ptr.add(off) as *const AtomicU64)).load(Ordering::Acquire) })
    }

    /// The u32 at `off` (4-aligned) as an atomic. Callers that store through it check
    /// that the mapping is writable first ([`Mapping::atomic_u32`]); a futex word needs
    /// no more than this (the kernel only reads it).
    fn u32_ref(&self, off: usize) -> io::Result<&std::sync::atomic::AtomicU32> {
        self.check(off, 4)?;
        if !off.is_multiple_of(4) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "unaligned u32"));
        }
        // SAFETY: in bounds and 4-aligned (the mapping is page aligned); `AtomicU32` has
        // the layout of u32 and every access through it is atomic; the reference lives
        // no longer than `&self`, and so the mapping. A read-only mapping is only loaded
        // from (the futex calls read the word).
        Ok(unsafe { &*(self.ptr.add(off) as *const std::sync::atomic::AtomicU32) })
    }

    /// Sleep while the u32 at `off` (4-aligned) holds `seen`, at most `timeout` (a futex
    /// wait on the mapped file: any process mapping it wakes us with
    /// [`Mapping::wake_all`]). Returns at once if the word differs; a spurious or timed
    /// out wake-up returns too, so callers check the word again.
    pub fn wait_u32(&self, off: usize, seen: u32, timeout: std::time::Duration) -> io::Result<()> {
        use rustix::io::Errno;
        let ts = rustix::thread::futex::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        // Not private: the waiters and the waker are different processes.
        let flags = rustix::thread::futex::Flags::empty();
        match rustix::thread::futex::wait(self.u32_ref(off)?, flags, seen, Some(&ts)) {
            Ok(()) => Ok(()),
            Err(Errno::AGAIN | Errno::TIMEDOUT | Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Wake every process sleeping in [`Mapping::wait_u32`] on the u32 at `off`.
    pub fn wake_all(&self, off: usize) -> io::Result<()> {
        let flags = rustix::thread::futex::Flags::empty();
        rustix::thread::futex::wake(self.u32_ref(off)?, flags, u32::MAX)?;
        Ok(())
    }

    /// Atomic 8-byte store (release) at `off` (must be 8-aligned). Not written back.
    #[track_caller]
    pub fn store_u64(&self, off: usize, v: u64) -> io::Result<()> {
        self.check_write(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned u64 store",
            ));
        }
        // SAFETY: in bounds, aligned, writable mapping; atomic access as in `load_u64`.
        unsafe { (*(self.ptr.add(off) as *const AtomicU64)).store(v, Ordering::Release) };
        if trace::on() {
            trace::store(
                &self.origin,
                off,
                &v.to_le_bytes(),
                false,
                Location::caller(),
            );
        }
        Ok(())
    }

    /// The u64 at `off` (8-byte aligned) as an atomic, for words processes share in a
    /// mapping of host memory that is not the NVM tier (lock tables: no persistence, no
    /// trace).
    #[inline]
    pub fn atomic_u64(&self, off: usize) -> io::Result<&AtomicU64> {
        self.check_write(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned atomic u64",
            ));
        }
        // SAFETY: in bounds, 8-aligned (the mapping is page aligned), writable; the
        // reference lives no longer than `&self`, and so the mapping; `AtomicU64` has the
        // layout of u64 and every access through it is atomic.
        Ok(unsafe { &*(self.ptr.add(off) as *const AtomicU64) })
    }

    /// The `n` u64s at `off` (8-byte aligned) as atomics, as [`Mapping::atomic_u64`]:
    /// tables of words that processes mapping the file share (an index, slot arrays).
    pub fn atomic_u64s(&self, off: usize, n: usize) -> io::Result<&[AtomicU64]> {
        let len = n
            .checked_mul(8)
            .ok_or_else(|| oob(off, usize::MAX, self.len))?;
        self.check_write(off, len)?;
        if !off.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned atomic u64s",
            ));
        }
        // SAFETY: `off..off + 8n` is in bounds, 8-aligned (the mapping is page aligned)
        // and writable; the slice lives no longer than `&self`, and so the mapping;
        // `AtomicU64` has the layout of u64 and every access through the slice is atomic
        // (other processes' too, by the callers' protocol).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.add(off) as *const AtomicU64, n) })
    }

    /// The u32 at `off` (4-byte aligned) as an atomic (a futex word), as
    /// [`Mapping::atomic_u64`].
    #[inline]
    pub fn atomic_u32(&self, off: usize) -> io::Result<&std::sync::atomic::AtomicU32> {
        self.check_write(off, 4)?;
        self.u32_ref(off)
    }

    /// Atomic 8-byte add (sequentially consistent) at `off` (must be 8-aligned); returns
    /// the previous value. Other processes mapping the same file see it at once.
    #[track_caller]
    pub fn fetch_add_u64(&self, off: usize, v: u64) -> io::Result<u64> {
        self.check_write(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "unaligned u64 add",
            ));
        }
        // SAFETY: in bounds, aligned, writable mapping; atomic access as in `load_u64`.
        let old =
            unsafe { (*(self.ptr.add(off) as *const AtomicU64)).fetch_add(v, Ordering::SeqCst) };
        if trace::on() {
            let new = old.wrapping_add(v).to_le_bytes();
            trace::store(&self.origin, off, &new, false, Location::caller());
        }
        Ok(old)
    }

    /// The first byte of the mapping. Reading or writing through it is the caller's
    /// `unsafe` business (other processes may change the bytes at any time).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Plain stores of `data` at `off`. Not written back: call `flush` + `fence`.
    #[track_caller]
    pub fn write(&self, off: usize, data: &[u8]) -> io::Result<()> {
        self.check_write(off, data.len())?;
        // SAFETY: bounds and writability checked; `data` is a Rust buffer outside the
        // mapping, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
        emulate::write(0, data.len());
        if trace::on() {
            trace::store(&self.origin, off, data, false, Location::caller());
        }
        Ok(())
    }

    /// Zero `len` bytes at `off`. Not written back.
    #[track_caller]
    pub fn zero(&self, off: usize, len: usize) -> io::Result<()> {
        self.check_write(off, len)?;
        // SAFETY: bounds and writability checked.
        unsafe { std::ptr::write_bytes(self.ptr.add(off), 0, len) };
        if trace::on() {
            trace::store(&self.origin, off, &vec![0; len], false, Location::caller());
        }
        Ok(())
    }

    /// Copy `data` to `off` with non-temporal stores where possible (bypassing the cache;
    /// still needs a `fence`). Head and tail bytes that are not 16-byte aligned use
    /// plain stores and are written back.
    #[track_caller]
    pub fn write_nt(&self, off: usize, data: &[u8]) -> io::Result<()> {
        self.check_write(off, data.len())?;
        // SAFETY: bounds and writability checked; `persist::nt_copy` writes exactly
        // `data.len()` bytes at the destination.
        unsafe { persist::nt_copy(self.ptr.add(off), data) };
        emulate::write(0, data.len());
        if trace::on() {
            trace::store(&self.origin, off, data, true, Location::caller());
        }
        Ok(())
    }

    /// Write back the cache lines covering `off..off+len` (no fence).
    #[track_caller]
    pub fn flush(&self, off: usize, len: usize) -> io::Result<()> {
        self.check(off, len)?;
        // SAFETY: the range is inside the mapping.
        unsafe { persist::flush_range(self.ptr.add(off), len) };
        if trace::on() {
            trace::flush(&self.origin, off, len, Location::caller());
        }
        Ok(())
    }

    /// Write back `off..off+len` and fence: the range is persistent when this returns.
    #[track_caller]
    pub fn persist(&self, off: usize, len: usize) -> io::Result<()> {
        self.flush(off, len)?;
        fence();
        Ok(())
    }
}

impl Mapping {
    /// Ask the kernel to back bytes `off..off + len` of the mapping (2 MiB aligned in the
    /// file, and so in the mapping: `Mapping::new`) with huge pages
    /// (`madvise(MADV_COLLAPSE)`, Linux 6.1; on tmpfs it works whatever `shmem_enabled`
    /// says unless it is `deny`). The kernel copies the 4 KiB pages into 2 MiB folios;
    /// the bytes do not change. `EAGAIN` (pages busy) is retried a few times.
    pub fn collapse(&self, off: usize, len: usize) -> io::Result<()> {
        self.check(off, len)?;
        let addr = self.ptr as usize + off;
        if !addr.is_multiple_of(huge::HUGE_PAGE) || !len.is_multiple_of(huge::HUGE_PAGE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "collapse of a range that is not 2 MiB aligned in the mapping",
            ));
        }
        huge::retry_busy(|| {
            // SAFETY: the range lies inside this mapping (checked above); MADV_COLLAPSE
            // does not change its contents or its protection.
            let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_COLLAPSE) };
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; no references into the mapping
        // can outlive it because none are ever handed out.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Order all previous stores and write-backs before later stores (`sfence`), plus a
/// compiler/CPU fence for the atomics protocol.
#[track_caller]
pub fn fence() {
    persist::sfence();
    atomic_fence(Ordering::SeqCst);
    if trace::on() {
        trace::fence(Location::caller());
    }
}

/// Start bringing the cache line at `addr` into the cache (`prefetcht0`), so that an
/// access a little later finds it there: a hint, for any address (an unmapped one is
/// ignored, never a fault).
#[inline(always)]
pub fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint with no architectural effect: it reads nothing into
    // the program and never faults, whatever `addr` is.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Writes to host files that hold store data (the lower tiers), through this funnel so
/// that the power-failure simulator sees them: a `pwrite` is durable at the file's next
/// `fdatasync`.
pub mod file {
    use super::trace;
    use std::fs::File;
    use std::io;
    use std::os::unix::fs::FileExt;
    use std::panic::Location;

    /// `pwrite` all of `data` at `off`.
    #[track_caller]
    pub fn write_all_at(file: &File, data: &[u8], off: u64) -> io::Result<()> {
        file.write_all_at(data, off)?;
        if trace::on() {
            trace::file_write(file, off, data, Location::caller());
        }
        Ok(())
    }

    /// Trim `len` bytes at `off` ([`super::sys::discard`]); traced as a write of zeros
    /// (a crash may or may not have it before the next `fdatasync`).
    #[track_caller]
    pub fn discard(file: &File, off: u64, len: u64) -> io::Result<()> {
        super::sys::discard(file, off, len)?;
        if trace::on() {
            trace::file_write(file, off, &vec![0; len as usize], Location::caller());
        }
        Ok(())
    }

    /// `fdatasync`.
    #[track_caller]
    pub fn sync_data(file: &File) -> io::Result<()> {
        file.sync_data()?;
        if trace::on() {
            trace::file_sync(file, Location::caller());
        }
        Ok(())
    }
}

/// Which write-back instruction this CPU uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushKind {
    Clwb,
    ClflushOpt,
    Clflush,
    None,
}

/// The write-back instruction in use (detected once).
pub fn flush_kind() -> FlushKind {
    static KIND: OnceLock<FlushKind> = OnceLock::new();
    *KIND.get_or_init(persist::detect)
}

mod persist {
    //! The persistence instructions.
    use super::{FlushKind, CACHE_LINE};

    pub fn detect() -> FlushKind {
        #[cfg(target_arch = "x86_64")]
        {
            // CPUID leaf 7, sub-leaf 0: EBX bit 24 = CLWB, bit 23 = CLFLUSHOPT.
            // CPUID is available on every x86_64 CPU (safe intrinsic).
            let ebx = std::arch::x86_64::__cpuid_count(7, 0).ebx;
            if ebx & (1 << 24) != 0 {
                return FlushKind::Clwb;
            }
            if ebx & (1 << 23) != 0 {
                return FlushKind::ClflushOpt;
            }
            return FlushKind::Clflush;
        }
        #[allow(unreachable_code)]
        FlushKind::None
    }

    /// # Safety
    /// `p..p+len` must be mapped memory.
    pub unsafe fn flush_range(p: *const u8, len: usize) {
        if len == 0 {
            return;
        }
        let start = (p as usize) & !(CACHE_LINE - 1);
        let end = p as usize + len;
        let kind = super::flush_kind();
        let mut a = start;
        while a < end {
            // SAFETY: `a` is inside (or at the cache-line start of) the caller's range,
            // which is mapped; these instructions only write back, never change data.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                match kind {
                    FlushKind::Clwb => {
                        std::arch::asm!("clwb [{0}]", in(reg) a, options(nostack, preserves_flags))
                    }
                    FlushKind::ClflushOpt => {
                        std::arch::asm!("clflushopt [{0}]", in(reg) a, options(nostack, preserves_flags))
                    }
                    FlushKind::Clflush => std::arch::x86_64::_mm_clflush(a as *const u8),
                    FlushKind::None => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = kind;
            a += CACHE_LINE;
        }
    }

    pub fn sfence() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: sfence has no memory operands and no preconditions.
        unsafe {
            std::arch::x86_64::_mm_sfence()
        };
    }

    /// # Safety
    /// `dst..dst+src.len()` must be writable mapped memory not overlapping `src`.
    pub unsafe fn nt_copy(dst: *mut u8, src: &[u8]) {
        let n = src.len();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128, _mm_stream_si64};
            let mut i = 0usize;
            // An 8-byte aligned destination that is not 16-byte aligned (a log record:
            // records are 8-byte aligned) starts with one 8-byte non-temporal store, not
            // a plain store and a cache-line write-back.
            if dst as usize & 15 == 8 && n >= 8 {
                // SAFETY: dst is 8-aligned and 8 bytes are in range; the read is
                // unaligned-safe.
                unsafe {
                    let v = std::ptr::read_unaligned(src.as_ptr() as *const i64);
                    _mm_stream_si64(dst as *mut i64, v);
                }
                i = 8;
            }
            // Plain copy up to 16-byte alignment of the destination.
            let head = ((16 - ((dst as usize + i) & 15)) & 15).min(n - i);
            // SAFETY: within the caller's range.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), head) };
            if head > 0 {
                // SAFETY: within the caller's range.
                unsafe { flush_range(dst.add(i), head) };
            }
            i += head;
            while i + 16 <= n {
                // SAFETY: dst+i is 16-aligned and in range; src read is unaligned-safe.
                unsafe {
                    let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                    _mm_stream_si128(dst.add(i) as *mut __m128i, v);
                }
                i += 16;
            }
            // An 8-byte tail (the rest of a record) non-temporal too.
            if i + 8 <= n && (dst as usize + i) & 7 == 0 {
                // SAFETY: dst+i is 8-aligned and 8 bytes are in range.
                unsafe {
                    let v = std::ptr::read_unaligned(src.as_ptr().add(i) as *const i64);
                    _mm_stream_si64(dst.add(i) as *mut i64, v);
                }
                i += 8;
            }
            if i < n {
                // SAFETY: within the caller's range.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), n - i);
                    flush_range(dst.add(i), n - i);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, n);
            flush_range(dst, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread asking for short slices gets them (where the kernel shows them) and
    /// keeps its nice value.
    #[test]
    fn a_short_slice_keeps_the_threads_nice_value() {
        std::thread::spawn(|| {
            sys::background_priority().unwrap();
            sys::request_slice(std::time::Duration::from_micros(100)).unwrap();
            assert_eq!(rustix::process::getpriority_process(None).unwrap(), 10);
            if let Ok(text) = std::fs::read_to_string("/proc/thread-self/sched") {
                let slice = text
                    .lines()
                    .find(|l| l.starts_with("se.slice"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|v| v.trim().to_string());
                if let Some(v) = slice {
                    assert_eq!(v, "100000", "{text}");
                }
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn write_read_persist_and_bounds() {
        let f = tempfile_in_shm();
        f.set_len(1 << 16).unwrap();
        let m = Mapping::new(&f, 0, 1 << 16, true, true).unwrap();
        m.write(100, b"hello").unwrap();
        m.persist(100, 5).unwrap();
        let mut b = [0u8; 5];
        m.read(100, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
        m.write_nt(3, &data).unwrap();
        fence();
        let mut back = vec![0u8; 1000];
        m.read(3, &mut back).unwrap();
        assert_eq!(back, data);
        // Every alignment of the destination and every short length (8-byte and
        // 16-byte non-temporal stores, plain stores written back), bytes around intact.
        for off in 2048..2048 + 17 {
            for len in 0..80 {
                m.write(off - 8, &[0xee; 100]).unwrap();
                m.write_nt(off, &data[len..2 * len]).unwrap();
                fence();
                let mut back = vec![0u8; len + 16];
                m.read(off - 8, &mut back).unwrap();
                assert_eq!(&back[..8], &[0xee; 8], "before, at {off} ({len} bytes)");
                assert_eq!(
                    &back[8..8 + len],
                    &data[len..2 * len],
                    "at {off} ({len} bytes)"
                );
                assert_eq!(
                    &back[8 + len..],
                    &[0xee; 8],
                    "after, at {off} ({len} bytes)"
                );
            }
        }
        m.store_u64(64, 77).unwrap();
        assert_eq!(m.load_u64(64).unwrap(), 77);
        assert!(m.read(1 << 16, &mut b).is_err());
        assert!(m.write(usize::MAX - 2, b"x").is_err());
        assert!(m.load_u64(3).is_err());
        let ro = Mapping::new(&f, 0, 4096, false, false).unwrap();
        assert!(ro.write(0, b"x").is_err());
        let mut one = [0u8; 5];
        ro.read(100, &mut one).unwrap();
        assert_eq!(&one, &data[97..102]);
    }

    fn tempfile_in_shm() -> File {
        let p = std::env::temp_dir().join(format!("cairn-media-test-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }
}

/// The system calls the daemon and LibFS need beyond `std`, on `rustix`'s safe wrappers,
/// so that no other crate needs `unsafe`. Four remain `unsafe` here, each with the
/// reason: `BLKDISCARD` and `process_madvise` (no safe wrappers in `rustix`), closing an
/// abandoned descriptor and `fork`.
pub mod sys {
    use rustix::fs::{FallocateFlags, FlockOperation};
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn flock(f: &File, op: FlockOperation) -> io::Result<()> {
        Ok(rustix::fs::flock(f, op)?)
    }

    /// A descriptor for process `pid` (`pidfd_open`, Linux 5.3): it names that process
    /// and no other, even once its pid is reused.
    pub fn pidfd_open(pid: u32) -> io::Result<std::os::fd::OwnedFd> {
        let pid = rustix::process::Pid::from_raw(pid as i32)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(rustix::process::pidfd_open(
            pid,
            rustix::process::PidfdFlags::empty(),
        )?)
    }

    /// `process_madvise(pidfd, [addr, addr + len), MADV_COLLAPSE)` (Linux 6.1): ask the
    /// kernel to back that range of the process `pidfd` names with huge pages now
    /// (copying its base pages into a 2 MiB page; holes are filled with zeros). The bytes
    /// advised. `EAGAIN` (pages busy) is retried a few times.
    pub fn collapse_remote(pidfd: &std::os::fd::OwnedFd, addr: u64, len: u64) -> io::Result<usize> {
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len as usize,
        };
        crate::huge::retry_busy(|| {
            // SAFETY: the kernel reads one `iovec` from `iov`, which lives for the call,
            // and a descriptor the caller owns; the range it names is in the other process
            // and is only advised, never dereferenced here.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    pidfd.as_raw_fd(),
                    &iov as *const libc::iovec,
                    1usize,
                    libc::MADV_COLLAPSE,
                    0u32,
                )
            };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        })
    }

    /// `PAGEMAP_SCAN` categories (Linux 6.7, `linux/fs.h`): a page is present, and is
    /// part of a huge page mapped by a PMD.
    pub const PAGE_IS_PRESENT: u64 = 1 << 3;
    pub const PAGE_IS_HUGE: u64 = 1 << 6;

    /// A range of pages with the same categories, as `PAGEMAP_SCAN` reports it.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct PageRange {
        pub start: u64,
        pub end: u64,
        pub categories: u64,
    }

    /// `struct pm_scan_arg`.
    #[repr(C)]
    struct PmScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }

    /// `_IOWR('f', 16, struct pm_scan_arg)`.
    const PAGEMAP_SCAN: libc::c_ulong =
        (3 << 30) | ((std::mem::size_of::<PmScanArg>() as libc::c_ulong) << 16) | (0x66 << 8) | 16;

    /// `PAGEMAP_SCAN` (Linux 6.7) on a `/proc/PID/pagemap` file: the ranges of
    /// `[start, end)` whose pages have any of the categories `anyof`, each with those of
    /// `report` it has, appended to `out`. An older kernel answers `ENOTTY` or `EINVAL`.
    pub fn pagemap_scan(
        pagemap: &File,
        start: u64,
        end: u64,
        anyof: u64,
        report: u64,
        out: &mut Vec<PageRange>,
    ) -> io::Result<()> {
        pagemap_scan_with(pagemap, start, end, (0, 0, anyof), report, out)
    }

    /// `PAGEMAP_SCAN` of the pages of `[start, end)` that, with the categories in
    /// `inverted` negated, have every category of `all`: for instance present pages that
    /// are not the file's (copied on write) with `inverted = PAGE_IS_FILE`,
    /// `all = PAGE_IS_PRESENT | PAGE_IS_FILE`. Reported with the categories of `report`.
    pub fn pagemap_scan_inverted(
        pagemap: &File,
        start: u64,
        end: u64,
        all: u64,
        inverted: u64,
        out: &mut Vec<PageRange>,
    ) -> io::Result<()> {
        pagemap_scan_with(pagemap, start, end, (inverted, all, 0), 0, out)
    }

    /// `PAGEMAP_SCAN` with `(category_inverted, category_mask, category_anyof_mask)`.
    fn pagemap_scan_with(
        pagemap: &File,
        start: u64,
        end: u64,
        (inverted, all, anyof): (u64, u64, u64),
        report: u64,
        out: &mut Vec<PageRange>,
    ) -> io::Result<()> {
        // Few ranges in the common case (a commit's pages): a small buffer on the stack,
        // the walk resumed from where the kernel stopped when it fills.
        let mut buf = [PageRange::default(); 256];
        let mut at = start;
        while at < end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: 0,
                start: at,
                end,
                walk_end: 0,
                vec: buf.as_mut_ptr() as u64,
                vec_len: buf.len() as u64,
                max_pages: 0,
                category_inverted: inverted,
                category_mask: all,
                category_anyof_mask: anyof,
                return_mask: report,
            };
            // SAFETY: `arg` is a `pm_scan_arg` of the size it says, alive for the call;
            // the kernel writes at most `vec_len` `page_region`s (`PageRange`, the same
            // layout) into `buf`, which has that many, and `walk_end` into `arg`; it
            // writes nothing else (no write-protect flags are asked for).
            let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            out.extend_from_slice(&buf[..n as usize]);
            if arg.walk_end <= at {
                break;
            }
            at = arg.walk_end;
        }
        Ok(())
    }

    /// Milliseconds of the system's monotonic clock: the same in every process (unlike
    /// an `Instant`, which a process cannot hand to another).
    pub fn monotonic_ms() -> u64 {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
    }

    /// The CPU the calling thread runs on now (for per-core structures; it may have
    /// moved by the time the caller uses it).
    pub fn current_cpu() -> usize {
        rustix::thread::sched_getcpu()
    }

    /// Run the calling thread on `cpu` only (tests that need a given per-CPU structure).
    pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        Ok(rustix::thread::sched_setaffinity(None, &set)?)
    }

    /// Give the calling thread a tenth of the CPU time of a thread at the usual priority
    /// when they compete (nice 10; per thread, allowed without privileges): for work
    /// that helps later but must not slow what runs now. Not `SCHED_IDLE`: such a thread
    /// starves under load while it may hold a lock (a page's, in the kernel) that a
    /// busy thread waits for.
    pub fn background_priority() -> io::Result<()> {
        // SAFETY: `gettid` and `setpriority` take and return plain integers; the id is
        // the calling thread's.
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Ask the scheduler for time slices of `slice` for the calling thread (the EEVDF
    /// scheduler's custom slice, Linux 6.12; clamped by the kernel to 0.1–100 ms): a
    /// thread with a shorter slice than the one running preempts it when it wakes,
    /// instead of waiting for that one's slice (3 ms) to end. For a `SCHED_OTHER` thread
    /// (`EINVAL` for another policy, which it keeps), whose nice value is kept; no
    /// privilege is needed; older kernels ignore the request or fail with `EINVAL`.
    pub fn request_slice(slice: std::time::Duration) -> io::Result<()> {
        /// `struct sched_attr` as of Linux 4.13 (`SCHED_ATTR_SIZE_VER1`).
        #[repr(C)]
        struct SchedAttr {
            size: u32,
            policy: u32,
            flags: u64,
            nice: i32,
            priority: u32,
            runtime: u64,
            deadline: u64,
            period: u64,
            util_min: u32,
            util_max: u32,
        }
        // SAFETY: `sched_getscheduler` takes and returns plain integers (0: this thread).
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy != libc::SCHED_OTHER {
            // A thread someone gave another policy keeps it.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // The thread's nice value is kept (the call sets it too).
        let nice = rustix::process::getpriority_process(None)?;
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            flags: 0,
            nice,
            priority: 0,
            runtime: slice.as_nanos() as u64,
            deadline: 0,
            period: 0,
            util_min: 0,
            util_max: 0,
        };
        // SAFETY: `attr` is a complete `struct sched_attr` of the size it states, alive
        // for the call, which only reads it; pid 0 is the calling thread.
        let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// `flock(2)`: take an exclusive lock (`nonblock`: fail with `WouldBlock` if held).
    pub fn flock_exclusive(f: &File, nonblock: bool) -> io::Result<()> {
        flock(
            f,
            if nonblock {
                FlockOperation::NonBlockingLockExclusive
            } else {
                FlockOperation::LockExclusive
            },
        )
    }

    /// `flock(2)`: take a shared lock (`nonblock`: fail with `WouldBlock` if an exclusive
    /// one is held).
    pub fn flock_shared(f: &File, nonblock: bool) -> io::Result<()> {
        flock(
            f,
            if nonblock {
                FlockOperation::NonBlockingLockShared
            } else {
                FlockOperation::LockShared
            },
        )
    }

    /// `flock(2)` unlock.
    pub fn flock_unlock(f: &File) -> io::Result<()> {
        flock(f, FlockOperation::Unlock)
    }

    /// Who owns a record lock taken with [`record_lock`]: the process (`F_SETLK`, POSIX
    /// locks) or the open file description (`F_OFD_SETLK`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RecordOwner {
        Process,
        Description,
    }

    /// What [`record_lock`] does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum RecordOp {
        /// Take a read (`write` false) or write lock, or with `None` remove the owner's
        /// locks; `wait`: block until granted (`F_SETLKW`; `EINTR` on a signal).
        Set { write: Option<bool>, wait: bool },
        /// `F_GETLK`: the first conflicting lock of another owner with a lock of this type.
        Test { write: bool },
    }

    /// A conflicting record lock as `F_GETLK` reports it: write lock or not, start,
    /// length (0: to the end of any file), holder's pid (-1: an OFD lock).
    pub type Conflict = (bool, u64, u64, i32);

    /// `fcntl(2)` record locks on `f` over `[start, start + len)` (`len` 0: to the end of
    /// any file). `Set` answers `None`; `Test` answers the conflict, if any.
    pub fn record_lock(
        f: &impl AsRawFd,
        owner: RecordOwner,
        op: RecordOp,
        start: u64,
        len: u64,
    ) -> io::Result<Option<Conflict>> {
        let typ = |w: Option<bool>| match w {
            Some(true) => libc::F_WRLCK,
            Some(false) => libc::F_RDLCK,
            None => libc::F_UNLCK,
        } as libc::c_short;
        let (cmd, l_type) = match (owner, op) {
            (RecordOwner::Process, RecordOp::Set { write, wait }) => (
                if wait { libc::F_SETLKW } else { libc::F_SETLK },
                typ(write),
            ),
            (RecordOwner::Description, RecordOp::Set { write, wait }) => (
                if wait {
                    libc::F_OFD_SETLKW
                } else {
                    libc::F_OFD_SETLK
                },
                typ(write),
            ),
            (RecordOwner::Process, RecordOp::Test { write }) => (libc::F_GETLK, typ(Some(write))),
            (RecordOwner::Description, RecordOp::Test { write }) => {
                (libc::F_OFD_GETLK, typ(Some(write)))
            }
        };
        let to_off =
            |v: u64| i64::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
        // SAFETY: an all-zero `flock64` is a valid value (OFD commands need `l_pid` 0).
        let mut fl: libc::flock64 = unsafe { std::mem::zeroed() };
        fl.l_type = l_type;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = to_off(start)?;
        fl.l_len = to_off(len)?;
        // SAFETY: fcntl with a lock command and a pointer to a valid, exclusively
        // borrowed `flock64` that outlives the call.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl as *mut libc::flock64) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(match op {
            RecordOp::Test { .. } if fl.l_type != libc::F_UNLCK as libc::c_short => Some((
                fl.l_type == libc::F_WRLCK as libc::c_short,
                fl.l_start as u64,
                fl.l_len as u64,
                fl.l_pid,
            )),
            _ => None,
        })
    }

    /// `bind(2)` of the Unix-domain socket `fd` to the filesystem path `path`.
    pub fn bind_unix(fd: std::os::fd::BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
        let addr = rustix::net::SocketAddrUnix::new(path)?;
        Ok(rustix::net::bind(fd, &addr)?)
    }

    /// `mkfifo(2)`: make a FIFO at `path` with `mode` (minus the umask).
    pub fn mkfifo(path: &std::ffi::CStr, mode: u32) -> io::Result<()> {
        Ok(rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(mode),
            0,
        )?)
    }

    /// Credentials of the peer of a Unix socket: (pid, uid, gid).
    pub fn peer_cred(s: &UnixStream) -> io::Result<(u32, u32, u32)> {
        let c = rustix::net::sockopt::socket_peercred(s)?;
        Ok((
            c.pid.as_raw_nonzero().get() as u32,
            c.uid.as_raw(),
            c.gid.as_raw(),
        ))
    }

    /// Reserve `len` bytes of `f` from offset 0 (`fallocate(2)`, mode 0), so that later
    /// stores through a mapping cannot fault for lack of space (tmpfs would `SIGBUS`).
    pub fn fallocate(f: &File, len: u64) -> io::Result<()> {
        Ok(rustix::fs::fallocate(f, FallocateFlags::empty(), 0, len)?)
    }

    /// Bytes free to an unprivileged writer on the file system holding `path`
    /// (`statvfs`: available blocks times the fragment size).
    pub fn free_space(path: &std::path::Path) -> io::Result<u64> {
        let st = rustix::fs::statvfs(path)?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// Whether `path` lives on tmpfs or ramfs: its pages are RAM (or swap).
    pub fn in_ram(path: &std::path::Path) -> io::Result<bool> {
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        const RAMFS_MAGIC: i64 = 0x8584_58f6;
        let st = rustix::fs::statfs(path)?;
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between libcs.
        let t = st.f_type as i64;
        Ok(t == TMPFS_MAGIC || t == RAMFS_MAGIC)
    }

    /// Bytes of a block device (its end, as `lseek(SEEK_END)` finds it).
    pub fn block_device_size(f: &File) -> io::Result<u64> {
        Ok(rustix::fs::seek(f, rustix::fs::SeekFrom::End(0))?)
    }

    /// Trim `len` bytes at `off`: `BLKDISCARD` on a block device, else a punched hole
    /// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`), so the file system frees the space.
    pub fn discard(f: &File, off: u64, len: u64) -> io::Result<()> {
        use std::os::unix::fs::FileTypeExt;
        if !f.metadata()?.file_type().is_block_device() {
            let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            return Ok(rustix::fs::fallocate(f, mode, off, len)?);
        }
        const BLKDISCARD: libc::c_ulong = 0x1277;
        let range = [off, len];
        // SAFETY: the ioctl reads two u64 from `range`, which lives for the call, on a
        // descriptor `f` owns. (`rustix` has no safe wrapper for `BLKDISCARD`.)
        let r = unsafe { libc::ioctl(f.as_raw_fd(), BLKDISCARD, range.as_ptr()) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// `renameat2(AT_FDCWD, from, AT_FDCWD, to, flags)` (`RENAME_NOREPLACE`,
    /// `RENAME_EXCHANGE`), which `std` does not offer.
    pub fn renameat2(from: &std::path::Path, to: &std::path::Path, flags: u32) -> io::Result<()> {
        let flags = rustix::fs::RenameFlags::from_bits(flags)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        Ok(rustix::fs::renameat_with(
            rustix::fs::CWD,
            from,
            rustix::fs::CWD,
            to,
            flags,
        )?)
    }

    /// Set the process's file mode creation mask (`umask(2)`); returns the previous one.
    pub fn set_umask(mask: u32) -> u32 {
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask)).as_raw_mode()
    }

    /// Close descriptor `fd`, which its owner (a structure this process abandoned after
    /// `fork`, never to be dropped) will not use again.
    pub fn close_abandoned(fd: std::os::fd::RawFd) {
        // SAFETY: close touches no memory; the caller guarantees no live object uses `fd`
        // (its owner is leaked and never runs its destructor). Taking ownership of a raw
        // descriptor is `unsafe` in every API, `rustix`'s too.
        unsafe { libc::close(fd) };
    }

    /// Whether process `pid` exists (`kill(pid, 0)`).
    pub fn pid_alive(pid: u32) -> bool {
        if pid > i32::MAX as u32 {
            return false;
        }
        let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
            return false; // 0
        };
        match rustix::process::test_kill_process(p) {
            Ok(()) => true,
            Err(e) => e == rustix::io::Errno::PERM,
        }
    }

    /// Raise this process's soft limit of open descriptors to its hard limit (a server
    /// that holds many connections); the limit now (`u64::MAX`: none).
    pub fn raise_open_files_limit() -> io::Result<u64> {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let mut l = getrlimit(Resource::Nofile);
        if l.current != l.maximum {
            l.current = l.maximum;
            setrlimit(Resource::Nofile, l)?;
        }
        Ok(l.current.unwrap_or(u64::MAX))
    }

    /// Current uid and gid of this process.
    pub fn ids() -> (u32, u32) {
        (
            rustix::process::getuid().as_raw(),
            rustix::process::getgid().as_raw(),
        )
    }

    fn termination() -> &'static std::sync::Arc<std::sync::atomic::AtomicBool> {
        static FLAG: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> =
            std::sync::OnceLock::new();
        FLAG.get_or_init(Default::default)
    }

    /// Route SIGTERM and SIGINT to a process-wide flag (see [`termination_requested`])
    /// instead of killing the process (`signal-hook`), and clear the flag.
    pub fn install_termination_flag() -> io::Result<()> {
        static REGISTERED: std::sync::OnceLock<io::Result<()>> = std::sync::OnceLock::new();
        termination().store(false, std::sync::atomic::Ordering::SeqCst);
        let r = REGISTERED.get_or_init(|| {
            for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                signal_hook::flag::register(sig, termination().clone())?;
            }
            Ok(())
        });
        match r {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// Whether SIGTERM or SIGINT arrived since [`install_termination_flag`].
    pub fn termination_requested() -> bool {
        termination().load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Number of threads of this process (from `/proc/self/task`).
    pub fn thread_count() -> io::Result<usize> {
        Ok(std::fs::read_dir("/proc/self/task")?.count())
    }

    /// Detach into the background: `fork(2)`; the parent gets `Some(child_pid)` and should
    /// exit; the child starts a new session (`setsid`), points stdin at `/dev/null` and
    /// stdout/stderr at `log`, and gets `None`. Refused (`EBUSY`) unless the process is
    /// single-threaded, because only the calling thread survives a fork.
    pub fn fork_detach(log: &File) -> io::Result<Option<u32>> {
        if thread_count()? != 1 {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let devnull = std::fs::OpenOptions::new().read(true).open("/dev/null")?;
        // SAFETY: the process is single-threaded (checked above), so the child cannot
        // inherit a lock held by another thread; fork takes no memory arguments. (`fork`
        // is `unsafe` in every API.)
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid > 0 {
            return Ok(Some(pid as u32));
        }
        rustix::process::setsid()?;
        rustix::stdio::dup2_stdin(&devnull)?;
        rustix::stdio::dup2_stdout(log)?;
        rustix::stdio::dup2_stderr(log)?;
        Ok(None)
    }
}
