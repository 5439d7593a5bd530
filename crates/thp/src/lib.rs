//! `libcairn_thp.so`: gives one program Linux's greedy huge-page policy (what THP
//! `enabled=always` does for every process) when the system's setting is `madvise`, as
//! it is by default, without changing that setting.
//!
//! Loaded with `LD_PRELOAD`, it marks `MADV_HUGEPAGE` what the program gets:
//! * every private anonymous mapping it (or its allocator: jemalloc, thread stacks)
//!   makes through `mmap`/`mmap64`, so the kernel backs it with 2 MiB pages at the first
//!   fault and `khugepaged` collapses it later;
//! * every block of at least 2 MiB from `malloc`, `calloc`, `realloc`, `memalign`,
//!   `posix_memalign` or `aligned_alloc`. glibc's `malloc` maps large blocks through its
//!   internal `mmap`, which no preload reaches; so these are wrapped: the wrapper calls
//!   the program's own allocator (the next definition after this library: jemalloc if
//!   the program links it, else glibc's) and marks the pages of the block it returns.
//!   The allocator is never replaced, only followed.
//!
//! What it does not reach, and says in docs/HUGEPAGE.md: small blocks of glibc's `brk`
//! heap, an allocator linked into the executable itself, and mappings made by raw system
//! calls. (glibc's own tunable `glibc.malloc.hugetlb=1` would mark `malloc`'s memory, but
//! glibc applies it only where it reads the THP mode `madvise` from sysfs: not on every
//! machine, so the library does not rely on it.)
//!
//! `cairn bench hugepage` runs its "greedy" rows under it.

use libc::{c_int, c_void, off_t, size_t};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Blocks at least this large are marked: a smaller one cannot hold a huge page.
const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// `MADV_HUGEPAGE` on the pages holding `[p, p + len)`, keeping the caller's errno.
///
/// # Safety
///
/// `[p, p + len)` lies in memory mapped for the caller (a block its allocator or
/// `mmap` just returned).
unsafe fn advise(p: *mut c_void, len: usize) {
    let start = p as usize & !(PAGE - 1);
    let end = (p as usize).saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
    let errno = std::io::Error::last_os_error().raw_os_error();
    // SAFETY: whole pages of memory mapped for the caller (the block's first and last
    // pages may hold its neighbours' bytes too); MADV_HUGEPAGE changes only how they are
    // backed, never their contents. A failure (THP `never`, an old kernel) leaves them
    // as they were, so it is ignored, and errno is put back.
    unsafe {
        libc::madvise(start as *mut c_void, end - start, libc::MADV_HUGEPAGE);
        if let Some(e) = errno {
            *libc::__errno_location() = e;
        }
    }
}

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
        // SAFETY: a range the kernel just mapped for the caller.
        unsafe { advise(p, len) };
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

// glibc's own entry points, always there: used only while the program's allocator is
// being looked up (dlsym does not allocate when it succeeds, so in practice never).
extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
}

/// The allocator functions after this library in the lookup order, resolved once.
static NEXT: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];
const NAMES: [&std::ffi::CStr; 6] = [
    c"malloc",
    c"calloc",
    c"realloc",
    c"memalign",
    c"aligned_alloc",
    c"posix_memalign",
];
const MALLOC: usize = 0;
const CALLOC: usize = 1;
const REALLOC: usize = 2;
const MEMALIGN: usize = 3;
const ALIGNED_ALLOC: usize = 4;
const POSIX_MEMALIGN: usize = 5;
static RESOLVING: AtomicBool = AtomicBool::new(false);

/// Look the allocator up. Runs as the library's constructor (single-threaded program
/// start), or earlier if another library's constructor allocates first; an allocation
/// dlsym makes meanwhile gets glibc's functions.
fn resolve() {
    if RESOLVING.swap(true, Ordering::AcqRel) {
        return;
    }
    for (slot, name) in NEXT.iter().zip(NAMES) {
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; a missing symbol gives
        // null, which leaves the glibc fallback in place.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(f as usize, Ordering::Release);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = {
    extern "C" fn init() {
        resolve();
    }
    init
};

/// The program's allocator function `i`, or None while it is being looked up.
fn next(i: usize) -> Option<usize> {
    let mut f = NEXT[i].load(Ordering::Acquire);
    if f == 0 && !RESOLVING.load(Ordering::Acquire) {
        resolve();
        f = NEXT[i].load(Ordering::Acquire);
    }
    (f != 0).then_some(f)
}

/// Mark `p` if it is a block of at least 2 MiB; `p` as the result.
///
/// # Safety
///
/// `p` is null or a block of `size` bytes the allocator just returned.
unsafe fn marked(p: *mut c_void, size: usize) -> *mut c_void {
    if !p.is_null() && size >= HUGE {
        // SAFETY: a block the allocator just returned lies in memory mapped for us.
        unsafe { advise(p, size) };
    }
    p
}

/// # Safety
///
/// The caller's contract of `malloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    // SAFETY: the program's malloc (or glibc's, its ABI), with the caller's argument.
    let p = unsafe {
        match next(MALLOC) {
            Some(f) => {
                std::mem::transmute::<usize, unsafe extern "C" fn(size_t) -> *mut c_void>(f)(size)
            }
            None => __libc_malloc(size),
        }
    };
    // SAFETY: what it returned.
    unsafe { marked(p, size) }
}

/// # Safety
///
/// The caller's contract of `calloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program's calloc (or glibc's), with the caller's arguments.
    let p = unsafe {
        match next(CALLOC) {
            Some(f) => std::mem::transmute::<
                usize,
                unsafe extern "C" fn(size_t, size_t) -> *mut c_void,
            >(f)(n, size),
            None => __libc_calloc(n, size),
        }
    };
    // SAFETY: on success calloc returned n * size bytes (so the product did not
    // overflow).
    unsafe { marked(p, n.wrapping_mul(size)) }
}

/// # Safety
///
/// The caller's contract of `realloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn realloc(old: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: the program's realloc (or glibc's), with the caller's arguments.
    let p = unsafe {
        match next(REALLOC) {
            Some(f) => std::mem::transmute::<
                usize,
                unsafe extern "C" fn(*mut c_void, size_t) -> *mut c_void,
            >(f)(old, size),
            None => __libc_realloc(old, size),
        }
    };
    // SAFETY: what it returned.
    unsafe { marked(p, size) }
}

/// # Safety
///
/// The caller's contract of `memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { aligned(MEMALIGN, align, size) }
}

/// # Safety
///
/// The caller's contract of `aligned_alloc(3)`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { aligned(ALIGNED_ALLOC, align, size) }
}

/// `memalign` or `aligned_alloc` (`i`), which have the same arguments.
///
/// # Safety
///
/// The caller's contract of `memalign(3)`.
unsafe fn aligned(i: usize, align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: the program's function (or glibc's memalign, which glibc's aligned_alloc
    // is), with the caller's arguments.
    let p = unsafe {
        match next(i) {
            Some(f) => std::mem::transmute::<
                usize,
                unsafe extern "C" fn(size_t, size_t) -> *mut c_void,
            >(f)(align, size),
            None => __libc_memalign(align, size),
        }
    };
    // SAFETY: what it returned.
    unsafe { marked(p, size) }
}

/// # Safety
///
/// The caller's contract of `posix_memalign(3)`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    let r = match next(POSIX_MEMALIGN) {
        // SAFETY: the program's posix_memalign with the caller's arguments.
        Some(f) => unsafe {
            std::mem::transmute::<
                usize,
                unsafe extern "C" fn(*mut *mut c_void, size_t, size_t) -> c_int,
            >(f)(out, align, size)
        },
        // Only while the allocator is being looked up: glibc's memalign, with
        // posix_memalign's checks.
        None if !align.is_power_of_two()
            || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) =>
        {
            libc::EINVAL
        }
        None => {
            // SAFETY: glibc's memalign with a valid alignment; `out` is the caller's.
            unsafe {
                let p = __libc_memalign(align, size);
                if p.is_null() {
                    libc::ENOMEM
                } else {
                    *out = p;
                    0
                }
            }
        }
    };
    if r == 0 {
        // SAFETY: on success a block of `size` bytes was stored at `out`.
        unsafe { marked(*out, size) };
    }
    r
}
