//! Zeroed heap buffers aligned to 4 KiB, for direct I/O (`O_DIRECT` needs the buffer,
//! the offset and the length aligned to the device's logical block).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};

/// Alignment of [`AlignedBuf`].
pub const ALIGN: usize = 4096;

/// Buffers from this size on are anonymous mappings: the kernel gives zeroed pages as
/// they are first touched, where the allocator would write zeros over all of them at
/// once (about 50 ms for 64 MiB here, a fifth of a migration round into RADOS).
pub const MAPPED_FROM: usize = 1 << 20;

/// A zeroed buffer whose start is 4 KiB aligned.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    /// An anonymous mapping of `len` bytes (rounded up to pages) rather than an
    /// allocation.
    mapped: bool,
}

// SAFETY: the buffer is uniquely owned heap memory, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes (at least one page is allocated).
    pub fn zeroed(len: usize) -> AlignedBuf {
        if len >= MAPPED_FROM {
            // SAFETY: a new private anonymous mapping, placed by the kernel: it touches
            // no existing memory.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr != libc::MAP_FAILED {
                return AlignedBuf {
                    ptr: ptr.cast(),
                    len,
                    mapped: true,
                };
            }
        }
        let layout = Layout::from_size_align(len.max(ALIGN), ALIGN).expect("buffer size");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf {
            ptr,
            len,
            mapped: false,
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to at least `len` initialized (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: the mapping `zeroed` made, of `len` bytes, unmapped once; no
            // borrow of it outlives `self`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
            return;
        }
        let layout = Layout::from_size_align(self.len.max(ALIGN), ALIGN).expect("buffer size");
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { dealloc(self.ptr, layout) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligned_and_zeroed() {
        let mut b = super::AlignedBuf::zeroed(3 * 4096 + 5);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(b.len(), 3 * 4096 + 5);
        assert!(b.iter().all(|&x| x == 0));
        b[12292] = 7;
        assert_eq!(b[12292], 7);
        let e = super::AlignedBuf::zeroed(0);
        assert!(e.is_empty());
        let mut m = super::AlignedBuf::zeroed(super::MAPPED_FROM + 5);
        assert_eq!(m.as_ptr() as usize % 4096, 0);
        assert!(m.iter().all(|&x| x == 0));
        let n = m.len();
        m[n - 1] = 9;
        assert_eq!(m[n - 1], 9);
    }
}
