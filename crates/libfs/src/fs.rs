//! The LibFS client: registration with the daemon, the operation log, the DRAM overlay of
//! undigested state, path resolution and every operation of the public API.
//!
//! All client state sits behind one mutex ([`State`]); an operation takes it once, so the
//! threads of a process see each other's updates at once. Shared-area reads happen under
//! that lock too, with the reader epoch published in the client page (PROTOCOL.md,
//! "Epochs") for as long as they touch map nodes, data blocks or directory buckets.

use crate::conn::{response_error, Conn};
use crate::extents::{Extents, Src};
use crate::meta::{groups_and_umask, now_ns, Cred, Metadata, R, W, X};
use crate::path::{self, Comp};
use crate::ring::{Ring, WRITE_HEAD};
use cairn_area::{fs_err, Area, StoreDir};
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::log::{
    seal_txn, txn_len, write_charge, write_txn_len, Record, KIND_COMMIT, TXN_HEADER,
    WRITE_HEADER_LEN,
};
use cairn_format::{BLOCK_SIZE_U64, LINK_MAX, MAX_FILE_SIZE, ROOT_INO};
use cairn_media::{fence, sys, Mapping};
use cairn_proto::{Registration, Request, Response, StatusReport, Upcall, XattrOp};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

pub(crate) mod mapobj;
pub(crate) mod special;
mod tmpfile;

/// What [`crate::Fs::on_lease_lost`] installs.
pub(crate) type LeaseLostHook = Box<dyn Fn(Option<u64>) + Send + Sync>;

/// Symlinks followed during one resolution before `ELOOP`.
const MAX_SYMLINKS: u32 = 40;
/// Inode numbers asked for at a time.
const INODE_BATCH: u32 = 64;
/// Smallest credit request, in 4 KiB blocks.
const CREDIT_CHUNK: u64 = 1024;

/// The undigested state of one inode.
pub(crate) struct InodeOv {
    gen: u64,
    attrs: Attrs,
    /// Tag (LSN just past the transaction) of the latest change of this inode. Every
    /// data range and directory entry below carries a tag no larger than this one.
    tag: u64,
    ext: Extents,
    /// Directory entries: name → (ino, kind), `None` for a removed name.
    dir: HashMap<Vec<u8>, DirOv>,
}

/// A hasher for inode-number keys (multiplicative; inode numbers are not adversarial).
#[derive(Default, Clone, Copy)]
pub(crate) struct InoHasher(u64);

impl std::hash::Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by inode number.
type InoMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<InoHasher>>;

/// An overlay directory entry: `(ino, kind)` or `None` (removed), and its tag.
type DirOv = (Option<(u64, Kind)>, u64);

impl InodeOv {
    /// An overlay entry, with an interval map from `spare` (used ones kept for reuse:
    /// the write path then does not allocate). The largest is taken: which map was
    /// recycled last depends on the order the overlay drops entries in, and a smaller one
    /// taken for a busy file would have to grow. (A cleared map lays its entries out
    /// from the start of its memory again, so a large one is as compact as a small one.)
    fn new(gen: u64, attrs: Attrs, tag: u64, spare: &mut Vec<Extents>) -> InodeOv {
        let largest = (0..spare.len()).max_by_key(|&i| spare[i].capacity());
        InodeOv {
            gen,
            attrs,
            tag,
            ext: largest.map(|i| spare.swap_remove(i)).unwrap_or_default(),
            dir: HashMap::new(),
        }
    }
}

/// Interval maps of dropped overlay entries kept for reuse, at most this many...
const SPARE_EXTENTS: usize = 32;
/// ... and only those indexing at most this many ranges (larger ones give their memory
/// back).
const SPARE_EXTENTS_MAX_RANGES: usize = 1 << 16;

/// Keep `o`'s interval map for reuse (emptied), within the limits above. A map that
/// never held a range (a directory's) is not kept: it would save nothing, and, taken
/// next by a busy file, it would have to grow.
fn recycle(spare: &mut Vec<Extents>, o: InodeOv) {
    let mut ext = o.ext;
    if spare.len() < SPARE_EXTENTS
        && ext.capacity() > 0
        && ext.capacity() <= SPARE_EXTENTS_MAX_RANGES
    {
        ext.clear();
        spare.push(ext);
    }
}

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

/// Whether `e` only asks [`Inner::run`] to run the operation again.
fn is_retry(e: &io::Error) -> bool {
    as_need_lease(e).is_some() || is_stale(e)
}

/// What this client holds on an inode (PROTOCOL.md, "Leases").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    Read,
    Write,
    /// Shared-write mode: read from the shared area, change through the daemon
    /// (`Commit`).
    Mediated,
}

/// The mutable client state.
pub(crate) struct State {
    ring: Ring,
    /// Next transaction's LSN and sequence number.
    tail: u64,
    seq: u64,
    /// The published head last seen (overlay entries up to it are dropped).
    ph: u64,
    /// `upto` of the outstanding asynchronous digest request.
    digest_pending: Option<u64>,
    credits: u64,
    inodes: Vec<u64>,
    ov: InoMap<InodeOv>,
    /// Emptied interval maps for new overlay entries ([`InodeOv::new`]).
    spare: Vec<Extents>,
    /// Open `File` handles per inode.
    open: InoMap<u32>,
    /// Inodes unlinked while open: their `nlink = 0` is logged at the last close.
    orphans: HashSet<u64>,
    /// Unnamed files (`O_TMPFILE`) that may still be given a name.
    tmpfiles: HashSet<u64>,
    /// Open inodes the daemon pinned (we said they were open when it revoked their
    /// lease): the last close sends `Unpin`.
    pinned: HashSet<u64>,
    /// Reused buffer for metadata transactions.
    buf: Vec<u8>,
    /// Epochs pinned by mappings of shared-area blocks (`Inner::map_plan`): the reader
    /// epoch never rises above the oldest while they live.
    long_pins: Vec<u64>,
    /// Leases held. PROTOCOL.md, "Leases".
    leases: InoMap<Lease>,
    /// Map objects of leased files (`mapobj`): learned at each lease grant, forgotten
    /// with the lease. Reads come from the object; writes go to the log and the object.
    objs: InoMap<Arc<File>>,
    /// This process's attachments to map objects (one per file, shared by its mappings).
    attached: InoMap<Weak<mapobj::MapObject>>,
    /// Shared-write inodes the running operation needed, with their sequence words
    /// before it read them (its `Commit` claims these; cleared when it starts again).
    seen: std::cell::RefCell<InoMap<u64>>,
    /// The slot's `lease_gen` these leases belong to.
    lease_gen: u64,
    /// Revocations answered so far, and per inode the count at its latest one (kept
    /// only while acquisitions are in flight): a grant that crossed a revocation of the
    /// same inode is not trusted.
    revokes: u64,
    revoked_at: InoMap<u64>,
    acquiring: u32,
}

/// The shared part of an `Fs` (also held by its `File`s and `DirEntry`s).
pub(crate) struct Inner {
    store: StoreDir,
    /// The default store (auto-started with `--create`).
    create: bool,
    pub(crate) area: Area,
    pub(crate) cred: Cred,
    /// The umask applied to created files (the process's at open; see `Fs::set_umask`).
    pub(crate) umask: std::sync::atomic::AtomicU32,
    /// The NVM tier file.
    pub(crate) nvm_path: PathBuf,
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
    /// Advisory locks: lock channels and bookkeeping (`lock.rs`).
    pub(crate) locks: crate::lock::ClientLocks,
}

/// A path and the directory a relative path starts from (the `*at` calls): absolute
/// paths start at the root whatever `dir` is. An empty path names `dir` itself, which
/// may then be any inode (as `AT_EMPTY_PATH`): [`At::inode`].
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub dir: u64,
    pub path: &'a Path,
}

impl<'a> At<'a> {
    /// `path` from the root (relative paths too).
    pub fn root(path: &'a Path) -> At<'a> {
        At {
            dir: ROOT_INO,
            path,
        }
    }

    /// Inode `ino` itself (an empty path from it), for the calls that act on an
    /// existing inode: metadata, permissions, owner, times, `read_link`, opening it,
    /// the source of a hard link. Calls that create or remove a name refuse it
    /// (`ENOENT`, as an empty path does).
    pub fn inode(ino: u64) -> At<'static> {
        At {
            dir: ino,
            path: Path::new(""),
        }
    }

    /// Whether this names an inode itself (an empty path), not a name in a directory.
    pub fn is_inode(&self) -> bool {
        self.path.as_os_str().is_empty()
    }

    /// `ENOENT` for [`At::inode`] (the calls that create or remove a name).
    fn named(&self, op: &str) -> io::Result<()> {
        if self.is_inode() {
            return Err(fs_err(libc::ENOENT, format!("{op}: empty path")));
        }
        Ok(())
    }

    /// For messages.
    pub fn display(&self) -> std::path::Display<'a> {
        self.path.display()
    }
}

/// The result of resolving a path.
pub(crate) struct Walk {
    /// Directory holding the last component.
    pub parent: u64,
    /// The last component's name (`None` for `/`, `.` or `..`).
    pub name: Option<Vec<u8>>,
    /// What the name refers to; `None`: it does not exist (the parent does).
    pub found: Option<(u64, Kind)>,
    /// The path ended with `/`.
    pub trailing_slash: bool,
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
        self.leases.remove(&ino);
        self.objs.remove(&ino);
    }

    /// The oldest epoch a mapping pins (0: none).
    fn pin_floor(&self) -> u64 {
        self.long_pins.iter().copied().min().unwrap_or(0)
    }
}

fn lock_timeout(f: &File, what: &Path) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sys::flock_exclusive(f, true) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => {
                return Err(fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("cannot lock {}: {e}", what.display()),
                ))
            }
        }
    }
}

/// Transport errors that mean "the daemon went away": worth reconnecting.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

/// Open the upcall channel of `slot` (PROTOCOL.md, "Leases": `UpcallChannel`).
fn open_upcall_channel(store: &StoreDir, slot: u32, slot_gen: u64) -> io::Result<UnixStream> {
    let mut s = UnixStream::connect(store.socket_path())?;
    cairn_proto::send(&mut s, &Request::UpcallChannel { slot, slot_gen })?;
    match cairn_proto::recv::<Response>(&mut s)? {
        Response::Ok => Ok(s),
        r => Err(response_error("open the upcall channel", r)),
    }
}

/// The upcall thread: answers revocations; when the channel breaks, re-attaches and
/// reopens it (with a growing delay) until the client goes away.
fn upcall_loop(weak: Weak<Inner>, mut s: UnixStream) {
    loop {
        let up = cairn_proto::recv::<Upcall>(&mut s);
        if let Ok(Upcall::RecallLocks { ino }) = up {
            // Answered on a lock channel (`ReturnLocks`), not here.
            let Some(inner) = weak.upgrade() else { return };
            inner.locks.give_back(&inner, ino);
            continue;
        }
        if let Ok(Upcall::Revoke { ino }) = up {
            let Some(inner) = weak.upgrade() else { return };
            let (tail, open) = inner.revoke_local(ino);
            inner.tell_lease_lost(Some(ino));
            drop(inner);
            let ack = Request::UpcallAck {
                ino,
                tail_lsn: tail,
                open,
            };
            if cairn_proto::send(&mut s, &ack).is_ok() {
                continue;
            }
        }
        let mut delay = Duration::from_millis(20);
        loop {
            std::thread::sleep(delay);
            let Some(inner) = weak.upgrade() else { return };
            if inner.closing.load(Ordering::SeqCst) {
                return;
            }
            match inner.reopen_upcall() {
                Ok(ns) => {
                    s = ns;
                    break;
                }
                Err(_) => delay = (delay * 2).min(Duration::from_millis(500)),
            }
        }
    }
}

fn name_str(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

impl Inner {
    /// Connect to (or start) the daemon, register and map the slot.
    pub(crate) fn open(store: StoreDir, create: bool) -> io::Result<Inner> {
        let pid = std::process::id();
        // A daemon that dies between accepting and answering (killed, or stopping) is
        // replaced: reconnect (auto-starting a new one) for up to 10 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (conn, reg) = loop {
            let attempt = Conn::connect(&store, create)
                .and_then(|mut c| c.roundtrip(&Request::Register { pid }).map(|r| (c, r)));
            match attempt {
                Ok((c, Response::Registered(r))) => break (c, r),
                Ok((_, r)) => return Err(response_error("register with the daemon", r)),
                Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        match Inner::attach(store, create, conn, reg, pid) {
            Ok(i) => Ok(i),
            Err((e, mut conn, reg)) => {
                let _ = conn.roundtrip(&Request::Goodbye {
                    tail_lsn: reg.head_lsn,
                });
                Err(e)
            }
        }
    }

    #[allow(clippy::result_large_err)]
    fn attach(
        store: StoreDir,
        create: bool,
        conn: Conn,
        reg: Registration,
        pid: u32,
    ) -> Result<Inner, (io::Error, Conn, Registration)> {
        let r = (|| -> io::Result<(File, Area, Ring)> {
            let lock_path = store.slot_lock_path(reg.slot);
            let lock = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&lock_path)
                .map_err(|e| {
                    fs_err(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        format!("open {}: {e}", lock_path.display()),
                    )
                })?;
            lock_timeout(&lock, &lock_path)?;
            let ro = File::open(&reg.nvm_path).map_err(|e| {
                fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("open the NVM tier {}: {e}", reg.nvm_path),
                )
            })?;
            let mut area = Area::open(&ro, false)?;
            let cfg = store.load_config()?;
            cfg.apply_emulation();
            if area.layout().tiers.iter().any(|t| t.present()) {
                area.attach_tiers([cfg.ssd_path.as_deref(), cfg.hdd_path.as_deref()], false)?;
                area.set_cache(cfg.read_cache_mib << 20, cfg.readahead_kib << 10);
            }
            let l = *area.layout();
            if reg.slot >= l.nslots {
                return Err(fs_err(
                    libc::EPROTO,
                    "daemon handed out a slot out of range",
                ));
            }
            let rw = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&reg.nvm_path)?;
            let map = Mapping::new(
                &rw,
                l.client_page_off(reg.slot),
                (BLOCK_SIZE_U64 + l.ring_bytes()) as usize,
                true,
                true,
            )?;
            let ring = Ring::new(map, l.ring_bytes());
            ring.set_pid(pid)?;
            ring.set_reader_epoch(0)?;
            Ok((lock, area, ring))
        })();
        let (lock, area, ring) = match r {
            Ok(x) => x,
            Err(e) => return Err((e, conn, reg)),
        };
        let upcall = match open_upcall_channel(&store, reg.slot, reg.slot_gen) {
            Ok(u) => u,
            Err(e) => return Err((e, conn, reg)),
        };
        let lease_gen_off = area.lease_gen_off(reg.slot);
        let lease_gen = area.map().load_u64(lease_gen_off).unwrap_or(0);
        let (groups, umask) = groups_and_umask();
        let ph = area.published_head(reg.slot).unwrap_or(reg.head_lsn);
        Ok(Inner {
            conn: Mutex::new(Some(conn)),
            conn_epoch: AtomicU64::new(1),
            upcall_epoch: AtomicU64::new(1),
            upcall: Mutex::new(Some(upcall)),
            upcall_thread_fd: std::sync::atomic::AtomicI32::new(-1),
            closing: AtomicBool::new(false),
            lease_lost: std::sync::RwLock::new(None),
            lease_gen_off,
            locks: crate::lock::ClientLocks::new(store.clone(), reg.slot, reg.slot_gen),
            store,
            create,
            cred: Cred {
                uid: reg.uid,
                gid: reg.gid,
                groups,
            },
            umask: std::sync::atomic::AtomicU32::new(umask),
            nvm_path: PathBuf::from(&reg.nvm_path),
            pid,
            slot: reg.slot,
            slot_gen: reg.slot_gen,
            threshold_pct: reg.digest_threshold_pct.clamp(1, 100) as u64,
            slot_lock: lock,
            st: Mutex::new(State {
                leases: InoMap::default(),
                objs: InoMap::default(),
                attached: InoMap::default(),
                seen: Default::default(),
                lease_gen,
                revokes: 0,
                revoked_at: InoMap::default(),
                acquiring: 0,
                tail: reg.head_lsn,
                seq: reg.head_seq,
                ph: ph.max(reg.head_lsn),
                digest_pending: None,
                credits: reg.credits,
                inodes: reg.inodes,
                ov: InoMap::default(),
                spare: Vec::with_capacity(SPARE_EXTENTS),
                open: InoMap::default(),
                orphans: HashSet::new(),
                tmpfiles: HashSet::new(),
                pinned: HashSet::new(),
                buf: Vec::new(),
                long_pins: Vec::new(),
                ring,
            }),
            area,
        })
    }

    pub(crate) fn store_dir(&self) -> &Path {
        &self.store.path
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_conn(&self) -> MutexGuard<'_, Option<Conn>> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the state lock and catch up with the daemon's progress: the slot's
    /// `lease_gen` (one atomic load; when it changed, every lease and cached state is
    /// dropped) and the published head.
    pub(crate) fn begin(&self) -> io::Result<MutexGuard<'_, State>> {
        let mut st = self.lock_state();
        let g = self.area.map().load_u64(self.lease_gen_off)?;
        if g != st.lease_gen {
            self.leases_lost(&mut st, g);
        }
        self.refresh(&mut st)?;
        Ok(st)
    }

    /// The daemon took every lease away (expiry, or a restart we did not re-attach to
    /// in time): have our log digested (best effort: the daemon digested its committed
    /// part already when it expired us), then forget the leases and the overlay.
    fn leases_lost(&self, st: &mut State, g: u64) {
        st.lease_gen = g;
        self.tell_lease_lost(None);
        st.leases.clear();
        st.objs.clear();
        let _ = self.digest_wait(st);
        st.ov.clear();
    }

    /// Run an operation under the state lock. When it needs a lease this client does
    /// not hold, the lock is released, the lease acquired (waiting for the daemon's
    /// grant while other threads and the upcall thread proceed) and the operation run
    /// again from the start, so every lease it uses is checked under the lock it logs
    /// under.
    pub(crate) fn run<T>(&self, mut f: impl FnMut(&mut State) -> io::Result<T>) -> io::Result<T> {
        loop {
            let mut st = self.begin()?;
            st.seen.get_mut().clear();
            match f(&mut st) {
                Err(e) => match as_need_lease(&e) {
                    Some((ino, write)) => {
                        let snap = st.revokes;
                        st.acquiring += 1;
                        drop(st);
                        self.acquire(ino, write, snap)?;
                    }
                    None if is_stale(&e) => {
                        drop(st);
                        std::thread::yield_now();
                    }
                    None => return Err(e),
                },
                ok => return ok,
            }
        }
    }

    /// Check that the lease `write` (or any lease) on `ino` is held.
    #[inline]
    pub(crate) fn need(&self, st: &State, ino: u64, write: bool) -> io::Result<()> {
        match st.leases.get(&ino) {
            Some(Lease::Write) => Ok(()),
            Some(Lease::Read) if !write => Ok(()),
            Some(Lease::Mediated) => {
                let mut seen = st.seen.borrow_mut();
                if let std::collections::hash_map::Entry::Vacant(v) = seen.entry(ino) {
                    v.insert(self.area.inode_seq(ino)?);
                }
                Ok(())
            }
            _ => Err(need_lease(ino, write)),
        }
    }

    /// Ask the daemon for a lease (without the state lock) and record the grant.
    fn acquire(&self, ino: u64, write: bool, snap: u64) -> io::Result<()> {
        let r = self.lease_request(ino, write);
        let mut st = self.lock_state();
        st.acquiring -= 1;
        let crossed = st.revoked_at.get(&ino).is_some_and(|&r| r > snap);
        if st.acquiring == 0 {
            st.revoked_at.clear();
        }
        // A revocation of this inode processed after we asked may have been for this
        // very grant: ask again rather than trust it.
        match r? {
            Response::Leased { .. } => {
                if !crossed {
                    // A read grant does not take away a write lease we hold.
                    let l = st.leases.entry(ino).or_insert(Lease::Read);
                    if write {
                        *l = Lease::Write;
                    } else if *l != Lease::Write {
                        *l = Lease::Read;
                    }
                    self.learn_object(&mut st, ino, write);
                }
                Ok(())
            }
            Response::Mediated { .. } => {
                if !crossed {
                    st.leases.insert(ino, Lease::Mediated);
                    self.learn_object(&mut st, ino, false);
                }
                Ok(())
            }
            r => Err(response_error("lease", r)),
        }
    }

    fn lease_request(&self, ino: u64, write: bool) -> io::Result<Response> {
        let req = Request::Lease { ino, write };
        let mut last = None;
        for _ in 0..2 {
            {
                let mut conn = self.lock_conn();
                if let Some(c) = conn.as_mut() {
                    match c.roundtrip(&req) {
                        Ok(r) => return Ok(r),
                        Err(e) => {
                            *conn = None;
                            last = Some(e);
                        }
                    }
                }
            }
            // Re-attach: the state lock first, then the connection.
            let mut st = self.lock_state();
            let mut conn = self.lock_conn();
            if conn.is_none() {
                self.reattach_patiently(&mut st, &mut conn)?;
            }
        }
        Err(fs_err(
            libc::EIO,
            format!(
                "lost the connection to the daemon: {}",
                last.map_or_else(|| "re-attach failed".to_string(), |e| e.to_string())
            ),
        ))
    }

    /// Run the lease-lost hook, if one is installed (it must not call into this client:
    /// it may run under the state lock).
    fn tell_lease_lost(&self, ino: Option<u64>) {
        if let Some(h) = &*self.lease_lost.read().unwrap_or_else(|p| p.into_inner()) {
            h(ino);
        }
    }

    pub(crate) fn set_lease_lost_hook(&self, h: Option<LeaseLostHook>) {
        *self.lease_lost.write().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// The upcall thread: a revocation of the lease on `ino`. Drops the lease and the
    /// inode's overlay under the state lock (no call on it is in progress) and returns
    /// the log tail to answer with, and whether the inode is open here (then the daemon
    /// pins it, and the last close unpins it).
    fn revoke_local(&self, ino: u64) -> (u64, bool) {
        let mut st = self.lock_state();
        let open = st.open.contains_key(&ino);
        if open {
            st.pinned.insert(ino);
        }
        st.drop_lease(ino);
        if let Some(o) = st.ov.remove(&ino) {
            recycle(&mut st.spare, o);
        }
        st.revokes += 1;
        if st.acquiring > 0 {
            let n = st.revokes;
            st.revoked_at.insert(ino, n);
        }
        (st.tail, open)
    }

    /// Start the upcall thread (once, after the `Inner` is shared).
    pub(crate) fn start_upcalls(this: &Arc<Inner>) -> io::Result<()> {
        let Some(ch) = this
            .upcall
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|u| u.try_clone())
            .transpose()?
        else {
            return Ok(());
        };
        let weak = Arc::downgrade(this);
        this.upcall_thread_fd
            .store(std::os::fd::AsRawFd::as_raw_fd(&ch), Ordering::SeqCst);
        std::thread::Builder::new()
            .name("cairn-upcalls".into())
            .spawn(move || upcall_loop(weak, ch))?;
        Ok(())
    }

    /// In a child after `fork`: close the descriptors this client shares with its parent
    /// (daemon connections, the slot lock) without a word to the daemon, so that the
    /// parent's death is seen when the parent dies. The caller then leaks the `Inner`.
    /// Lock requests another thread had in flight at the fork keep their channel open.
    pub(crate) fn abandon(&self) {
        use std::os::fd::AsRawFd;
        if let Ok(mut c) = self.conn.try_lock() {
            drop(c.take());
        }
        if let Ok(mut u) = self.upcall.try_lock() {
            drop(u.take());
        }
        let t = self.upcall_thread_fd.swap(-1, Ordering::SeqCst);
        if t >= 0 {
            cairn_media::sys::close_abandoned(t);
        }
        self.locks.abandon();
        cairn_media::sys::close_abandoned(self.slot_lock.as_raw_fd());
    }

    /// The upcall channel broke (the daemon stopped or died): re-attach if the main
    /// connection has not been renewed since the channel was opened (without starting a
    /// daemon), then open a new channel.
    fn reopen_upcall(&self) -> io::Result<UnixStream> {
        let mut st = self.lock_state();
        let mut conn = self.lock_conn();
        if conn.is_none()
            || self.conn_epoch.load(Ordering::SeqCst) == self.upcall_epoch.load(Ordering::SeqCst)
        {
            *conn = None;
            self.reattach(&mut st, &mut conn, false)?;
        }
        let ch = open_upcall_channel(&self.store, self.slot, self.slot_gen)?;
        self.upcall_epoch
            .store(self.conn_epoch.load(Ordering::SeqCst), Ordering::SeqCst);
        *self.upcall.lock().unwrap_or_else(|p| p.into_inner()) = Some(ch.try_clone()?);
        Ok(ch)
    }

    /// Read the published head (one atomic load) and drop the overlay entries it passed.
    fn refresh(&self, st: &mut State) -> io::Result<()> {
        let ph = self.area.published_head(self.slot)?;
        if ph > st.ph {
            st.ph = ph;
            let st = &mut *st;
            for (_, o) in st.ov.extract_if(|_, o| o.tag <= ph) {
                recycle(&mut st.spare, o);
            }
            for o in st.ov.values_mut() {
                o.ext.prune(ph);
                o.dir.retain(|_, e| e.1 > ph);
            }
            if st.digest_pending.is_some_and(|p| ph >= p) {
                st.digest_pending = None;
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- daemon requests

    /// Re-attach to a restarted daemon (`start`: starting one if none runs), sending
    /// the leases held (none if `lease_gen` changed: `begin` drops them).
    fn reattach(&self, st: &mut State, conn: &mut Option<Conn>, start: bool) -> io::Result<()> {
        let mut c = if start {
            Conn::connect(&self.store, self.create)?
        } else {
            Conn::connect_only(&self.store)?
        };
        let g = self.area.map().load_u64(self.lease_gen_off)?;
        // Shared-write mode does not outlive the daemon: those inodes are leased anew.
        st.leases.retain(|_, l| *l != Lease::Mediated);
        let State { objs, leases, .. } = &mut *st;
        objs.retain(|i, _| leases.contains_key(i));
        let leases = if g == st.lease_gen {
            st.leases
                .iter()
                .map(|(&i, &l)| (i, l == Lease::Write))
                .collect()
        } else {
            Vec::new()
        };
        match c.roundtrip(&Request::Reattach {
            pid: self.pid,
            slot: self.slot,
            slot_gen: self.slot_gen,
            leases,
            pinned: st.pinned.iter().copied().collect(),
        })? {
            Response::Registered(reg) => {
                st.inodes = reg.inodes;
                st.credits = reg.credits;
                st.digest_pending = None;
                *conn = Some(c);
                self.conn_epoch.fetch_add(1, Ordering::SeqCst);
                self.locks.forget_delegations();
                Ok(())
            }
            r => Err(response_error("reattach to the restarted daemon", r)),
        }
    }

    /// [`Inner::reattach`], starting a daemon if none runs, for up to 10 s while the
    /// daemon is stopping (`ESHUTDOWN`) or goes away during the re-attach (killed: the
    /// next attempt starts another).
    fn reattach_patiently(&self, st: &mut State, conn: &mut Option<Conn>) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.reattach(st, conn, true) {
                Err(e)
                    if (cairn_area::errno_of(&e) == libc::ESHUTDOWN || transient(&e))
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                r => return r,
            }
        }
    }

    /// One request/response, reconnecting (and re-attaching) once if the daemon went away.
    fn request(&self, st: &mut State, req: &Request) -> io::Result<Response> {
        // A daemon that is stopping answers ESHUTDOWN: wait for it to go and re-attach
        // to the next one (started on demand), for up to 10 s.
        let deadline = Instant::now() + Duration::from_secs(10);
        let stopping = |errno: i32| errno == libc::ESHUTDOWN && Instant::now() < deadline;
        let mut lost = 0;
        let mut conn = self.lock_conn();
        loop {
            if conn.is_none() {
                self.reattach_patiently(st, &mut conn)?;
            }
            let c = conn.as_mut().expect("connected");
            match c.roundtrip(req) {
                Ok(Response::Error { errno, .. }) if stopping(errno) => {
                    *conn = None;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(r) => return Ok(r),
                Err(e) => {
                    *conn = None;
                    lost += 1;
                    if lost >= 2 {
                        return Err(fs_err(
                            libc::EIO,
                            format!("lost the connection to the daemon: {e}"),
                        ));
                    }
                }
            }
        }
    }

    /// Ask for an asynchronous digest once the log passes the threshold.
    fn maybe_request_digest(&self, st: &mut State) {
        if st.digest_pending.is_some() {
            return;
        }
        let used = st.tail - st.ph;
        if used * 100 <= self.threshold_pct * st.ring.bytes() {
            return;
        }
        let mut conn = self.lock_conn();
        if conn.is_none() && self.reattach(st, &mut conn, true).is_err() {
            return;
        }
        let req = Request::Digest {
            upto_lsn: st.tail,
            wait: false,
        };
        match conn.as_mut().expect("connected").send_only(&req) {
            Ok(()) => st.digest_pending = Some(st.tail),
            Err(_) => *conn = None,
        }
    }

    /// Digest the whole log now and wait for it.
    pub(crate) fn digest_wait(&self, st: &mut State) -> io::Result<()> {
        let upto = st.tail;
        match self.request(
            st,
            &Request::Digest {
                upto_lsn: upto,
                wait: true,
            },
        )? {
            Response::Digested { .. } => {}
            r => return Err(response_error("digest", r)),
        }
        self.refresh(st)
    }

    fn ensure_credits(&self, st: &mut State, need: u64) -> io::Result<()> {
        for attempt in 0..2 {
            if st.credits >= need {
                return Ok(());
            }
            // A chunk at a time, but no more than a fair share of a small store.
            let chunk = CREDIT_CHUNK.min(self.area.layout().credit_share());
            let want = chunk.max(need - st.credits);
            match self.request(st, &Request::Credits { blocks: want })? {
                Response::Credits { granted } => st.credits += granted,
                r => return Err(response_error("space credits", r)),
            }
            if st.credits >= need {
                return Ok(());
            }
            if attempt == 0 {
                self.digest_wait(st)?;
            }
        }
        Err(fs_err(
            libc::ENOSPC,
            format!(
                "no space left in the store {}: the daemon grants no more space ({} blocks \
                 of 4 KiB needed, {} held)",
                self.store.path.display(),
                need,
                st.credits
            ),
        ))
    }

    fn alloc_ino(&self, st: &mut State) -> io::Result<(u64, u64)> {
        if st.inodes.is_empty() {
            match self.request(st, &Request::Inodes { count: INODE_BATCH })? {
                Response::Inodes(v) => st.inodes = v,
                r => return Err(response_error("inode numbers", r)),
            }
            st.inodes.reverse();
        }
        let Some(ino) = st.inodes.pop() else {
            return Err(fs_err(
                libc::ENOSPC,
                format!("no free inodes left in {}", self.store.path.display()),
            ));
        };
        let old = self.area.read_inode(ino)?;
        if old.attrs.kind != Kind::Free {
            return Err(fs_err(
                libc::EIO,
                format!("the daemon handed out inode {ino}, which is in use"),
            ));
        }
        Ok((ino, old.generation + 1))
    }

    // ---------------------------------------------------------------- the log

    /// Find room for a transaction of `len` bytes: wrap to the next lap if it would
    /// straddle the end, wait for a digest if the ring is full. Returns its LSN.
    fn reserve(&self, st: &mut State, len: usize) -> io::Result<u64> {
        let ring = st.ring.bytes();
        let len = len as u64;
        for _ in 0..3 {
            let lap_left = ring - st.tail % ring;
            let start = if len > lap_left {
                st.tail + lap_left
            } else {
                st.tail
            };
            self.refresh(st)?;
            if start + len <= st.ph + ring {
                if start != st.tail {
                    st.ring.put_wrap(st.tail, st.seq)?;
                    st.seq += 1;
                    st.tail = start;
                }
                return Ok(start);
            }
            self.digest_wait(st)?;
        }
        Err(fs_err(
            libc::ENOSPC,
            "the operation log stays full (the daemon does not digest it)",
        ))
    }

    /// Append a metadata transaction and apply it to the overlay. Returns its tag.
    fn commit(&self, st: &mut State, tx: Tx) -> io::Result<u64> {
        // Every inode the transaction logs a record about needs the write lease.
        for (ino, _, _) in &tx.inodes {
            self.need(st, *ino, true)?;
        }
        for ino in tx.write.iter().map(|w| w.0).chain(tx.punch.map(|p| p.0)) {
            self.need(st, ino, true)?;
        }
        for (dir, ..) in &tx.dirents {
            self.need(st, *dir, true)?;
        }
        // Inodes in shared-write mode: the daemon commits the transaction.
        let written = tx.inodes.iter().map(|e| e.0);
        let written = written.chain(tx.write.iter().map(|w| w.0));
        let written = written.chain(tx.punch.map(|p| p.0));
        let med = Self::claims(st, written.chain(tx.dirents.iter().map(|d| d.0)));
        let mut recs: Vec<Record<'_>> = Vec::new();
        for (ino, gen, a) in &tx.inodes {
            recs.push(Record::InodeSet {
                ino: *ino,
                generation: *gen,
                attrs: *a,
            });
        }
        if let Some((ino, data, size, mtime)) = &tx.write {
            recs.push(Record::Write {
                ino: *ino,
                offset: 0,
                size: *size,
                mtime: *mtime,
                data,
            });
        }
        if let Some((ino, offset, len, mtime)) = tx.punch {
            recs.push(Record::Punch {
                ino,
                offset,
                len,
                mtime,
            });
        }
        for (dir, name, ino, kind) in &tx.dirents {
            recs.push(Record::DirentSet {
                dir: *dir,
                name,
                ino: *ino,
                kind: *kind,
            });
        }
        let payload: usize = recs.iter().map(|r| r.encoded_len()).sum();
        let len = txn_len(payload);
        if len as u64 > st.ring.bytes() / 4 {
            return Err(fs_err(
                libc::E2BIG,
                "transaction larger than a quarter of the log",
            ));
        }
        let mut buf = std::mem::take(&mut st.buf);
        buf.clear();
        buf.resize(len, 0);
        let mut off = TXN_HEADER;
        let mut data_off = 0;
        for r in &recs {
            if matches!(r, Record::Write { .. }) {
                data_off = off + WRITE_HEADER_LEN;
            }
            r.encode_into(&mut buf[off..]);
            off += r.encoded_len();
        }
        let lsn = match self.reserve(st, len) {
            Ok(l) => l,
            Err(e) => {
                st.buf = buf;
                return Err(e);
            }
        };
        seal_txn(&mut buf, KIND_COMMIT, st.seq, recs.len() as u32);
        if !med.is_empty() {
            buf[..4].fill(0);
        }
        let put = st.ring.put_txn(lsn, &buf);
        st.buf = buf;
        put?;
        fence();
        if !med.is_empty() {
            self.commit_mediated(st, lsn, len, &med)?;
        }
        // Committed.
        for &(kind, ino, gen) in &tx.gone {
            self.drop_rendezvous(kind, ino, gen);
        }
        if !med.is_empty() {
            st.seq += 1;
            st.tail = lsn + len as u64;
            // Digested: nothing of it (or before it) belongs in the overlay. (Committed:
            // no error may make the caller run the operation again.)
            let _ = self.refresh(st);
            return Ok(st.tail);
        }
        st.seq += 1;
        st.tail = lsn + len as u64;
        let tag = st.tail;
        // The overlay.
        for (ino, gen, a) in &tx.inodes {
            let o = st
                .ov
                .entry(*ino)
                .or_insert_with(|| InodeOv::new(*gen, *a, tag, &mut st.spare));
            o.gen = *gen;
            o.attrs = *a;
            o.tag = tag;
            if a.nlink == 0 {
                o.ext.clear();
                o.dir.clear();
            }
        }
        for &(ino, start, end) in &tx.zero {
            if let Some(o) = st.ov.get_mut(&ino) {
                o.ext.insert(start, end, Src::Zero, tag);
            }
        }
        if let Some((ino, data, _, _)) = &tx.write {
            if let Some(o) = st.ov.get_mut(ino) {
                o.ext
                    .insert(0, data.len() as u64, Src::Log(lsn + data_off as u64), tag);
            }
        }
        for (dir, name, ino, kind) in tx.dirents {
            if let Some(o) = st.ov.get_mut(&dir) {
                let e = (ino != 0).then_some((ino, kind));
                o.dir.insert(name, (e, tag));
                o.tag = tag;
            }
        }
        self.maybe_request_digest(st);
        Ok(tag)
    }

    /// The `Commit` claims of a transaction writing `inos`: each shared-write inode with
    /// the sequence word it had before the operation read it.
    fn claims(st: &State, inos: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
        let seen = st.seen.borrow();
        let mut med: Vec<(u64, u64)> = Vec::new();
        for ino in inos {
            if st.leases.get(&ino) == Some(&Lease::Mediated) && !med.iter().any(|m| m.0 == ino) {
                // `need` recorded it (0, never a published word, if it did not).
                med.push((ino, seen.get(&ino).copied().unwrap_or(0)));
            }
        }
        med
    }

    /// Shared-write mode (PROTOCOL.md, "Commit"): have the daemon seal and digest the
    /// transaction of `len` bytes just written unsealed at `lsn`, claiming the sequence
    /// words `med`. `Ok`: committed and digested. `Err(Stale)`: not committed (the caller
    /// runs the operation again). If the daemon went away meanwhile, the transaction's
    /// magic tells whether it was sealed: then it is committed (and digested at the
    /// re-attach).
    fn commit_mediated(
        &self,
        st: &mut State,
        lsn: u64,
        len: usize,
        med: &[(u64, u64)],
    ) -> io::Result<()> {
        let req = Request::Commit {
            lsn,
            len: len as u32,
            seq: st.seq,
            versions: med.to_vec(),
        };
        match self.request(st, &req) {
            Ok(Response::Committed { ended }) => {
                for ino in ended {
                    st.leases.insert(ino, Lease::Read);
                }
                Ok(())
            }
            Ok(Response::Stale { ended }) => {
                for ino in ended {
                    st.drop_lease(ino);
                }
                Err(io::Error::other(Stale))
            }
            r => {
                if st.ring.is_sealed(lsn)? {
                    for (ino, _) in med {
                        st.drop_lease(*ino);
                    }
                    return Ok(());
                }
                match r {
                    Ok(r) => Err(response_error("commit", r)),
                    // Not sealed: not committed. The daemon went away while it was
                    // restarting: run the operation again (it re-attaches).
                    Err(e) if transient(&e) => {
                        for (ino, _) in med {
                            st.drop_lease(*ino);
                        }
                        Err(io::Error::other(Stale))
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// The write path: `WRITE` transactions encoded straight into the ring. `pos`
    /// `None` appends at the current size. Returns the offset just past the data written
    /// and the number of bytes written (fewer than asked only when a write split into
    /// several transactions failed part-way).
    pub(crate) fn write_data(
        &self,
        st: &mut State,
        ino: u64,
        pos: Option<u64>,
        data: &[u8],
    ) -> io::Result<(u64, usize)> {
        let (end, n) = self.write_logged(st, ino, pos, data)?;
        if n > 0 {
            if let Some(o) = st.objs.get(&ino) {
                // The file has a map object (`mapobj`): the mappings see the write too.
                std::os::unix::fs::FileExt::write_all_at(&**o, &data[..n], end - n as u64)
                    .map_err(|e| fs_err(libc::EIO, format!("write to the map object: {e}")))?;
            }
        }
        Ok((end, n))
    }

    /// [`Inner::write_data`] to the log only.
    fn write_logged(
        &self,
        st: &mut State,
        ino: u64,
        pos: Option<u64>,
        data: &[u8],
    ) -> io::Result<(u64, usize)> {
        self.need(st, ino, true)?;
        let (gen, mut attrs) = self.attrs_held(st, ino)?;
        match attrs.kind {
            Kind::File => {}
            Kind::Dir => return Err(fs_err(libc::EISDIR, "write: is a directory")),
            _ => return Err(fs_err(libc::EINVAL, "write: not a regular file")),
        }
        let mut off = pos.unwrap_or(attrs.size);
        if data.is_empty() {
            return Ok((off, 0));
        }
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(fs_err(
                libc::EFBIG,
                format!("write: beyond the largest file size ({MAX_FILE_SIZE} bytes)"),
            ));
        }
        // After the checks that refuse the write, as Linux's file_remove_privs.
        if self.kill_privs(st, ino, &attrs)? {
            (_, attrs) = self.attrs_held(st, ino)?;
        }
        let max = (st.ring.bytes() / 4) as usize - 128;
        let mut done = 0;
        while done < data.len() {
            let med = Self::claims(st, [ino]);
            let med = (!med.is_empty()).then_some(med);
            let n = max.min(data.len() - done);
            let chunk = &data[done..done + n];
            let charge = write_charge(off, n as u64);
            // A write split into several transactions that fails part-way returns the
            // bytes already committed (a short write), as POSIX requires.
            let partial = |e: io::Error| if done > 0 { Ok((off, done)) } else { Err(e) };
            if st.credits < charge {
                if let Err(e) = self.ensure_credits(st, charge) {
                    return partial(e);
                }
            }
            let size = attrs.size.max(off + n as u64);
            let now = now_ns();
            let tlen = write_txn_len(n);
            let lsn = match self.reserve(st, tlen) {
                Ok(l) => l,
                Err(e) => return partial(e),
            };
            st.ring
                .put_write(lsn, st.seq, ino, off, size, now, chunk, med.is_none())?;
            fence();
            if let Some(med) = &med {
                if let Err(e) = self.commit_mediated(st, lsn, tlen, med) {
                    return partial(e);
                }
            }
            st.seq += 1;
            st.tail = lsn + tlen as u64;
            st.credits -= charge;
            let tag = st.tail;
            attrs.size = size;
            attrs.mtime = now;
            attrs.ctime = now;
            if med.is_some() {
                // Committed: from here no error may make the caller write it again.
                let _ = self.refresh(st);
                off += n as u64;
                done += n;
                if done < data.len() {
                    // The next part is checked against what the inode is now.
                    st.seen.get_mut().remove(&ino);
                    match self
                        .need(st, ino, true)
                        .and_then(|_| self.attrs_held(st, ino))
                    {
                        Ok((_, a)) => attrs = a,
                        Err(_) => return Ok((off, done)),
                    }
                }
                continue;
            }
            let o = st
                .ov
                .entry(ino)
                .or_insert_with(|| InodeOv::new(gen, attrs, tag, &mut st.spare));
            o.attrs = attrs;
            o.tag = tag;
            o.ext
                .insert(off, off + n as u64, Src::Log(lsn + WRITE_HEAD as u64), tag);
            self.maybe_request_digest(st);
            off += n as u64;
            done += n;
        }
        Ok((off, done))
    }

    // ---------------------------------------------------------------- reading state

    /// Generation and attributes of `ino`: the overlay, else the shared area (a lease
    /// on it is needed).
    fn attrs(&self, st: &State, ino: u64) -> io::Result<(u64, Attrs)> {
        self.need(st, ino, false)?;
        self.attrs_held(st, ino)
    }

    /// [`Inner::attrs`] when the caller checked the lease.
    fn attrs_held(&self, st: &State, ino: u64) -> io::Result<(u64, Attrs)> {
        if let Some(o) = st.ov.get(&ino) {
            // Unlinked here, unless it is open here (our own orphan, or one another
            // process unlinked while the daemon had it pinned for us).
            if o.attrs.nlink == 0 && !st.orphans.contains(&ino) && !st.pinned.contains(&ino) {
                return Err(fs_err(libc::ENOENT, format!("inode {ino} was removed")));
            }
            return Ok((o.gen, o.attrs));
        }
        let i = self.area.read_inode(ino)?;
        if i.attrs.kind == Kind::Free {
            return Err(fs_err(libc::ENOENT, format!("inode {ino} was removed")));
        }
        Ok((i.generation, i.attrs))
    }

    /// [`Inner::metadata_of`] as a call.
    pub(crate) fn metadata_ino(&self, ino: u64) -> io::Result<Metadata> {
        if !self.area.layout().ino_valid(ino) {
            return Err(fs_err(
                libc::EINVAL,
                format!("inode number {ino} out of range"),
            ));
        }
        self.run(|st| self.metadata_of(st, ino))
    }

    pub(crate) fn metadata_of(&self, st: &State, ino: u64) -> io::Result<Metadata> {
        let (gen, mut attrs) = self.attrs(st, ino)?;
        let shared = self.area.read_inode(ino)?;
        let mut blocks = if shared.generation == gen && shared.attrs.kind != Kind::Free {
            shared.blocks * 8
        } else {
            0
        };
        if st.ov.get(&ino).is_some_and(|o| !o.ext.is_empty()) {
            blocks = blocks.max(attrs.size.div_ceil(BLOCK_SIZE_U64) * 8);
        }
        if st.orphans.contains(&ino) {
            attrs.nlink = 0;
        }
        Ok(Metadata { ino, attrs, blocks })
    }

    /// Look `name` up in directory `dir`.
    fn lookup(&self, st: &State, dir: u64, name: &[u8]) -> io::Result<Option<(u64, Kind)>> {
        self.need(st, dir, false)?;
        let mut gen = None;
        if let Some(o) = st.ov.get(&dir) {
            if let Some((e, _)) = o.dir.get(name) {
                return Ok(*e);
            }
            if o.attrs.kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, "lookup in a non-directory"));
            }
            gen = Some(o.gen);
        }
        let _pin = Pin::new(&self.area, &st.ring, st.pin_floor())?;
        let inode = self.area.read_inode(dir)?;
        match gen {
            Some(g) if g != inode.generation || inode.attrs.kind != Kind::Dir => Ok(None),
            _ => self.area.dir_lookup(&inode, name),
        }
    }

    /// Every entry of directory `dir`: the shared listing merged with the overlay.
    fn list(&self, st: &State, dir: u64) -> io::Result<Vec<(Vec<u8>, u64, Kind)>> {
        self.need(st, dir, false)?;
        let o = st.ov.get(&dir);
        let mut out = Vec::new();
        {
            let _pin = Pin::new(&self.area, &st.ring, st.pin_floor())?;
            let inode = self.area.read_inode(dir)?;
            let fresh = o.is_some_and(|o| o.gen != inode.generation);
            if inode.attrs.kind == Kind::Dir && !fresh {
                for e in self.area.dir_list(&inode)? {
                    if o.is_some_and(|o| o.dir.contains_key(&e.name)) {
                        continue;
                    }
                    out.push((e.name, e.ino, e.kind));
                }
            }
        }
        if let Some(o) = o {
            for (name, (e, _)) in &o.dir {
                if let Some((ino, kind)) = e {
                    out.push((name.clone(), *ino, *kind));
                }
            }
        }
        Ok(out)
    }

    fn dir_is_empty(&self, st: &State, dir: u64) -> io::Result<bool> {
        Ok(self.list(st, dir)?.is_empty())
    }

    /// Read file data of `ino` at `off` into `buf`: overlay ranges from the ring, the
    /// rest from the shared area (zeros beyond its size). Returns the bytes read.
    pub(crate) fn read_data(
        &self,
        st: &State,
        ino: u64,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        self.need(st, ino, false)?;
        if let Some(o) = st.objs.get(&ino) {
            // The file has a map object (`mapobj`): it holds the current bytes.
            let (_, attrs) = self.attrs_held(st, ino)?;
            if off >= attrs.size || buf.is_empty() {
                return Ok(0);
            }
            let n = (buf.len() as u64).min(attrs.size - off) as usize;
            mapobj::read_full(o, &mut buf[..n], off)?;
            return Ok(n);
        }
        self.read_logged(st, ino, off, buf)
    }

    /// [`Inner::read_data`] from the log and the shared area, never the map object.
    fn read_logged(&self, st: &State, ino: u64, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let (gen, attrs) = self.attrs(st, ino)?;
        if attrs.kind == Kind::Dir {
            return Err(fs_err(libc::EISDIR, "read: is a directory"));
        }
        if off >= attrs.size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(attrs.size - off) as usize;
        let buf = &mut buf[..n];
        let mut shared = SharedFile {
            area: &self.area,
            ring: &st.ring,
            floor: st.pin_floor(),
            ino,
            gen,
            state: None,
        };
        match st.ov.get(&ino).filter(|o| !o.ext.is_empty()) {
            None => shared.read(off, buf)?,
            Some(o) => {
                for seg in o.ext.segments(off, off + n as u64) {
                    let dst = &mut buf[(seg.start - off) as usize..(seg.end - off) as usize];
                    match seg.src {
                        Some(Src::Log(l)) => st.ring.read(l, dst)?,
                        Some(Src::Zero) => dst.fill(0),
                        None => shared.read(seg.start, dst)?,
                    }
                }
            }
        }
        Ok(n)
    }

    /// `lseek`'s `SEEK_DATA` (`data`) or `SEEK_HOLE` from `off` in file `ino`, at block
    /// granularity as ext4 reports: a 4 KiB block is data if any byte of it was written
    /// (logged here, or digested and mapped), a hole otherwise; the end of the file counts
    /// as a hole. `ENXIO` at or beyond the end, or when no data follows.
    pub(crate) fn seek_data(&self, st: &State, ino: u64, off: u64, data: bool) -> io::Result<u64> {
        const B: u64 = BLOCK_SIZE_U64;
        let (gen, attrs) = self.attrs(st, ino)?;
        if attrs.kind == Kind::Dir {
            return Err(fs_err(
                libc::EISDIR,
                "lseek: SEEK_DATA/SEEK_HOLE on a directory",
            ));
        }
        let size = attrs.size;
        if off >= size {
            return Err(fs_err(
                libc::ENXIO,
                "lseek: offset at or beyond the end of the file",
            ));
        }
        let nblocks = size.div_ceil(B);
        // The map is read under a pin: its blocks are not reused meanwhile.
        let _pin = Pin::new(&self.area, &st.ring, st.pin_floor())?;
        let shared = self.area.read_inode(ino)?;
        let shared =
            (shared.generation == gen && shared.attrs.kind != Kind::Free).then_some(shared);
        let shared_next = |from: u64, to: u64, want: bool| match &shared {
            Some(i) => self.area.next_block(i, from, to, want),
            None => Ok((!want && from < to).then_some(from)),
        };
        let empty = Extents::new();
        let ov = st.ov.get(&ino).map_or(&empty, |o| &o.ext);
        let found = |b: u64| (b * B).max(off);
        let mut b = off / B;
        while b < nblocks {
            // Blocks before the next one the overlay touches are the shared file's alone.
            let seg = ov.segments(b * B, size).find(|s| s.src.is_some());
            let touched = seg.as_ref().map_or(nblocks, |s| s.start / B);
            if b < touched {
                if let Some(x) = shared_next(b, touched, data)? {
                    return Ok(found(x));
                }
                b = touched;
                continue;
            }
            let seg = seg.expect("a block the overlay touches has a segment");
            // Whole blocks inside one overlay piece: logged bytes are data, zeros a hole.
            let logged = matches!(seg.src, Some(Src::Log(_)));
            let whole_end = if logged {
                seg.end.div_ceil(B)
            } else {
                seg.end / B
            };
            if seg.start <= b * B && whole_end > b {
                if logged == data {
                    return Ok(found(b));
                }
                b = whole_end;
                continue;
            }
            // A block shared between pieces: data if any of it is logged or mapped.
            let (bs, be) = (b * B, ((b + 1) * B).min(size));
            let mut is_data = false;
            for s in ov.segments(bs, be) {
                is_data |= match s.src {
                    Some(Src::Log(_)) => true,
                    Some(Src::Zero) => false,
                    None => shared_next(b, b + 1, true)?.is_some(),
                };
            }
            if is_data == data {
                return Ok(found(b));
            }
            b += 1;
        }
        if data {
            Err(fs_err(libc::ENXIO, "lseek: no data after the offset"))
        } else {
            Ok(size)
        }
    }

    /// Where each 4 KiB page of `pages` pages from `off` (a multiple of 4096) of file
    /// `ino` lies, for mapping it in place: `Some(offset in the NVM tier file)` for a
    /// whole page of digested data inside the file, `None` for a page to read (logged
    /// and not digested, a hole, the file's last partial page, beyond its end). When a
    /// page is `Some`, the epoch returned is pinned — the blocks stay until
    /// [`Inner::map_unpin`] — so the pin is taken before the map is read.
    pub(crate) fn map_plan(
        &self,
        st: &mut State,
        ino: u64,
        off: u64,
        pages: usize,
    ) -> io::Result<(Vec<Option<u64>>, Option<u64>)> {
        let (gen, attrs) = self.attrs(st, ino)?;
        if attrs.kind != Kind::File {
            return Err(fs_err(libc::ENODEV, "mmap: not a regular file"));
        }
        if st.objs.contains_key(&ino) {
            // The current bytes are the map object's: nothing maps NVM in place.
            return Ok((vec![None; pages], None));
        }
        let e = self.area.global_epoch()?;
        st.long_pins.push(e);
        st.ring.set_reader_epoch(st.pin_floor())?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let plan = (|| -> io::Result<Vec<Option<u64>>> {
            let mut plan = vec![None; pages];
            let inode = self.area.read_inode(ino)?;
            if inode.generation != gen || inode.attrs.kind != Kind::File {
                return Ok(plan);
            }
            let ov = st.ov.get(&ino).filter(|o| !o.ext.is_empty());
            for (i, p) in plan.iter_mut().enumerate() {
                let start = off + (i as u64) * BLOCK_SIZE_U64;
                let end = start + BLOCK_SIZE_U64;
                if end > attrs.size || end > inode.attrs.size {
                    break;
                }
                if ov.is_some_and(|o| o.ext.segments(start, end).any(|s| s.src.is_some())) {
                    continue;
                }
                // Only NVM blocks can be mapped in place; lower-tier data is read.
                match self.area.block_of(&inode, start / BLOCK_SIZE_U64)? {
                    Some(blk) if cairn_format::map::entry_tier(blk) == 0 => {
                        *p = Some(blk * BLOCK_SIZE_U64)
                    }
                    _ => {}
                }
            }
            Ok(plan)
        })();
        let keep = plan.as_ref().is_ok_and(|p| p.iter().any(Option::is_some));
        if !keep {
            self.unpin_epoch(st, e)?;
        }
        Ok((plan?, keep.then_some(e)))
    }

    /// A mapping pinned by [`Inner::map_plan`] at epoch `e` is gone.
    pub(crate) fn map_unpin(&self, st: &mut State, e: u64) -> io::Result<()> {
        self.unpin_epoch(st, e)
    }

    fn unpin_epoch(&self, st: &mut State, e: u64) -> io::Result<()> {
        if let Some(i) = st.long_pins.iter().position(|&x| x == e) {
            st.long_pins.swap_remove(i);
        }
        st.ring.set_reader_epoch(st.pin_floor())
    }

    // ---------------------------------------------------------------- path resolution

    /// Resolve `p` from the root. `follow_last`: follow a symlink in the last component
    /// (a trailing `/` always does).
    pub(crate) fn walk(
        &self,
        st: &State,
        p: At<'_>,
        follow_last: bool,
        op: &str,
    ) -> io::Result<Walk> {
        if p.is_inode() {
            if !self.area.layout().ino_valid(p.dir) {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: inode number {} out of range", p.dir),
                ));
            }
            let (_, a) = self.attrs(st, p.dir)?;
            return Ok(Walk {
                parent: p.dir,
                name: None,
                found: Some((p.dir, a.kind)),
                trailing_slash: false,
            });
        }
        let parsed = path::parse(p.path, op)?;
        let trailing_slash = parsed.trailing_slash;
        let mut stack: Vec<Comp> = parsed.comps;
        stack.reverse();
        let mut cur = if parsed.absolute { ROOT_INO } else { p.dir };
        let mut parent = cur;
        let mut name: Option<Vec<u8>> = None;
        let mut kind = Kind::Dir;
        let mut links = 0u32;
        while let Some(c) = stack.pop() {
            let is_last = stack.is_empty();
            // `cur` must be a searchable directory.
            let (_, da) = self.attrs(st, cur)?;
            if da.kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            if !self.cred.may(&da, X) {
                return Err(fs_err(
                    libc::EACCES,
                    format!("{op}: search permission denied"),
                ));
            }
            match c {
                Comp::Cur => {
                    parent = cur;
                    name = None;
                    kind = Kind::Dir;
                }
                Comp::Parent => {
                    let up = if cur == ROOT_INO || da.parent == 0 {
                        ROOT_INO
                    } else {
                        da.parent
                    };
                    parent = up;
                    cur = up;
                    name = None;
                    kind = Kind::Dir;
                }
                Comp::Name(n) => match self.lookup(st, cur, &n)? {
                    None => {
                        if is_last {
                            return Ok(Walk {
                                parent: cur,
                                name: Some(n),
                                found: None,
                                trailing_slash,
                            });
                        }
                        return Err(fs_err(
                            libc::ENOENT,
                            format!("{op}: no such file or directory ({})", name_str(&n)),
                        ));
                    }
                    Some((ino, k)) => {
                        if k == Kind::Symlink && (!is_last || follow_last || trailing_slash) {
                            links += 1;
                            if links > MAX_SYMLINKS {
                                return Err(fs_err(
                                    libc::ELOOP,
                                    format!("{op}: too many levels of symbolic links"),
                                ));
                            }
                            let target = self.read_symlink(st, ino)?;
                            let t = path::parse_bytes(&target, op)?;
                            if t.absolute {
                                cur = ROOT_INO;
                            }
                            stack.extend(t.comps.into_iter().rev());
                            if stack.is_empty() {
                                // A target of "/" (or "/."-like): the root itself.
                                parent = ROOT_INO;
                                name = None;
                                kind = Kind::Dir;
                            }
                            continue;
                        }
                        parent = cur;
                        cur = ino;
                        kind = k;
                        name = Some(n);
                    }
                },
            }
        }
        if trailing_slash && kind != Kind::Dir {
            return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
        }
        Ok(Walk {
            parent,
            name,
            found: Some((cur, kind)),
            trailing_slash,
        })
    }

    /// The target of symlink `ino`.
    fn read_symlink(&self, st: &State, ino: u64) -> io::Result<Vec<u8>> {
        let (_, a) = self.attrs(st, ino)?;
        if a.kind != Kind::Symlink {
            return Err(fs_err(libc::EINVAL, "not a symbolic link"));
        }
        let mut v = vec![0u8; a.size.min(path::PATH_MAX as u64) as usize];
        let n = self.read_data(st, ino, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }
}

/// Lazily pinned reads of one file from the shared area (for the gaps of the overlay).
struct SharedFile<'a> {
    area: &'a Area,
    ring: &'a Ring,
    floor: u64,
    ino: u64,
    gen: u64,
    /// The pin and the shared inode, once the first gap is read.
    state: Option<(Pin<'a>, Option<Inode>)>,
}

impl SharedFile<'_> {
    /// Fill `dst` with the shared bytes at `off`: zeros beyond the shared size, or when
    /// the shared inode is not (yet) this file.
    fn read(&mut self, off: u64, dst: &mut [u8]) -> io::Result<()> {
        if self.state.is_none() {
            let pin = Pin::new(self.area, self.ring, self.floor)?;
            let i = self.area.read_inode(self.ino)?;
            let ok = i.generation == self.gen && i.attrs.kind != Kind::Free;
            self.state = Some((pin, ok.then_some(i)));
        }
        let (ring, ino) = (self.ring, self.ino);
        let got = match &self.state {
            // Reads of lower-tier data are hinted to the daemon (promotion).
            Some((_, Some(i))) => self.area.read_file_with(i, off, dst, &mut |fb| {
                let _ = ring.hint(ino, fb);
            })?,
            _ => 0,
        };
        dst[got..].fill(0);
        Ok(())
    }
}

/// Options of the file-creating operations.
pub(crate) struct CreateOpts {
    pub kind: Kind,
    pub perm: u32,
    /// Device number (device nodes only).
    pub rdev: u64,
}

impl Inner {
    fn check_parent_write(&self, st: &State, parent: u64, op: &str) -> io::Result<(u64, Attrs)> {
        self.need(st, parent, true)?;
        let (gen, pa) = self.attrs(st, parent)?;
        if pa.kind != Kind::Dir {
            return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
        }
        if !self.cred.may(&pa, W | X) {
            return Err(fs_err(
                libc::EACCES,
                format!("{op}: permission denied (no write access to the directory)"),
            ));
        }
        if pa.nlink == 0 {
            return Err(fs_err(libc::ENOENT, format!("{op}: directory was removed")));
        }
        Ok((gen, pa))
    }

    /// Create `name` in `parent` (which the caller resolved; the name does not exist).
    /// Returns the new inode number.
    fn create_in(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
        o: CreateOpts,
        symlink_target: Option<&[u8]>,
        op: &str,
    ) -> io::Result<u64> {
        let (pgen, mut pa) = self.check_parent_write(st, parent, op)?;
        if let Some(t) = symlink_target {
            let charge = write_charge(0, t.len() as u64);
            if st.credits < charge {
                self.ensure_credits(st, charge)?;
            }
        }
        let (ino, gen) = self.alloc_ino(st)?;
        // Nobody else can name it before its entry is digested: its write lease is ours
        // (the daemon records it when it digests the creation).
        st.leases.insert(ino, Lease::Write);
        let now = now_ns();
        let setgid = pa.perm & 0o2000 != 0;
        let mut perm = o.perm & 0o7777;
        if o.kind == Kind::Dir && setgid {
            perm |= 0o2000;
        }
        let a = Attrs {
            kind: o.kind,
            perm,
            uid: self.cred.uid,
            gid: if setgid { pa.gid } else { self.cred.gid },
            nlink: if o.kind == Kind::Dir { 2 } else { 1 },
            size: symlink_target.map_or(0, |t| t.len() as u64),
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            parent: if o.kind == Kind::Dir { parent } else { 0 },
            rdev: if o.kind.is_device() { o.rdev } else { 0 },
        };
        pa.mtime = now;
        pa.ctime = now;
        if o.kind == Kind::Dir {
            pa.nlink += 1;
        }
        let mut tx = Tx::default();
        tx.inode(ino, gen, a);
        if let Some(t) = symlink_target {
            tx.write = Some((ino, t.to_vec(), t.len() as u64, now));
        }
        tx.dirent(parent, name, ino, o.kind);
        tx.inode(parent, pgen, pa);
        if let Err(e) = self.commit(st, tx) {
            // Not created (a shared-write retry, or a failure): the number stays ours.
            st.drop_lease(ino);
            st.inodes.push(ino);
            return Err(e);
        }
        if let Some(t) = symlink_target {
            st.credits -= write_charge(0, t.len() as u64);
        }
        Ok(ino)
    }

    fn need_found(w: &Walk, op: &str) -> io::Result<(u64, Kind)> {
        w.found
            .ok_or_else(|| fs_err(libc::ENOENT, format!("{op}: no such file or directory")))
    }

    /// `mkdir(p, mode)`: the directory gets `mode & 0o7777` minus the umask.
    pub(crate) fn create_dir(&self, p: At<'_>, mode: u32) -> io::Result<()> {
        let op = format!("create_dir {}", p.display());
        p.named(&op)?;
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let Some(name) = w.name.filter(|_| w.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            let perm = mode & 0o7777 & !self.umask.load(Ordering::Relaxed);
            self.create_in(
                st,
                w.parent,
                &name,
                CreateOpts {
                    kind: Kind::Dir,
                    perm,
                    rdev: 0,
                },
                None,
                &op,
            )?;
            Ok(())
        })
    }

    pub(crate) fn create_dir_all(&self, p: At<'_>) -> io::Result<()> {
        let op = format!("create_dir_all {}", p.display());
        p.named(&op)?;
        let parsed = path::parse(p.path, &op)?;
        let mut prefix = PathBuf::from(if parsed.absolute { "/" } else { "." });
        for c in parsed.comps {
            match c {
                Comp::Cur => continue,
                Comp::Parent => prefix.push(".."),
                Comp::Name(n) => prefix.push(std::ffi::OsStr::from_bytes_ext(&n)),
            }
            let at = At {
                dir: p.dir,
                path: &prefix,
            };
            match self.create_dir(at, 0o777) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !self.metadata(at)?.is_dir() {
                        return Err(fs_err(
                            libc::EEXIST,
                            format!("{op}: {} exists and is not a directory", prefix.display()),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(crate) fn metadata(&self, p: At<'_>) -> io::Result<Metadata> {
        let op = format!("metadata {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, true, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.metadata_of(st, ino)
        })
    }

    pub(crate) fn symlink_metadata(&self, p: At<'_>) -> io::Result<Metadata> {
        let op = format!("symlink_metadata {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.metadata_of(st, ino)
        })
    }

    /// An extended-attribute call on the file `p` names (its symlink itself unless
    /// `follow`): answered by the daemon, which keeps attributes (ARCHITECTURE.md,
    /// "Extended attributes"), once this client holds a lease on the inode and its own
    /// records are digested, so the daemon checks the caller against current attributes.
    pub(crate) fn xattr(&self, p: At<'_>, follow: bool, op: XattrOp) -> io::Result<Response> {
        let what = match &op {
            XattrOp::Get { .. } => "getxattr",
            XattrOp::List => "listxattr",
            XattrOp::Set { .. } => "setxattr",
            XattrOp::Remove { .. } => "removexattr",
        };
        let opname = format!("{what} {}", p.display());
        // The name is checked as Linux does: its length before the path is looked up,
        // its namespace after (a call on an inode looks nothing up).
        let name = match &op {
            XattrOp::Get { name } | XattrOp::Set { name, .. } | XattrOp::Remove { name } => {
                Some(name.as_slice())
            }
            XattrOp::List => None,
        };
        let bad_name = |n: i32| {
            let shown = String::from_utf8_lossy(name.unwrap_or_default()).into_owned();
            let why = match n {
                libc::ERANGE => "the name is empty or longer than 255 bytes",
                libc::EINVAL => "the name has no part after its namespace",
                _ => "Cairn stores user., trusted. and security. attributes only",
            };
            fs_err(n, format!("{opname} {shown}: {why}"))
        };
        let check_ns = || match name.map(cairn_format::xattr::namespace) {
            Some(Err(n)) => Err(bad_name(n)),
            _ => Ok(()),
        };
        if name.is_some_and(|n| n.is_empty() || n.len() > cairn_format::xattr::NAME_MAX) {
            return Err(bad_name(libc::ERANGE));
        }
        if p.is_inode() {
            check_ns()?;
        }
        self.run(|st| {
            let w = self.walk(st, p, follow, &opname)?;
            let (ino, _) = Self::need_found(&w, &opname)?;
            check_ns()?;
            let (gen, attrs) = self.attrs(st, ino)?;
            let reads = matches!(op, XattrOp::Get { .. } | XattrOp::List);
            if reads {
                // Reads (the kernel asks for `security.capability` before every write
                // through the mount) do not digest, and most never reach the daemon: an
                // inode not digested yet has no attributes (setting one digests first),
                // nor has one the daemon has not flagged. For a flagged one the daemon
                // checks with the published attributes, which must then be ours.
                let shared = self.area.read_inode(ino)?;
                if shared.generation != gen || shared.attrs.kind == Kind::Free || !shared.xattrs {
                    return match (&op, name.map(cairn_format::xattr::namespace)) {
                        (XattrOp::Get { .. }, Some(Ok(ns))) => {
                            let n = cairn_format::xattr::check(
                                &self.cred,
                                &attrs,
                                ns,
                                cairn_format::xattr::Access::Get,
                            )
                            .err()
                            .unwrap_or(libc::ENODATA);
                            let why = match n {
                                libc::ENODATA => "no such attribute",
                                _ => "permission denied",
                            };
                            Err(fs_err(n, format!("{opname}: {why}")))
                        }
                        _ => Ok(Response::XattrNames(Vec::new())),
                    };
                }
                let a = &shared.attrs;
                if (a.perm, a.uid, a.gid) != (attrs.perm, attrs.uid, attrs.gid) {
                    self.digest_wait(st)?;
                }
            } else if st.ph < st.tail {
                self.digest_wait(st)?;
            }
            let r = self.request(
                st,
                &Request::Xattr {
                    ino,
                    op: op.clone(),
                },
            )?;
            match r {
                Response::Error { errno, message } => {
                    Err(fs_err(errno, format!("{}: {message}", p.display())))
                }
                r => Ok(r),
            }
        })
    }

    pub(crate) fn read_dir_entries(&self, p: At<'_>) -> io::Result<Vec<(Vec<u8>, u64, Kind)>> {
        let op = format!("read_dir {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, true, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            let (_, a) = self.attrs(st, ino)?;
            if !self.cred.may(&a, R) {
                return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
            }
            self.list(st, ino)
        })
    }

    /// Drop one link of `ino` (post-state into `tx`), deferring `nlink = 0` of a
    /// file that is still open in this process to its last close.
    fn unlink_inode(&self, st: &mut State, tx: &mut Tx, ino: u64, now: i64) -> io::Result<()> {
        self.need(st, ino, true)?;
        let (gen, mut a) = match tx.get(ino) {
            Some(x) => x,
            None => self.attrs(st, ino)?,
        };
        a.ctime = now;
        if a.kind == Kind::Dir {
            a.nlink = 0;
        } else {
            a.nlink = a.nlink.saturating_sub(1);
            if a.nlink == 0 && st.open.get(&ino).copied().unwrap_or(0) > 0 {
                st.orphans.insert(ino);
                return Ok(());
            }
            if a.nlink == 0 && matches!(a.kind, Kind::Fifo | Kind::Socket) {
                tx.gone.push((a.kind, ino, gen));
            }
        }
        tx.inode(ino, gen, a);
        Ok(())
    }

    fn touch_dir(&self, st: &State, tx: &mut Tx, dir: u64, now: i64, dlink: i64) -> io::Result<()> {
        self.need(st, dir, true)?;
        let (gen, mut a) = match tx.get(dir) {
            Some(x) => x,
            None => self.attrs(st, dir)?,
        };
        a.mtime = now;
        a.ctime = now;
        a.nlink = (a.nlink as i64 + dlink).max(0) as u64;
        tx.inode(dir, gen, a);
        Ok(())
    }

    fn check_sticky(&self, st: &State, dir: u64, victim: u64, op: &str) -> io::Result<()> {
        let (_, da) = self.attrs(st, dir)?;
        let (_, va) = self.attrs(st, victim)?;
        if !self.cred.sticky_ok(&da, &va) {
            return Err(fs_err(
                libc::EPERM,
                format!("{op}: operation not permitted (sticky directory)"),
            ));
        }
        Ok(())
    }

    pub(crate) fn remove_file(&self, p: At<'_>) -> io::Result<()> {
        let op = format!("remove_file {}", p.display());
        p.named(&op)?;
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind == Kind::Dir {
                return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
            }
            let Some(name) = w.name else {
                return Err(fs_err(libc::ENOENT, format!("{op}: empty path")));
            };
            self.check_parent_write(st, w.parent, &op)?;
            self.check_sticky(st, w.parent, ino, &op)?;
            let now = now_ns();
            let mut tx = Tx::default();
            self.unlink_inode(st, &mut tx, ino, now)?;
            tx.dirent(w.parent, &name, 0, Kind::Free);
            self.touch_dir(st, &mut tx, w.parent, now, 0)?;
            self.commit(st, tx)?;
            Ok(())
        })
    }

    pub(crate) fn remove_dir(&self, p: At<'_>) -> io::Result<()> {
        let op = format!("remove_dir {}", p.display());
        p.named(&op)?;
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            if ino == ROOT_INO {
                return Err(fs_err(libc::EBUSY, format!("{op}: cannot remove the root")));
            }
            let Some(name) = w.name else {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: invalid last component"),
                ));
            };
            self.check_parent_write(st, w.parent, &op)?;
            self.check_sticky(st, w.parent, ino, &op)?;
            if !self.dir_is_empty(st, ino)? {
                return Err(fs_err(
                    libc::ENOTEMPTY,
                    format!("{op}: directory not empty"),
                ));
            }
            let now = now_ns();
            let mut tx = Tx::default();
            self.unlink_inode(st, &mut tx, ino, now)?;
            tx.dirent(w.parent, &name, 0, Kind::Free);
            self.touch_dir(st, &mut tx, w.parent, now, -1)?;
            self.commit(st, tx)?;
            Ok(())
        })
    }

    pub(crate) fn remove_dir_all(&self, p: At<'_>) -> io::Result<()> {
        let m = self.symlink_metadata(p)?;
        if !m.is_dir() {
            if m.is_symlink() {
                return self.remove_file(p);
            }
            return Err(fs_err(
                libc::ENOTDIR,
                format!("remove_dir_all {}: not a directory", p.display()),
            ));
        }
        for (name, _, kind) in self.read_dir_entries(p)? {
            let child = p.path.join(std::ffi::OsStr::from_bytes_ext(&name));
            let child = At {
                dir: p.dir,
                path: &child,
            };
            if kind == Kind::Dir {
                self.remove_dir_all(child)?;
            } else {
                self.remove_file(child)?;
            }
        }
        self.remove_dir(p)
    }

    /// Whether `anc` is `dir` or one of its ancestors.
    fn is_ancestor(&self, st: &State, anc: u64, mut dir: u64) -> io::Result<bool> {
        for _ in 0..100_000 {
            if dir == anc {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            let (_, a) = self.attrs(st, dir)?;
            dir = if a.parent == 0 { ROOT_INO } else { a.parent };
        }
        Err(fs_err(libc::ELOOP, "directory parent chain too long"))
    }

    /// `renameat2`: `noreplace` fails with `EEXIST` if `to` exists; `exchange` swaps two
    /// existing entries atomically (the two are exclusive).
    pub(crate) fn rename(
        &self,
        from: At<'_>,
        to: At<'_>,
        noreplace: bool,
        exchange: bool,
    ) -> io::Result<()> {
        let op = format!("rename {} -> {}", from.display(), to.display());
        from.named(&op)?;
        to.named(&op)?;
        if noreplace && exchange {
            return Err(fs_err(
                libc::EINVAL,
                format!("{op}: RENAME_NOREPLACE with RENAME_EXCHANGE"),
            ));
        }
        if exchange {
            return self.exchange(from, to, &op);
        }
        self.run(|st| {
            // The order of checks follows Linux (do_renameat2, vfs_rename), so that the same
            // call fails with the same errno: both parents, the source, the subtree traps,
            // then permissions and types.
            let wf = self.walk(st, from, false, &op)?;
            let wt = self.walk(st, to, false, &op)?;
            // `/`, `.` or `..` as either last component: EBUSY (EEXIST for a destination
            // with RENAME_NOREPLACE), as Linux's do_renameat2.
            let (Some(fname), Some(tname)) = (wf.name.clone(), wt.name.clone()) else {
                let errno = if wf.name.is_some() && noreplace {
                    libc::EEXIST
                } else {
                    libc::EBUSY
                };
                return Err(fs_err(
                    errno,
                    format!("{op}: `/`, `.` or `..` cannot be renamed"),
                ));
            };
            let (src, skind) = Self::need_found(&wf, &op)?;
            if noreplace && wt.found.is_some() {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            }
            if skind != Kind::Dir && (wt.trailing_slash || wf.trailing_slash) {
                return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
            }
            if skind == Kind::Dir && self.is_ancestor(st, src, wt.parent)? {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: cannot move a directory into itself"),
                ));
            }
            if let Some((t, Kind::Dir)) = wt.found {
                if t != src && self.is_ancestor(st, t, wf.parent)? {
                    return Err(fs_err(
                        libc::ENOTEMPTY,
                        format!("{op}: the destination is an ancestor of the source"),
                    ));
                }
            }
            if wt.found.is_some_and(|(t, _)| t == src) {
                return Ok(()); // Same file: nothing to do (POSIX).
            }
            self.check_parent_write(st, wf.parent, &op)?;
            self.check_parent_write(st, wt.parent, &op)?;
            self.check_sticky(st, wf.parent, src, &op)?;
            if let Some((t, tkind)) = wt.found {
                self.check_sticky(st, wt.parent, t, &op)?;
                if skind == Kind::Dir {
                    if tkind != Kind::Dir {
                        return Err(fs_err(libc::ENOTDIR, format!("{op}: not a directory")));
                    }
                    if !self.dir_is_empty(st, t)? {
                        return Err(fs_err(
                            libc::ENOTEMPTY,
                            format!("{op}: directory not empty"),
                        ));
                    }
                } else if tkind == Kind::Dir {
                    return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
                }
            }
            if skind == Kind::Dir && wf.parent != wt.parent {
                let (_, sa) = self.attrs(st, src)?;
                if !self.cred.may(&sa, W) {
                    return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
                }
            }
            // Every write lease the transaction needs, before anything changes.
            self.need(st, src, true)?;
            if let Some((t, _)) = wt.found {
                self.need(st, t, true)?;
            }
            let now = now_ns();
            let mut tx = Tx::default();
            let moved_dir = skind == Kind::Dir && wf.parent != wt.parent;
            self.touch_dir(st, &mut tx, wf.parent, now, if moved_dir { -1 } else { 0 })?;
            self.touch_dir(st, &mut tx, wt.parent, now, if moved_dir { 1 } else { 0 })?;
            if let Some((t, tkind)) = wt.found {
                self.unlink_inode(st, &mut tx, t, now)?;
                if tkind == Kind::Dir {
                    self.touch_dir(st, &mut tx, wt.parent, now, -1)?;
                }
            }
            let (sgen, mut sa) = match tx.get(src) {
                Some(x) => x,
                None => self.attrs(st, src)?,
            };
            sa.ctime = now;
            if skind == Kind::Dir {
                sa.parent = wt.parent;
            }
            tx.inode(src, sgen, sa);
            tx.dirent(wf.parent, &fname, 0, Kind::Free);
            tx.dirent(wt.parent, &tname, src, skind);
            self.commit(st, tx)?;
            Ok(())
        })
    }

    /// `RENAME_EXCHANGE`: swap the entries `a` and `b` (both must exist; they may be of
    /// different types) in one transaction.
    fn exchange(&self, a: At<'_>, b: At<'_>, op: &str) -> io::Result<()> {
        self.run(|st| {
            let wa = self.walk(st, a, false, op)?;
            let wb = self.walk(st, b, false, op)?;
            let (Some(aname), Some(bname)) = (wa.name.clone(), wb.name.clone()) else {
                return Err(fs_err(libc::EINVAL, format!("{op}: invalid entry")));
            };
            let (ai, ak) = Self::need_found(&wa, op)?;
            let (bi, bk) = Self::need_found(&wb, op)?;
            // A directory cannot go below itself.
            if (ak == Kind::Dir && self.is_ancestor(st, ai, wb.parent)?)
                || (bk == Kind::Dir && self.is_ancestor(st, bi, wa.parent)?)
            {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("{op}: cannot move a directory into itself"),
                ));
            }
            if ai == bi {
                return Ok(());
            }
            self.check_parent_write(st, wa.parent, op)?;
            self.check_parent_write(st, wb.parent, op)?;
            self.check_sticky(st, wa.parent, ai, op)?;
            self.check_sticky(st, wb.parent, bi, op)?;
            // A directory moving to another parent rewrites its `..`.
            if wa.parent != wb.parent {
                for (i, k) in [(ai, ak), (bi, bk)] {
                    if k == Kind::Dir && !self.cred.may(&self.attrs(st, i)?.1, W) {
                        return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
                    }
                }
            }
            self.need(st, ai, true)?;
            self.need(st, bi, true)?;
            let now = now_ns();
            let mut tx = Tx::default();
            let dirs = |k: Kind| (k == Kind::Dir) as i64;
            let moved = wa.parent != wb.parent;
            let (da, db) = if moved {
                (dirs(bk) - dirs(ak), dirs(ak) - dirs(bk))
            } else {
                (0, 0)
            };
            self.touch_dir(st, &mut tx, wa.parent, now, da)?;
            self.touch_dir(st, &mut tx, wb.parent, now, db)?;
            for (i, k, parent) in [(ai, ak, wb.parent), (bi, bk, wa.parent)] {
                let (gen, mut attrs) = match tx.get(i) {
                    Some(x) => x,
                    None => self.attrs(st, i)?,
                };
                attrs.ctime = now;
                if k == Kind::Dir {
                    attrs.parent = parent;
                }
                tx.inode(i, gen, attrs);
            }
            tx.dirent(wa.parent, &aname, bi, bk);
            tx.dirent(wb.parent, &bname, ai, ak);
            self.commit(st, tx)?;
            Ok(())
        })
    }

    pub(crate) fn hard_link(&self, original: At<'_>, link: At<'_>) -> io::Result<()> {
        let op = format!("hard_link {} -> {}", link.display(), original.display());
        link.named(&op)?;
        self.run(|st| {
            let wo = self.walk(st, original, false, &op)?;
            let (ino, kind) = Self::need_found(&wo, &op)?;
            // Linux order (linkat): the new name must not exist, then permission, then the
            // directory check.
            let wl = self.walk(st, link, false, &op)?;
            let Some(name) = wl.name.filter(|_| wl.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            if wl.trailing_slash {
                return Err(fs_err(libc::ENOENT, format!("{op}: trailing slash")));
            }
            self.check_parent_write(st, wl.parent, &op)?;
            if kind == Kind::Dir {
                return Err(fs_err(
                    libc::EPERM,
                    format!("{op}: hard links to directories are not allowed"),
                ));
            }
            let (gen, mut a) = self.attrs(st, ino)?;
            // An unlinked file gets no name again, except an unnamed file made linkable
            // (`O_TMPFILE` without `O_EXCL`), as on Linux.
            if st.orphans.contains(&ino) || (a.nlink == 0 && !st.tmpfiles.contains(&ino)) {
                return Err(fs_err(libc::ENOENT, format!("{op}: file was removed")));
            }
            if a.nlink >= LINK_MAX {
                return Err(fs_err(
                    libc::EMLINK,
                    format!("{op}: the file has {} links already", a.nlink),
                ));
            }
            let now = now_ns();
            a.nlink += 1;
            a.ctime = now;
            let mut tx = Tx::default();
            tx.inode(ino, gen, a);
            tx.dirent(wl.parent, &name, ino, kind);
            self.touch_dir(st, &mut tx, wl.parent, now, 0)?;
            self.commit(st, tx)?;
            st.tmpfiles.remove(&ino);
            Ok(())
        })
    }

    pub(crate) fn symlink(&self, target: &Path, link: At<'_>) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let op = format!("symlink {} -> {}", link.display(), target.display());
        link.named(&op)?;
        let t = target.as_os_str().as_bytes();
        if t.is_empty() {
            return Err(fs_err(libc::ENOENT, format!("{op}: empty target")));
        }
        if t.len() > path::PATH_MAX {
            return Err(fs_err(libc::ENAMETOOLONG, format!("{op}: target too long")));
        }
        if t.contains(&0) {
            return Err(fs_err(libc::EINVAL, format!("{op}: target contains NUL")));
        }
        self.run(|st| {
            let wl = self.walk(st, link, false, &op)?;
            let Some(name) = wl.name.filter(|_| wl.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            self.create_in(
                st,
                wl.parent,
                &name,
                CreateOpts {
                    kind: Kind::Symlink,
                    perm: 0o777,
                    rdev: 0,
                },
                Some(t),
                &op,
            )?;
            Ok(())
        })
    }

    pub(crate) fn read_link(&self, p: At<'_>) -> io::Result<PathBuf> {
        use std::os::unix::ffi::OsStringExt;
        let op = format!("read_link {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let (ino, kind) = Self::need_found(&w, &op)?;
            if kind != Kind::Symlink {
                return Err(fs_err(libc::EINVAL, format!("{op}: not a symbolic link")));
            }
            let t = self.read_symlink(st, ino)?;
            Ok(PathBuf::from(std::ffi::OsString::from_vec(t)))
        })
    }

    pub(crate) fn set_permissions(&self, p: At<'_>, mode: u32) -> io::Result<()> {
        let op = format!("set_permissions {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, true, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.chattr(st, ino, &op, |cred, a| {
                if !cred.owns(a) {
                    return Err(fs_err(libc::EPERM, format!("{op}: not the owner")));
                }
                a.perm = mode & 0o7777;
                if !cred.is_root() && !cred.in_group(a.gid) {
                    a.perm &= !0o2000;
                }
                Ok(())
            })
        })
    }

    /// `chown`: a new owner needs root; a new group needs root, or the owner and
    /// membership of the group. A regular file loses its setuid bit, and its setgid bit
    /// if group-executable (as on Linux); `None` keeps a field.
    pub(crate) fn set_owner(
        &self,
        p: At<'_>,
        follow: bool,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> io::Result<()> {
        let op = format!("set_owner {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, follow, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            self.chattr(st, ino, &op, |cred, a| {
                let uid_change = uid.is_some_and(|u| u != a.uid);
                let gid_change = gid.is_some_and(|g| g != a.gid);
                if uid_change && !cred.is_root() {
                    return Err(fs_err(
                        libc::EPERM,
                        format!("{op}: only root changes the owner"),
                    ));
                }
                if gid_change
                    && !cred.is_root()
                    && !(cred.owns(a) && gid.is_some_and(|g| cred.in_group(g)))
                {
                    return Err(fs_err(
                        libc::EPERM,
                        format!("{op}: not the owner, or not a member of the group"),
                    ));
                }
                if (uid.is_some() || gid.is_some()) && a.kind == Kind::File {
                    a.perm &= !0o4000;
                    if a.perm & 0o010 != 0 {
                        a.perm &= !0o2000;
                    }
                }
                if let Some(u) = uid {
                    a.uid = u;
                }
                if let Some(g) = gid {
                    a.gid = g;
                }
                Ok(())
            })
        })
    }

    /// Set the access and/or modification time. `touch`: both to now (`utimensat` with
    /// NULL times), which the owner or anyone with write permission may do (else
    /// `EACCES`); other times are the owner's (else `EPERM`), as Linux.
    pub(crate) fn set_times(
        &self,
        p: At<'_>,
        follow: bool,
        atime: Option<i64>,
        mtime: Option<i64>,
        touch: bool,
    ) -> io::Result<()> {
        let op = format!("set_times {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, follow, &op)?;
            let (ino, _) = Self::need_found(&w, &op)?;
            if atime.is_none() && mtime.is_none() {
                return Ok(());
            }
            self.chattr(st, ino, &op, |cred, a| {
                if touch && !cred.owns_or_writes(a) {
                    return Err(fs_err(
                        libc::EACCES,
                        format!("{op}: neither the owner nor a writer"),
                    ));
                }
                if !touch && !cred.owns(a) {
                    return Err(fs_err(libc::EPERM, format!("{op}: not the owner")));
                }
                if let Some(t) = atime {
                    a.atime = t;
                }
                if let Some(t) = mtime {
                    a.mtime = t;
                }
                Ok(())
            })
        })
    }

    /// Change attributes of `ino` (ctime = now) in one transaction.
    fn chattr(
        &self,
        st: &mut State,
        ino: u64,
        _op: &str,
        f: impl FnOnce(&Cred, &mut Attrs) -> io::Result<()>,
    ) -> io::Result<()> {
        self.need(st, ino, true)?;
        let (gen, mut a) = self.attrs(st, ino)?;
        f(&self.cred, &mut a)?;
        a.ctime = now_ns();
        let mut tx = Tx::default();
        tx.inode(ino, gen, a);
        self.commit(st, tx)?;
        Ok(())
    }

    /// Clear the setuid and setgid bits a write or truncate by this client removes
    /// (`Cred::privs_to_kill`), in a transaction of its own; whether it did.
    fn kill_privs(&self, st: &mut State, ino: u64, a: &Attrs) -> io::Result<bool> {
        let kill = self.cred.privs_to_kill(a);
        if kill == 0 {
            return Ok(false);
        }
        self.chattr(st, ino, "write", |_, a| {
            a.perm &= !kill;
            Ok(())
        })?;
        Ok(true)
    }

    /// Truncate or extend `ino` to `size` (one transaction).
    pub(crate) fn set_len(&self, st: &mut State, ino: u64, size: u64) -> io::Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(fs_err(libc::EFBIG, "set_len: beyond the largest file size"));
        }
        self.need(st, ino, true)?;
        let (_, a) = self.attrs(st, ino)?;
        if a.kind != Kind::File {
            return Err(fs_err(libc::EINVAL, "set_len: not a regular file"));
        }
        self.kill_privs(st, ino, &a)?;
        let (gen, mut a) = self.attrs(st, ino)?;
        let now = now_ns();
        let from = a.size.min(size);
        a.size = size;
        a.mtime = now;
        a.ctime = now;
        let mut tx = Tx::default();
        tx.inode(ino, gen, a);
        tx.zero.push((ino, from, MAX_FILE_SIZE));
        self.commit(st, tx)?;
        if let Some(o) = st.objs.get(&ino) {
            // Mappings past the new end fault (`SIGBUS`), as on Linux.
            o.set_len(size)
                .map_err(|e| fs_err(libc::EIO, format!("truncate the map object: {e}")))?;
        }
        Ok(())
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)` (`zero_size: None`) or `ZERO_RANGE`
    /// (`Some(extend)`: with `extend`, a range past the end grows the file): bytes
    /// `[off, off + len)` read as zeros from now on, and the digest frees the whole
    /// blocks among them. The size never shrinks.
    pub(crate) fn punch(
        &self,
        st: &mut State,
        ino: u64,
        off: u64,
        len: u64,
        zero_size: Option<bool>,
    ) -> io::Result<()> {
        let end = off
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or_else(|| fs_err(libc::EFBIG, "fallocate: beyond the largest file size"))?;
        if len == 0 {
            return Err(fs_err(libc::EINVAL, "fallocate: empty range"));
        }
        self.need(st, ino, true)?;
        let (gen, mut a) = self.attrs(st, ino)?;
        match a.kind {
            Kind::File => {}
            Kind::Dir => return Err(fs_err(libc::EISDIR, "fallocate: is a directory")),
            _ => return Err(fs_err(libc::ENODEV, "fallocate: not a regular file")),
        }
        let now = now_ns();
        let mut tx = Tx::default();
        let in_file = end.min(a.size);
        let charge = cairn_format::log::punch_charge(off, len);
        if off < in_file {
            if st.credits < charge {
                self.ensure_credits(st, charge)?;
            }
            tx.punch = Some((ino, off, in_file - off, now));
            tx.zero.push((ino, off, in_file));
        }
        a.mtime = now;
        a.ctime = now;
        if zero_size == Some(true) && end > a.size {
            tx.zero.push((ino, a.size, end));
            a.size = end;
        }
        tx.inode(ino, gen, a);
        self.commit(st, tx)?;
        if off < in_file {
            st.credits -= charge;
        }
        if let Some(o) = st.objs.get(&ino) {
            // A shared mapping sees the zeros at once.
            let mut r = Ok(());
            if off < in_file {
                r = sys::discard(o, off, in_file - off);
            }
            if r.is_ok() && a.size > in_file {
                r = o.set_len(a.size);
            }
            r.map_err(|e| fs_err(libc::EIO, format!("fallocate: the map object: {e}")))?;
        }
        Ok(())
    }

    /// Open (and maybe create) a file; returns its inode. Checks access for `read` /
    /// `write`; `trunc` truncates an existing file to 0.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open_inode(
        &self,
        p: At<'_>,
        read: bool,
        write: bool,
        create: bool,
        create_new: bool,
        trunc: bool,
        mode: u32,
    ) -> io::Result<u64> {
        let op = format!("open {}", p.display());
        self.run(|st| {
            let w = self.walk(st, p, !create_new, &op)?;
            let ino = match (w.found, &w.name) {
                (Some((ino, kind)), _) => {
                    if create_new {
                        return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
                    }
                    if kind == Kind::Dir && write {
                        return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
                    }
                    let (_, a) = self.attrs(st, ino)?;
                    let want = if read { R } else { 0 } | if write { W } else { 0 };
                    if !self.cred.may(&a, want) {
                        return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
                    }
                    if !kind.has_data() && kind != Kind::Dir {
                        return Err(fs_err(
                            libc::ENXIO,
                            format!("{op}: a FIFO, socket or device node (Fs::open_special)"),
                        ));
                    }
                    if trunc && kind == Kind::File && a.size > 0 {
                        self.set_len(st, ino, 0)?;
                    }
                    ino
                }
                (None, Some(name)) => {
                    if !create {
                        return Err(fs_err(
                            libc::ENOENT,
                            format!("{op}: no such file or directory"),
                        ));
                    }
                    if w.trailing_slash {
                        return Err(fs_err(libc::EISDIR, format!("{op}: is a directory")));
                    }
                    self.create_in(
                        st,
                        w.parent,
                        name,
                        CreateOpts {
                            kind: Kind::File,
                            perm: mode & !self.umask.load(Ordering::Relaxed),
                            rdev: 0,
                        },
                        None,
                        &op,
                    )?
                }
                (None, None) => unreachable!("a missing entry has a name"),
            };
            *st.open.entry(ino).or_insert(0) += 1;
            Ok(ino)
        })
    }

    /// A `File` handle of `ino` was closed.
    pub(crate) fn close(&self, ino: u64) {
        let _ = self.run(|st| {
            let left = match st.open.get(&ino) {
                Some(n) => n.saturating_sub(1),
                None => return Ok(()),
            };
            if left > 0 {
                st.open.insert(ino, left);
                return Ok(());
            }
            if st.orphans.contains(&ino) {
                // The last handle of an unlinked file: free it now (its write lease
                // first; the operation runs again after a lease or a shared-write retry).
                self.need(st, ino, true)?;
                if let Ok((gen, mut a)) = self.attrs(st, ino) {
                    a.nlink = 0;
                    a.ctime = now_ns();
                    let mut tx = Tx::default();
                    tx.inode(ino, gen, a);
                    match self.commit(st, tx) {
                        Err(e) if is_retry(&e) => return Err(e),
                        _ => {}
                    }
                }
                st.orphans.remove(&ino);
            }
            if st.pinned.contains(&ino) {
                // Another process may have unlinked it meanwhile: the daemon frees it
                // once nobody has it open (after digesting our records about it).
                let req = Request::Unpin {
                    ino,
                    tail_lsn: st.tail,
                };
                match self.request(st, &req) {
                    Ok(Response::Ok) => {}
                    Ok(r) => return Err(response_error("unpin", r)),
                    Err(e) => return Err(e),
                }
                st.pinned.remove(&ino);
            }
            st.open.remove(&ino);
            st.tmpfiles.remove(&ino);
            Ok(())
        });
    }

    pub(crate) fn status(&self) -> io::Result<StatusReport> {
        let mut st = self.begin()?;
        match self.request(&mut st, &Request::Status)? {
            Response::Status(r) => Ok(r),
            r => Err(response_error("status", r)),
        }
    }

    pub(crate) fn digest(&self) -> io::Result<()> {
        let mut st = self.begin()?;
        self.digest_wait(&mut st)
    }
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
        let _ = st.ring.set_reader_epoch(0);
        let bye = Request::Goodbye { tail_lsn: st.tail };
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
