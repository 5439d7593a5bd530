//! Fixed-address mappings, for segments that live at one virtual address forever
//! (SpaceJMP's segments, `crates/sj`).
//!
//! A [`Window`] is a range of the address space reserved once per process with
//! `PROT_NONE` and `MAP_NORESERVE` through `MAP_FIXED_NOREPLACE`, which fails with `EEXIST`
//! rather than replace anything already mapped there. Inside its window, and only there,
//! a file is mapped at exactly the address its segment records with `MAP_FIXED`: the
//! range is this process's own reservation, so nothing else (a library, the heap, another
//! thread's `mmap`) can be clobbered. A mapping is a [`Region`]; dropping it puts the
//! reservation back (`PROT_NONE` again, its pages released).
//!
//! **Parking.** Segments that share addresses (SpaceJMP's overlapping address spaces)
//! take turns at them: [`Region::park`] moves a region's page tables to a *park slot*, a
//! reservation of its own outside the window, with `mremap` (no page is faulted again,
//! and a private region's uncommitted pages move with it), and puts the reservation
//! back at its home; [`Region::place`] moves it home again. Both moves use
//! `MREMAP_DONTUNMAP`, so the range a region leaves is never a hole another `mmap` could
//! land in: it keeps an empty mapping of the file until it is reserved again.
//!
//! Access to a region's bytes goes through its methods (bounds-checked byte copies and
//! aligned atomics), never through Rust references to the mapped memory, which other
//! processes may change at any time.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

/// Page size of the mappings (the base page; huge pages are 2 MiB, `huge::HUGE_PAGE`).
pub const PAGE: usize = 4096;

/// How a region is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, shared with every other mapping of the file.
    Read,
    /// Read-write, shared: stores go to the file at once (and to every other mapping).
    Shared,
    /// Read-write, private copy-on-write: the first store to a page copies it; the file
    /// and other mappings never see the stores ([`Region::discard`] drops them).
    Private,
}

fn einval(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

/// Where [`Window::map`] maps a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// At its home address.
    Home,
    /// In a park slot of its own, outside the window.
    Parked,
}

/// A reserved range of this process's address space: `[base, base + len)`.
#[derive(Debug)]
pub struct Window {
    base: usize,
    len: usize,
}

impl Window {
    /// Reserve `[base, base + len)` (page aligned) with `MAP_FIXED_NOREPLACE`: `EEXIST`
    /// if any of it is mapped already (the error names what is there).
    pub fn reserve(base: usize, len: usize) -> io::Result<Arc<Window>> {
        if len == 0 || !base.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(einval(
                "window: base and length must be page aligned, length > 0",
            ));
        }
        base.checked_add(len)
            .ok_or_else(|| einval("window: past the end of the address space"))?;
        reserve_at(base, len).map_err(|e| {
            if e.raw_os_error() == Some(libc::EEXIST) {
                io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "the address range {base:#x}..{:#x} is in use in this process ({}): \
                         it cannot hold Cairn's segment window",
                        base + len,
                        occupant(base, base + len)
                    ),
                )
            } else {
                e
            }
        })?;
        Ok(Arc::new(Window { base, len }))
    }

    /// In a child after `fork`: the window again, for objects of the child's own. The
    /// parent's objects mapped in it (which the child copied and leaks: it never uses
    /// nor drops them) are replaced by the bare reservation in one `mmap`, so no hole
    /// opens.
    pub fn take_over_after_fork(&self) -> io::Result<Arc<Window>> {
        reserve_fixed(self.base, self.len)?;
        Ok(Arc::new(Window {
            base: self.base,
            len: self.len,
        }))
    }

    pub fn base(&self) -> usize {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[addr, addr + len)` lies inside the window.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.base + self.len)
    }

    /// Map `len` bytes of `file` from `file_off` for home `addr` (page aligned, inside
    /// the window): at `addr` itself ([`Place::Home`]: no other live placed [`Region`]
    /// may be there, which the caller keeps, as the segment registry hands out disjoint
    /// ranges), or parked in a slot of its own ([`Place::Parked`]: another region may hold
    /// its home).
    pub fn map(
        self: &Arc<Self>,
        home: usize,
        len: usize,
        (file, file_off): (&File, u64),
        access: Access,
        place: Place,
    ) -> io::Result<Region> {
        self.check_range(home, len)?;
        let slot = match place {
            Place::Parked => Some(ParkSlot::reserve(len, align_of(home))?),
            Place::Home => None,
        };
        let addr = slot.as_ref().map_or(home, |s| s.addr);
        map_fixed(addr, len, file, file_off, access)?;
        Ok(Region {
            window: self.clone(),
            home,
            addr,
            len,
            access,
            slot,
        })
    }

    fn check_range(&self, addr: usize, len: usize) -> io::Result<()> {
        if len == 0 || !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(einval(
                "map: address and length must be page aligned, length > 0",
            ));
        }
        if !self.contains(addr, len) {
            return Err(einval("map: the range is outside the segment window"));
        }
        Ok(())
    }
}

/// The largest power of two (at most 1 GiB) that divides `addr`: a park slot aligned as
/// its home lets `mremap` move whole page-table pages (PUD or PMD entries).
fn align_of(addr: usize) -> usize {
    1usize << addr.trailing_zeros().clamp(PAGE.trailing_zeros(), 30)
}

/// `mmap` of `file` over `[addr, addr + len)`, a range of this process's own reservations
/// (a window's or a park slot's), with `MADV_DONTFORK`.
fn map_fixed(
    addr: usize,
    len: usize,
    file: &File,
    file_off: u64,
    access: Access,
) -> io::Result<()> {
    let (prot, share) = match access {
        Access::Read => (libc::PROT_READ, libc::MAP_SHARED),
        Access::Shared => (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED),
        Access::Private => (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE),
    };
    // SAFETY: `MAP_FIXED` over `[addr, addr + len)`, a reservation of this process (a
    // window's range that no placed region maps, or a region's own range or park slot:
    // callers check); the descriptor is valid for the call; errors are checked.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            share | libc::MAP_FIXED,
            file.as_raw_fd(),
            file_off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // A failed MAP_FIXED may have unmapped the range: reserve it again.
        let _ = reserve_fixed(addr, len);
        return Err(e);
    }
    debug_assert_eq!(p as usize, addr);
    // Never inherited by a child: uncommitted private pages must not leak into one.
    // SAFETY: the range was just mapped; MADV_DONTFORK changes no contents.
    unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
    Ok(())
}

/// A range reserved outside every window (`PROT_NONE`, `MAP_NORESERVE`, where the kernel
/// chooses), aligned, where a parked region keeps its page tables. Unmapped when dropped.
#[derive(Debug)]
struct ParkSlot {
    addr: usize,
    len: usize,
}

impl ParkSlot {
    fn reserve(len: usize, align: usize) -> io::Result<ParkSlot> {
        let total = len
            .checked_add(align)
            .ok_or_else(|| einval("park: length too large"))?;
        // SAFETY: a new anonymous PROT_NONE mapping where the kernel chooses: it replaces
        // nothing and touches no memory of ours.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = p as usize;
        let addr = start.next_multiple_of(align);
        // Give back what lies outside the aligned slot.
        // SAFETY: both pieces are parts of the reservation just made, unused.
        unsafe {
            if addr > start {
                libc::munmap(p, addr - start);
            }
            let tail = start + total - (addr + len);
            if tail > 0 {
                libc::munmap((addr + len) as *mut libc::c_void, tail);
            }
        }
        Ok(ParkSlot { addr, len })
    }
}

impl Drop for ParkSlot {
    fn drop(&mut self) {
        // SAFETY: the slot is this value's own reservation; the region that used it has
        // re-reserved it (or left an empty mapping of its file there) and is gone.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// Move the mapping at `[from, from + len)` to `to` (page tables and all, replacing the
/// reservation there); `from` keeps an empty mapping of the same kind.
fn move_mapping(from: usize, to: usize, len: usize) -> io::Result<()> {
    // SAFETY: `from` is a region's own mapping and `to` its home (reserved: no placed
    // region is there, the caller checks) or its park slot; MREMAP_DONTUNMAP leaves
    // `from` mapped, so no hole opens; no reference points into either range.
    let p = unsafe {
        libc::mremap(
            from as *mut libc::c_void,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP,
            to as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    debug_assert_eq!(p as usize, to);
    Ok(())
}

/// `mmap(PROT_NONE, MAP_NORESERVE | MAP_FIXED_NOREPLACE)` at `addr`.
fn reserve_at(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: it fails with
    // EEXIST instead; a new PROT_NONE anonymous mapping touches no memory of ours.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    if p as usize != addr {
        // A kernel older than 4.17 takes the flag as a hint: do not keep a mapping
        // elsewhere.
        // SAFETY: the mapping just made, at the address the kernel chose.
        unsafe { libc::munmap(p, len) };
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "MAP_FIXED_NOREPLACE is not supported by this kernel (Linux 4.17 or later)",
        ));
    }
    Ok(())
}

/// Put `[addr, addr + len)`, a region's own range (its home or its park slot), back to
/// the reservation (`PROT_NONE`).
fn reserve_fixed(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: callers pass a range a region of this process maps or has just left (in
    // its window or its park slot), or, in a child after `fork`, the whole window whose
    // copied regions the child never uses: it is given up, no reference points in.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What `/proc/self/maps` shows in `[start, end)`, for an error message.
fn occupant(start: usize, end: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut found = Vec::new();
    for l in maps.lines() {
        let Some((a, b)) = crate::huge::area_of(l) else {
            continue;
        };
        if a < end && b > start {
            let what = l.split_whitespace().nth(5).unwrap_or("[anonymous]");
            found.push(format!("{a:#x}-{b:#x} {what}"));
        }
    }
    if found.is_empty() {
        "mapped".into()
    } else {
        found.join(", ")
    }
}

/// A file mapped at a fixed address inside a [`Window`] (its home), or parked.
#[derive(Debug)]
pub struct Region {
    window: Arc<Window>,
    /// Where it belongs.
    home: usize,
    /// Where it is mapped now: `home`, or its park slot's address.
    addr: usize,
    len: usize,
    access: Access,
    /// Its park slot, once it has been parked.
    slot: Option<ParkSlot>,
}

impl Region {
    /// Where its bytes are mapped now (its home unless parked).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Where it belongs in the window.
    pub fn home(&self) -> usize {
        self.home
    }

    /// Whether it is parked (mapped outside the window, its home free for another).
    pub fn is_parked(&self) -> bool {
        self.addr != self.home
    }

    /// Park it: move its page tables to its park slot and reserve its home again, so a
    /// store to its home faults. Nothing is faulted again when it is placed back.
    pub fn park(&mut self) -> io::Result<()> {
        if self.is_parked() {
            return Ok(());
        }
        let to = self.slot_addr()?;
        move_mapping(self.home, to, self.len)?;
        self.addr = to;
        // The home keeps an empty mapping of the file: reserved again, so a confused
        // pointer faults instead of reading the file.
        reserve_fixed(self.home, self.len)
    }

    /// Move it back home. The caller guarantees that no placed region overlaps its home
    /// (it parked them first). Its slot keeps an empty mapping until the next park.
    pub fn place(&mut self) -> io::Result<()> {
        if !self.is_parked() {
            return Ok(());
        }
        debug_assert!(self.window.contains(self.home, self.len));
        move_mapping(self.addr, self.home, self.len)?;
        self.addr = self.home;
        Ok(())
    }

    /// Park `self` and place `other` in its stead, when both have the same home and
    /// length: two moves, and the home is never reserved in between (the second move
    /// replaces the empty mapping the first leaves there).
    pub fn swap(&mut self, other: &mut Region) -> io::Result<()> {
        if self.home != other.home || self.len != other.len || self.is_parked() {
            return Err(einval("swap: regions of one home, the first placed"));
        }
        if !other.is_parked() {
            return Err(einval("swap: the second region is placed already"));
        }
        let to = self.slot_addr()?;
        move_mapping(self.home, to, self.len)?;
        self.addr = to;
        if let Err(e) = move_mapping(other.addr, other.home, other.len) {
            // Back home (over the empty mapping it left), or reserved at least.
            if move_mapping(to, self.home, self.len).is_ok() {
                self.addr = self.home;
            } else {
                let _ = reserve_fixed(self.home, self.len);
            }
            return Err(e);
        }
        other.addr = other.home;
        Ok(())
    }

    /// Its park slot's address (the slot reserved at the first park).
    fn slot_addr(&mut self) -> io::Result<usize> {
        if let Some(s) = &self.slot {
            return Ok(s.addr);
        }
        let s = ParkSlot::reserve(self.len, align_of(self.home))?;
        let addr = s.addr;
        self.slot = Some(s);
        Ok(addr)
    }

    /// Map `file` again where the region is now, with `access` (a read-only region made
    /// writable, for instance).
    pub fn remap(&mut self, file: &File, file_off: u64, access: Access) -> io::Result<()> {
        map_fixed(self.addr, self.len, file, file_off, access)?;
        self.access = access;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn access(&self) -> Access {
        self.access
    }

    fn check(&self, off: usize, len: usize) -> io::Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "access {off:#x}+{len:#x} outside the segment of {:#x} bytes at {:#x}",
                    self.len, self.addr
                ),
            ));
        }
        Ok(())
    }

    fn check_write(&self, off: usize, len: usize) -> io::Result<()> {
        self.check(off, len)?;
        if self.access == Access::Read {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        Ok(())
    }

    /// The bytes at `off..off + len`, in place (no copy). The region is shared memory:
    /// the caller's protocol (SpaceJMP's writer lock) must keep writers out of the range
    /// while the slice is in use, as for [`crate::Mapping::bytes`].
    pub fn bytes(&self, off: usize, len: usize) -> io::Result<&[u8]> {
        self.check(off, len)?;
        // SAFETY: bounds checked; the region stays mapped as long as `self`, which the
        // slice borrows. Concurrent writers are excluded by the caller's protocol.
        Ok(unsafe { std::slice::from_raw_parts((self.addr + off) as *const u8, len) })
    }

    /// Copy `buf.len()` bytes at `off` into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> io::Result<()> {
        self.check(off, buf.len())?;
        // SAFETY: the range is inside this mapping (checked), readable; a byte copy
        // through raw pointers creates no reference to memory others may change.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr + off) as *const u8,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }

    /// Copy `data` to `off` (a writable region).
    pub fn write(&self, off: usize, data: &[u8]) -> io::Result<()> {
        self.check_write(off, data.len())?;
        // SAFETY: the range is inside this writable mapping (checked); `data` is a
        // separate buffer of ours, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (self.addr + off) as *mut u8, data.len())
        };
        Ok(())
    }

    /// Set `len` bytes at `off` to zero (a writable region).
    pub fn zero(&self, off: usize, len: usize) -> io::Result<()> {
        self.check_write(off, len)?;
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes((self.addr + off) as *mut u8, 0, len) };
        Ok(())
    }

    /// Copy `len` bytes within the region from `from` to `to` (ranges may overlap).
    pub fn copy_within(&self, from: usize, to: usize, len: usize) -> io::Result<()> {
        self.check(from, len)?;
        self.check_write(to, len)?;
        // SAFETY: both ranges are inside the mapping (checked), the target writable;
        // `copy` handles overlap.
        unsafe {
            std::ptr::copy(
                (self.addr + from) as *const u8,
                (self.addr + to) as *mut u8,
                len,
            )
        };
        Ok(())
    }

    /// The u64 at `off` (8-byte aligned), read plainly (the caller's lock orders it).
    pub fn load_u64(&self, off: usize) -> io::Result<u64> {
        Ok(self
            .atomic_u64(off)?
            .load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Store the u64 at `off` (8-byte aligned; a writable region).
    pub fn store_u64(&self, off: usize, v: u64) -> io::Result<()> {
        self.check_write(off, 8)?;
        self.atomic_u64(off)?
            .store(v, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The u64 at `off` (8-byte aligned) as an atomic, for words processes share.
    pub fn atomic_u64(&self, off: usize) -> io::Result<&AtomicU64> {
        self.check(off, 8)?;
        if !(self.addr + off).is_multiple_of(8) {
            return Err(einval("atomic_u64: unaligned"));
        }
        // SAFETY: 8 aligned bytes inside the mapping, which lives as long as `&self`;
        // `AtomicU64` has the layout of `u64`, and every access through it is atomic.
        Ok(unsafe { &*((self.addr + off) as *const AtomicU64) })
    }

    /// The u32 at `off` (4-byte aligned) as an atomic (a futex word, for instance).
    pub fn atomic_u32(&self, off: usize) -> io::Result<&AtomicU32> {
        self.check(off, 4)?;
        if !(self.addr + off).is_multiple_of(4) {
            return Err(einval("atomic_u32: unaligned"));
        }
        // SAFETY: as in `atomic_u64`, for 4 bytes.
        Ok(unsafe { &*((self.addr + off) as *const AtomicU32) })
    }

    fn madvise(&self, off: usize, len: usize, advice: i32) -> io::Result<()> {
        self.check(off, len)?;
        if !off.is_multiple_of(PAGE) {
            return Err(einval("madvise: unaligned"));
        }
        // SAFETY: the range is inside this mapping (checked); the advice values used
        // here change no memory the caller has a reference to (there are none).
        let r = unsafe { libc::madvise((self.addr + off) as *mut libc::c_void, len, advice) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A private region: drop the private copies of the pages in `[off, off + len)`, so
    /// they read the file again (`MADV_DONTNEED`). Uncommitted stores are gone.
    pub fn discard(&self, off: usize, len: usize) -> io::Result<()> {
        if self.access != Access::Private {
            return Err(einval("discard: only private regions have copies to drop"));
        }
        self.madvise(off, len, libc::MADV_DONTNEED)
    }

    /// Fault the pages of `[off, off + len)` in now (`MADV_POPULATE_READ`, Linux 5.14),
    /// so that the first accesses do not fault; huge folios map with one PMD each.
    pub fn populate(&self, off: usize, len: usize) -> io::Result<()> {
        const MADV_POPULATE_READ: i32 = 22;
        self.madvise(off, len, MADV_POPULATE_READ)
    }

    /// Back `[off, off + len)` (2 MiB aligned) with huge pages now (`MADV_COLLAPSE`;
    /// `EAGAIN`, pages busy, is retried a few times).
    pub fn collapse(&self, off: usize, len: usize) -> io::Result<()> {
        crate::huge::retry_busy(|| self.madvise(off, len, libc::MADV_COLLAPSE))
    }

    /// The pages of `[off, off + len)` this process wrote in a private region (its own
    /// copies: present pages that are not the file's), as page runs `(off, len)` relative
    /// to the region, from `PAGEMAP_SCAN` (Linux 6.7) on `pagemap` (`/proc/self/pagemap`).
    pub fn written_pages(
        &self,
        pagemap: &File,
        off: usize,
        len: usize,
        out: &mut Vec<(usize, usize)>,
    ) -> io::Result<()> {
        self.check(off, len)?;
        // A page copied on write is present and no longer a page of the file: PAGE_IS_FILE
        // inverted, among present pages.
        const PAGE_IS_PRESENT: u64 = 1 << 3;
        const PAGE_IS_FILE: u64 = 1 << 2;
        let mut ranges = Vec::new();
        crate::sys::pagemap_scan_inverted(
            pagemap,
            (self.addr + off) as u64,
            (self.addr + off + len) as u64,
            PAGE_IS_PRESENT | PAGE_IS_FILE,
            PAGE_IS_FILE,
            &mut ranges,
        )?;
        for r in ranges {
            out.push((r.start as usize - self.addr, (r.end - r.start) as usize));
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Its range back to the reservation (a park slot is unmapped after it). On error
        // the range stays mapped to the file, still ours: nothing else can land there.
        let _ = reserve_fixed(self.addr, self.len);
        debug_assert!(self.window.contains(self.home, self.len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    // A window far from everything else in the test process.
    const BASE: usize = 0x2100_0000_0000;

    #[test]
    fn a_window_maps_a_file_at_a_fixed_address_and_refuses_an_occupied_range() {
        let w = Window::reserve(BASE, 64 << 20).unwrap();
        // The same range again: it is ours, so it is occupied.
        let e = Window::reserve(BASE + 4096, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        let r = w
            .map(BASE + (1 << 20), 8192, (&f, 0), Access::Read, Place::Home)
            .unwrap();
        let mut b = [0u8; 4];
        r.read(4096, &mut b).unwrap();
        assert_eq!(b, [7; 4]);
        assert!(r.write(0, &[1]).is_err());
        assert!(r.read(8190, &mut b).is_err());
        assert!(w
            .map(BASE - 4096, 8192, (&f, 0), Access::Read, Place::Home)
            .is_err());

        // A private region: stores stay private until discarded.
        let p = w
            .map(
                BASE + (2 << 20),
                8192,
                (&f, 0),
                Access::Private,
                Place::Home,
            )
            .unwrap();
        p.write(10, &[9, 9]).unwrap();
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        let mut written = Vec::new();
        match p.written_pages(&pagemap, 0, 8192, &mut written) {
            Ok(()) => assert_eq!(written, vec![(0, 4096)]),
            Err(e) => assert!(
                matches!(e.raw_os_error(), Some(libc::ENOTTY) | Some(libc::EINVAL)),
                "{e}"
            ),
        }
        r.read(10, &mut b[..2]).unwrap();
        assert_eq!(
            &b[..2],
            &[7, 7],
            "the shared mapping does not see private stores"
        );
        p.discard(0, 8192).unwrap();
        p.read(10, &mut b[..2]).unwrap();
        assert_eq!(&b[..2], &[7, 7]);
        drop(p);
        drop(r);
        // Dropped regions are reserved again: mapping there works, reserving does not.
        let e = Window::reserve(BASE + (1 << 20), 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        w.map(BASE + (1 << 20), 4096, (&f, 0), Access::Shared, Place::Home)
            .unwrap();
    }

    /// Whether `addr` is readable in this process (a parked region's home is not).
    fn readable(addr: usize) -> bool {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().any(|l| {
            crate::huge::area_of(l).is_some_and(|(a, b)| a <= addr && addr < b)
                && l.split_whitespace()
                    .nth(1)
                    .is_some_and(|p| p.starts_with('r'))
        })
    }

    #[test]
    fn regions_sharing_a_home_take_turns_and_keep_their_pages() {
        let base = BASE + (1 << 30);
        let w = Window::reserve(base, 8 << 20).unwrap();
        let mut fa = tempfile::tempfile().unwrap();
        fa.write_all(&[1u8; 2 << 20]).unwrap();
        let mut fb = tempfile::tempfile().unwrap();
        fb.write_all(&[2u8; 2 << 20]).unwrap();
        let mut a = w
            .map(base, 2 << 20, (&fa, 0), Access::Private, Place::Home)
            .unwrap();
        // An uncommitted private store travels with the region.
        a.write(100, &[9]).unwrap();
        let mut b = w
            .map(base, 2 << 20, (&fb, 0), Access::Read, Place::Parked)
            .unwrap();
        assert!(b.is_parked() && !a.is_parked());
        assert_eq!(b.home(), base);
        assert_eq!(b.addr() % (2 << 20), 0, "slots are aligned as the home");
        let mut x = [0u8; 1];
        b.read(5, &mut x).unwrap();
        assert_eq!(x, [2]);

        a.park().unwrap();
        assert!(!readable(base), "a parked home faults");
        b.place().unwrap();
        assert!(readable(base));
        b.read(100, &mut x).unwrap();
        assert_eq!(x, [2]);
        a.read(100, &mut x).unwrap();
        assert_eq!(x, [9], "parked, its private page is still there");

        // A swap: one home, both moves at once.
        b.swap(&mut a).unwrap();
        assert!(b.is_parked() && !a.is_parked());
        a.read(100, &mut x).unwrap();
        assert_eq!(x, [9]);
        assert_eq!(a.addr(), base);
        assert!(
            b.swap(&mut a).is_err(),
            "a parked region cannot be swapped out"
        );
        // Remapped where it is (parked or not), with another access.
        b.remap(&fb, 0, Access::Shared).unwrap();
        b.write(7, &[5]).unwrap();
        let mut y = [0u8; 1];
        std::os::unix::fs::FileExt::read_at(&fb, &mut y, 7).unwrap();
        assert_eq!(y, [5]);
        let slot = b.addr();
        drop(b);
        assert!(!readable(slot), "a dropped region's slot is given back");
        drop(a);
        assert!(!readable(base));
    }
}
