//! Read-only views assembled from pieces: an anonymous region, 2 MiB aligned like the
//! file offsets it stands for (`huge::reserve_aligned`), over parts of which ranges of
//! a file are mapped in place (`MAP_FIXED`, shared, read-only) while the rest is filled
//! by copying. LibFS's `File::map` uses it to show a Cairn file: its superpage extents
//! mapped straight from the NVM tier (PMD-mapped where the kernel backs them with huge
//! folios), everything else copied.

use crate::huge;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A read-only view of `len` bytes. Until [`View::seal`] its anonymous parts can be
/// filled; after, nothing in it can be written by this process.
pub struct View {
    ptr: *mut u8,
    len: usize,
    sealed: bool,
}

// SAFETY: like `crate::Mapping`: all access goes through raw-pointer copies and atomics,
// never Rust references to the mapped bytes.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

fn einval(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

impl View {
    /// A zeroed view of `len` bytes placed so that its byte 0 is congruent to
    /// `file_off` modulo 2 MiB.
    pub fn new(len: usize, file_off: u64) -> io::Result<View> {
        if len == 0 {
            return Err(einval("empty view"));
        }
        let at = huge::reserve_aligned(len, file_off)?;
        // SAFETY: `MAP_FIXED` over the reservation just made for this view (nothing else
        // uses it); anonymous memory, zero-filled; checked below.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: the reservation made above.
            unsafe { libc::munmap(at as *mut libc::c_void, len) };
            return Err(e);
        }
        Ok(View {
            ptr: p as *mut u8,
            len,
            sealed: false,
        })
    }

    fn check(&self, off: usize, len: usize) -> io::Result<()> {
        match off.checked_add(len) {
            Some(e) if e <= self.len => Ok(()),
            _ => Err(einval("access outside the view")),
        }
    }

    /// Map `len` bytes of `file` from `file_off` at byte `at` of the view, shared and
    /// read-only (`at`, `file_off` and `len` multiples of 4096).
    pub fn map_file(
        &mut self,
        at: usize,
        file: &File,
        file_off: u64,
        len: usize,
    ) -> io::Result<()> {
        self.check(at, len)?;
        if self.sealed
            || !at.is_multiple_of(4096)
            || !file_off.is_multiple_of(4096)
            || !len.is_multiple_of(4096)
        {
            return Err(einval("view: unaligned or sealed"));
        }
        // SAFETY: replaces pages of this view (inside it: checked above) that no Rust
        // reference points into; the fd is valid for the call; checked below.
        let p = unsafe {
            libc::mmap(
                self.ptr.add(at) as *mut libc::c_void,
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                file_off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Copy `data` to byte `at` of an anonymous part (before [`View::seal`]).
    pub fn fill(&mut self, at: usize, data: &[u8]) -> io::Result<()> {
        self.check(at, data.len())?;
        if self.sealed {
            return Err(einval("view: sealed"));
        }
        // SAFETY: inside the view (checked), in a part still anonymous and writable
        // (callers fill only the pages they did not map; a mapped page is read-only and
        // would fault, not corrupt).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(at), data.len()) };
        Ok(())
    }

    /// Make the whole view read-only.
    pub fn seal(&mut self) -> io::Result<()> {
        // SAFETY: the view's own range.
        let r = unsafe { libc::mprotect(self.ptr as *mut libc::c_void, self.len, libc::PROT_READ) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        self.sealed = true;
        Ok(())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy `buf.len()` bytes at `off` into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> io::Result<()> {
        self.check(off, buf.len())?;
        // SAFETY: inside the view; readable; a raw copy, no reference to the bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// The 8 bytes at `off` (8-aligned), read with one load.
    pub fn load_u64(&self, off: usize) -> io::Result<u64> {
        self.check(off, 8)?;
        if !off.is_multiple_of(8) {
            return Err(einval("unaligned load"));
        }
        // SAFETY: inside the view, 8-aligned; atomic load of bytes another process may
        // change (an in-place write of the file).
        Ok(unsafe {
            (*(self.ptr.add(off) as *const std::sync::atomic::AtomicU64))
                .load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// The view's first byte, for callers that manage access themselves (and for
    /// `/proc/self/smaps` checks).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: exactly the range this view reserved and mapped; no references into it
        // outlive it (none are handed out).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn pieces_mapped_and_filled() {
        let path = std::env::temp_dir().join(format!("cairn-media-view-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![9u8; 4 * 4096]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let mut v = View::new(3 * 4096, 8192).unwrap();
        assert_eq!(v.as_ptr() as usize % huge::HUGE_PAGE, 8192);
        v.map_file(4096, &f, 8192, 4096).unwrap();
        v.fill(0, b"abc").unwrap();
        assert!(v.fill(4096 * 3 - 1, b"xy").is_err());
        v.seal().unwrap();
        assert!(v.fill(0, b"z").is_err());
        let mut b = [0u8; 4];
        v.read(0, &mut b).unwrap();
        assert_eq!(&b, b"abc\0");
        v.read(4096, &mut b).unwrap();
        assert_eq!(b, [9; 4]);
        assert_eq!(v.load_u64(4096).unwrap(), u64::from_le_bytes([9; 8]));
        assert!(v.read(3 * 4096 - 2, &mut b).is_err());
    }
}
