//! A process's view of the store's segments and address spaces: [`SpaceJmp`].
//!
//! One per process (segments live at fixed addresses, and the segment window is the
//! process's). It keeps the segments this process has mapped, the address spaces it has
//! attached (handles), and for each thread the handle it is switched into and the locks
//! it holds (docs/SPACEJMP.md, "Switching").
//!
//! Switching (Mode A, segments at distinct addresses): every segment of every attached
//! address space stays mapped at its base, so a switch changes no mapping: it releases
//! the locks of the address space the thread leaves and takes those of the one it enters
//! (per thread, no system call when uncontended). What this mode does not give is
//! hardware isolation: a thread can still reach a segment of an attached address space
//! it is not switched into (the Rust API's guards keep safe code from doing so).
//!
//! Switching (Mode B, overlapping segments): segments made with `flags::OVERLAP` may
//! share addresses. Of the mapped segments that overlap, one at a time is *placed* at
//! its base; the others are *parked* (their page tables moved out of the window with
//! `mremap`, `cairn_media::fixed`). Switching into an address space places its
//! segments, parking those in their way. That changes the mapping of the whole process,
//! so it is refused (`EBUSY`) while another thread is in an address space holding a
//! segment that would be parked; segments of the primary address space are never parked.

use crate::control::{self, Control, Journal, Slot, Taken};
use crate::heap::{self, Heap, Mem};
use crate::segment::{self, Segment};
use crate::undo::UndoLog;
use cairn::{FlockOp, Fs, InoMap, OpenOptions};
use cairn_area::{errno_of, fs_err};
use cairn_format::sj::{self, flags, prot, SegHeader, VasEntry};
use cairn_media::fixed::{Access, Place, Region, Window};
use smallvec::SmallVec;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// A huge page: the chunk a commit drops private copies in.
const HUGE: u64 = cairn_media::huge::HUGE_PAGE as u64;

/// A segment's id: its file's inode number (global in the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegId(pub u64);

/// An address space's id: its file's inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VasId(pub u64);

/// A process-local handle of an attached address space; [`Vh::PRIMARY`] (0) is the
/// process's own address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vh(pub u32);

impl Vh {
    pub const PRIMARY: Vh = Vh(0);
}

/// How a writer's stores reach the segment (docs/SPACEJMP.md, "Commit modes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// Stores go to private copy-on-write pages; a commit finds them (`PAGEMAP_SCAN`),
    /// logs them and publishes them. Works for any code that stores through pointers.
    #[default]
    Snapshot,
    /// Stores go straight to the resident copy, after the bytes are declared
    /// (`tx_add`, done by the Rust API's writes): a commit logs just those bytes.
    Explicit,
}

/// Where `seg_attach`/`seg_detach` act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The calling thread's current address space.
    Current,
    /// An attached address space (its handle), or the primary.
    Handle(Vh),
    /// A named address space (its file changes; processes attached already are not).
    Vas(VasId),
}

/// A change of a named address space (`vas_ctl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VasCtl {
    Add { seg: SegId, prot: u32 },
    Remove { seg: SegId },
    SetProt { seg: SegId, prot: u32 },
    List,
}

/// What `seg_info` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegInfo {
    pub id: SegId,
    pub gen: u64,
    pub path: String,
    pub base: u64,
    pub len: u64,
    pub flags: u32,
    pub prot: u32,
    pub commit_seq: u64,
    /// Bytes the resident copy holds in memory (0: not resident).
    pub resident_bytes: u64,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Segments with stores in the commit.
    pub segments: usize,
    /// Pages found written (snapshot mode; 0 in explicit mode).
    pub pages: usize,
    /// Bytes logged.
    pub bytes: usize,
}

/// The path of a segment or address space name: a name without `/` lives under
/// `/.sj/seg/` (or `/.sj/vas/`); a name starting with `/` is that path of the store.
pub fn seg_path(name: &str) -> io::Result<String> {
    named_path(name, "/.sj/seg")
}

pub fn vas_path(name: &str) -> io::Result<String> {
    named_path(name, "/.sj/vas")
}

fn named_path(name: &str, dir: &str) -> io::Result<String> {
    if name.starts_with('/') {
        return Ok(name.to_string());
    }
    if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.len() > 255 {
        return Err(fs_err(
            libc::EINVAL,
            format!("{name:?}: not a name (1 to 255 bytes, no `/`) nor an absolute path"),
        ));
    }
    Ok(format!("{dir}/{name}"))
}

/// How [`open_named`] opens a segment's or an address space's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    Read,
    Write,
    /// Create it (`EEXIST` if it exists) with this mode; its directory under `/.sj` too.
    Create(u32),
}

impl Open {
    /// For writing if `write`, else for reading.
    pub(crate) fn rw(write: bool) -> Open {
        if write {
            Open::Write
        } else {
            Open::Read
        }
    }
}

/// The file at `path` of a `what` (`segment`, `address space`), opened `how`; errors
/// name it.
pub(crate) fn open_named(fs: &Fs, what: &str, path: &str, how: Open) -> io::Result<cairn::File> {
    let mut o = OpenOptions::new();
    o.read(true);
    match how {
        Open::Read => {}
        Open::Write => {
            o.write(true);
        }
        Open::Create(mode) => {
            if let Some(dir) = path.strip_prefix("/.sj/").and_then(|r| r.split_once('/')) {
                shared_dir(fs, "/.sj")?;
                shared_dir(fs, &format!("/.sj/{}", dir.0))?;
            }
            o.write(true).create_new(true).mode(mode);
        }
    }
    o.open(fs, path).map_err(|e| {
        fs_err(
            errno_of(&e),
            format!("{what} {path}: {}", cairn_area::error::message(&e)),
        )
    })
}

/// Make directory `path` if missing, shared by the store's users: as `/tmp`, anyone who
/// may use the store may make names in it and only their owners may remove or rename
/// them (sticky), and what is made in it gets the store's group, the NVM file's (setgid),
/// so a mode's group bits share it within the trust domain. Mode `3777` whatever the
/// umask. An existing directory is left as it is.
fn shared_dir(fs: &Fs, path: &str) -> io::Result<()> {
    let ctx = |e: io::Error| {
        fs_err(
            errno_of(&e),
            format!("{path}: {}", cairn_area::error::message(&e)),
        )
    };
    match fs.create_dir_mode(path, 0o3777) {
        Ok(()) => {
            let gid = std::os::unix::fs::MetadataExt::gid(&std::fs::metadata(fs.nvm_path())?);
            // Where this process may give it (root, or a member of the group).
            let _ = fs.set_owner(path, None, Some(gid));
            fs.set_permissions(path, cairn::Permissions::from_mode(0o3777))
                .map_err(ctx)
        }
        Err(e) if errno_of(&e) == libc::EEXIST => Ok(()),
        Err(e) => Err(ctx(e)),
    }
}

/// What a call uses of a mapped segment: the segment, its mapping and its undo log,
/// under one reference count (a call takes one reference, not three).
struct Parts {
    seg: Arc<Segment>,
    region: Region,
    undo: Option<Arc<UndoLog>>,
}

/// A segment this process has mapped.
struct Mapped {
    /// Changed only while no call holds a reference ([`exclusive`]).
    parts: Arc<Parts>,
    /// The segment's slot in the control file, and this process's reader entry there.
    slot: usize,
    entry: u64,
    /// Attachments (handle entries) that use it.
    users: usize,
    mode: CommitMode,
}

impl std::ops::Deref for Mapped {
    type Target = Parts;
    fn deref(&self) -> &Parts {
        &self.parts
    }
}

/// A mapped segment as a call needs it, taken out of the process state.
#[derive(Clone)]
struct View {
    parts: Arc<Parts>,
    slot: usize,
    mode: CommitMode,
}

impl std::ops::Deref for View {
    type Target = Parts;
    fn deref(&self) -> &Parts {
        &self.parts
    }
}

impl Mapped {
    fn view(&self) -> View {
        View {
            parts: self.parts.clone(),
            slot: self.slot,
            mode: self.mode,
        }
    }
}

/// One segment of an attached address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    ino: u64,
    prot: u32,
    lockable: bool,
}

/// An attached address space (or the primary, handle 0).
pub(crate) struct Handle {
    pub(crate) vid: Option<VasId>,
    entries: Vec<Entry>,
    pub(crate) mode: CommitMode,
    /// Its helper process, once a call started one ([`SpaceJmp::vas_call`]).
    pub(crate) helper: Option<Arc<crate::helper::Helper>>,
}

pub(crate) struct State {
    segs: InoMap<Mapped>,
    pub(crate) handles: Vec<Option<Handle>>,
    /// The handle each thread that has switched is in (its `ThreadState::cur`); an entry
    /// only this table still holds is a thread that has ended.
    threads: Vec<Arc<AtomicU32>>,
    /// Paths of address spaces this process created or found, by id.
    vas_paths: HashMap<u64, String>,
    /// Paths of segments by id, as far as this process knows them.
    seg_paths: HashMap<u64, String>,
}

impl State {
    /// Attached handle `vh` (`EBADF`: detached, or never attached).
    pub(crate) fn handle(&self, vh: u32) -> io::Result<&Handle> {
        self.handles
            .get(vh as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| fs_err(libc::EBADF, format!("handle {vh}: not attached")))
    }

    pub(crate) fn handle_mut(&mut self, vh: u32) -> io::Result<&mut Handle> {
        self.handles
            .get_mut(vh as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| fs_err(libc::EBADF, format!("handle {vh}: not attached")))
    }
}

/// A segment's part of a staged commit: the segment, the commit sequence, the runs.
type Staging<'a> = (&'a Segment, u64, Vec<(u64, &'a [u8])>);

/// A segment's part of a commit: its writes (ranges of [`CommitBuf`]'s vectors), and
/// whether its writer lock is the transaction's.
struct Work {
    parts: Arc<Parts>,
    slot: usize,
    /// Its runs: `CommitBuf::runs[runs]` and `CommitBuf::in_place[in_place]`.
    runs: std::ops::Range<usize>,
    in_place: std::ops::Range<usize>,
    /// Snapshot mode: the pages it found written, `CommitBuf::pages[pages]`.
    pages: std::ops::Range<usize>,
    /// Where in `CommitBuf::data` its commit sequence goes.
    seq_at: usize,
    temp_lock: bool,
    seq: u64,
}

impl std::ops::Deref for Work {
    type Target = Parts;
    fn deref(&self) -> &Parts {
        &self.parts
    }
}

/// What a commit collects, in vectors a thread keeps from one commit to the next (a
/// small commit allocates nothing).
#[derive(Default)]
struct CommitBuf {
    /// The bytes of the runs copied out of their segment, one after the other.
    data: Vec<u8>,
    /// The copied runs: offset in their segment, bytes in `data`.
    runs: Vec<(u64, std::ops::Range<usize>)>,
    /// Runs read in place from the resident copy: offset and length (an explicit
    /// transaction's ranges of a page or more: its writer lock keeps every other writer
    /// out until the commit ends).
    in_place: Vec<(u64, usize)>,
    /// Snapshot mode: written pages `(offset, length)`.
    pages: Vec<(u64, u64)>,
    /// The ranges of the segment being collected.
    ranges: Vec<(u64, u64)>,
    /// The journal's pages of a segment.
    jp: Vec<u64>,
    work: Vec<Work>,
}

/// The offsets and bytes of the runs of `w`: the copied ones (in `data`), then those
/// read in place.
fn runs_of<'a>(
    data: &'a [u8],
    runs: &'a [(u64, std::ops::Range<usize>)],
    in_place: &'a [(u64, usize)],
    w: &'a Work,
) -> impl Iterator<Item = io::Result<(u64, &'a [u8])>> + 'a {
    let copied = runs[w.runs.clone()]
        .iter()
        .map(|(o, r)| Ok((*o, &data[r.clone()])));
    let read = in_place[w.in_place.clone()]
        .iter()
        .map(|&(o, n)| Ok((o, w.region.bytes(o as usize, n)?)));
    copied.chain(read)
}

impl CommitBuf {
    fn push_run(&mut self, off: u64, bytes: &[u8]) {
        let at = self.data.len();
        self.data.extend_from_slice(bytes);
        self.runs.push((off, at..self.data.len()));
    }

    /// A run of `len` bytes at `off` of `region`, copied.
    fn read_run(&mut self, region: &Region, off: u64, len: u64) -> io::Result<()> {
        let at = self.data.len();
        self.data.resize(at + len as usize, 0);
        region.read(off as usize, &mut self.data[at..])?;
        self.runs.push((off, at..self.data.len()));
        Ok(())
    }

    /// Empty (the segments' references go), capacity kept.
    fn clear(&mut self) {
        self.data.clear();
        self.runs.clear();
        self.in_place.clear();
        self.pages.clear();
        self.ranges.clear();
        self.jp.clear();
        self.work.clear();
    }
}

/// A lock a thread holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    ino: u64,
    slot: usize,
    entry: u64,
    write: bool,
}

/// The lock plan of a handle (what switching into it takes), cached per thread.
#[derive(Debug, Clone)]
struct Plan {
    version: u64,
    locks: Arc<[Held]>,
    /// The handle holds segments that may be parked (switching in may have to place
    /// them: never the fast path).
    overlap: bool,
}

/// A thread's place: the handle it is in and the locks it holds.
#[derive(Default)]
struct ThreadState {
    vh: u32,
    /// `vh`, as other threads see it (registered in `State::threads` once).
    cur: Arc<AtomicU32>,
    registered: bool,
    /// The locks held.
    held: Vec<Held>,
    /// A Rust guard (`Switched`) is alive.
    guarded: bool,
    /// Explicit-mode ranges declared in this transaction, per segment.
    declared: DeclaredSets,
    /// Buffers of [`SpaceJmp::commit`], kept for the next.
    commit_buf: CommitBuf,
    /// Lock plans by handle.
    plans: Vec<Option<Plan>>,
}

impl ThreadState {
    /// The thread is now in handle `vh` (0: the primary), holding `held`.
    fn now_in(&mut self, vh: u32, held: &[Held]) {
        self.vh = vh;
        self.cur.store(vh, Ordering::Release);
        self.held.clear();
        self.held.extend_from_slice(held);
    }
}

impl Drop for ThreadState {
    fn drop(&mut self) {
        // A thread that ends inside an address space: its uncommitted stores are dropped
        // and its locks released.
        if self.held.is_empty() && self.declared.is_empty() {
            return;
        }
        if let Some(sj) = instance() {
            let held = std::mem::take(&mut self.held);
            let declared = self.declared.take_inos();
            let writes = held.iter().filter(|h| h.write).map(|h| h.ino);
            let _ = sj.drop_uncommitted(writes.chain(declared), &held);
            sj.release(&held);
        }
    }
}

thread_local! {
    static THREAD: RefCell<ThreadState> = RefCell::new(ThreadState::default());
}

static GLOBAL: OnceLock<Arc<SpaceJmp>> = OnceLock::new();

/// In a helper process ([`crate::helper`]): its own `SpaceJmp` (the `GLOBAL` it
/// inherited is its parent's, which it may not use).
static HELPER: Mutex<Option<Arc<SpaceJmp>>> = Mutex::new(None);
static IN_HELPER: AtomicBool = AtomicBool::new(false);

/// The process's `SpaceJmp`, if one was opened.
fn instance() -> Option<Arc<SpaceJmp>> {
    if IN_HELPER.load(Ordering::Acquire) {
        HELPER.lock().unwrap_or_else(|e| e.into_inner()).clone()
    } else {
        GLOBAL.get().cloned()
    }
}

/// The store's segments and address spaces as this process sees them.
pub struct SpaceJmp {
    fs: Fs,
    uuid: [u8; 16],
    window: Arc<Window>,
    ctl: Control,
    pagemap: std::fs::File,
    state: Mutex<State>,
    /// Bumped whenever a handle's segments change (per-thread plans are then redone).
    version: AtomicU64,
    /// The process it belongs to (a child after `fork` may not use it).
    pid: u32,
}

impl std::fmt::Debug for SpaceJmp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpaceJmp")
            .field("store", &self.fs.store_dir())
            .finish()
    }
}

/// The bytes of a mapped segment, through its region (offsets from its base).
struct RegionMem<'a>(&'a Region);

impl Mem for RegionMem<'_> {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn load(&self, off: u64) -> io::Result<u64> {
        self.0.load_u64(off as usize)
    }
    fn store(&mut self, off: u64, v: u64) -> io::Result<()> {
        self.0.store_u64(off as usize, v)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read(off as usize, buf)
    }
    fn write(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(off as usize, data)
    }
}

/// [`RegionMem`] in explicit mode: every store is declared first (undo log + range).
struct DeclaringMem<'a> {
    region: &'a Region,
    undo: &'a UndoLog,
    declared: &'a mut Declared,
}

impl DeclaringMem<'_> {
    fn declare(&mut self, off: u64, len: u64) -> io::Result<()> {
        declare(self.region, self.undo, self.declared, off, len)
    }
}

impl Mem for DeclaringMem<'_> {
    fn size(&self) -> u64 {
        self.region.len() as u64
    }
    fn load(&self, off: u64) -> io::Result<u64> {
        self.region.load_u64(off as usize)
    }
    fn store(&mut self, off: u64, v: u64) -> io::Result<()> {
        self.declare(off, 8)?;
        self.region.store_u64(off as usize, v)
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.region.read(off as usize, buf)
    }
    fn write(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
        self.declare(off, data.len() as u64)?;
        self.region.write(off as usize, data)
    }
}

/// The ranges an explicit transaction declared in one segment: `(start, end)`, each
/// range as declared (not merged: a lookup sees the one starting nearest before it).
/// A sorted vector while the transaction is small (no allocation once its capacity is
/// there: a thread reuses its sets), a B-tree past [`Declared::SMALL`] ranges.
#[derive(Debug, Default)]
struct Declared {
    small: Vec<(u64, u64)>,
    big: std::collections::BTreeMap<u64, u64>,
}

impl Declared {
    /// Ranges kept in the sorted vector (an insert moves up to this many).
    const SMALL: usize = 64;

    fn clear(&mut self) {
        self.small.clear();
        self.big.clear();
    }

    fn is_empty(&self) -> bool {
        self.small.is_empty() && self.big.is_empty()
    }

    /// Whether a declaration covers `[off, off + len)` whole. Only the one starting
    /// nearest at or before `off` is looked at: a range inside one that starts further
    /// back is declared again, which records its bytes twice (rolled back newest first,
    /// that restores the same).
    fn covers(&self, off: u64, len: u64) -> bool {
        let end = if self.big.is_empty() {
            let i = self.small.partition_point(|r| r.0 <= off);
            i.checked_sub(1).map(|i| self.small[i].1)
        } else {
            self.big.range(..=off).next_back().map(|(_, &e)| e)
        };
        end.is_some_and(|end| off + len <= end)
    }

    fn add(&mut self, off: u64, len: u64) {
        let end = off + len;
        if self.big.is_empty() {
            let i = self.small.partition_point(|r| r.0 < off);
            if self.small.get(i).is_some_and(|r| r.0 == off) {
                self.small[i].1 = self.small[i].1.max(end);
            } else if self.small.len() < Self::SMALL {
                self.small.insert(i, (off, end));
            } else {
                self.big.extend(self.small.drain(..));
            }
            if self.big.is_empty() {
                return;
            }
        }
        let e = self.big.entry(off).or_insert(end);
        *e = (*e).max(end);
    }

    /// The declared ranges, merged where they touch or overlap: `(offset, length)` in
    /// order, appended to `out`.
    fn merged_into(&self, out: &mut Vec<(u64, u64)>) {
        let first = out.len();
        let mut push = |(o, e): (u64, u64)| match out[first..].last_mut() {
            Some(last) if o <= last.0 + last.1 => {
                last.1 = (last.0 + last.1).max(e) - last.0;
            }
            _ => out.push((o, e - o)),
        };
        // One of the two holds the ranges (the B-tree's iterator is not free).
        if self.big.is_empty() {
            self.small.iter().copied().for_each(&mut push);
        } else {
            debug_assert!(self.small.is_empty());
            self.big.iter().map(|(&o, &e)| (o, e)).for_each(push);
        }
    }
}

/// A thread's declared sets, by segment: a short vector (a transaction writes a few
/// segments), searched in order, whose emptied sets are kept for the next transaction
/// (no allocation once warm).
#[derive(Debug, Default)]
struct DeclaredSets {
    /// `(segment ino, its set)`, each ino once; the sets in use come first.
    sets: Vec<(u64, Declared)>,
    /// How many of `sets` are in use (the rest are empty spares).
    used: usize,
}

impl DeclaredSets {
    fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// The set of segment `ino` (a spare one if it has none).
    fn get(&mut self, ino: u64) -> &mut Declared {
        let i = match self.sets[..self.used].iter().position(|s| s.0 == ino) {
            Some(i) => i,
            None => {
                if self.used == self.sets.len() {
                    self.sets.push((ino, Declared::default()));
                }
                self.sets[self.used].0 = ino;
                self.used += 1;
                self.used - 1
            }
        };
        &mut self.sets[i].1
    }

    /// Forget the set of segment `ino`, if it has one (kept as a spare).
    fn forget(&mut self, ino: u64) {
        let Some(i) = self.sets[..self.used].iter().position(|s| s.0 == ino) else {
            return;
        };
        self.sets[i].1.clear();
        self.used -= 1;
        self.sets.swap(i, self.used);
        debug_assert!(self.sets[self.used..].iter().all(|s| s.1.is_empty()));
    }

    /// Append segment `ino`'s declared ranges, merged, to `out`, and forget its set.
    fn take_merged(&mut self, ino: u64, out: &mut Vec<(u64, u64)>) {
        if let Some(i) = self.sets[..self.used].iter().position(|s| s.0 == ino) {
            self.sets[i].1.merged_into(out);
            self.forget(ino);
        }
    }

    /// The segments with a set, all forgotten.
    fn take_inos(&mut self) -> Vec<u64> {
        let inos: Vec<u64> = self.sets[..self.used].iter().map(|s| s.0).collect();
        for &ino in &inos {
            self.forget(ino);
        }
        inos
    }
}

/// Record `[off, off + len)` of `region` in the undo log, unless this transaction
/// declared it already ([`Declared::covers`]).
fn declare(
    region: &Region,
    undo: &UndoLog,
    declared: &mut Declared,
    off: u64,
    len: u64,
) -> io::Result<()> {
    if len == 0 || declared.covers(off, len) {
        return Ok(());
    }
    // The writer lock (held) keeps other writers out of the bytes.
    let old = region.bytes(off as usize, len as usize)?;
    if old.len() >= crate::undo::FROM_FILE_MIN {
        // A page or more: restored from the file, not copied (`undo`).
        undo.record_range(off, len)?;
    } else {
        undo.record(off, old)?;
    }
    declared.add(off, len);
    Ok(())
}

/// The largest store or declaration made under the process state's lock
/// ([`SpaceJmp::store`]); larger ones take a reference of the segment and copy outside it.
const LOCKED_STORE_MAX: u64 = 4096;

/// The mapped segment holding `[addr, addr + len)` in handle `vh`, and the offset of
/// `addr` in it. `EFAULT` outside them; `EACCES` for a write where the address space
/// grants read only.
fn find(st: &State, vh: u32, addr: u64, len: u64, write: bool) -> io::Result<(&Mapped, u64)> {
    let h = st.handle(vh)?;
    for e in &h.entries {
        let Some(m) = st.segs.get(&e.ino) else {
            continue;
        };
        let (b, l) = (m.seg.base(), m.seg.len());
        if addr >= b && addr.checked_add(len).is_some_and(|end| end <= b + l) {
            if write && e.prot & prot::WRITE == 0 {
                return Err(fs_err(
                    libc::EACCES,
                    format!(
                        "{addr:#x}: segment {} is read-only in this address space",
                        m.seg.path
                    ),
                ));
            }
            return Ok((m, addr - b));
        }
    }
    Err(fs_err(
        libc::EFAULT,
        format!("{addr:#x}+{len:#x} is in no segment of the current address space (handle {vh})"),
    ))
}

fn lock_err(e: &io::Error, what: &str) -> io::Error {
    fs_err(errno_of(e), format!("{what}: {e}"))
}

impl SpaceJmp {
    /// The process's `SpaceJmp` for the store `store` (else `$CAIRN_STORE`, else the
    /// default store): made at the first call, which reserves the segment window in
    /// this process. `EBUSY` if this process uses another store's segments already.
    pub fn open(store: Option<&Path>) -> io::Result<Arc<SpaceJmp>> {
        if let Some(sj) = instance() {
            sj.check_process()?;
            let want = cairn_area::StoreDir::resolve(store).path;
            if sj.fs.store_dir() != want.as_path() {
                return Err(fs_err(
                    libc::EBUSY,
                    format!(
                        "this process uses the segments of store {} already (one store per process)",
                        sj.fs.store_dir().display()
                    ),
                ));
            }
            return Ok(sj.clone());
        }
        SpaceJmp::with_fs(Fs::open_store(store)?)
    }

    /// [`SpaceJmp::open`] with a client already open.
    pub fn with_fs(fs: Fs) -> io::Result<Arc<SpaceJmp>> {
        static INIT: Mutex<()> = Mutex::new(());
        let _g = INIT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sj) = instance() {
            sj.check_process()?;
            if sj.fs.store_dir() != fs.store_dir() {
                return Err(fs_err(
                    libc::EBUSY,
                    "this process uses another store's segments",
                ));
            }
            return Ok(sj.clone());
        }
        let window = Window::reserve(
            sj::WINDOW_BASE as usize,
            (sj::WINDOW_END - sj::WINDOW_BASE) as usize,
        )?;
        let sj = SpaceJmp::build(fs, window)?;
        let _ = GLOBAL.set(sj.clone());
        Ok(sj)
    }

    fn build(fs: Fs, window: Arc<Window>) -> io::Result<Arc<SpaceJmp>> {
        let uuid = fs.uuid();
        let ctl = Control::open(&uuid, fs.nvm_path())?;
        let pagemap = std::fs::File::open("/proc/self/pagemap")?;
        Ok(Arc::new(SpaceJmp {
            fs,
            uuid,
            window,
            ctl,
            pagemap,
            state: Mutex::new(State {
                segs: InoMap::default(),
                handles: vec![Some(Handle {
                    vid: None,
                    entries: Vec::new(),
                    mode: CommitMode::Snapshot,
                    helper: None,
                })],
                threads: Vec::new(),
                vas_paths: HashMap::new(),
                seg_paths: HashMap::new(),
            }),
            version: AtomicU64::new(1),
            pid: std::process::id(),
        }))
    }

    /// In a helper process just forked from this `SpaceJmp`'s process: a `SpaceJmp` of
    /// its own, on a client of its own (the parent's client is abandoned, its mappings
    /// replaced by the bare window). It becomes the process's instance.
    pub(crate) fn fork_child(&self) -> io::Result<Arc<SpaceJmp>> {
        // The calling thread's place and locks are its parent thread's: forgotten here
        // (dropping them would release the parent's locks).
        std::mem::forget(THREAD.with(|t| std::mem::take(&mut *t.borrow_mut())));
        control::forked();
        self.fs.abandon_after_fork();
        let window = self.window.take_over_after_fork()?;
        let fs = Fs::open_store(Some(self.fs.store_dir()))?;
        let sj = SpaceJmp::build(fs, window)?;
        *HELPER.lock().unwrap_or_else(|e| e.into_inner()) = Some(sj.clone());
        IN_HELPER.store(true, Ordering::Release);
        Ok(sj)
    }

    /// In a helper process, at its end: the process's instance is dropped (its client
    /// says goodbye to the daemon once the last reference goes).
    pub(crate) fn helper_done() {
        HELPER.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether this process is a helper.
    pub(crate) fn in_helper() -> bool {
        IN_HELPER.load(Ordering::Acquire)
    }

    /// `ENOTSUP` in a child after `fork`: the mappings and locks are the parent's.
    pub(crate) fn check_process(&self) -> io::Result<()> {
        if self.pid != std::process::id() {
            return Err(fs_err(
                libc::ENOTSUP,
                "segments cannot be used in a child after fork (its mappings and locks are \
                 the parent's): exec, or attach in the parent",
            ));
        }
        Ok(())
    }

    /// The process's `SpaceJmp`, if one was opened.
    pub fn global() -> Option<Arc<SpaceJmp>> {
        instance()
    }

    pub fn fs(&self) -> &Fs {
        &self.fs
    }

    pub fn control(&self) -> &Control {
        &self.ctl
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, off: usize) -> Slot<'_> {
        self.ctl.slot_at(off)
    }

    // ---- segments -------------------------------------------------------------------

    /// Make a segment: a file at `name` (`seg_path`) of `len` bytes with mode `mode`,
    /// given the range at `base` (`None`: the first free one) by the daemon's registry.
    /// `prot`: what it allows (`prot::READ`, `prot::RW`); `flags`: `flags::LOCKABLE`,
    /// `flags::OVERLAP`. `EEXIST` if the name exists.
    pub fn seg_alloc(
        &self,
        name: &str,
        base: Option<u64>,
        len: u64,
        prot_: u32,
        flags_: u32,
        mode: u32,
    ) -> io::Result<SegId> {
        let path = seg_path(name)?;
        if len == 0 {
            return Err(fs_err(
                libc::EINVAL,
                format!("segment {path}: a length of 0"),
            ));
        }
        if flags_ & !flags::ALL != 0 || prot_ & !prot::RW != 0 || prot_ & prot::READ == 0 {
            return Err(fs_err(
                libc::EINVAL,
                format!("segment {path}: unknown flags or protections"),
            ));
        }
        // An explicit base is checked again by the registry; without one, the length.
        sj::check_range(base.unwrap_or(sj::WINDOW_BASE), len)
            .map_err(|e| fs_err(libc::EINVAL, format!("segment {path}: {}", e.0)))?;
        let file = open_named(&self.fs, "segment", &path, Open::Create(mode))?;
        let meta = file.metadata()?;
        let (ino, gen) = (meta.ino(), meta.generation());
        let undo = |e: io::Error| {
            let _ = self.fs.remove_file(path.as_str());
            e
        };
        let base = self
            .fs
            .sj_reserve(cairn_proto::SjReservation {
                ino,
                gen,
                path: path.clone(),
                base,
                len,
                overlap: flags_ & flags::OVERLAP != 0,
            })
            .map_err(undo)?;
        crash_point("creating");
        let header = SegHeader {
            flags: flags_,
            prot: prot_,
            base,
            len,
            ino,
            created_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64),
        };
        let mut page0 = vec![0u8; sj::PAGE as usize];
        page0[..sj::SEG_HEADER_LEN].copy_from_slice(&header.encode());
        let mut page1 = vec![0u8; sj::PAGE as usize];
        for (off, v) in heap::initial_state(len) {
            let o = (off - sj::HEAP_STATE_OFF) as usize;
            page1[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        let r = file
            .set_len(len)
            .and_then(|()| file.write_runs_atomic(&[(0, &page0), (sj::PAGE, &page1)]));
        if let Err(e) = r {
            let _ = self.fs.sj_release(ino, gen);
            return Err(undo(e));
        }
        self.state().seg_paths.insert(ino, path);
        Ok(SegId(ino))
    }

    /// The segment named `name`.
    pub fn seg_find(&self, name: &str) -> io::Result<SegId> {
        let path = seg_path(name)?;
        let f = open_named(&self.fs, "segment", &path, Open::Read)?;
        segment::read_header(&f, &path)?;
        let m = f.metadata()?;
        self.state().seg_paths.insert(m.ino(), path);
        Ok(SegId(m.ino()))
    }

    /// The path of segment `id` (known to this process, else from the registry).
    fn seg_path_of(&self, id: SegId) -> io::Result<String> {
        if let Some(p) = self.state().seg_paths.get(&id.0) {
            return Ok(p.clone());
        }
        let ranges = self.fs.sj_ranges()?;
        let r = ranges
            .iter()
            .find(|r| r.ino == id.0)
            .ok_or_else(|| fs_err(libc::ENOENT, format!("no segment {}", id.0)))?;
        self.state().seg_paths.insert(id.0, r.path.clone());
        Ok(r.path.clone())
    }

    /// What segment `name` is.
    pub fn seg_info(&self, name: &str) -> io::Result<SegInfo> {
        let path = seg_path(name)?;
        let f = open_named(&self.fs, "segment", &path, Open::Read)?;
        let h = segment::read_header(&f, &path)?;
        let m = f.metadata()?;
        let mut b = [0u8; 8];
        f.read_at(&mut b, sj::COMMIT_SEQ_OFF)?;
        let obj = segment::object_path(&self.uuid, m.ino(), m.generation());
        Ok(SegInfo {
            id: SegId(m.ino()),
            gen: m.generation(),
            path,
            base: h.base,
            len: h.len,
            flags: h.flags,
            prot: h.prot,
            commit_seq: u64::from_le_bytes(b),
            resident_bytes: cairn_area::host::allocated_bytes(&obj),
        })
    }

    /// Every segment of the store (from the daemon's registry).
    pub fn seg_list(&self) -> io::Result<Vec<SegInfo>> {
        let mut out = Vec::new();
        for r in self.fs.sj_ranges()? {
            match self.seg_info(&r.path) {
                Ok(i) if i.id.0 == r.ino => out.push(i),
                _ => {}
            }
        }
        Ok(out)
    }

    /// Remove segment `name`: its file, its range, its resident copy and its lock. `EBUSY`
    /// while another live process has it attached (this process detaches it first). A
    /// file without a segment's header (a `seg_alloc` killed before it wrote one, or a
    /// header damaged on disk) is removed all the same.
    pub fn seg_free(&self, name: &str) -> io::Result<()> {
        let path = seg_path(name)?;
        let meta = open_named(&self.fs, "segment", &path, Open::Read)?.metadata()?;
        let (ino, gen) = (meta.ino(), meta.generation());
        let slot = self.ctl.slot(ino, gen)?;
        let mine = control::process_word();
        let others: Vec<u64> = slot
            .attached()
            .into_iter()
            .filter(|&w| w != mine && !control::owner_dead(w))
            .collect();
        if !others.is_empty() {
            return Err(fs_err(
                libc::EBUSY,
                format!(
                    "segment {path} is attached by {} other process(es) (pid {}): detach it there first",
                    others.len(),
                    others.iter().map(|w| (w >> 32).to_string()).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if self.state().segs.contains_key(&ino) {
            return Err(fs_err(
                libc::EBUSY,
                format!("segment {path} is attached in this process: detach it first"),
            ));
        }
        match slot.write_lock_timeout(std::time::Duration::from_secs(10)) {
            Ok(_) => {}
            Err(e) => return Err(lock_err(&e, &format!("segment {path}: its writer lock"))),
        }
        self.fs.remove_file(path.as_str())?;
        let _ = self.fs.remove_file(segment::stage_path(ino, gen).as_str());
        let _ = self.fs.sj_release(ino, gen);
        // The daemon removes the copy and the undo log of a file that is gone (if a
        // process still has it open, the daemon's sweep removes them once it is freed).
        let _ = self.fs.sj_drop(ino, gen, true);
        slot.retire();
        self.state().seg_paths.remove(&ino);
        Ok(())
    }

    /// Drop the resident copy of segment `name` (the next attach builds it again from the
    /// file). `EBUSY` while a live process has it attached.
    pub fn seg_evict(&self, name: &str) -> io::Result<u64> {
        let info = self.seg_info(name)?;
        let slot = self.ctl.slot(info.id.0, info.gen)?;
        let busy = slot.attached().into_iter().any(|w| !control::owner_dead(w));
        if busy || self.state().segs.contains_key(&info.id.0) {
            return Err(fs_err(
                libc::EBUSY,
                format!("segment {}: attached; detach it first", info.path),
            ));
        }
        slot.write_lock_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| lock_err(&e, "the segment's writer lock"))?;
        let freed = info.resident_bytes;
        let dropped = self.fs.sj_drop(info.id.0, info.gen, false);
        slot.write_unlock();
        dropped.map(|()| freed)
    }

    // ---- address spaces --------------------------------------------------------------

    /// Make an empty address space `name` with mode `mode` (`EEXIST` if it exists).
    pub fn vas_create(&self, name: &str, mode: u32) -> io::Result<VasId> {
        self.vas_create_with(name, mode, &[])
    }

    /// A new address space `name` holding `entries`.
    fn vas_create_with(&self, name: &str, mode: u32, entries: &[VasEntry]) -> io::Result<VasId> {
        let path = vas_path(name)?;
        let f = open_named(&self.fs, "address space", &path, Open::Create(mode))?;
        write_vas(&f, entries)?;
        let id = f.metadata()?.ino();
        self.state().vas_paths.insert(id, path);
        Ok(VasId(id))
    }

    /// The address space named `name`.
    pub fn vas_find(&self, name: &str) -> io::Result<VasId> {
        let path = vas_path(name)?;
        let f = open_named(&self.fs, "address space", &path, Open::Read)?;
        read_vas(&f, &path)?;
        let id = f.metadata()?.ino();
        self.state().vas_paths.insert(id, path);
        Ok(VasId(id))
    }

    pub(crate) fn vas_path_of(&self, id: VasId) -> io::Result<String> {
        self.state().vas_paths.get(&id.0).cloned().ok_or_else(|| {
            fs_err(
                libc::ENOENT,
                format!(
                    "address space {}: unknown to this process (vas_find it first)",
                    id.0
                ),
            )
        })
    }

    /// The address spaces under `/.sj/vas`: `(name, id, segments)`.
    pub fn vas_list(&self) -> io::Result<Vec<(String, VasId, Vec<VasEntry>)>> {
        let mut out = Vec::new();
        let rd = match self.fs.read_dir("/.sj/vas") {
            Ok(rd) => rd,
            Err(e) if errno_of(&e) == libc::ENOENT => return Ok(out),
            Err(e) => return Err(e),
        };
        for e in rd {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let path = format!("/.sj/vas/{name}");
            if let Ok(f) = cairn::File::open(&self.fs, path.as_str()) {
                if let Ok(entries) = read_vas(&f, &path) {
                    out.push((name, VasId(f.metadata()?.ino()), entries));
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// A new address space `name` with the segments of `id` (the same segments, shared).
    pub fn vas_clone(&self, id: VasId, name: &str) -> io::Result<VasId> {
        let src = self.vas_path_of(id)?;
        let f = open_named(&self.fs, "address space", &src, Open::Read)?;
        let entries = read_vas(&f, &src)?;
        let mode = f.metadata()?.permissions().mode() & 0o7777;
        self.vas_create_with(name, mode, &entries)
    }

    /// Change (or list) the segments of address space `id`. The segments must not
    /// overlap within it; a segment may be granted at most what it allows.
    pub fn vas_ctl(&self, id: VasId, op: VasCtl) -> io::Result<Vec<VasEntry>> {
        let path = self.vas_path_of(id)?;
        let write = op != VasCtl::List;
        let f = open_named(&self.fs, "address space", &path, Open::rw(write))?;
        if !write {
            return read_vas(&f, &path);
        }
        f.flock(FlockOp::Exclusive, false)?;
        let mut entries = read_vas(&f, &path)?;
        match op {
            VasCtl::Add { seg, prot: p } => {
                let sp = self.seg_path_of(seg)?;
                let sf = open_granted(&self.fs, &sp, p)?;
                let h = segment::read_header(&sf, &sp)?;
                let m = sf.metadata()?;
                check_grant(&sp, &h, p)?;
                if entries.iter().any(|e| e.ino == seg.0) {
                    return Err(fs_err(
                        libc::EEXIST,
                        format!("{path} holds segment {sp} already"),
                    ));
                }
                if let Some(o) = entries.iter().find(|e| {
                    e.base < h.base + sj::reserved_len(h.len)
                        && h.base < e.base + sj::reserved_len(e.len)
                }) {
                    return Err(fs_err(
                        libc::EEXIST,
                        format!(
                            "segment {sp} ({:#x}+{:#x}) overlaps {} ({:#x}+{:#x}) in {path}",
                            h.base, h.len, o.path, o.base, o.len
                        ),
                    ));
                }
                entries.push(VasEntry {
                    ino: m.ino(),
                    gen: m.generation(),
                    base: h.base,
                    len: h.len,
                    prot: p,
                    flags: h.flags,
                    path: sp,
                });
                entries.sort_by_key(|e| e.base);
            }
            VasCtl::Remove { seg } => {
                let before = entries.len();
                entries.retain(|e| e.ino != seg.0);
                if entries.len() == before {
                    return Err(fs_err(
                        libc::ENOENT,
                        format!("{path} does not hold segment {}", seg.0),
                    ));
                }
            }
            VasCtl::SetProt { seg, prot: p } => {
                let e = entries.iter_mut().find(|e| e.ino == seg.0).ok_or_else(|| {
                    fs_err(
                        libc::ENOENT,
                        format!("{path} does not hold segment {}", seg.0),
                    )
                })?;
                let sf = open_granted(&self.fs, &e.path, p)?;
                check_grant(&e.path, &segment::read_header(&sf, &e.path)?, p)?;
                e.prot = p;
            }
            VasCtl::List => unreachable!(),
        }
        write_vas(&f, &entries)?;
        let _ = f.flock(FlockOp::Unlock, false);
        Ok(entries)
    }

    /// Remove address space `name` (processes attached keep their handles).
    pub fn vas_remove(&self, name: &str) -> io::Result<()> {
        let path = vas_path(name)?;
        let f = open_named(&self.fs, "address space", &path, Open::Read)?;
        read_vas(&f, &path)?;
        let id = f.metadata()?.ino();
        drop(f);
        self.fs.remove_file(path.as_str())?;
        self.state().vas_paths.remove(&id);
        Ok(())
    }

    /// Attach address space `id`: map its segments (at their bases) and return a handle.
    /// `EBUSY` if this process has it attached already. Permissions are checked here:
    /// reading the address space's file, and each segment's file for what it is granted.
    pub fn vas_attach(&self, id: VasId, mode: CommitMode) -> io::Result<Vh> {
        let path = self.vas_path_of(id)?;
        let f = open_named(&self.fs, "address space", &path, Open::Read)?;
        let entries = read_vas(&f, &path)?;
        {
            let st = self.state();
            if let Some((i, _)) = st
                .handles
                .iter()
                .enumerate()
                .find(|(_, h)| h.as_ref().is_some_and(|h| h.vid == Some(id)))
            {
                return Err(fs_err(
                    libc::EBUSY,
                    format!("address space {path} is attached already (handle {i})"),
                ));
            }
        }
        let mut mine = Vec::new();
        for e in &entries {
            match self.map_segment(&e.path, Some((e.ino, e.gen)), e.prot, mode) {
                Ok(()) => mine.push(Entry {
                    ino: e.ino,
                    prot: e.prot,
                    lockable: e.flags & flags::LOCKABLE != 0,
                }),
                Err(err) => {
                    for m in &mine {
                        self.unmap_segment(m.ino);
                    }
                    return Err(err);
                }
            }
        }
        let mut st = self.state();
        let h = Handle {
            vid: Some(id),
            entries: mine,
            mode,
            helper: None,
        };
        let vh = match st.handles.iter().position(Option::is_none) {
            Some(i) => {
                st.handles[i] = Some(h);
                i
            }
            None => {
                st.handles.push(Some(h));
                st.handles.len() - 1
            }
        };
        self.version.fetch_add(1, Ordering::SeqCst);
        Ok(Vh(vh as u32))
    }

    /// Detach handle `vh`: its segments are unmapped where no other handle uses them.
    /// `EBUSY` while a thread of this process is switched into it.
    pub fn vas_detach(&self, vh: Vh) -> io::Result<()> {
        if vh == Vh::PRIMARY {
            return Err(fs_err(
                libc::EINVAL,
                "the primary address space cannot be detached",
            ));
        }
        if THREAD.with(|t| t.borrow().vh) == vh.0 {
            return Err(fs_err(
                libc::EBUSY,
                format!(
                    "handle {}: this thread is switched into it (switch back first)",
                    vh.0
                ),
            ));
        }
        let taken = {
            let mut st = self.state();
            if Self::occupied(&st, vh.0, None) {
                return Err(fs_err(
                    libc::EBUSY,
                    format!("handle {}: another thread of this process is in it", vh.0),
                ));
            }
            let h = st
                .handles
                .get_mut(vh.0 as usize)
                .and_then(Option::take)
                .ok_or_else(|| fs_err(libc::EBADF, format!("handle {}: not attached", vh.0)))?;
            h
        };
        // Its helper (if any, and no call is running in it) ends here, outside the lock.
        let Handle {
            entries, helper, ..
        } = taken;
        drop(helper);
        for e in entries {
            self.unmap_segment(e.ino);
        }
        self.version.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Add segment `seg` to `target` with protection `p`.
    pub fn seg_attach(&self, target: Target, seg: SegId, p: u32) -> io::Result<()> {
        let vh = match target {
            Target::Vas(id) => {
                self.vas_ctl(id, VasCtl::Add { seg, prot: p })?;
                return Ok(());
            }
            Target::Current => Vh(THREAD.with(|t| t.borrow().vh)),
            Target::Handle(vh) => vh,
        };
        let path = self.seg_path_of(seg)?;
        let mode = {
            let st = self.state();
            let h = st.handle(vh.0)?;
            if h.entries.iter().any(|e| e.ino == seg.0) {
                return Err(fs_err(
                    libc::EEXIST,
                    format!("segment {path} is attached there already"),
                ));
            }
            h.mode
        };
        self.map_segment(&path, None, p, mode)?;
        let (lockable, ino) = {
            let st = self.state();
            let m = &st.segs[&seg.0];
            (m.seg.lockable(), m.seg.ino)
        };
        let entry = Entry {
            ino,
            prot: p,
            lockable,
        };
        {
            let mut st = self.state();
            let added = Self::add_entry(&mut st, vh.0, entry);
            if let Err(e) = added {
                drop(st);
                self.unmap_segment(ino);
                return Err(e);
            }
        }
        self.version.fetch_add(1, Ordering::SeqCst);
        // A thread in that handle now takes the segment's lock too.
        if THREAD.with(|t| t.borrow().vh) == vh.0 && lockable {
            let held = self.lock_one(entry, true)?;
            THREAD.with(|t| t.borrow_mut().held.push(held));
        }
        Ok(())
    }

    /// Add `entry` to handle `vh`: `EINVAL` if it overlaps a segment there already. A
    /// handle a thread is in gets it placed at once (Mode B: parking what is in the way,
    /// `EBUSY` if that is in use).
    fn add_entry(st: &mut State, vh: u32, entry: Entry) -> io::Result<()> {
        let h = st.handle(vh)?;
        let range = |ino: u64| {
            st.segs
                .get(&ino)
                .map_or((0, 0), |m| (m.seg.base(), sj::reserved_len(m.seg.len())))
        };
        let (b, l) = range(entry.ino);
        for e in &h.entries {
            let (eb, el) = range(e.ino);
            if eb < b + l && b < eb + el {
                return Err(fs_err(
                    libc::EINVAL,
                    format!(
                        "segment {} ({b:#x}+{l:#x}) overlaps segment {} ({eb:#x}+{el:#x}) of \
                         the same address space",
                        st.segs[&entry.ino].seg.path, st.segs[&e.ino].seg.path
                    ),
                ));
            }
        }
        let in_use = Self::occupied(st, vh, None);
        if let Some(h) = st.handles.get_mut(vh as usize).and_then(Option::as_mut) {
            h.entries.push(entry);
        }
        if in_use && st.segs[&entry.ino].region.is_parked() {
            // Placed with the rest of the handle (all but it are placed already).
            let placed = Self::place_handle(st, vh, None);
            if let Err(e) = placed {
                if let Some(h) = st.handles.get_mut(vh as usize).and_then(Option::as_mut) {
                    h.entries.retain(|x| *x != entry);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Remove segment `seg` from `target`. The calling thread's uncommitted stores to it
    /// are dropped first when it is in that handle.
    pub fn seg_detach(&self, target: Target, seg: SegId) -> io::Result<()> {
        let vh = match target {
            Target::Vas(id) => {
                self.vas_ctl(id, VasCtl::Remove { seg })?;
                return Ok(());
            }
            Target::Current => Vh(THREAD.with(|t| t.borrow().vh)),
            Target::Handle(vh) => vh,
        };
        {
            let mut st = self.state();
            let h = st.handle_mut(vh.0)?;
            let before = h.entries.len();
            h.entries.retain(|e| e.ino != seg.0);
            if h.entries.len() == before {
                return Err(fs_err(
                    libc::ENOENT,
                    format!("segment {} is not attached there", seg.0),
                ));
            }
        }
        self.version.fetch_add(1, Ordering::SeqCst);
        // The calling thread in that handle drops its stores to the segment first.
        let mine: Option<Vec<Held>> = THREAD.with(|t| {
            let mut t = t.borrow_mut();
            if t.vh != vh.0 {
                return None;
            }
            t.declared.forget(seg.0);
            let (gone, keep): (Vec<Held>, Vec<Held>) = t.held.iter().partition(|h| h.ino == seg.0);
            t.held = keep;
            Some(gone)
        });
        if let Some(mine) = mine {
            let _ = self.drop_uncommitted(std::iter::once(seg.0), &mine);
            self.release(&mine);
        }
        self.unmap_segment(seg.0);
        Ok(())
    }

    /// Map segment `path` for one more attachment (`prot`), in `mode` when writable.
    fn map_segment(
        &self,
        path: &str,
        expect: Option<(u64, u64)>,
        p: u32,
        mode: CommitMode,
    ) -> io::Result<()> {
        let write = p & prot::WRITE != 0;
        // Already mapped: one more user (remapped writable if it was read-only).
        {
            let mut st = self.state();
            let existing = st
                .segs
                .values_mut()
                .find(|m| m.seg.path == path || expect.is_some_and(|(i, _)| i == m.seg.ino));
            if let Some(m) = existing {
                if let Some(want) = expect {
                    if want != (m.seg.ino, m.seg.gen) {
                        return Err(fs_err(
                            libc::ESTALE,
                            format!("segment {path} was replaced since it was added"),
                        ));
                    }
                }
                check_grant(path, &m.seg.header, p)?;
                let needs = if write { access_of(mode) } else { Access::Read };
                if write && (!m.seg.writable || m.region.access() == Access::Read) {
                    // Reopen for writing (the store checks the permission) and remap, in
                    // place (parked or not).
                    let seg = Arc::new(Segment::open(
                        &self.fs,
                        path,
                        true,
                        Some((m.seg.ino, m.seg.gen)),
                    )?);
                    let parts = exclusive(m)?;
                    parts.region.remap(&seg.object, 0, needs)?;
                    parts.seg = seg;
                    if mode == CommitMode::Explicit && parts.undo.is_none() {
                        parts.undo =
                            Some(Arc::new(UndoLog::open(&parts.seg.file, &parts.seg.path)?));
                    }
                    m.mode = mode;
                } else if write && m.mode != mode && m.users > 0 {
                    return Err(fs_err(
                        libc::EBUSY,
                        format!("segment {path} is attached writable in the other commit mode in this process"),
                    ));
                }
                m.users += 1;
                return Ok(());
            }
        }
        let seg = Segment::open(&self.fs, path, write, expect)?;
        check_grant(path, &seg.header, p)?;
        // Where a placed segment of this process is in the way, it is mapped parked
        // (both must allow overlapping: the registry hands out nothing else).
        let parked = {
            let st = self.state();
            let (b, l) = (seg.base(), sj::reserved_len(seg.len()));
            let mut placed = st.segs.values().filter(|m| {
                !m.region.is_parked()
                    && m.seg.base() < b + l
                    && b < m.seg.base() + sj::reserved_len(m.seg.len())
            });
            match placed.next() {
                None => false,
                Some(o) if seg.may_overlap() && o.seg.may_overlap() => true,
                Some(o) => {
                    return Err(fs_err(
                        libc::EINVAL,
                        format!(
                            "segment {path} ({b:#x}+{:#x}) overlaps segment {} mapped in this \
                             process, and not both were made to overlap",
                            seg.len(),
                            o.seg.path
                        ),
                    ))
                }
            }
        };
        let slot = self.ctl.slot(seg.ino, seg.gen)?;
        let entry = slot.reader_entry().map_err(|e| {
            if e.raw_os_error() == Some(libc::EAGAIN) {
                fs_err(
                    libc::EAGAIN,
                    format!(
                        "segment {path}: {} processes have it attached already",
                        control::READER_SLOTS
                    ),
                )
            } else {
                e
            }
        })?;
        // A stale resident copy (the file changed outside commits) is rebuilt, under the
        // writer lock; a dead writer's journal is repaired the same way.
        self.settle(&seg, &slot)?;
        let access = if write { access_of(mode) } else { Access::Read };
        let (base, len) = (seg.base() as usize, seg.len() as usize);
        let place = if parked { Place::Parked } else { Place::Home };
        let region = self.window.map(base, len, (&seg.object, 0), access, place);
        let region = region.map_err(|e| {
            fs_err(
                errno_of(&e),
                format!("mapping segment {path} at {:#x}: {e}", seg.base()),
            )
        })?;
        // Readers map every page now (no fault later; PMDs where the copy is in huge
        // folios). A writable private mapping is left to fault: a commit scans the page
        // tables of the whole segment, and pages never touched cost that scan nothing.
        if access == Access::Read {
            let _ = region.populate(0, region.len());
        }
        let undo = if write && mode == CommitMode::Explicit {
            Some(Arc::new(UndoLog::open(&seg.file, &seg.path)?))
        } else {
            None
        };
        let ino = seg.ino;
        let slot_off = slot.offset();
        self.state().seg_paths.insert(ino, path.to_string());
        self.state().segs.insert(
            ino,
            Mapped {
                parts: Arc::new(Parts {
                    seg: Arc::new(seg),
                    region,
                    undo,
                }),
                slot: slot_off,
                entry,
                users: 1,
                mode,
            },
        );
        Ok(())
    }

    /// Check the resident copy against the file and repair a dead writer's work, under
    /// the segment's writer lock (skipped while another live thread holds it: that
    /// writer keeps the copy current).
    fn settle(&self, seg: &Segment, slot: &Slot<'_>) -> io::Result<()> {
        match slot.write_lock(false) {
            Ok(t) => {
                let r = (|| {
                    if t == Taken::Recovered {
                        self.repair(seg, slot)?;
                    }
                    seg.resync().map(|_| ())
                })();
                slot.write_unlock();
                r
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EWOULDBLOCK) | Some(libc::EDEADLK)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Repair what a dead writer left (the caller holds the writer lock).
    fn repair(&self, seg: &Segment, slot: &Slot<'_>) -> io::Result<()> {
        let (j, pages) = slot.journal();
        // A dead explicit-mode writer's undo log: rolled back if its transaction was
        // open (by a process that may not write the copy: those ranges copied from the
        // file, which they are in); otherwise (it died logging or publishing a commit:
        // the pages journal made the resident copy the file's state) its entries are out
        // of date, and a later abort would put them back over newer commits: a writer
        // clears them, and a writer's next transaction ignores those a reader left.
        let at = (&self.uuid, seg.ino, seg.gen);
        let undo = UndoLog::open_existing(&seg.file, at, &seg.path, seg.writable)?;
        let mut more = Vec::new();
        match undo.as_ref().filter(|_| j == Journal::Undo) {
            Some(u) if u.writable() => more = u.roll_back(&seg.object)?,
            Some(u) => more = u.ranges()?,
            // An open transaction whose log cannot be read: all of the copy.
            None if j == Journal::Undo => more = vec![(0, seg.len())],
            None => {}
        }
        seg.repair(j, &pages, &more)?;
        if let Some(u) = undo.as_ref().filter(|u| u.writable()) {
            u.clear()?;
        }
        slot.journal_clear();
        Ok(())
    }

    /// One attachment fewer of segment `ino`: unmapped at the last.
    fn unmap_segment(&self, ino: u64) {
        let mut st = self.state();
        let last = match st.segs.get_mut(&ino) {
            Some(m) => {
                m.users = m.users.saturating_sub(1);
                m.users == 0
            }
            None => false,
        };
        if last {
            if let Some(m) = st.segs.remove(&ino) {
                self.slot(m.slot).leave(m.entry);
            }
        }
    }

    // ---- switching --------------------------------------------------------------------

    /// The calling thread's current handle.
    pub fn current(&self) -> Vh {
        Vh(THREAD.with(|t| t.borrow().vh))
    }

    /// The locks switching into `vh` takes (cached per thread until handles change).
    fn plan(&self, vh: u32) -> io::Result<Plan> {
        let version = self.version.load(Ordering::SeqCst);
        if let Some(p) = THREAD.with(|t| t.borrow().plans.get(vh as usize).cloned().flatten()) {
            if p.version == version {
                return Ok(p);
            }
        }
        let mut st = self.state();
        THREAD.with(|t| {
            let mut t = t.borrow_mut();
            if !t.registered {
                // Threads that have ended leave the table here.
                st.threads.retain(|c| Arc::strong_count(c) > 1);
                st.threads.push(t.cur.clone());
                t.registered = true;
            }
        });
        let h = st.handle(vh)?;
        let mut locks: Vec<Held> = h
            .entries
            .iter()
            .filter(|e| e.lockable)
            .filter_map(|e| {
                st.segs.get(&e.ino).map(|m| Held {
                    ino: e.ino,
                    slot: m.slot,
                    entry: m.entry,
                    write: e.prot & prot::WRITE != 0,
                })
            })
            .collect();
        locks.sort_by_key(|l| l.ino);
        let plan = Plan {
            version,
            locks: locks.into(),
            overlap: h
                .entries
                .iter()
                .any(|e| st.segs.get(&e.ino).is_some_and(|m| m.seg.may_overlap())),
        };
        THREAD.with(|t| {
            let plans = &mut t.borrow_mut().plans;
            if plans.len() <= vh as usize {
                plans.resize(vh as usize + 1, None);
            }
            plans[vh as usize] = Some(plan.clone());
        });
        Ok(plan)
    }

    /// A thread that may be using segment `ino`, other than `leaving` (a thread on its way
    /// out of its address space): the handle it is in. The primary address space's
    /// segments always count as in use (every thread that never switched is in it).
    fn user_of(st: &State, ino: u64, leaving: Option<&Arc<AtomicU32>>) -> Option<u32> {
        st.handles.iter().enumerate().find_map(|(i, h)| {
            let h = h.as_ref()?;
            if !h.entries.iter().any(|e| e.ino == ino) {
                return None;
            }
            Self::occupied(st, i as u32, leaving).then_some(i as u32)
        })
    }

    /// Whether a thread other than `leaving` is in handle `vh` (the primary: always, as
    /// every thread that never switched is in it).
    fn occupied(st: &State, vh: u32, leaving: Option<&Arc<AtomicU32>>) -> bool {
        vh == 0
            || st.threads.iter().any(|t| {
                Arc::strong_count(t) > 1
                    && !leaving.is_some_and(|l| Arc::ptr_eq(l, t))
                    && t.load(Ordering::Acquire) == vh
            })
    }

    /// Place every segment of handle `vh` at its base, parking the placed segments in
    /// the way (Mode B). `EBUSY`, with nothing moved, if one of those may be in use by a
    /// thread other than `leaving`.
    fn place_handle(st: &mut State, vh: u32, leaving: Option<&Arc<AtomicU32>>) -> io::Result<()> {
        let h = st.handle(vh)?;
        let want: Vec<u64> = h
            .entries
            .iter()
            .map(|e| e.ino)
            .filter(|i| st.segs.get(i).is_some_and(|m| m.region.is_parked()))
            .collect();
        if want.is_empty() {
            return Ok(());
        }
        // Per segment to place, the placed segments in its way.
        let mut plan: Vec<(u64, Vec<u64>)> = Vec::new();
        for ino in &want {
            let m = &st.segs[ino];
            let (b, l) = (m.seg.base(), sj::reserved_len(m.seg.len()));
            let mut out = Vec::new();
            for (&o, c) in &st.segs {
                let (cb, cl) = (c.seg.base(), sj::reserved_len(c.seg.len()));
                if o == *ino || c.region.is_parked() || !(cb < b + l && b < cb + cl) {
                    continue;
                }
                if let Some(user) = Self::user_of(st, o, leaving) {
                    let whose = if user == 0 {
                        "the primary address space holds it".to_string()
                    } else {
                        format!(
                            "another thread of this process is in handle {user}, which holds it"
                        )
                    };
                    return Err(fs_err(
                        libc::EBUSY,
                        format!(
                            "handle {vh}: segment {} ({b:#x}+{l:#x}) overlaps segment {} \
                             ({cb:#x}+{cl:#x}), and {whose}: switching between overlapping \
                             address spaces moves the mappings of the whole process",
                            m.seg.path, c.seg.path
                        ),
                    ));
                }
                out.push(o);
            }
            plan.push((*ino, out));
        }
        enum Move {
            Parked(u64),
            Placed(u64),
            /// The first parked, the second placed at the same home.
            Swapped(u64, u64),
        }
        let mut moved: Vec<Move> = Vec::new();
        let r = (|| {
            for (ino, out) in &plan {
                let same = |o: u64| {
                    let (a, b) = (&st.segs[&o].region, &st.segs[ino].region);
                    a.home() == b.home() && a.len() == b.len()
                };
                match out.as_slice() {
                    // One segment in the way, at the same address and of the same size:
                    // the two trade places.
                    [o] if same(*o) && !st.segs[o].region.is_parked() => {
                        let (a, b) = regions_mut(st, *o, *ino)?;
                        a.swap(b)?;
                        moved.push(Move::Swapped(*o, *ino));
                    }
                    _ => {
                        for &o in out {
                            if !st.segs[&o].region.is_parked() {
                                region_mut(st, o)?.park()?;
                                moved.push(Move::Parked(o));
                            }
                        }
                        region_mut(st, *ino)?.place()?;
                        moved.push(Move::Placed(*ino));
                    }
                }
            }
            Ok(())
        })();
        if r.is_err() {
            // Back as it was, as far as it goes (the moves that worked, undone in reverse).
            for m in moved.iter().rev() {
                let _ = match *m {
                    Move::Parked(o) => region_mut(st, o).and_then(|r| r.place()),
                    Move::Placed(i) => region_mut(st, i).and_then(|r| r.park()),
                    Move::Swapped(o, i) => regions_mut(st, i, o).and_then(|(a, b)| a.swap(b)),
                };
            }
        }
        r
    }

    /// Take one lock for the calling thread.
    fn lock_one(&self, e: Entry, block: bool) -> io::Result<Held> {
        let (slot_off, entry) = {
            let st = self.state();
            let m = st
                .segs
                .get(&e.ino)
                .ok_or_else(|| fs_err(libc::ENOENT, "segment not mapped"))?;
            (m.slot, m.entry)
        };
        let h = Held {
            ino: e.ino,
            slot: slot_off,
            entry,
            write: e.prot & prot::WRITE != 0,
        };
        self.take(&h, block)?;
        Ok(h)
    }

    /// Take lock `h` (a dead writer's journal is repaired first).
    fn take(&self, h: &Held, block: bool) -> io::Result<()> {
        let slot = self.slot(h.slot);
        if h.write {
            if slot.write_lock(block)? == Taken::Recovered {
                let seg = self.mapped_segment(h.ino)?;
                if let Err(e) = self.repair(&seg, &slot) {
                    slot.write_unlock();
                    return Err(e);
                }
            }
            Ok(())
        } else {
            slot.read_lock(h.entry, block, &mut |s| {
                let seg = self.mapped_segment(h.ino)?;
                self.repair(&seg, s)
            })
        }
    }

    fn mapped_segment(&self, ino: u64) -> io::Result<Arc<Segment>> {
        self.state()
            .segs
            .get(&ino)
            .map(|m| m.seg.clone())
            .ok_or_else(|| fs_err(libc::ENOENT, format!("segment {ino} is not mapped")))
    }

    /// Release locks.
    fn release(&self, held: &[Held]) {
        for h in held.iter().rev() {
            let slot = self.slot(h.slot);
            if h.write {
                if slot.held_by_me() {
                    slot.write_unlock();
                }
            } else {
                slot.read_unlock(h.entry);
            }
        }
    }

    /// Switch the calling thread into `vh` ([`Vh::PRIMARY`]: back to the primary):
    /// release the locks of the address space it leaves and take those of `vh`
    /// (blocking when `block`; else `EWOULDBLOCK` and the thread stays where it was).
    /// Uncommitted stores to a segment whose writer lock it gives up are committed
    /// first when `commit`, else dropped.
    pub fn switch_to(&self, vh: Vh, block: bool, commit: bool) -> io::Result<()> {
        if let Some(done) = self.switch_fast(vh) {
            return done;
        }
        let plan = self.plan(vh.0)?;
        let want = plan.locks;
        let held: Vec<Held> = THREAD.with(|t| t.borrow().held.clone());
        // Keep what both hold alike; give up the rest (committing or dropping writes).
        let gone: Vec<Held> = held.iter().filter(|h| !want.contains(h)).copied().collect();
        let new: Vec<Held> = want.iter().filter(|w| !held.contains(w)).copied().collect();
        if gone.iter().any(|h| h.write) || THREAD.with(|t| !t.borrow().declared.is_empty()) {
            if commit {
                self.commit()?;
            } else {
                self.abort()?;
            }
        }
        // A read lock that becomes a write lock (or back) is given up first.
        let upgrades: Vec<Held> = gone
            .iter()
            .filter(|g| new.iter().any(|n| n.ino == g.ino))
            .copied()
            .collect();
        self.release(&upgrades);
        let but_upgrades = |locks: &[Held]| -> Vec<Held> {
            let rest = locks.iter().filter(|h| !upgrades.contains(h));
            rest.copied().collect()
        };
        let mut taken = Vec::new();
        let mut r = Ok(());
        for h in &new {
            if let Err(e) = self.take(h, block) {
                r = Err(e);
                break;
            }
            taken.push(*h);
        }
        // Its segments at their bases (Mode B: parking the overlapping ones in the way).
        if r.is_ok() && plan.overlap {
            let me = THREAD.with(|t| t.borrow().cur.clone());
            let mut st = self.state();
            r = Self::place_handle(&mut st, vh.0, Some(&me));
            // Seen by other threads before they may park anything again.
            if r.is_ok() {
                me.store(vh.0, Ordering::Release);
            }
        }
        if let Err(e) = r {
            self.release(&taken);
            // Back where it was, as far as it can be.
            let mut lost = false;
            for u in &upgrades {
                if self.take(u, false).is_err() {
                    lost = true;
                }
            }
            if lost {
                self.release(&but_upgrades(&held));
                THREAD.with(|t| t.borrow_mut().now_in(0, &[]));
                return Err(fs_err(
                    errno_of(&e),
                    format!(
                        "switch to handle {}: {e}; a lock given up meanwhile was taken, so \
                         the thread is back in the primary address space",
                        vh.0
                    ),
                ));
            }
            return Err(e);
        }
        self.release(&but_upgrades(&gone));
        THREAD.with(|t| t.borrow_mut().now_in(vh.0, &want));
        Ok(())
    }

    /// The common switch, with no allocation and no process lock: reader locks only on
    /// both sides (or none), nothing declared, the lock plan cached, every reader lock
    /// free now. `None`: take the general path.
    fn switch_fast(&self, vh: Vh) -> Option<io::Result<()>> {
        THREAD.with(|t| {
            let mut t = t.borrow_mut();
            if t.vh == vh.0 {
                return Some(Ok(()));
            }
            let version = self.version.load(Ordering::Acquire);
            let ThreadState {
                held,
                plans,
                declared,
                vh: cur,
                cur: shared,
                ..
            } = &mut *t;
            let want = match plans.get(vh.0 as usize) {
                Some(Some(p)) if p.version == version && !p.overlap => &p.locks,
                _ => return None,
            };
            if !declared.is_empty() || held.iter().chain(want.iter()).any(|h| h.write) {
                return None;
            }
            for (i, w) in want.iter().enumerate() {
                if !self.slot(w.slot).try_read(w.entry) {
                    for u in &want[..i] {
                        self.slot(u.slot).read_unlock(u.entry);
                    }
                    return None;
                }
            }
            for h in held.iter() {
                self.slot(h.slot).read_unlock(h.entry);
            }
            held.clear();
            held.extend_from_slice(want);
            *cur = vh.0;
            shared.store(vh.0, Ordering::Release);
            Some(Ok(()))
        })
    }

    // ---- programs that map segment files (the shim) ------------------------------------

    /// Segment `seg` at its base for a program that maps its file: as it is if this
    /// process has it mapped (remapped writable if `p` asks for writing), else attached to
    /// the calling thread's current address space with `p`. Its base and length. `EBUSY`
    /// while it is parked (an overlapping segment holds its addresses).
    pub fn seg_mapped(&self, seg: SegId, p: u32) -> io::Result<(u64, u64)> {
        let found = {
            let st = self.state();
            st.segs.get(&seg.0).map(|m| {
                (
                    m.seg.base(),
                    m.seg.len(),
                    m.region.is_parked(),
                    m.region.access() == Access::Read,
                )
            })
        };
        match found {
            Some((_, _, true, _)) => Err(fs_err(
                libc::EBUSY,
                format!(
                    "segment {}: parked (an overlapping segment holds its addresses)",
                    seg.0
                ),
            )),
            Some((b, l, false, read_only)) if !(read_only && p & prot::WRITE != 0) => Ok((b, l)),
            Some(_) | None => {
                let vh = self.current();
                // Attached there already (read-only): remapped writable in place.
                if self.handle_has(vh, seg) {
                    self.seg_detach(Target::Handle(vh), seg)?;
                }
                self.seg_attach(Target::Handle(vh), seg, p)?;
                let st = self.state();
                let m = &st.segs[&seg.0];
                Ok((m.seg.base(), m.seg.len()))
            }
        }
    }

    fn handle_has(&self, vh: Vh, seg: SegId) -> bool {
        let st = self.state();
        st.handles
            .get(vh.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|h| h.entries.iter().any(|e| e.ino == seg.0))
    }

    /// Commit the address space that holds `addr` (`msync` of a mapped segment): the
    /// calling thread's current one if it holds it, else an attached one that does, which
    /// the thread switches into for the commit and then leaves. `EFAULT` if no attached
    /// address space holds `addr`.
    pub fn commit_at(&self, addr: u64) -> io::Result<CommitStats> {
        let cur = self.current();
        let holder = {
            let st = self.state();
            let holds = |h: &Handle| {
                h.entries.iter().any(|e| {
                    st.segs
                        .get(&e.ino)
                        .is_some_and(|m| addr >= m.seg.base() && addr < m.seg.base() + m.seg.len())
                })
            };
            let all: Vec<usize> = (st.handles.iter().enumerate())
                .filter(|(_, h)| h.as_ref().is_some_and(holds))
                .map(|(i, _)| i)
                .collect();
            if all.contains(&(cur.0 as usize)) {
                Some(cur)
            } else {
                all.first().map(|&i| Vh(i as u32))
            }
        };
        match holder {
            None => Err(fs_err(
                libc::EFAULT,
                format!("{addr:#x} is in no segment of an attached address space"),
            )),
            Some(vh) if vh == cur => self.commit(),
            Some(vh) => {
                self.switch_to(vh, true, true)?;
                let r = self.commit();
                let back = self.switch_to(cur, true, true);
                let stats = r?;
                back.map(|()| stats)
            }
        }
    }

    // ---- commits -------------------------------------------------------------------------

    /// The writable segments of the calling thread's current handle.
    fn writable(&self) -> io::Result<SmallVec<[View; 4]>> {
        let vh = THREAD.with(|t| t.borrow().vh);
        let st = self.state();
        let h = st.handle(vh)?;
        Ok(h.entries
            .iter()
            .filter(|e| e.prot & prot::WRITE != 0)
            .filter_map(|e| st.segs.get(&e.ino))
            .map(Mapped::view)
            .collect())
    }

    /// Commit the calling thread's stores to the segments of its current address space:
    /// durable and visible to others when it returns, all of them or none after any crash.
    /// A commit larger than one transaction of this client's log (a quarter of it) is
    /// staged first ([`SpaceJmp::commit_staged`]): all or nothing all the same.
    pub fn commit(&self) -> io::Result<CommitStats> {
        // The thread's buffers (a commit from inside this one, which cannot happen, would
        // get new ones).
        let mut buf = THREAD.with(|t| std::mem::take(&mut t.borrow_mut().commit_buf));
        let r = self.commit_with(&mut buf);
        buf.clear();
        THREAD.with(|t| t.borrow_mut().commit_buf = buf);
        r
    }

    /// [`SpaceJmp::commit`] with the thread's buffers.
    fn commit_with(&self, buf: &mut CommitBuf) -> io::Result<CommitStats> {
        let switched_in =
            |ino: u64| THREAD.with(|t| t.borrow().held.iter().any(|h| h.ino == ino && h.write));
        let mut stats = CommitStats::default();
        let collected = (|| -> io::Result<()> {
            for View {
                parts,
                slot: slot_off,
                mode,
            } in self.writable()?
            {
                let Parts { seg, region, .. } = &*parts;
                let (first_run, first_page) = (buf.runs.len(), buf.pages.len());
                let first_in_place = buf.in_place.len();
                buf.ranges.clear();
                match mode {
                    CommitMode::Snapshot => {
                        let mut found = Vec::new();
                        region
                            .written_pages(&self.pagemap, 0, region.len(), &mut found)
                            .map_err(|e| {
                                fs_err(
                                    errno_of(&e),
                                    format!(
                                    "finding the stores of a commit (PAGEMAP_SCAN, Linux 6.7): {e}"
                                ),
                                )
                            })?;
                        buf.ranges
                            .extend(found.iter().map(|&(o, l)| (o as u64, l as u64)));
                        buf.pages.extend_from_slice(&buf.ranges);
                    }
                    CommitMode::Explicit => THREAD.with(|t| {
                        let t = &mut *t.borrow_mut();
                        t.declared.take_merged(seg.ino, &mut buf.ranges);
                    }),
                }
                // The commit sequence goes with the stores: into a run that holds its
                // word (copied, to carry the new value), else in a run of its own (its
                // value is known once the lock is). An explicit transaction's other
                // runs of a page or more are read in place (smaller ones cost less to
                // copy than to look up again).
                let at = sj::COMMIT_SEQ_OFF;
                let holds_seq = |o: u64, len: u64| o <= at && at + 8 <= o + len;
                let mut seq_at = None;
                for i in 0..buf.ranges.len() {
                    let (off, len) = buf.ranges[i];
                    if mode == CommitMode::Explicit && len >= sj::PAGE && !holds_seq(off, len) {
                        buf.in_place.push((off, len as usize));
                        continue;
                    }
                    buf.read_run(region, off, len)?;
                    if holds_seq(off, len) {
                        seq_at = Some(buf.data.len() - len as usize + (at - off) as usize);
                    }
                }
                if buf.runs.len() == first_run && buf.in_place.len() == first_in_place {
                    continue;
                }
                let seq_at = match seq_at {
                    Some(i) => i,
                    None => {
                        buf.push_run(at, &[0; 8]);
                        buf.data.len() - 8
                    }
                };
                let slot = self.slot(slot_off);
                if !slot.held_by_me() && slot.write_lock(true)? == Taken::Recovered {
                    if let Err(e) = self.repair(seg, &slot) {
                        slot.write_unlock();
                        return Err(e);
                    }
                }
                // The writer lock is this transaction's (taken just now, or by the first
                // declared store) unless switching took it.
                let temp_lock = !switched_in(seg.ino);
                buf.work.push(Work {
                    parts,
                    slot: slot_off,
                    runs: first_run..buf.runs.len(),
                    in_place: first_in_place..buf.in_place.len(),
                    pages: first_page..buf.pages.len(),
                    seq_at,
                    temp_lock,
                    seq: 0,
                });
            }
            Ok(())
        })();
        let CommitBuf {
            data,
            runs,
            in_place,
            pages,
            jp,
            work,
            ..
        } = buf;
        if let Err(e) = collected {
            // The snapshot-mode locks taken so far go (explicit-mode transactions stay
            // open, with their locks, until they commit or abort).
            for w in work.iter().filter(|w| w.temp_lock && w.undo.is_none()) {
                self.slot(w.slot).write_unlock();
            }
            return Err(e);
        }
        if work.is_empty() {
            return Ok(stats);
        }
        // Past the commit point (the commit is durable, whatever fails after it), and
        // with a staged commit not yet copied into the files.
        let (mut committed, mut unfinished) = (false, false);
        let result = (|| -> io::Result<()> {
            for w in work.iter_mut() {
                w.seq = w.seg.object_seq()? + 1;
                data[w.seq_at..w.seq_at + 8].copy_from_slice(&w.seq.to_le_bytes());
                // The journal first: a writer dying from here on is repaired by copying
                // these pages from the file (before the transaction: its old state;
                // after: the new one).
                jp.clear();
                let copied = runs[w.runs.clone()].iter().map(|(o, r)| (*o, r.len()));
                for (o, len) in copied.chain(in_place[w.in_place.clone()].iter().copied()) {
                    let first = o / sj::PAGE;
                    let last = (o + len as u64 - 1) / sj::PAGE;
                    jp.extend((first..=last).map(|p| p * sj::PAGE));
                }
                jp.sort_unstable();
                jp.dedup();
                if !planted("no-journal") {
                    self.slot(w.slot).journal_publish(jp);
                }
            }
            crash_point("before-log");
            let run_of = |w| runs_of(data, runs, in_place, w);
            let mut all: SmallVec<[(&cairn::File, u64, &[u8]); 8]> = SmallVec::new();
            for w in work.iter() {
                for r in run_of(w) {
                    let (o, d) = r?;
                    all.push((&w.seg.file, o, d));
                }
            }
            // One transaction if it fits; else staged.
            let bytes: usize = all.iter().map(|r| r.2.len()).sum();
            let fits = bytes <= work[0].seg.file.atomic_write_limit(all.len())
                && match cairn::File::write_files_atomic(&all) {
                    Ok(()) => true,
                    Err(e) if errno_of(&e) == libc::E2BIG => false,
                    Err(e) => return Err(e),
                };
            if fits {
                crash_point("after-log");
            } else {
                let staged: Vec<Staging<'_>> = work
                    .iter()
                    .map(|w| {
                        let mut runs = run_of(w).collect::<io::Result<Vec<(u64, &[u8])>>>()?;
                        runs.sort_by_key(|r| r.0);
                        Ok((&*w.seg, w.seq, runs))
                    })
                    .collect::<io::Result<_>>()?;
                unfinished = !self.commit_staged(&staged)?;
            }
            committed = true;
            // Durable. Publish into the resident copies.
            for w in work.iter() {
                if w.undo.is_some() {
                    // Explicit mode: the stores are in the resident copy already; only
                    // the commit sequence is new there.
                    w.region.store_u64(sj::COMMIT_SEQ_OFF as usize, w.seq)?;
                    crash_point("publishing");
                } else {
                    for (i, r) in run_of(w).enumerate() {
                        let (o, d) = r?;
                        std::os::unix::fs::FileExt::write_all_at(&w.seg.object, d, o)?;
                        if i == 0 {
                            crash_point("publishing");
                        }
                    }
                }
                // The copies go with their whole 2 MiB chunk: the chunk's next read maps
                // the resident copy's huge folio with one PMD again, so the next
                // commit's scan does not walk the 512 page-table entries a copy split
                // it into.
                let mut last = None;
                for &(o, l) in &pages[w.pages.clone()] {
                    for c in o / HUGE..(o + l).div_ceil(HUGE) {
                        if last == Some(c) {
                            continue;
                        }
                        last = Some(c);
                        let len = HUGE.min(w.region.len() as u64 - c * HUGE);
                        w.region.discard((c * HUGE) as usize, len as usize)?;
                    }
                }
                if let Some(u) = &w.undo {
                    u.clear()?;
                }
                let slot = self.slot(w.slot);
                if unfinished {
                    // The next holder of the writer lock finishes the staged commit.
                    slot.journal_whole();
                } else {
                    slot.journal_clear();
                }
                slot.count_commit();
            }
            Ok(())
        })();
        for w in work.iter() {
            stats.segments += 1;
            stats.pages += pages[w.pages.clone()]
                .iter()
                .map(|p| p.1.div_ceil(sj::PAGE) as usize)
                .sum::<usize>();
            stats.bytes += runs[w.runs.clone()]
                .iter()
                .map(|r| r.1.len())
                .sum::<usize>()
                + in_place[w.in_place.clone()]
                    .iter()
                    .map(|r| r.1)
                    .sum::<usize>();
            let slot = self.slot(w.slot);
            if result.is_err() && committed {
                // Failed after the commit point (publishing): the commit stands. The
                // resident copy is made the files' committed state again now (an
                // explicit-mode undo log is out of date), or, if that fails too, by the
                // next holder of the writer lock.
                slot.journal_whole();
                let _ = self.repair(&w.seg, &slot);
            } else if result.is_err() {
                // Not committed: the stores stay; the journal's pages are the file's
                // state, which the resident copy still holds.
                if slot.journal().0 == Journal::Pages || slot.journal().0 == Journal::Whole {
                    slot.journal_clear();
                    if w.undo.is_some() {
                        slot.journal_undo(true);
                    }
                }
            }
            // An explicit-mode transaction that failed before its commit point is still
            // open (its stores are in the resident copy): its lock stays until it
            // commits or aborts.
            if w.temp_lock && (result.is_ok() || committed || w.undo.is_none()) {
                slot.write_unlock();
            }
        }
        result.map(|()| stats)
    }

    /// A commit too large for one transaction of this client's log: staged in each
    /// segment's stage file, committed by **one** transaction that sets every segment's
    /// marker (the commit point), then copied into the files. `Ok`: committed; whether
    /// the copy finished (if not, the commit stands all the same: the next holder of the
    /// writer lock finishes it from the stage files).
    fn commit_staged(&self, segs: &[Staging<'_>]) -> io::Result<bool> {
        for (seg, seq, runs) in segs {
            seg.stage(*seq, runs)?;
        }
        crash_point("staged");
        let marks: Vec<[u8; 8]> = segs.iter().map(|s| s.1.to_le_bytes()).collect();
        let all: Vec<(&cairn::File, u64, &[u8])> = segs
            .iter()
            .zip(&marks)
            .map(|((seg, ..), m)| (&seg.file, sj::REDO_SEQ_OFF, m.as_slice()))
            .collect();
        cairn::File::write_files_atomic(&all)?;
        crash_point("after-log");
        Ok(segs
            .iter()
            .all(|(seg, seq, runs)| seg.apply_staged(*seq, runs).is_ok()))
    }

    /// Drop the calling thread's uncommitted stores to the segments of its current
    /// address space.
    pub fn abort(&self) -> io::Result<()> {
        let held: Vec<Held> = THREAD.with(|t| t.borrow().held.clone());
        let declared = THREAD.with(|t| t.borrow_mut().declared.take_inos());
        let writable: Vec<u64> = self.writable()?.iter().map(|v| v.seg.ino).collect();
        self.drop_uncommitted(writable.into_iter().chain(declared), &held)
    }

    /// Drop the uncommitted stores to segments `inos` (snapshot mode: the private copies;
    /// explicit mode: the undo log rolled back), and give up the writer locks of those a
    /// transaction took (not those of `held`, which a switch took).
    fn drop_uncommitted(&self, inos: impl Iterator<Item = u64>, held: &[Held]) -> io::Result<()> {
        let mut inos: Vec<u64> = inos.collect();
        inos.sort_unstable();
        inos.dedup();
        let st = self.state();
        for ino in inos {
            let Some(m) = st.segs.get(&ino) else {
                continue;
            };
            let slot = self.slot(m.slot);
            match (&m.undo, m.mode) {
                (_, CommitMode::Snapshot) if m.region.access() == Access::Private => {
                    m.region.discard(0, m.region.len())?
                }
                (Some(u), CommitMode::Explicit)
                    if slot.held_by_me() && slot.journal_kind() == Journal::Undo =>
                {
                    // Under the journal and the writer lock: a crash before the clear
                    // has the next writer roll back again.
                    let from_file = u.roll_back(&m.seg.object)?;
                    if !from_file.is_empty() {
                        m.seg.repair(Journal::Undo, &[], &from_file)?;
                    }
                    u.clear()?;
                    slot.journal_clear();
                }
                _ => {}
            }
            if slot.held_by_me() && !held.iter().any(|h| h.ino == ino && h.write) {
                slot.write_unlock();
            }
        }
        Ok(())
    }

    // ---- memory ---------------------------------------------------------------------------

    /// The mapped segment holding `[addr, addr + len)` in the calling thread's current
    /// address space, and the offset of `addr` in it. `EFAULT` outside them; `EACCES`
    /// for a write where the address space grants read only.
    fn resolve(&self, addr: u64, len: u64, write: bool) -> io::Result<(View, u64)> {
        let vh = THREAD.with(|t| t.borrow().vh);
        let st = self.state();
        find(&st, vh, addr, len, write).map(|(m, off)| (m.view(), off))
    }

    /// Copy `buf.len()` bytes at `addr` (in a segment of the current address space).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        let (v, off) = self.resolve(addr, buf.len() as u64, false)?;
        v.region.read(off as usize, buf)
    }

    /// Store `data` at `addr` (in a writable segment of the current address space);
    /// visible to others at the next commit.
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        self.store(addr, data.len() as u64, Some(data))
    }

    /// Declare `[addr, addr + len)` for an explicit-mode commit: its old bytes go to the
    /// undo log, or from 4 KiB on its range only (restored from the segment file)
    /// (`sj_tx_add`). A no-op for snapshot-mode segments.
    pub fn tx_add(&self, addr: u64, len: u64) -> io::Result<()> {
        self.store(addr, len, None)
    }

    /// Declare `[addr, addr + len)` (explicit mode) and store `data` there, if given.
    fn store(&self, addr: u64, len: u64, data: Option<&[u8]>) -> io::Result<()> {
        // The target's cache line is on its way while the segment is looked up and the
        // store declared (in explicit mode, a small declaration's old bytes are copied
        // first); for a declaration, every line of its first page (the commit reads a
        // page's new bytes into the log: `pages 1 8` +5–14%, `pages 4 8` +9–13%,
        // `pages 1024 8` +8%).
        let lines = if data.is_none() {
            len.clamp(1, sj::PAGE)
        } else {
            1
        };
        for l in (0..lines).step_by(64) {
            cairn_media::prefetch((addr + l) as usize);
        }
        let vh = THREAD.with(|t| t.borrow().vh);
        let (v, off) = {
            let st = self.state();
            let (m, off) = find(&st, vh, addr, len, true)?;
            // Small stores where nothing can block (this thread holds the writer lock,
            // or snapshot mode) under the process state's lock: no reference of the
            // segment is taken for the call.
            let held = m.mode == CommitMode::Snapshot || self.slot(m.slot).held_by_me();
            if held && len <= LOCKED_STORE_MAX {
                if m.mode == CommitMode::Explicit {
                    self.declare_held(m.seg.ino, &m.region, m.undo.as_deref(), m.slot, off, len)?;
                }
                return data.map_or(Ok(()), |d| m.region.write(off as usize, d));
            }
            (m.view(), off)
        };
        if v.mode == CommitMode::Explicit {
            self.declared_write(&v, off, len)?;
        }
        data.map_or(Ok(()), |d| v.region.write(off as usize, d))
    }

    /// Declare `[off, off + len)` of explicit-mode segment `v` (its writer lock taken for
    /// the transaction if the thread does not hold it).
    fn declared_write(&self, v: &View, off: u64, len: u64) -> io::Result<()> {
        let slot = self.slot(v.slot);
        if !slot.held_by_me() && slot.write_lock(true)? == Taken::Recovered {
            // A segment without locks: its writer lock is held for the transaction.
            self.repair(&v.seg, &slot)?;
        }
        self.declare_held(v.seg.ino, &v.region, v.undo.as_deref(), v.slot, off, len)
    }

    /// [`SpaceJmp::declared_write`] once the thread holds the writer lock of segment
    /// `ino` (slot `slot`).
    fn declare_held(
        &self,
        ino: u64,
        region: &Region,
        undo: Option<&UndoLog>,
        slot: usize,
        off: u64,
        len: u64,
    ) -> io::Result<()> {
        let undo = undo.ok_or_else(|| fs_err(libc::EINVAL, "explicit mode without an undo log"))?;
        let slot = self.slot(slot);
        debug_assert!(slot.held_by_me());
        if slot.journal_kind() != Journal::Undo {
            // The transaction's first declaration. Entries still in the log are a dead
            // writer's that a process which may not write the log repaired: stale.
            if !undo.is_empty() {
                undo.clear()?;
            }
            slot.journal_undo(true);
        }
        THREAD.with(|t| {
            let mut t = t.borrow_mut();
            declare(region, undo, t.declared.get(ino), off, len)
        })
    }

    /// Run `f` on the heap of segment `seg` (mapped in the current address space;
    /// writable for changes).
    fn with_mem<T>(
        &self,
        seg: SegId,
        write: bool,
        f: impl FnOnce(&mut dyn Mem) -> io::Result<T>,
    ) -> io::Result<T> {
        let (base, len) = {
            let st = self.state();
            let m = st.segs.get(&seg.0).ok_or_else(|| {
                fs_err(libc::ENOENT, format!("segment {} is not attached", seg.0))
            })?;
            (m.seg.base(), m.seg.len())
        };
        let (v, _) = self.resolve(base, len, write)?;
        if write && v.mode == CommitMode::Explicit {
            // Lock and journal as a declared write does, then declare through the heap.
            self.declared_write(&v, 0, 0)?;
            let undo = v.undo.as_deref().expect("declared_write checked it");
            return THREAD.with(|t| {
                let mut t = t.borrow_mut();
                let declared = t.declared.get(v.seg.ino);
                let mut m = DeclaringMem {
                    region: &v.region,
                    undo,
                    declared,
                };
                f(&mut m)
            });
        }
        f(&mut RegionMem(&v.region))
    }

    /// Allocate `n` bytes in segment `seg`'s heap: their address.
    pub fn alloc(&self, seg: SegId, n: u64) -> io::Result<u64> {
        let base = self.mapped_segment(seg.0)?.base();
        self.with_mem(seg, true, |m| Heap::open(m)?.alloc(n))
            .map(|off| base + off)
    }

    /// Free the object at `addr`.
    pub fn free(&self, addr: u64) -> io::Result<()> {
        let (v, _) = self.resolve(addr, 1, true)?;
        let base = v.seg.base();
        self.with_mem(SegId(v.seg.ino), true, |m| Heap::open(m)?.free(addr - base))
    }

    /// Root `name` of segment `seg` (`None`: not set).
    pub fn root(&self, seg: SegId, name: &str) -> io::Result<Option<u64>> {
        self.with_mem(seg, false, |m| heap::root(m, name))
    }

    /// Set root `name` of segment `seg` to `addr` (0: remove it).
    pub fn set_root(&self, seg: SegId, name: &str, addr: u64) -> io::Result<()> {
        self.with_mem(seg, true, |m| heap::set_root(m, name, addr))
    }

    /// Whether a Rust guard is alive on this thread (one at a time).
    pub(crate) fn guard_enter(&self) -> io::Result<()> {
        THREAD.with(|t| {
            let mut t = t.borrow_mut();
            if t.guarded {
                return Err(fs_err(
                    libc::EBUSY,
                    "this thread is switched through a guard already: drop it first",
                ));
            }
            t.guarded = true;
            Ok(())
        })
    }

    pub(crate) fn guard_leave(&self) {
        THREAD.with(|t| t.borrow_mut().guarded = false);
    }
}

/// A planted crash for the tests (checked builds only, as the test suite's `ci`
/// profile): with `CAIRN_SJ_CRASH=<point>` the process kills itself there (SIGKILL: no
/// clean-up of any kind runs).
pub(crate) fn crash_point(point: &str) {
    if cfg!(debug_assertions) && std::env::var("CAIRN_SJ_CRASH").is_ok_and(|p| p == point) {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// A planted bug for the tests (checked builds only): with `CAIRN_SJ_PLANT=<bug>` a step
/// the code needs is skipped, so that a test can show its checker notices.
fn planted(bug: &str) -> bool {
    cfg!(debug_assertions) && std::env::var("CAIRN_SJ_PLANT").is_ok_and(|p| p == bug)
}

/// The region of mapped segment `ino`, to move or remap it: `EBUSY` while a call of
/// another thread uses it.
fn region_mut(st: &mut State, ino: u64) -> io::Result<&mut Region> {
    let m = st
        .segs
        .get_mut(&ino)
        .ok_or_else(|| fs_err(libc::ENOENT, format!("segment {ino} is not mapped")))?;
    exclusive(m).map(|p| &mut p.region)
}

/// The regions of two mapped segments, as [`region_mut`].
fn regions_mut(st: &mut State, a: u64, b: u64) -> io::Result<(&mut Region, &mut Region)> {
    match st.segs.get_disjoint_mut([&a, &b]) {
        [Some(x), Some(y)] => Ok((&mut exclusive(x)?.region, &mut exclusive(y)?.region)),
        _ => Err(fs_err(
            libc::ENOENT,
            format!("segment {a} or {b} is not mapped"),
        )),
    }
}

/// The parts of mapped segment `m`, to change them: `EBUSY` while a call of another
/// thread uses them.
fn exclusive(m: &mut Mapped) -> io::Result<&mut Parts> {
    let path = m.parts.seg.path.clone();
    Arc::get_mut(&mut m.parts).ok_or_else(|| {
        fs_err(
            libc::EBUSY,
            format!("segment {path} is in use by a call of another thread of this process"),
        )
    })
}

fn access_of(mode: CommitMode) -> Access {
    match mode {
        CommitMode::Snapshot => Access::Private,
        CommitMode::Explicit => Access::Shared,
    }
}

/// Segment file `path` opened for what protection `p` grants: `EACCES` unless the
/// caller may (a grant never exceeds what its maker could use).
fn open_granted(fs: &Fs, path: &str, p: u32) -> io::Result<cairn::File> {
    open_named(fs, "segment", path, Open::rw(p & prot::WRITE != 0))
}

/// `EACCES` when an address space would grant more than the segment allows.
fn check_grant(path: &str, h: &SegHeader, p: u32) -> io::Result<()> {
    if p & !prot::RW != 0 || p & prot::READ == 0 {
        return Err(fs_err(
            libc::EINVAL,
            format!("segment {path}: protection {p:#x} (read, or read-write)"),
        ));
    }
    if p & !h.prot != 0 {
        return Err(fs_err(libc::EACCES, format!("segment {path} is read-only")));
    }
    Ok(())
}

/// The entries of an address space's file.
fn read_vas(f: &cairn::File, path: &str) -> io::Result<Vec<VasEntry>> {
    let len = f.metadata()?.len() as usize;
    let mut b = vec![0u8; len];
    let n = f.read_at(&mut b, 0)?;
    sj::decode_vas(&b[..n]).map_err(|e| fs_err(libc::EINVAL, format!("{path}: {}", e.0)))
}

/// Rewrite an address space's file in place (one transaction), then cut what is left.
fn write_vas(f: &cairn::File, entries: &[VasEntry]) -> io::Result<()> {
    let b = sj::encode_vas(entries);
    f.write_runs_atomic(&[(0, &b)])?;
    if f.metadata()?.len() > b.len() as u64 {
        f.set_len(b.len() as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Declared;

    #[test]
    fn declared_ranges_cover_what_they_hold_and_merge() {
        let mut d = Declared::default();
        d.add(100, 8);
        d.add(200, 64);
        d.add(200, 16);
        assert!(d.covers(100, 8) && d.covers(104, 4) && d.covers(220, 8));
        assert!(!d.covers(96, 8) && !d.covers(104, 8) && !d.covers(300, 1));
        d.add(108, 4);
        d.add(112, 100);
        let mut m = vec![(1, 1)];
        d.merged_into(&mut m);
        assert_eq!(m, vec![(1, 1), (100, 164)]);
        // Of ranges starting at one place, the longest counts, whichever came first and
        // whether or not they were merged in between.
        for others in [0, Declared::SMALL as u64] {
            let mut d = Declared::default();
            d.add(0, 8);
            for i in 0..others {
                d.add(1000 + 10 * i, 8);
            }
            d.add(0, 64);
            assert!(d.covers(32, 8), "after {others} others");
        }
    }

    /// A set of many ranges (merged many times) answers as a model does, and merges to
    /// exactly the declared bytes.
    #[test]
    fn a_large_declared_set_answers_as_a_model_does() {
        let mut d = Declared::default();
        let mut x = 7u64;
        let mut model = std::collections::BTreeMap::new();
        for i in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (off, len) = (x % 600, 1 + (x >> 20) % 300);
            if i % 3 == 0 {
                assert!(
                    !d.covers(off, len)
                        || model
                            .range(..=off)
                            .next_back()
                            .is_some_and(|(_, &e)| off + len <= e)
                );
            }
            d.add(off, len);
            let e = model.entry(off).or_insert(off + len);
            *e = (*e).max(off + len);
            let probe = (x >> 8) % 600;
            assert_eq!(
                d.covers(probe, 8),
                model
                    .range(..=probe)
                    .next_back()
                    .is_some_and(|(_, &e)| probe + 8 <= e),
                "after {i} ranges"
            );
        }
        let mut m = Vec::new();
        d.merged_into(&mut m);
        assert!(m.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
        // Every declared byte is in the merged ranges, and no other.
        let bytes = |v: &mut dyn Iterator<Item = (u64, u64)>| {
            let mut b = std::collections::BTreeSet::new();
            for (o, e) in v {
                b.extend(o..e);
            }
            b
        };
        assert_eq!(
            bytes(&mut m.iter().map(|&(o, l)| (o, o + l))),
            bytes(&mut model.iter().map(|(&o, &e)| (o, e)))
        );
        d.clear();
        assert!(d.is_empty());
    }
}
