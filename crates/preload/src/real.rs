//! The C library's own definitions of the functions this library interposes, found with
//! `dlsym(RTLD_NEXT, name)` on first use and cached.
//!
//! Every wrapper is `unsafe`: it calls C through a pointer the dynamic linker gave, with
//! the caller's raw arguments. SAFETY for all of them: the signature written here is the
//! one glibc documents for the symbol, and the arguments are passed through unchanged
//! from a caller bound by the same contract. A symbol the C library lacks fails with
//! `ENOSYS`.

use libc::{c_char, c_int, c_uint, c_void, mode_t, off64_t, size_t, ssize_t, DIR, FILE};
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One symbol's address, looked up once.
pub struct Next {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl Next {
    pub const fn new(name: &'static CStr) -> Next {
        Next {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    pub fn addr(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no other
        // precondition.
        let a = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
        self.addr.store(a, Ordering::Relaxed);
        a
    }
}

/// `scandir`'s filter and comparison functions.
pub type ScanFilter = Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>;
pub type ScanCompar =
    Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>;

/// glibc's `glob_t` (x86-64; `glob64_t` has the same layout): with `GLOB_ALTDIRFUNC`,
/// `glob` reads directories and stats paths through these five functions (which may be
/// NULL, hence `Option`, until set).
#[repr(C)]
pub struct Glob {
    pub pathc: size_t,
    pub pathv: *mut *mut c_char,
    pub offs: size_t,
    pub flags: c_int,
    pub closedir: Option<unsafe extern "C" fn(*mut DIR) -> c_int>,
    pub readdir: Option<unsafe extern "C" fn(*mut DIR) -> *mut libc::dirent64>,
    pub opendir: Option<unsafe extern "C" fn(*const c_char) -> *mut DIR>,
    pub lstat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int>,
    pub stat: Option<unsafe extern "C" fn(*const c_char, *mut libc::stat64) -> c_int>,
}

/// glibc's `struct FTW`: where the name starts in the path, and the depth.
#[repr(C)]
pub struct Ftw {
    pub base: c_int,
    pub level: c_int,
}

/// `nftw`'s and `ftw`'s callbacks.
pub type NftwFn =
    Option<unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int, *mut Ftw) -> c_int>;
pub type FtwFn = Option<unsafe extern "C" fn(*const c_char, *const libc::stat64, c_int) -> c_int>;

/// `glob`'s error callback.
pub type GlobErr = Option<unsafe extern "C" fn(*const c_char, c_int) -> c_int>;

/// What a failed call returns.
pub trait Fail {
    const FAIL: Self;
}
impl Fail for c_int {
    const FAIL: Self = -1;
}
impl Fail for ssize_t {
    const FAIL: Self = -1;
}
impl Fail for off64_t {
    const FAIL: Self = -1;
}
impl<T> Fail for *mut T {
    const FAIL: Self = std::ptr::null_mut();
}

pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

pub fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

macro_rules! next_fns {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        #[allow(clippy::missing_safety_doc)]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SYM: Next = Next::new(
                match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!("symbol name"),
                },
            );
            let a = SYM.addr();
            if a == 0 {
                set_errno(libc::ENOSYS);
                return <$ret as Fail>::FAIL;
            }
            // SAFETY: see the module comment.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(a) };
            unsafe { f($($arg),*) }
        }
    )*};
}

// Variadic in C (`open`, `openat`, `fcntl`): on x86-64 an integer third argument travels
// in the same register either way, and the callee reads it only when the flags say so.
next_fns! {
    fn __open64_2(path: *const c_char, flags: c_int) -> c_int;
    fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t;
    fn pwritev64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t) -> ssize_t;
    fn preadv64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, fl: c_int) -> ssize_t;
    fn pwritev64v2(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off64_t, fl: c_int) -> ssize_t;
    fn fsync(fd: c_int) -> c_int;
    fn fdatasync(fd: c_int) -> c_int;
    fn sync_file_range(fd: c_int, off: off64_t, n: off64_t, flags: c_uint) -> c_int;
    fn syncfs(fd: c_int) -> c_int;
    fn ftruncate64(fd: c_int, len: off64_t) -> c_int;
    fn truncate64(path: *const c_char, len: off64_t) -> c_int;
    fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int;
    fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int;
    fn posix_fadvise64(fd: c_int, off: off64_t, len: off64_t, advice: c_int) -> c_int;
    fn __xstat64(ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int;
    fn __lxstat64(ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int;
    fn __fxstat64(ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int;
    fn __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int;
    fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, st: *mut libc::statx) -> c_int;
    fn statfs64(path: *const c_char, st: *mut libc::statfs64) -> c_int;
    fn fstatfs64(fd: c_int, st: *mut libc::statfs64) -> c_int;
    fn statvfs64(path: *const c_char, st: *mut libc::statvfs64) -> c_int;
    fn fstatvfs64(fd: c_int, st: *mut libc::statvfs64) -> c_int;
    fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int;
    fn euidaccess(path: *const c_char, mode: c_int) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn remove(path: *const c_char) -> c_int;
    fn rename(from: *const c_char, to: *const c_char) -> c_int;
    fn renameat(fd1: c_int, from: *const c_char, fd2: c_int, to: *const c_char) -> c_int;
    fn renameat2(fd1: c_int, from: *const c_char, fd2: c_int, to: *const c_char, fl: c_uint) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn mknodat(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int;
    fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int;
    fn link(from: *const c_char, to: *const c_char) -> c_int;
    fn linkat(fd1: c_int, from: *const c_char, fd2: c_int, to: *const c_char, fl: c_int) -> c_int;
    fn symlinkat(target: *const c_char, dirfd: c_int, link: *const c_char) -> c_int;
    fn fchmod(fd: c_int, mode: mode_t) -> c_int;
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, fl: c_int) -> c_int;
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int;
    fn fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, fl: c_int) -> c_int;
    fn utimensat(dirfd: c_int, path: *const c_char, ts: *const libc::timespec, fl: c_int) -> c_int;
    fn futimens(fd: c_int, ts: *const libc::timespec) -> c_int;
    fn utime(path: *const c_char, t: *const libc::utimbuf) -> c_int;
    fn utimes(path: *const c_char, t: *const libc::timeval) -> c_int;
    fn lutimes(path: *const c_char, t: *const libc::timeval) -> c_int;
    fn futimes(fd: c_int, t: *const libc::timeval) -> c_int;
    fn opendir(path: *const c_char) -> *mut DIR;
    fn scandirat64(dirfd: c_int, dir: *const c_char, list: *mut *mut *mut libc::dirent64, filter: ScanFilter, compar: ScanCompar) -> c_int;
    fn nftw64(dir: *const c_char, f: NftwFn, nopenfd: c_int, flags: c_int) -> c_int;
    fn ftw64(dir: *const c_char, f: FtwFn, nopenfd: c_int) -> c_int;
    fn glob(pat: *const c_char, flags: c_int, errfunc: GlobErr, pglob: *mut Glob) -> c_int;
    fn glob64(pat: *const c_char, flags: c_int, errfunc: GlobErr, pglob: *mut Glob) -> c_int;
    fn fdopendir(fd: c_int) -> *mut DIR;
    fn readdir64(d: *mut DIR) -> *mut libc::dirent64;
    fn readdir64_r(d: *mut DIR, e: *mut libc::dirent64, r: *mut *mut libc::dirent64) -> c_int;
    fn closedir(d: *mut DIR) -> c_int;
    fn rewinddir(d: *mut DIR) -> c_int;
    fn telldir(d: *mut DIR) -> libc::c_long;
    fn seekdir(d: *mut DIR, pos: libc::c_long) -> c_int;
    fn dirfd(d: *mut DIR) -> c_int;
    fn flock(fd: c_int, op: c_int) -> c_int;
    fn chdir(path: *const c_char) -> c_int;
    fn fchdir(fd: c_int) -> c_int;
    fn getcwd(buf: *mut c_char, n: size_t) -> *mut c_char;
    fn get_current_dir_name() -> *mut c_char;
    fn realpath(path: *const c_char, out: *mut c_char) -> *mut c_char;
    fn getxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn lgetxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: size_t) -> ssize_t;
    fn setxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, fl: c_int) -> c_int;
    fn lsetxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: size_t, fl: c_int) -> c_int;
    fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: size_t, fl: c_int) -> c_int;
    fn listxattr(path: *const c_char, l: *mut c_char, n: size_t) -> ssize_t;
    fn llistxattr(path: *const c_char, l: *mut c_char, n: size_t) -> ssize_t;
    fn flistxattr(fd: c_int, l: *mut c_char, n: size_t) -> ssize_t;
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int;
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int;
    fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE;
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE;
    fn freopen64(path: *const c_char, mode: *const c_char, f: *mut FILE) -> *mut FILE;
    fn fileno(f: *mut FILE) -> c_int;
    fn fileno_unlocked(f: *mut FILE) -> c_int;
    fn msync(addr: *mut c_void, n: size_t, fl: c_int) -> c_int;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn posix_spawn_file_actions_addopen(fa: *mut libc::posix_spawn_file_actions_t, fd: c_int, path: *const c_char, oflag: c_int, mode: mode_t) -> c_int;
    fn posix_spawn_file_actions_adddup2(fa: *mut libc::posix_spawn_file_actions_t, fd: c_int, new: c_int) -> c_int;
    fn posix_spawn_file_actions_destroy(fa: *mut libc::posix_spawn_file_actions_t) -> c_int;
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, fa: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    fn system(cmd: *const c_char) -> c_int;
    fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE;
    fn umask(mask: mode_t) -> mode_t;
    fn setuid(uid: libc::uid_t) -> c_int;
    fn seteuid(uid: libc::uid_t) -> c_int;
    fn setreuid(r: libc::uid_t, e: libc::uid_t) -> c_int;
    fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t) -> c_int;
    fn setgid(gid: libc::gid_t) -> c_int;
    fn setegid(gid: libc::gid_t) -> c_int;
    fn setregid(r: libc::gid_t, e: libc::gid_t) -> c_int;
    fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t) -> c_int;
    fn setgroups(n: size_t, list: *const libc::gid_t) -> c_int;
    fn initgroups(user: *const c_char, gid: libc::gid_t) -> c_int;
    fn copy_file_range(fd1: c_int, o1: *mut off64_t, fd2: c_int, o2: *mut off64_t, n: size_t, fl: c_uint) -> ssize_t;
    fn sendfile64(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t;
    fn splice(fd1: c_int, o1: *mut off64_t, fd2: c_int, o2: *mut off64_t, n: size_t, fl: c_uint) -> ssize_t;
    fn close_range(first: c_uint, last: c_uint, fl: c_int) -> c_int;
    fn bind(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    fn connect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    fn sendto(fd: c_int, buf: *const c_void, n: size_t, fl: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> ssize_t;
    fn sendmsg(fd: c_int, msg: *const libc::msghdr, fl: c_int) -> ssize_t;
    fn closefrom(first: c_int) -> c_int;
    fn mkostemps64(tmpl: *mut c_char, sfx: c_int, fl: c_int) -> c_int;
    fn mkdtemp(tmpl: *mut c_char) -> *mut c_char;
    fn pathconf(path: *const c_char, name: c_int) -> libc::c_long;
    fn fpathconf(fd: c_int, name: c_int) -> libc::c_long;
}

impl Fail for mode_t {
    const FAIL: Self = 0;
}

/// System call `nr` with six arguments, straight to the kernel (not through the C
/// library's `syscall`, which this library interposes): the kernel's answer, `-errno` on
/// failure.
///
/// SAFETY: the arguments are what the kernel documents for `nr` (pointers valid for what
/// it reads and writes).
#[cfg(target_arch = "x86_64")]
pub unsafe fn raw_syscall(nr: libc::c_long, args: [libc::c_long; 6]) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: the x86-64 Linux system call convention: number in rax, arguments in
    // rdi, rsi, rdx, r10, r8, r9; the kernel clobbers rcx and r11 and uses no user
    // stack. What the call itself does is the caller's contract.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Elsewhere: through the C library (which this library does not interpose there).
///
/// SAFETY: as the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn raw_syscall(nr: libc::c_long, a: [libc::c_long; 6]) -> libc::c_long {
    // SAFETY: see the function comment.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r == -1 {
        -(errno() as libc::c_long)
    } else {
        r
    }
}

/// [`raw_syscall`] with the C library's convention: -1 and `errno` on failure.
///
/// SAFETY: as [`raw_syscall`].
pub unsafe fn syscall6(nr: libc::c_long, args: [libc::c_long; 6]) -> libc::c_long {
    // SAFETY: see the function comment.
    let r = unsafe { raw_syscall(nr, args) };
    if (-4095..0).contains(&r) {
        set_errno(-r as c_int);
        return -1;
    }
    r
}

/// The calls an allocator or the dynamic linker may make while they initialize (when
/// `dlsym`, which allocates, cannot be used) go straight to the kernel: for these the
/// C library's wrappers are the system calls.
macro_rules! sys_fns {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $nr:expr, ($($pass:expr),*);)*) => {$(
        #[allow(clippy::missing_safety_doc)]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            let mut args = [0 as libc::c_long; 6];
            for (slot, v) in args.iter_mut().zip([$($pass as libc::c_long),*]) {
                *slot = v;
            }
            // SAFETY: see the module comment; the arguments are the system call's.
            unsafe { syscall6($nr, args) as $ret }
        }
    )*};
}

sys_fns! {
    fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int = libc::SYS_openat, (libc::AT_FDCWD, path, flags, mode);
    fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int = libc::SYS_openat, (dirfd, path, flags, mode);
    fn close(fd: c_int) -> c_int = libc::SYS_close, (fd);
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t = libc::SYS_read, (fd, buf, n);
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t = libc::SYS_write, (fd, buf, n);
    fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t = libc::SYS_pread64, (fd, buf, n, off);
    fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t = libc::SYS_pwrite64, (fd, buf, n, off);
    fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t = libc::SYS_lseek, (fd, off, whence);
    fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int = libc::SYS_fstat, (fd, st);
    fn fstatat64(dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int = libc::SYS_newfstatat, (dirfd, path, st, flags);
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t = libc::SYS_readlinkat, (dirfd, path, buf, n);
    fn mmap64(addr: *mut c_void, n: size_t, prot: c_int, fl: c_int, fd: c_int, off: off64_t) -> *mut c_void = libc::SYS_mmap, (addr, n, prot, fl, fd, off);
    fn munmap(addr: *mut c_void, n: size_t) -> c_int = libc::SYS_munmap, (addr, n);
    fn mprotect(addr: *mut c_void, n: size_t, prot: c_int) -> c_int = libc::SYS_mprotect, (addr, n, prot);
    fn getdents64(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t = libc::SYS_getdents64, (fd, buf, n);
    fn memfd_create(name: *const c_char, fl: c_uint) -> c_int = libc::SYS_memfd_create, (name, fl);
    fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int = libc::SYS_fcntl, (fd, cmd, arg);
    fn dup(fd: c_int) -> c_int = libc::SYS_dup, (fd);
    fn ioctl(fd: c_int, req: libc::c_ulong, arg: *mut c_void) -> c_int = libc::SYS_ioctl, (fd, req, arg);
    fn dup2(fd: c_int, new: c_int) -> c_int = libc::SYS_dup2, (fd, new);
    fn dup3(fd: c_int, new: c_int, fl: c_int) -> c_int = libc::SYS_dup3, (fd, new, fl);
}
