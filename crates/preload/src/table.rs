//! Open Cairn files and their descriptors.
//!
//! Each open of a Cairn file creates an open file description ([`Ofd`]) and a
//! **placeholder**: a real kernel descriptor, so that descriptor numbers, `poll`,
//! `select`, `close` of all descriptors, `O_CLOEXEC` and fd limits behave. A placeholder
//! is a sealed, empty memfd reopened write-only: a program that reaches it without going
//! through this library (a raw system call, a static binary) gets `EBADF` on read and
//! `EPERM` on write rather than wrong data.
//!
//! An open duplicates one **template** placeholder (one system call). Before `fork` and
//! `exec` every description is **materialized**: it gets a placeholder of its own, named
//! `cairn:<inode>:<access>` so that the program an `exec` starts can adopt it, whose
//! kernel file offset carries the position from then on (shared with the other
//! process, as POSIX wants); `dup3` puts it in place under the same numbers.

use crate::real;
use crate::state::{self, err};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// One directory entry as `getdents64`/`readdir` give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dent {
    pub ino: u64,
    pub kind: u8,
    pub name: Vec<u8>,
}

/// An open file description of a Cairn file or directory.
pub struct Ofd {
    pub ino: u64,
    pub dir: bool,
    pub read: bool,
    pub write: bool,
    pub append: AtomicBool,
    /// The position lives in the placeholder's kernel offset (the description may be
    /// shared with another process).
    shared: AtomicBool,
    /// The position while not shared; held by every call that uses the position.
    pos: Mutex<u64>,
    file: OnceLock<cairn::File>,
    /// A directory's entries, read when its listing starts at 0.
    pub entries: Mutex<Option<Vec<Dent>>>,
    /// A directory's host-visible path (for `fchdir`), if known.
    pub path: Option<Vec<u8>>,
    /// A directory's attributes when it was opened, or last seen before this process
    /// removed it (`fstat` after it was removed).
    pub opened: Mutex<Option<crate::ops::Stat>>,
}

impl Ofd {
    pub fn new_file(f: cairn::File, read: bool, write: bool, append: bool) -> Ofd {
        let o = Ofd::blank(f.ino(), false, read, write, append, None);
        let _ = o.file.set(f);
        o
    }

    pub fn new_dir(ino: u64, path: Option<Vec<u8>>, opened: Option<crate::ops::Stat>) -> Ofd {
        Ofd {
            opened: Mutex::new(opened),
            ..Ofd::blank(ino, true, true, false, false, path)
        }
    }

    /// `O_PATH`: names the inode; no reading or writing.
    pub fn path_only(ino: u64) -> Ofd {
        Ofd::blank(ino, false, false, false, false, None)
    }

    fn blank(
        ino: u64,
        dir: bool,
        read: bool,
        write: bool,
        append: bool,
        path: Option<Vec<u8>>,
    ) -> Ofd {
        Ofd {
            ino,
            dir,
            read,
            write,
            append: AtomicBool::new(append),
            shared: AtomicBool::new(false),
            pos: Mutex::new(0),
            file: OnceLock::new(),
            entries: Mutex::new(None),
            path,
            opened: Mutex::new(None),
        }
    }

    /// The same description for a child process: opened again (lazily) by its client.
    fn reborn(&self) -> Ofd {
        let o = Ofd::blank(
            self.ino,
            self.dir,
            self.read,
            self.write,
            self.append.load(Ordering::Relaxed),
            self.path.clone(),
        );
        o.shared.store(true, Ordering::Relaxed);
        Ofd {
            opened: Mutex::new(self.opened.lock().clone()),
            ..o
        }
    }

    /// The LibFS handle (a regular file's), opened by inode when inherited.
    pub fn file(&self) -> io::Result<&cairn::File> {
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        if self.dir {
            return Err(err(libc::EISDIR, "is a directory"));
        }
        if !self.read && !self.write {
            return Err(err(libc::EBADF, "opened with O_PATH"));
        }
        let fs = state::fs()?;
        let f = cairn::OpenOptions::new()
            .read(self.read)
            .write(self.write)
            .open(&fs, cairn::At::inode(self.ino))?;
        // A racing thread may have set it first: then `f` closes.
        let _ = self.file.set(f);
        Ok(self.file.get().expect("set above"))
    }

    /// Run `f` with the position (read from descriptor `fd` when shared); `f` returns
    /// the new position.
    pub fn with_pos<R>(
        &self,
        fd: c_int,
        f: impl FnOnce(u64) -> io::Result<(R, u64)>,
    ) -> io::Result<R> {
        let mut pos = self.pos.lock();
        if self.shared.load(Ordering::Acquire) {
            let cur = kernel_pos(fd, 0, libc::SEEK_CUR)?;
            let (r, new) = f(cur)?;
            if new != cur {
                kernel_pos(fd, new, libc::SEEK_SET)?;
            }
            Ok(r)
        } else {
            let (r, new) = f(*pos)?;
            *pos = new;
            Ok(r)
        }
    }
}

fn kernel_pos(fd: c_int, pos: u64, whence: c_int) -> io::Result<u64> {
    let off = i64::try_from(pos).map_err(|_| err(libc::EOVERFLOW, "position"))?;
    // SAFETY: lseek on a descriptor; no memory is passed.
    let r = unsafe { real::lseek64(fd, off, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

// ---- the table --------------------------------------------------------------------

/// Descriptors at or above this number cannot be Cairn files (`EMFILE`).
pub const MAX_FD: usize = 1 << 20;
static BITS: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];
static TABLE: Mutex<Vec<Option<Arc<Ofd>>>> = Mutex::new(Vec::new());

/// Whether `fd` is a Cairn descriptor: one atomic load, the cost every other call pays.
#[inline]
pub fn is_cairn(fd: c_int) -> bool {
    let Ok(i) = usize::try_from(fd) else {
        return false;
    };
    i < MAX_FD && BITS[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
}

pub fn get(fd: c_int) -> Option<Arc<Ofd>> {
    if !is_cairn(fd) {
        return None;
    }
    TABLE.lock().get(fd as usize).cloned().flatten()
}

/// Make `fd` (a placeholder) refer to `ofd`; returns what it referred to before.
pub fn insert(fd: c_int, ofd: Arc<Ofd>) -> Option<Arc<Ofd>> {
    let i = fd as usize;
    let mut t = TABLE.lock();
    if t.len() <= i {
        t.resize(i + 1, None);
    }
    let old = t[i].replace(ofd);
    BITS[i / 64].fetch_or(1 << (i % 64), Ordering::Release);
    old
}

/// Forget `fd`; returns what it referred to.
pub fn remove(fd: c_int) -> Option<Arc<Ofd>> {
    if !is_cairn(fd) {
        return None;
    }
    let i = fd as usize;
    let mut t = TABLE.lock();
    BITS[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Release);
    t.get_mut(i).and_then(|e| e.take())
}

/// Forget every descriptor in `[first, last]` (`close_range`, `closefrom`).
pub fn remove_range(first: usize, last: usize) -> Vec<Arc<Ofd>> {
    let mut t = TABLE.lock();
    if t.is_empty() {
        return Vec::new();
    }
    let end = last.min(t.len() - 1);
    let mut gone = Vec::new();
    for i in first..=end {
        if let Some(o) = t[i].take() {
            BITS[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Release);
            gone.push(o);
        }
    }
    gone
}

/// Whether another descriptor still refers to `ofd`.
pub fn still_open(ofd: &Arc<Ofd>) -> bool {
    TABLE.lock().iter().flatten().any(|o| Arc::ptr_eq(o, ofd))
}

/// Directory `ino` is about to be removed by this process: its open descriptions keep
/// these attributes for `fstat`.
pub fn dir_removing(ino: u64, st: &crate::ops::Stat) {
    for o in TABLE.lock().iter().flatten() {
        if o.dir && o.ino == ino {
            *o.opened.lock() = Some(st.clone());
        }
    }
}

/// Inodes on which this process asked for POSIX record locks.
static POSIX_LOCKED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

pub fn mark_posix_locked(ino: u64) {
    let mut v = POSIX_LOCKED.lock();
    if !v.contains(&ino) {
        v.push(ino);
    }
}

pub fn posix_locked(ino: u64) -> bool {
    POSIX_LOCKED.lock().contains(&ino)
}

/// The template placeholder (-1: not made yet).
static TEMPLATE: AtomicI32 = AtomicI32::new(-1);

/// A placeholder for a new open: a duplicate of the template.
pub fn placeholder(cloexec: bool) -> io::Result<c_int> {
    let mut t = TEMPLATE.load(Ordering::Acquire);
    if t < 0 {
        let n = named_placeholder("cairn:template", true)?;
        t = match TEMPLATE.compare_exchange(-1, n, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => n,
            Err(other) => {
                // SAFETY: closing the descriptor made just above.
                unsafe { real::close(n) };
                other
            }
        };
    }
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: fcntl(F_DUPFD) on a descriptor.
    let fd = unsafe { real::fcntl64(t, cmd, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    if fd as usize >= MAX_FD {
        // SAFETY: closing the descriptor made just above.
        unsafe { real::close(fd) };
        return Err(err(
            libc::EMFILE,
            "descriptor number too large for a Cairn file",
        ));
    }
    Ok(fd)
}

/// The program closed or replaced descriptors `[first, last]`: if the template was
/// among them, make a new one next time.
pub fn template_gone(first: usize, last: usize) {
    let t = TEMPLATE.load(Ordering::Acquire);
    if t >= 0 && (first..=last).contains(&(t as usize)) {
        let _ = TEMPLATE.compare_exchange(t, -1, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Give every open description a placeholder of its own, named after its inode, whose
/// kernel offset holds the position from now on (before `fork` and `exec`).
pub fn materialize_all() {
    let all: Vec<(c_int, Arc<Ofd>)> = TABLE
        .lock()
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.clone().map(|o| (i as c_int, o)))
        .collect();
    let mut seen: Vec<*const Ofd> = Vec::new();
    for (_, o) in &all {
        if o.shared.load(Ordering::Acquire) || seen.contains(&Arc::as_ptr(o)) {
            continue;
        }
        seen.push(Arc::as_ptr(o));
        let fds: Vec<c_int> = all
            .iter()
            .filter(|(_, x)| Arc::ptr_eq(x, o))
            .map(|(fd, _)| *fd)
            .collect();
        let _ = o.materialize(&fds);
    }
}

impl Ofd {
    /// See [`materialize_all`]: `fds` are the descriptors of this description.
    fn materialize(&self, fds: &[c_int]) -> io::Result<()> {
        let pos = self.pos.lock();
        if self.shared.load(Ordering::Acquire) {
            return Ok(());
        }
        let acc = match (self.dir, self.read, self.write) {
            (true, _, _) => "dir",
            (_, true, true) => "rw",
            (_, false, true) => "w",
            _ => "r",
        };
        let u = named_placeholder(&format!("cairn:{}:{acc}", self.ino), true)?;
        let r = (|| {
            kernel_pos(u, *pos, libc::SEEK_SET)?;
            // SAFETY: descriptor calls on `u` and on the program's descriptors `fds`,
            // which dup3 replaces atomically, keeping their close-on-exec flag.
            unsafe {
                if self.append.load(Ordering::Relaxed) {
                    real::fcntl64(u, libc::F_SETFL, libc::O_APPEND as usize);
                }
                for &fd in fds {
                    let fl = real::fcntl64(fd, libc::F_GETFD, 0);
                    let cx = if fl >= 0 && fl & libc::FD_CLOEXEC != 0 {
                        libc::O_CLOEXEC
                    } else {
                        0
                    };
                    if real::dup3(u, fd, cx) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
            self.shared.store(true, Ordering::Release);
            Ok(())
        })();
        // SAFETY: closing the descriptor made above (its duplicates stay).
        unsafe { real::close(u) };
        r
    }
}

/// A new named placeholder.
fn named_placeholder(name: &str, cloexec: bool) -> io::Result<c_int> {
    let name = CString::new(name).expect("no NUL");
    let cx = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: plain descriptor calls; `name` and `proc` are NUL-terminated and live
    // across the calls.
    unsafe {
        let m = real::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        if m < 0 {
            return Err(io::Error::last_os_error());
        }
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        real::fcntl64(m, libc::F_ADD_SEALS, seals as usize);
        let proc = CString::new(format!("/proc/self/fd/{m}")).expect("no NUL");
        let fd = real::open64(proc.as_ptr(), libc::O_WRONLY | cx, 0);
        let e = io::Error::last_os_error();
        real::close(m);
        if fd < 0 {
            return Err(e);
        }
        if fd as usize >= MAX_FD {
            real::close(fd);
            return Err(err(
                libc::EMFILE,
                "descriptor number too large for a Cairn file",
            ));
        }
        Ok(fd)
    }
}

/// Parse a placeholder's `/proc/self/fd` link: `(ino, read, write, dir)`.
pub fn parse_placeholder(link: &[u8]) -> Option<(u64, bool, bool, bool)> {
    let rest = link.strip_prefix(b"/memfd:cairn:")?;
    let rest = rest.strip_suffix(b" (deleted)").unwrap_or(rest);
    let s = std::str::from_utf8(rest).ok()?;
    let (ino, acc) = s.split_once(':')?;
    let ino = ino.parse().ok()?;
    Some(match acc {
        "r" => (ino, true, false, false),
        "w" => (ino, false, true, false),
        "rw" => (ino, true, true, false),
        "dir" => (ino, true, false, true),
        _ => return None,
    })
}

/// At start-up: adopt the placeholders inherited through `exec`.
pub fn adopt_inherited() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<c_int>().ok()) else {
            continue;
        };
        let Ok(link) = std::fs::read_link(e.path()) else {
            continue;
        };
        let Some((ino, read, write, dir)) =
            parse_placeholder(std::os::unix::ffi::OsStrExt::as_bytes(link.as_os_str()))
        else {
            continue;
        };
        if fd as usize >= MAX_FD {
            continue;
        }
        // SAFETY: fcntl(F_GETFL) on a descriptor.
        let fl = unsafe { real::fcntl64(fd, libc::F_GETFL, 0) };
        let o = if dir {
            Ofd::new_dir(ino, None, None)
        } else {
            Ofd::blank(
                ino,
                false,
                read,
                write,
                fl >= 0 && fl & libc::O_APPEND != 0,
                None,
            )
        };
        o.shared.store(true, Ordering::Relaxed);
        insert(fd, Arc::new(o));
    }
}

// ---- fork ---------------------------------------------------------------------------

pub fn lock_all() {
    std::mem::forget(TABLE.lock());
    crate::maps::lock_for_fork();
}

pub fn unlock_all() {
    crate::maps::unlock_after_fork();
    // SAFETY: `lock_all` locked it and forgot the guard, in this thread, before `fork`.
    unsafe { TABLE.force_unlock() };
}

/// In the child: every description is replaced by one of the child's (dups stay dups).
pub fn reborn_after_fork() {
    let mut reborn: HashMap<*const Ofd, Arc<Ofd>> = HashMap::new();
    let mut renew = |o: &Arc<Ofd>| -> Arc<Ofd> {
        reborn
            .entry(Arc::as_ptr(o))
            .or_insert_with(|| Arc::new(o.reborn()))
            .clone()
    };
    {
        let mut t = TABLE.lock();
        let old = std::mem::take(&mut *t);
        *t = old.iter().map(|e| e.as_ref().map(&mut renew)).collect();
        // The parent's descriptions hold the parent's client: never dropped here.
        std::mem::forget(old);
    }
    crate::maps::reborn_after_fork(&mut renew);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholder_names() {
        assert_eq!(
            parse_placeholder(b"/memfd:cairn:42:rw (deleted)"),
            Some((42, true, true, false))
        );
        assert_eq!(
            parse_placeholder(b"/memfd:cairn:7:r"),
            Some((7, true, false, false))
        );
        assert_eq!(
            parse_placeholder(b"/memfd:cairn:7:dir (deleted)"),
            Some((7, true, false, true))
        );
        assert_eq!(parse_placeholder(b"/memfd:cairn:x:r"), None);
        assert_eq!(parse_placeholder(b"/memfd:other:1:r"), None);
        assert_eq!(parse_placeholder(b"/tmp/cairn:1:r"), None);
    }
}
