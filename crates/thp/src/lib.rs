//! `libcairn_thp.so`: gives one program Linux's greedy huge-page policy (what THP
//! `enabled=always` does for every process) when the system's setting is `madvise`, as
//! it is by default, without changing that setting.
//!
//! Loaded with `LD_PRELOAD`, it replaces `mmap`/`mmap64`: each private anonymous
//! mapping the program (or its allocator: glibc's `malloc` for large blocks, jemalloc,
//! thread stacks) makes is marked `MADV_HUGEPAGE`, so the kernel backs it with 2 MiB
//! pages at the first fault and `khugepaged` collapses it later. What it does not reach,
//! and says in docs/HUGEPAGE.md: the `brk` heap (glibc's small allocations) and
//! mappings made by raw system calls.
//!
//! `cairn bench hugepage` runs its "greedy" rows under it.

use libc::{c_int, c_void, off_t, size_t};

/// The `mmap` the program calls: the system call itself, then `MADV_HUGEPAGE` on what
/// it mapped if it is private anonymous memory.
///
/// # Safety
///
/// The caller's contract of `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the same arguments the caller gave mmap(2); the raw system call (not
    // dlsym(RTLD_NEXT), which may allocate) sets errno and returns MAP_FAILED (-1) on
    // failure exactly as glibc's mmap does.
    let p =
        unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) } as *mut c_void;
    let anon = libc::MAP_ANONYMOUS | libc::MAP_PRIVATE;
    if p != libc::MAP_FAILED && flags & anon == anon && flags & libc::MAP_SHARED == 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        // SAFETY: a range the kernel just mapped for the caller; MADV_HUGEPAGE changes
        // only how it is backed, never its contents. A failure (an old kernel, THP
        // `never`) leaves the mapping as it was, so it is ignored, and errno is put back.
        unsafe {
            libc::madvise(p, len, libc::MADV_HUGEPAGE);
            if let Some(e) = errno {
                *libc::__errno_location() = e;
            }
        }
    }
    p
}

/// `mmap64` is `mmap` on 64-bit Linux.
///
/// # Safety
///
/// The caller's contract of `mmap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: forwarded unchanged.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}
