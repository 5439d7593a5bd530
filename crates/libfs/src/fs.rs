//! The LibFS client: registration with the daemon, the operation log, the DRAM overlay of
//! undigested state, path resolution and every operation of the public API.
//!
//! All client state sits behind one mutex ([`State`]); an operation takes it once, so the
//! threads of a process see each other's updates at once. Shared-area reads happen under
//! that lock too, with the reader epoch published in the client page (PROTOCOL.md,
//! "Epochs") for as long as they touch map nodes, data blocks or directory buckets.
//!
//! This module holds the state ([`State`], whose parts are owned types of their own:
//! the log writer `crate::log`, the overlay `crate::overlay`, the lease table
//! `crate::leases`, the handle table `crate::handles`), [`Inner`] and the transaction
//! builder [`Tx`]; its submodules each add one concern's methods to [`Inner`]:
//!
//! | module | what |
//! |---|---|
//! | `session` | attaching to the daemon, each call's entry and retries, requests, digests, credits, inode numbers |
//! | `leases` | taking leases, the upcall channel that revokes them, giving them up |
//! | `logwriter` | transactions reserved, encoded, sealed and made durable; the write path; shared-write commits |
//! | `reading` | attributes, entries and data through the overlay and the shared area; `SEEK_DATA`; read-only mappings |
//! | `resolve` | paths ([`At`]) walked to inodes |
//! | `namespace` | create, remove, rename, exchange, links, listing |
//! | `attrs` | metadata, permissions, owners, times, setuid/setgid clearing, size, holes |
//! | `xattr` | extended attributes (through the daemon) |
//! | `handles` | opening an inode and the last close |
//! | `mapobj` | shared mappings (`MAP_SHARED`) through map objects |
//! | `special` | FIFOs, sockets and device nodes |
//! | `tmpfile` | unnamed files (`O_TMPFILE`) |

use crate::conn::Conn;
use crate::handles::Handles;
pub(crate) use crate::leases::Lease;
use crate::leases::LeaseTable;
use crate::log::LogWriter;
use crate::meta::Cred;
use crate::overlay::{InoMap, Overlay};
use crate::ring::Ring;
use cairn_area::{Area, StoreDir};
use cairn_format::inode::{Attrs, Kind};
use cairn_media::sys;
use cairn_proto::{Request, Response};
use std::fs::File;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

mod attrs;
mod handles;
mod leases;
mod logwriter;
pub(crate) mod mapobj;
mod namespace;
mod reading;
mod resolve;
mod segobj;
mod session;
pub(crate) mod special;
mod tmpfile;
mod xattr;

use leases::open_upcall_channel;
pub(crate) use namespace::CreateOpts;
pub use resolve::At;
use session::transient;

/// What [`crate::Fs::on_lease_lost`] installs.
pub(crate) type LeaseLostHook = Box<dyn Fn(Option<u64>) + Send + Sync>;

/// Symlinks followed during one resolution before `ELOOP`.
const MAX_SYMLINKS: u32 = 40;
/// Inode numbers asked for at a time.
const INODE_BATCH: u32 = 64;
/// Smallest credit request, in 4 KiB blocks (64 MiB; at most a fair share of a small
/// store): a stream of small writes, each charged the blocks it touches, asks about
/// once per several thousand.
const CREDIT_CHUNK: u64 = 16 << 10;

/// An operation needs a lease this client does not hold: the operation is abandoned
/// (nothing was changed yet), the lease acquired without the state lock, and the
/// operation run again ([`Inner::run`]). Never returned to callers.
#[derive(Debug)]
struct NeedLease {
    ino: u64,
    write: bool,
}

impl std::fmt::Display for NeedLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "needs the {} lease on inode {}",
            if self.write { "write" } else { "read" },
            self.ino
        )
    }
}

impl std::error::Error for NeedLease {}

fn need_lease(ino: u64, write: bool) -> io::Error {
    io::Error::other(NeedLease { ino, write })
}

fn as_need_lease(e: &io::Error) -> Option<(u64, bool)> {
    e.get_ref()
        .and_then(|x| x.downcast_ref::<NeedLease>())
        .map(|n| (n.ino, n.write))
}

/// A shared-write `Commit` was refused (another client changed an inode first, or the
/// mode ended): the operation is run again ([`Inner::run`]). Never returned to callers.
#[derive(Debug)]
struct Stale;

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a shared-write inode changed meanwhile")
    }
}

impl std::error::Error for Stale {}

fn is_stale(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<Stale>())
}

/// The mutable client state.
pub(crate) struct State {
    /// The operation log: tail, sequence numbers, the published head last seen (overlay
    /// entries up to it are dropped), credits.
    log: LogWriter,
    inodes: Vec<u64>,
    /// What this client wrote that the shared area does not have yet.
    ov: Overlay,
    /// Open `File` handles and what their last close must do.
    handles: Handles,
    /// Epochs pinned by mappings of shared-area blocks (`Inner::map_plan`): the reader
    /// epoch never rises above the oldest while they live.
    long_pins: Vec<u64>,
    /// Leases held. PROTOCOL.md, "Leases".
    leases: LeaseTable,
    /// Map objects of leased files (`mapobj`): learned at each lease grant, forgotten
    /// with the lease. Reads come from the object; writes go to the log and the object.
    objs: InoMap<Arc<File>>,
    /// This process's attachments to map objects (one per file, shared by its mappings).
    attached: InoMap<Weak<mapobj::MapObject>>,
    /// Shared-write inodes the running operation needed, with their sequence words
    /// before it read them (its `Commit` claims these; cleared when it starts again).
    seen: std::cell::RefCell<InoMap<u64>>,
}

/// The shared part of an `Fs` (also held by its `File`s and `DirEntry`s).
pub(crate) struct Inner {
    store: StoreDir,
    /// The default store (auto-started with `--create`).
    create: bool,
    pub(crate) area: Area,
    /// The credentials this client checks permissions with: the process's, as the daemon
    /// read them from the kernel (at registration, and after every change of the
    /// process's credentials: [`Inner::credentials_changed`]). Use [`Inner::cred`].
    cred: std::sync::RwLock<std::sync::Arc<Cred>>,
    /// The umask applied to created files (the process's at open; see `Fs::set_umask`).
    pub(crate) umask: std::sync::atomic::AtomicU32,
    /// The NVM tier file, and a read-only descriptor of it (what a view maps: a process
    /// may not be allowed to open it again, after dropping its privileges or always).
    pub(crate) nvm_path: PathBuf,
    pub(crate) nvm: File,
    pub(crate) pid: u32,
    slot: u32,
    slot_gen: u64,
    threshold_pct: u64,
    slot_lock: File,
    st: Mutex<State>,
    /// The daemon connection (lock order: `st` before `conn`). Lease requests wait for
    /// their grant holding only this lock.
    conn: Mutex<Option<Conn>>,
    /// Incremented at each (re-)attach; `upcall_epoch`: its value when the upcall
    /// channel was opened.
    conn_epoch: AtomicU64,
    upcall_epoch: AtomicU64,
    /// A handle of the upcall channel (shut down when the client goes away).
    upcall: Mutex<Option<UnixStream>>,
    /// The descriptor the upcall thread reads (-1: none yet), for [`Inner::abandon`].
    upcall_thread_fd: std::sync::atomic::AtomicI32,
    closing: AtomicBool,
    /// Told when this client loses a lease (`Some(ino)`) or all of them (`None`), before
    /// the daemon learns it: a cache of what the lease protected (the FUSE mount's kernel
    /// attribute cache) drops it ([`crate::Fs::on_lease_lost`]).
    lease_lost: std::sync::RwLock<Option<LeaseLostHook>>,
    /// Offset of the slot's `lease_gen` word in the read-only mapping.
    lease_gen_off: usize,
    /// Advisory locks: the lock files and this process's POSIX descriptors (`lock.rs`).
    pub(crate) locks: crate::lock::ClientLocks,
    /// Where the store's root appears in the processes' namespace, for symbolic links
    /// and `..` leading out of the store (`Fs::set_link_root`; `None`: the store is the
    /// whole namespace, absolute targets start at its root).
    pub(crate) link_root: std::sync::RwLock<Option<crate::path::LinkRoot>>,
}

/// A transaction being assembled: records of absolute post-state.
#[derive(Default)]
pub(crate) struct Tx {
    inodes: Vec<(u64, u64, Attrs)>,
    write: Option<(u64, Vec<u8>, u64, i64)>,
    dirents: Vec<(u64, Vec<u8>, u64, Kind)>,
    /// `PUNCH`: inode, offset, length, mtime.
    punch: Option<(u64, u64, u64, i64)>,
    /// Overlay only: file ranges `[start, end)` that read as zeros (beyond a size that
    /// shrank or grew, a punched hole).
    zero: Vec<(u64, u64, u64)>,
    /// FIFOs and sockets whose last link the transaction removes: their host rendezvous
    /// go once it is committed.
    gone: Vec<(Kind, u64, u64)>,
}

impl Tx {
    /// Set (or replace) the post-state of an inode.
    fn inode(&mut self, ino: u64, gen: u64, a: Attrs) {
        if let Some(e) = self.inodes.iter_mut().find(|e| e.0 == ino) {
            *e = (ino, gen, a);
        } else {
            self.inodes.push((ino, gen, a));
        }
    }
    fn get(&self, ino: u64) -> Option<(u64, Attrs)> {
        self.inodes.iter().find(|e| e.0 == ino).map(|e| (e.1, e.2))
    }
    fn dirent(&mut self, dir: u64, name: &[u8], ino: u64, kind: Kind) {
        self.dirents.push((dir, name.to_vec(), ino, kind));
    }
}

/// Read guard for the shared area: publishes the reader epoch while alive. `floor` is
/// the oldest epoch a mapping pins (0: none), which the reader epoch never rises above
/// and goes back to afterwards.
struct Pin<'a> {
    ring: &'a Ring,
    floor: u64,
}

impl<'a> Pin<'a> {
    fn new(area: &Area, ring: &'a Ring, floor: u64) -> io::Result<Pin<'a>> {
        let e = area.global_epoch()?;
        ring.set_reader_epoch(if floor != 0 { e.min(floor) } else { e })?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        Ok(Pin { ring, floor })
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let _ = self.ring.set_reader_epoch(self.floor);
    }
}

impl State {
    /// Forget the lease on `ino` and what it let us know (the file's map object).
    fn drop_lease(&mut self, ino: u64) {
        self.leases.remove(ino);
        self.objs.remove(&ino);
    }

    /// The oldest epoch a mapping pins (0: none).
    fn pin_floor(&self) -> u64 {
        self.long_pins.iter().copied().min().unwrap_or(0)
    }
}

fn name_str(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// `OsStr` from bytes (Unix).
trait FromBytesExt {
    fn from_bytes_ext(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytesExt for std::ffi::OsStr {
    fn from_bytes_ext(b: &[u8]) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(u) = self
            .upcall
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = u.shutdown(std::net::Shutdown::Both);
        }
        let st = self.st.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = st.log.ring().set_reader_epoch(0);
        let bye = Request::Goodbye {
            tail_lsn: st.log.tail(),
        };
        let mut done = false;
        if let Some(c) = self
            .conn
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            done = matches!(c.roundtrip(&bye), Ok(Response::Ok));
        }
        if !done {
            // The daemon restarted since our last request: re-attach (without starting
            // one) so that it releases the slot; otherwise the next daemon recovers the
            // log once our slot lock is gone.
            if let Ok(mut c) = Conn::connect_only(&self.store) {
                let re = Request::Reattach {
                    pid: self.pid,
                    slot: self.slot,
                    slot_gen: self.slot_gen,
                    leases: Vec::new(),
                    pinned: Vec::new(),
                };
                if matches!(c.roundtrip(&re), Ok(Response::Registered(_))) {
                    let _ = c.roundtrip(&bye);
                }
            }
        }
        let _ = sys::flock_unlock(&self.slot_lock);
    }
}
