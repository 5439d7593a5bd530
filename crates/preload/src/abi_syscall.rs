//! `syscall(2)`: a program that makes a file system call through the C library's generic
//! `syscall` function rather than its wrapper (fsx calls `copy_file_range` this way; Go
//! and Rust programs call some through it) gets what the wrapper gives it here: every
//! system call whose wrapper this library interposes goes to that wrapper's definition
//! below (so Cairn descriptors and paths work), with `syscall`'s convention (-1 and
//! `errno`, or the kernel's value). Every other number goes straight to the kernel.
//!
//! x86-64 passes `syscall`'s variadic arguments in the registers of six fixed integer
//! arguments, so a definition with six `long` arguments receives them (glibc's own
//! definition reads exactly these registers); the unused ones hold garbage and are not
//! read.
//!
//! SAFETY (every call below): the arguments are the caller's, given to the wrapper that
//! takes the same system call's arguments, under the same contract (`abi.rs`).

use crate::{abi_copy, abi_dir, abi_fd, abi_mmap, abi_path, abi_proc, abi_sock, abi_xattr, real};
use libc::{c_long, c_void};

/// The raw value of a call that returns a pointer (`MAP_FAILED` is -1).
fn ptr(p: *mut c_void) -> c_long {
    p as c_long
}

#[no_mangle]
#[allow(non_upper_case_globals)] // libc's `SYS_*` names
pub unsafe extern "C" fn syscall(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    // Argument conversions, by the type the wrapper takes.
    let i = |x: c_long| x as c_int;
    let u = |x: c_long| x as c_uint;
    let z = |x: c_long| x as size_t;
    let s = |x: c_long| x as *const c_char;
    let m = |x: c_long| x as *mut c_char;
    let v = |x: c_long| x as *mut c_void;
    use libc::*;
    unsafe {
        match n {
            // Descriptors and data.
            SYS_read => abi_fd::read(i(a), v(b), z(c)) as c_long,
            SYS_write => abi_fd::write(i(a), v(b), z(c)) as c_long,
            SYS_pread64 => abi_fd::pread64(i(a), v(b), z(c), d) as c_long,
            SYS_pwrite64 => abi_fd::pwrite64(i(a), v(b), z(c), d) as c_long,
            SYS_readv => abi_fd::readv(i(a), b as *const iovec, i(c)) as c_long,
            SYS_writev => abi_fd::writev(i(a), b as *const iovec, i(c)) as c_long,
            // (x86-64: the offset is the whole of `pos_l`; `pos_h` is unused.)
            SYS_preadv => abi_fd::preadv64(i(a), b as *const iovec, i(c), d) as c_long,
            SYS_pwritev => abi_fd::pwritev64(i(a), b as *const iovec, i(c), d) as c_long,
            SYS_preadv2 => abi_fd::preadv64v2(i(a), b as *const iovec, i(c), d, i(f)) as c_long,
            SYS_pwritev2 => abi_fd::pwritev64v2(i(a), b as *const iovec, i(c), d, i(f)) as c_long,
            SYS_lseek => abi_fd::lseek64(i(a), b, i(c)),
            SYS_close => abi_fd::close(i(a)) as c_long,
            SYS_close_range => abi_fd::close_range(u(a), u(b), i(c)) as c_long,
            SYS_dup => abi_fd::dup(i(a)) as c_long,
            SYS_dup2 => abi_fd::dup2(i(a), i(b)) as c_long,
            SYS_dup3 => abi_fd::dup3(i(a), i(b), i(c)) as c_long,
            SYS_fcntl => abi_fd::fcntl64(i(a), i(b), c as usize) as c_long,
            SYS_ioctl => abi_fd::ioctl(i(a), b as c_ulong, v(c)) as c_long,
            SYS_flock => abi_fd::flock(i(a), i(b)) as c_long,
            SYS_fsync => abi_fd::fsync(i(a)) as c_long,
            SYS_fdatasync => abi_fd::fdatasync(i(a)) as c_long,
            SYS_syncfs => abi_fd::syncfs(i(a)) as c_long,
            SYS_sync_file_range => abi_fd::sync_file_range(i(a), b, c, u(d)) as c_long,
            SYS_ftruncate => abi_fd::ftruncate64(i(a), b) as c_long,
            SYS_fallocate => abi_fd::fallocate64(i(a), i(b), c, d) as c_long,
            SYS_fadvise64 => match abi_fd::posix_fadvise64(i(a), b, c, i(d)) {
                // posix_fadvise answers the error number itself.
                0 => 0,
                err => {
                    real::set_errno(err);
                    -1
                }
            },
            SYS_readahead => abi_fd::readahead(i(a), b, z(c)) as c_long,
            SYS_fstat => abi_fd::fstat64(i(a), b as *mut stat64) as c_long,
            SYS_fstatfs => abi_fd::fstatfs64(i(a), b as *mut statfs64) as c_long,
            SYS_fchmod => abi_fd::fchmod(i(a), u(b)) as c_long,
            SYS_fchown => abi_fd::fchown(i(a), u(b), u(c)) as c_long,
            SYS_getdents64 => abi_dir::getdents64(i(a), v(b), z(c)) as c_long,
            SYS_copy_file_range => abi_copy::copy_file_range(
                i(a),
                b as *mut off64_t,
                i(c),
                d as *mut off64_t,
                z(e),
                u(f),
            ) as c_long,
            SYS_sendfile => abi_copy::sendfile64(i(a), i(b), c as *mut off64_t, z(d)) as c_long,
            SYS_splice => {
                abi_copy::splice(i(a), b as *mut off64_t, i(c), d as *mut off64_t, z(e), u(f))
                    as c_long
            }
            // Mappings.
            SYS_mmap => ptr(abi_mmap::mmap64(v(a), z(b), i(c), i(d), i(e), f)),
            SYS_munmap => abi_mmap::munmap(v(a), z(b)) as c_long,
            SYS_mremap => ptr(abi_mmap::mremap(v(a), z(b), z(c), i(d), v(e))),
            SYS_msync => abi_mmap::msync(v(a), z(b), i(c)) as c_long,
            // Paths.
            SYS_open => abi_path::open64(s(a), i(b), u(c)) as c_long,
            SYS_openat => abi_path::openat64(i(a), s(b), i(c), u(d)) as c_long,
            SYS_creat => abi_path::creat64(s(a), u(b)) as c_long,
            SYS_stat => abi_path::stat64(s(a), b as *mut stat64) as c_long,
            SYS_lstat => abi_path::lstat64(s(a), b as *mut stat64) as c_long,
            SYS_newfstatat => abi_path::fstatat64(i(a), s(b), c as *mut stat64, i(d)) as c_long,
            SYS_statx => abi_fd::statx(i(a), s(b), i(c), u(d), e as *mut statx) as c_long,
            SYS_statfs => abi_path::statfs64(s(a), b as *mut statfs64) as c_long,
            SYS_access => abi_path::access(s(a), i(b)) as c_long,
            // The kernel's `faccessat` has no flags; `faccessat2` has.
            SYS_faccessat => abi_path::faccessat(i(a), s(b), i(c), 0) as c_long,
            SYS_faccessat2 => abi_path::faccessat(i(a), s(b), i(c), i(d)) as c_long,
            SYS_truncate => abi_path::truncate64(s(a), b) as c_long,
            SYS_mkdir => abi_path::mkdir(s(a), u(b)) as c_long,
            SYS_mkdirat => abi_path::mkdirat(i(a), s(b), u(c)) as c_long,
            SYS_mknod => abi_path::mknod(s(a), u(b), c as dev_t) as c_long,
            SYS_mknodat => abi_path::mknodat(i(a), s(b), u(c), d as dev_t) as c_long,
            SYS_rmdir => abi_path::rmdir(s(a)) as c_long,
            SYS_unlink => abi_path::unlink(s(a)) as c_long,
            SYS_unlinkat => abi_path::unlinkat(i(a), s(b), i(c)) as c_long,
            SYS_rename => abi_path::rename(s(a), s(b)) as c_long,
            SYS_renameat => abi_path::renameat(i(a), s(b), i(c), s(d)) as c_long,
            SYS_renameat2 => abi_path::renameat2(i(a), s(b), i(c), s(d), u(e)) as c_long,
            SYS_link => abi_path::link(s(a), s(b)) as c_long,
            SYS_linkat => abi_path::linkat(i(a), s(b), i(c), s(d), i(e)) as c_long,
            SYS_symlink => abi_path::symlink(s(a), s(b)) as c_long,
            SYS_symlinkat => abi_path::symlinkat(s(a), i(b), s(c)) as c_long,
            SYS_readlink => abi_path::readlink(s(a), m(b), z(c)) as c_long,
            SYS_readlinkat => abi_path::readlinkat(i(a), s(b), m(c), z(d)) as c_long,
            SYS_chmod => abi_path::chmod(s(a), u(b)) as c_long,
            // The kernel's `fchmodat` has no flags; `fchmodat2` has.
            SYS_fchmodat => abi_path::fchmodat(i(a), s(b), u(c), 0) as c_long,
            SYS_fchmodat2 => abi_path::fchmodat(i(a), s(b), u(c), i(d)) as c_long,
            SYS_chown => abi_path::chown(s(a), u(b), u(c)) as c_long,
            SYS_lchown => abi_path::lchown(s(a), u(b), u(c)) as c_long,
            SYS_fchownat => abi_path::fchownat(i(a), s(b), u(c), u(d), i(e)) as c_long,
            SYS_utime => abi_path::utime(s(a), b as *const utimbuf) as c_long,
            SYS_utimes => abi_path::utimes(s(a), b as *const timeval) as c_long,
            SYS_utimensat => abi_path::utimensat(i(a), s(b), c as *const timespec, i(d)) as c_long,
            // The current directory, the umask, programs.
            SYS_chdir => abi_proc::chdir(s(a)) as c_long,
            SYS_fchdir => abi_proc::fchdir(i(a)) as c_long,
            // The kernel answers the length of the path, with its NUL.
            SYS_getcwd => {
                let p = abi_proc::getcwd(m(a), z(b));
                if p.is_null() {
                    -1
                } else {
                    std::ffi::CStr::from_ptr(p).to_bytes().len() as c_long + 1
                }
            }
            SYS_umask => abi_proc::umask(u(a)) as c_long,
            SYS_execve => {
                abi_proc::execve(s(a), b as *const *const c_char, c as *const *const c_char)
                    as c_long
            }
            // Unix-domain sockets named by paths.
            SYS_bind => abi_sock::bind(i(a), b as *const sockaddr, u(c)) as c_long,
            SYS_connect => abi_sock::connect(i(a), b as *const sockaddr, u(c)) as c_long,
            SYS_sendto => {
                abi_sock::sendto(i(a), v(b), z(c), i(d), e as *const sockaddr, u(f)) as c_long
            }
            SYS_sendmsg => abi_sock::sendmsg(i(a), b as *const msghdr, i(c)) as c_long,
            // Extended attributes.
            SYS_getxattr => abi_xattr::getxattr(s(a), s(b), v(c), z(d)) as c_long,
            SYS_lgetxattr => abi_xattr::lgetxattr(s(a), s(b), v(c), z(d)) as c_long,
            SYS_fgetxattr => abi_xattr::fgetxattr(i(a), s(b), v(c), z(d)) as c_long,
            SYS_setxattr => abi_xattr::setxattr(s(a), s(b), v(c), z(d), i(e)) as c_long,
            SYS_lsetxattr => abi_xattr::lsetxattr(s(a), s(b), v(c), z(d), i(e)) as c_long,
            SYS_fsetxattr => abi_xattr::fsetxattr(i(a), s(b), v(c), z(d), i(e)) as c_long,
            SYS_listxattr => abi_xattr::listxattr(s(a), m(b), z(c)) as c_long,
            SYS_llistxattr => abi_xattr::llistxattr(s(a), m(b), z(c)) as c_long,
            SYS_flistxattr => abi_xattr::flistxattr(i(a), m(b), z(c)) as c_long,
            SYS_removexattr => abi_xattr::removexattr(s(a), s(b)) as c_long,
            SYS_lremovexattr => abi_xattr::lremovexattr(s(a), s(b)) as c_long,
            SYS_fremovexattr => abi_xattr::fremovexattr(i(a), s(b)) as c_long,
            _ => real::syscall6(n, [a, b, c, d, e, f]),
        }
    }
}
