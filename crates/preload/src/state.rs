//! Process-wide state: configuration, the LibFS client, the Cairn current directory,
//! error reporting, and what `fork(2)` does to all of it.

use crate::paths;
use crate::real;
use crate::table;
use cairn::Fs;
use parking_lot::Mutex;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// `CAIRN_PREFIX` (default `/cairn`) and `CAIRN_PRELOAD_LOG`.
///
/// Read without allocating: an allocator that opens files while it initializes
/// (jemalloc reads `/proc`) calls into this library before anything else works.
pub struct Config {
    prefix: [u8; 256],
    prefix_len: usize,
    /// `CAIRN_STORE` and `CAIRN_BIN` as the environment had them when the library was
    /// loaded (before `main`: some programs, nginx for one, clear their environment).
    store: [u8; 4096],
    store_len: usize,
    bin: [u8; 4096],
    bin_len: usize,
    pub log: bool,
    /// `CAIRN_PREFIX` was set but unusable (reported when the client opens).
    pub bad_prefix: bool,
}

impl Config {
    pub fn prefix(&self) -> &[u8] {
        &self.prefix[..self.prefix_len]
    }
    /// `CAIRN_STORE` when the library was loaded, if set.
    pub fn store(&self) -> Option<&[u8]> {
        (self.store_len > 0).then(|| &self.store[..self.store_len])
    }
    /// `CAIRN_BIN` when the library was loaded, if set.
    pub fn bin(&self) -> Option<&[u8]> {
        (self.bin_len > 0).then(|| &self.bin[..self.bin_len])
    }
}

/// Copy `v` into `buf` if it fits; its length (0 if it does not).
fn keep(v: Option<&[u8]>, buf: &mut [u8; 4096]) -> usize {
    match v {
        Some(v) if v.len() <= buf.len() => {
            buf[..v.len()].copy_from_slice(v);
            v.len()
        }
        _ => 0,
    }
}

pub const DEFAULT_PREFIX: &str = "/cairn";

static CONFIG: OnceLock<Config> = OnceLock::new();

fn getenv(k: &std::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv with a NUL-terminated name; the value lives in the environment.
    let p = unsafe { libc::getenv(k.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv returns a NUL-terminated string.
    Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes()).filter(|v| !v.is_empty())
}

pub fn config() -> &'static Config {
    CONFIG.get_or_init(|| {
        let mut c = Config {
            prefix: [0; 256],
            prefix_len: 0,
            store: [0; 4096],
            store_len: 0,
            bin: [0; 4096],
            bin_len: 0,
            log: getenv(c"CAIRN_PRELOAD_LOG").is_some(),
            bad_prefix: false,
        };
        c.store_len = keep(getenv(c"CAIRN_STORE"), &mut c.store);
        c.bin_len = keep(getenv(c"CAIRN_BIN"), &mut c.bin);
        let want = getenv(c"CAIRN_PREFIX");
        match want.and_then(|p| paths::canonical_prefix(p, &mut c.prefix)) {
            Some(n) => c.prefix_len = n,
            None => {
                c.bad_prefix = want.is_some();
                let d = DEFAULT_PREFIX.as_bytes();
                c.prefix[..d.len()].copy_from_slice(d);
                c.prefix_len = d.len();
            }
        }
        c
    })
}

/// The LibFS client, opened on first use (and again in a child after `fork`).
static FS: Mutex<Option<Arc<Fs>>> = Mutex::new(None);
/// The process that opened `FS`.
static FS_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A thread is opening `FS` (the others wait for its client instead of opening one each:
/// a program whose threads all start with a file call would take as many log slots).
static OPENING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

thread_local! {
    /// This thread is the one opening `FS`.
    static OPENER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub fn fs() -> io::Result<Arc<Fs>> {
    use std::sync::atomic::Ordering::{AcqRel, Acquire, Release};
    loop {
        if let Some(f) = FS.lock().as_ref() {
            return Ok(f.clone());
        }
        if OPENER.get() {
            return Err(err(
                libc::EDEADLK,
                "the store was used while its client was being opened",
            ));
        }
        if OPENING
            .compare_exchange(false, true, AcqRel, Acquire)
            .is_ok()
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    OPENER.set(true);
    let r = open_fs();
    OPENER.set(false);
    OPENING.store(false, Release);
    r
}

/// Open the client and make it `FS` (by one thread at a time: [`fs`]).
fn open_fs() -> io::Result<Arc<Fs>> {
    // Opened without the lock held: opening may start the daemon.
    if config().bad_prefix {
        eprintln!(
            "cairn-preload: CAIRN_PREFIX must be an absolute path other than `/`, without \
             `..`, of at most 255 bytes; using {DEFAULT_PREFIX}"
        );
    }
    use std::os::unix::ffi::OsStrExt;
    let from_load = |v: Option<&[u8]>| v.map(|b| PathBuf::from(std::ffi::OsStr::from_bytes(b)));
    let store = std::env::var_os("CAIRN_STORE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| from_load(config().store()));
    if let Some(bin) = from_load(config().bin()) {
        cairn::set_daemon_binary(bin);
    }
    let f = Arc::new(Fs::open_store(store.as_deref()).map_err(|e| {
        eprintln!("cairn-preload: cannot use the Cairn store: {e}");
        e
    })?);
    f.set_umask(current_umask());
    // Symbolic links and `..` resolve as the kernel would, with the store at the prefix.
    let prefix = std::path::Path::new(std::ffi::OsStr::from_bytes(config().prefix()));
    f.set_link_root(Some(prefix))?;
    let mut g = FS.lock();
    // SAFETY: getpid cannot fail.
    FS_PID.store(
        unsafe { libc::getpid() } as u32,
        std::sync::atomic::Ordering::Release,
    );
    Ok(g.get_or_insert(f).clone())
}

fn current_umask() -> u32 {
    // SAFETY: umask(2) cannot fail; the old mask is put back at once.
    unsafe {
        let m = real::umask(0o022);
        real::umask(m);
        m
    }
}

/// `umask(2)` was called: tell the client, if there is one.
pub fn umask_changed(mask: u32) {
    if let Some(f) = FS.lock().as_ref() {
        f.set_umask(mask);
    }
}

/// Whether this thread is inside a Cairn operation (`crate::abi::in_cairn`; never in
/// unit tests, which have no ABI layer).
fn in_cairn() -> bool {
    #[cfg(not(test))]
    return crate::abi::in_cairn();
    #[cfg(test)]
    return false;
}

/// Before the process changes its credentials: open the client now, if this process
/// may (it is about to give up the rights that let it map the store; its client keeps
/// working with the new credentials: [`credentials_changed`]). A process whose store
/// cannot be opened goes on without one.
pub fn before_credentials_change() {
    let ours = in_cairn();
    if FS.lock().is_none() && !ours {
        let _ = fs();
    }
}

/// The process changed its credentials: the client checks its calls with the new ones
/// (and so does the daemon, which reads them from the kernel).
pub fn credentials_changed() {
    let f = FS.lock().clone();
    if let Some(f) = f {
        if let Err(e) = f.credentials_changed() {
            if config().log {
                eprintln!("cairn-preload: telling the daemon about new credentials: {e}");
            }
        }
    }
}

/// The current directory when it is inside Cairn: its host-visible path (absolute,
/// canonical, under the prefix) and inode (0: not looked up yet, after `exec`).
#[derive(Clone)]
pub struct Cwd {
    pub path: Vec<u8>,
    pub ino: u64,
}

static CWD: Mutex<Option<Cwd>> = Mutex::new(None);

/// The environment variable carrying a Cairn current directory across `exec`.
pub const CWD_ENV: &str = "CAIRN_CWD";

pub fn cwd() -> Option<Cwd> {
    CWD.lock().clone()
}

pub fn set_cwd(c: Option<Cwd>) {
    match &c {
        Some(c) => std::env::set_var(
            CWD_ENV,
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&c.path),
        ),
        None => std::env::remove_var(CWD_ENV),
    }
    *CWD.lock() = c;
}

/// The inode of the Cairn current directory, looked up if needed.
pub fn cwd_ino(c: &Cwd) -> io::Result<u64> {
    if c.ino != 0 {
        return Ok(c.ino);
    }
    let inner = paths::strip_prefix(&c.path, config().prefix()).unwrap_or(b"/");
    let ino = fs()?.metadata(bytes_path(inner))?.ino();
    if let Some(cur) = CWD.lock().as_mut() {
        if cur.path == c.path {
            cur.ino = ino;
        }
    }
    Ok(ino)
}

pub fn bytes_path(b: &[u8]) -> &std::path::Path {
    std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b))
}

/// The POSIX errno of a LibFS error.
pub fn errno_of(e: &io::Error) -> i32 {
    match cairn_area::errno_of(e) {
        0 => libc::EIO,
        n => n,
    }
}

/// Report a failed call: set errno (and print the message with `CAIRN_PRELOAD_LOG`).
pub fn fail<T: real::Fail>(op: &str, e: io::Error) -> T {
    let n = errno_of(&e);
    if config().log {
        eprintln!("cairn-preload: {op}: {e} (errno {n})");
    }
    real::set_errno(n);
    T::FAIL
}

pub fn err(n: i32, msg: impl Into<String>) -> io::Error {
    cairn_area::fs_err(n, msg.into())
}

// ---- fork -------------------------------------------------------------------------

/// Before `exec`: digest this client's log. A file this client created and has not
/// digested exists only in its log; the process that `exec` starts opens it by inode
/// number (an inherited descriptor) while the daemon may still be recovering the log
/// of the client that `exec` ended. (A live client, as a parent after `fork`, needs no
/// such step: the daemon revokes the creator's lease on an inode it reserved for it.)
pub fn publish() {
    // Not in a child sharing the parent's memory (`vfork`, `posix_spawn`): the client
    // is the parent's, and the parent published before the `fork` if it could.
    // SAFETY: getpid cannot fail.
    if FS_PID.load(std::sync::atomic::Ordering::Acquire) != unsafe { libc::getpid() } as u32 {
        return;
    }
    let f = FS.lock().clone();
    if let Some(f) = f {
        if let Err(e) = f.digest() {
            if config().log {
                eprintln!("cairn-preload: digest before fork/exec: {e}");
            }
        }
    }
}

/// Before `fork`: materialize the placeholders (their kernel offsets, which parent and
/// child share as POSIX wants, hold the positions from now on), then hold every lock
/// across the fork.
pub extern "C" fn before_fork() {
    // Not for a fork LibFS makes itself (its locks are held): it execs at once.
    let ours = in_cairn();
    if !ours {
        table::materialize_all();
    }
    std::mem::forget(FS.lock());
    std::mem::forget(CWD.lock());
    table::lock_all();
}

/// After `fork`, in the parent: release the locks.
pub extern "C" fn after_fork_parent() {
    table::unlock_all();
    // SAFETY: `before_fork` locked both and forgot the guards; this thread owns them.
    unsafe {
        CWD.force_unlock();
        FS.force_unlock();
    }
}

/// The program is about to close descriptors `[first, last]` wholesale (`close_range`,
/// `closefrom`: a child between `fork` and `exec` closing what it inherited, a daemon
/// starting): if the client's own descriptors are among them, publish its log while
/// they work, then give the client up as after `fork`, so that nothing of it ever uses
/// a closed (or reused) descriptor. The next Cairn call opens a new client, through
/// which open Cairn files and mappings reopen their inodes.
pub fn step_aside(first: usize, last: usize) {
    let Some(f) = FS.lock().clone() else { return };
    if f.holds_descriptor_in(first, last) == Some(false) {
        return;
    }
    step_aside_now(f);
}

/// The program is about to close descriptor `fd` (`close`, or `dup2` onto it), which
/// is not a Cairn file's: if it is one of the client's own (a daemon closing every
/// descriptor it inherited, one by one), step aside as [`step_aside`] does first. Not
/// for the library's own closes (inside a Cairn operation, or while the client is in
/// use by another thread: then nothing is done), and it never waits for a lock, so a
/// close from a signal handler cannot deadlock.
pub fn step_aside_for(fd: libc::c_int) {
    if fd < 0 || in_cairn() {
        return;
    }
    let Some(g) = FS.try_lock() else { return };
    let Some(f) = g.as_ref() else { return };
    if f.holds_descriptor_in(fd as usize, fd as usize) != Some(true) {
        return;
    }
    let f = f.clone();
    drop(g);
    step_aside_now(f);
}

/// Publish the log of client `f`, give every open description a placeholder of its own
/// that holds its position (as before `fork`: the new client's descriptions keep their
/// offsets), and give the client up.
fn step_aside_now(f: Arc<Fs>) {
    let _ = f.digest();
    drop(f);
    table::materialize_all();
    give_up_client();
}

/// Give up the client without a word to the daemon and without dropping it (its
/// descriptors are closed here, and nothing of it runs again; another thread in the
/// middle of a call on it fails), and make every open file and mapping reopen its inode
/// through a new client on first use.
fn give_up_client() {
    if let Some(f) = FS.lock().take() {
        f.abandon_after_fork();
        std::mem::forget(f);
    }
    #[cfg(not(test))]
    crate::abi_mmap::copy_in_place_mappings();
    table::reborn_after_fork();
}

/// After `fork`, in the child: release the locks; give up the parent's client (its
/// connection is the parent's) and make every open file and mapping reopen its inode
/// through a client of the child's own, on first use.
pub extern "C" fn after_fork_child() {
    // SAFETY: as in `after_fork_parent`; the child has only this thread.
    unsafe {
        CWD.force_unlock();
        FS.force_unlock();
    }
    table::unlock_all();
    // A thread of the parent that was opening the client is not in the child.
    OPENING.store(false, std::sync::atomic::Ordering::Release);
    give_up_client();
}
