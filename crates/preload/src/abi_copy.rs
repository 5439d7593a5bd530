//! Data moving between descriptors (`copy_file_range`, `sendfile`, `splice`): the
//! kernel cannot see Cairn data, so a copy that involves a Cairn file runs here, through a
//! buffer. SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::run;
use crate::ops;
use crate::real;
use crate::state::err;
use crate::table::{self, Ofd};
use libc::{c_int, c_uint, c_void, off64_t, size_t, ssize_t};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One side of a copy between descriptors that involves a Cairn file (the kernel cannot
/// see Cairn data, so such copies run here, through a buffer).
enum End {
    Cairn(c_int, Arc<Ofd>),
    Host(c_int),
}

impl End {
    fn of(fd: c_int) -> End {
        match table::get(fd) {
            Some(o) => End::Cairn(fd, o),
            None => End::Host(fd),
        }
    }

    /// Read into `buf` at `off`, or at the descriptor's position (moving it).
    fn read(&self, buf: &mut [u8], off: Option<u64>) -> io::Result<usize> {
        match (self, off) {
            (End::Cairn(_, o), Some(off)) => ops::pread(o, buf, off as i64),
            (End::Cairn(fd, o), None) => ops::read(*fd, o, buf),
            // SAFETY: `buf` is a Rust buffer of `buf.len()` bytes.
            (End::Host(fd), Some(off)) => host_io(unsafe {
                real::pread64(
                    *fd,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    off as off64_t,
                )
            }),
            // SAFETY: as above.
            (End::Host(fd), None) => {
                host_io(unsafe { real::read(*fd, buf.as_mut_ptr() as *mut c_void, buf.len()) })
            }
        }
    }

    /// Write `buf` at `off`, or at the descriptor's position; the bytes written (a host
    /// socket or pipe may take fewer).
    fn write(&self, buf: &[u8], off: Option<u64>) -> io::Result<usize> {
        match (self, off) {
            (End::Cairn(_, o), Some(off)) => ops::pwrite(o, buf, off as i64),
            (End::Cairn(fd, o), None) => ops::write(*fd, o, buf),
            // SAFETY: `buf` is a Rust buffer of `buf.len()` bytes.
            (End::Host(fd), Some(off)) => host_io(unsafe {
                real::pwrite64(
                    *fd,
                    buf.as_ptr() as *const c_void,
                    buf.len(),
                    off as off64_t,
                )
            }),
            // SAFETY: as above.
            (End::Host(fd), None) => {
                host_io(unsafe { real::write(*fd, buf.as_ptr() as *const c_void, buf.len()) })
            }
        }
    }

    fn is_pipe(&self) -> bool {
        let End::Host(fd) = self else {
            return false;
        };
        // SAFETY: fstat into a local buffer.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        let r = unsafe { real::fstat64(*fd, &mut st) };
        r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO
    }
}

fn host_io(r: ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Copy up to `n` bytes from `src` (at `*src_off` if given, which moves; else at its
/// position) to `dst` (likewise), through a buffer; the bytes copied. Stops at the end
/// of the source, or when the destination takes fewer bytes than offered (a full
/// socket or pipe: the source moves only by what was written). An error after some
/// bytes were copied returns the count, as the kernel's copies do.
fn copy_through(
    src: &End,
    src_off: Option<&mut u64>,
    dst: &End,
    dst_off: Option<&mut u64>,
    n: usize,
) -> io::Result<usize> {
    const CHUNK: usize = 256 << 10;
    let mut buf = vec![0u8; CHUNK.min(n.max(1))];
    let (mut so, mut dof) = (src_off, dst_off);
    let mut done = 0usize;
    while done < n {
        let want = buf.len().min(n - done);
        let r = src.read(&mut buf[..want], so.as_deref().copied());
        let got = match r {
            Ok(0) => break,
            Ok(k) => k,
            Err(_) if done > 0 => break,
            Err(e) => return Err(e),
        };
        let mut put = 0;
        while put < got {
            match dst.write(&buf[put..got], dof.as_deref().map(|o| *o + put as u64)) {
                Ok(0) => break,
                Ok(k) => put += k,
                Err(_) if done + put > 0 => break,
                Err(e) => return Err(e),
            }
        }
        if let Some(o) = so.as_deref_mut() {
            *o += put as u64;
        } else if put < got {
            // The source's position moved past bytes the destination did not take.
            if let End::Cairn(fd, o) = src {
                let _ = ops::lseek(*fd, o, -((got - put) as i64), libc::SEEK_CUR);
            }
        }
        if let Some(o) = dof.as_deref_mut() {
            *o += put as u64;
        }
        done += put;
        if put < got || got < want {
            break;
        }
    }
    Ok(done)
}

/// The offset behind a caller's `off64_t *` (`None`: NULL, use the position).
/// SAFETY: `p` is NULL or points to a valid `off64_t`.
unsafe fn offset_arg(p: *mut off64_t) -> io::Result<Option<u64>> {
    if p.is_null() {
        return Ok(None);
    }
    let v = unsafe { *p };
    u64::try_from(v)
        .map(Some)
        .map_err(|_| err(libc::EINVAL, "negative offset"))
}

/// Run a copy with the caller's offset pointers, writing the moved offsets back.
/// SAFETY: `p1` and `p2` are NULL or point to valid `off64_t`s.
unsafe fn copy_with_offsets(
    op: &str,
    src: End,
    p1: *mut off64_t,
    dst: End,
    p2: *mut off64_t,
    n: usize,
) -> ssize_t {
    run(op, || {
        let (mut a, mut b) = unsafe { (offset_arg(p1)?, offset_arg(p2)?) };
        let done = copy_through(&src, a.as_mut(), &dst, b.as_mut(), n)?;
        // SAFETY: the pointers were checked above (NULL, or valid).
        unsafe {
            if let Some(a) = a {
                *p1 = a as off64_t;
            }
            if let Some(b) = b {
                *p2 = b as off64_t;
            }
        }
        Ok(done as ssize_t)
    })
}

/// `copy_file_range` with a Cairn file on either side (to or from the host too) copies
/// through a buffer; only host to host goes to the kernel.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd1: c_int,
    o1: *mut off64_t,
    fd2: c_int,
    o2: *mut off64_t,
    n: size_t,
    fl: c_uint,
) -> ssize_t {
    if !table::is_cairn(fd1) && !table::is_cairn(fd2) {
        return unsafe { real::copy_file_range(fd1, o1, fd2, o2, n, fl) };
    }
    let (src, dst) = (End::of(fd1), End::of(fd2));
    let checked = run("copy_file_range", || {
        if fl != 0 {
            return Err(err(libc::EINVAL, "copy_file_range: flags must be 0"));
        }
        for (e, write) in [(&src, false), (&dst, true)] {
            if let End::Cairn(_, o) = e {
                if o.dir {
                    return Err(err(libc::EISDIR, "copy_file_range: a directory"));
                }
                if (write && !o.write) || (!write && !o.read) {
                    return Err(err(libc::EBADF, "copy_file_range: wrong access mode"));
                }
                if write && o.append.load(Ordering::Relaxed) {
                    return Err(err(libc::EBADF, "copy_file_range: O_APPEND destination"));
                }
            }
        }
        if let (End::Cairn(_, a), End::Cairn(_, b)) = (&src, &dst) {
            if a.ino == b.ino {
                // Linux refuses overlapping ranges of one file.
                let pos = |p: *mut off64_t, o: &Ofd, fd: c_int| -> io::Result<u64> {
                    // SAFETY: NULL or a valid pointer (the caller's contract).
                    match unsafe { offset_arg(p)? } {
                        Some(v) => Ok(v),
                        None => ops::lseek(fd, o, 0, libc::SEEK_CUR),
                    }
                };
                let (x, y) = (pos(o1, a, fd1)?, pos(o2, b, fd2)?);
                if x < y.saturating_add(n as u64) && y < x.saturating_add(n as u64) {
                    return Err(err(
                        libc::EINVAL,
                        "copy_file_range: overlapping ranges of one file",
                    ));
                }
            }
        }
        Ok(0)
    });
    if checked < 0 {
        return -1;
    }
    unsafe { copy_with_offsets("copy_file_range", src, o1, dst, o2, n) }
}

/// `sendfile` from a Cairn file (to a socket, a pipe or any file) copies through a
/// buffer; to a Cairn file from the host likewise.
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut off64_t,
    n: size_t,
) -> ssize_t {
    if !table::is_cairn(out) && !table::is_cairn(inp) {
        return unsafe { real::sendfile64(out, inp, off, n) };
    }
    let (src, dst) = (End::of(inp), End::of(out));
    if let End::Cairn(_, o) = &src {
        if o.dir || !o.read {
            return run("sendfile", || {
                Err(err(libc::EBADF, "sendfile: source not open for reading"))
            });
        }
    }
    unsafe { copy_with_offsets("sendfile", src, off, dst, std::ptr::null_mut(), n) }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(out: c_int, inp: c_int, off: *mut off64_t, n: size_t) -> ssize_t {
    unsafe { sendfile64(out, inp, off, n) }
}

/// `splice` between a Cairn file and a pipe copies through a buffer (one side must be a
/// pipe, whose offset must be NULL, as Linux requires).
#[no_mangle]
pub unsafe extern "C" fn splice(
    fd1: c_int,
    o1: *mut off64_t,
    fd2: c_int,
    o2: *mut off64_t,
    n: size_t,
    fl: c_uint,
) -> ssize_t {
    if !table::is_cairn(fd1) && !table::is_cairn(fd2) {
        return unsafe { real::splice(fd1, o1, fd2, o2, n, fl) };
    }
    let (src, dst) = (End::of(fd1), End::of(fd2));
    let (pipe_in, pipe_out) = (src.is_pipe(), dst.is_pipe());
    if !pipe_in && !pipe_out {
        return run("splice", || {
            Err(err(libc::EINVAL, "splice: neither descriptor is a pipe"))
        });
    }
    if (pipe_in && !o1.is_null()) || (pipe_out && !o2.is_null()) {
        return run("splice", || {
            Err(err(libc::ESPIPE, "splice: offset given for a pipe"))
        });
    }
    unsafe { copy_with_offsets("splice", src, o1, dst, o2, n) }
}
