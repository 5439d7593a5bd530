//! The client session: attaching to the daemon (registration, the slot and its ring), each
//! operation's entry (`begin`, `run`: re-attach, lease and retry handling), requests to
//! the daemon, digests, space credits and inode numbers.

use super::{
    as_need_lease, is_stale, open_upcall_channel, Inner, InoMap, State, CREDIT_CHUNK, INODE_BATCH,
};
use crate::conn::{response_error, Conn};
use crate::handles::Handles;
use crate::leases::LeaseTable;
use crate::log::LogWriter;
use crate::meta::{groups_and_umask, Cred};
use crate::overlay::Overlay;
use crate::ring::Ring;
use cairn_area::{fs_err, Area, StoreDir};
use cairn_format::inode::Kind;
use cairn_format::BLOCK_SIZE_U64;
use cairn_media::{sys, Mapping};
use cairn_proto::{Registration, Request, Response, StatusReport};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a writer waiting for room in its log waits for the published head to move
/// before it digests synchronously ([`Inner::wait_for_room`]).
const STALL_LIMIT: Duration = Duration::from_secs(1);

/// What the daemon sent with a registration (`Registration::log_fds`): the NVM file
/// opened read-only and the slot's log file opened read-write.
pub(super) struct LogFds {
    nvm: File,
    log: File,
}

impl LogFds {
    /// Receive them on `conn` if `reg` says they follow.
    pub(super) fn recv(conn: &Conn, reg: &Registration) -> io::Result<Option<LogFds>> {
        if !reg.log_fds {
            return Ok(None);
        }
        let mut fds = conn.recv_fds(cairn_proto::REGISTRATION_FDS)?.into_iter();
        match (fds.next(), fds.next()) {
            (Some(nvm), Some(log)) => Ok(Some(LogFds {
                nvm: nvm.into(),
                log: log.into(),
            })),
            _ => Err(fs_err(libc::EPROTO, "the daemon sent too few descriptors")),
        }
    }
}

/// The slot the daemon handed out: its lock taken (waiting for a dead previous owner's
/// lock to go), the NVM tier mapped read-only with the lower tiers attached, and the
/// slot's client page and ring mapped read-write: from the descriptors the daemon sent
/// (a store of format version 7, whose files the client cannot open itself), else
/// opened by path (the ring is then a range of the NVM file). Returns the slot lock, the
/// NVM file (read-only), the area and the ring.
fn map_slot(
    store: &StoreDir,
    reg: &Registration,
    fds: Option<LogFds>,
    pid: u32,
) -> io::Result<(File, File, Area, Ring)> {
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
    let (ro, log) = match fds {
        Some(f) => (f.nvm, Some(f.log)),
        None => {
            let ro = File::open(&reg.nvm_path).map_err(|e| {
                fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("open the NVM tier {}: {e}", reg.nvm_path),
                )
            })?;
            (ro, None)
        }
    };
    let mut area = Area::open(&ro, false)?;
    let cfg = store.load_config()?;
    cfg.apply_emulation();
    if area.layout().tiers.iter().any(|t| t.present()) {
        let remote = area
            .layout()
            .tier(cairn_format::map::TIER_REMOTE)
            .map(|_| Box::new(crate::tier::DaemonTier::new(store, 3)) as _);
        area.attach_tiers(
            [cfg.ssd_path.as_deref(), cfg.hdd_path.as_deref()],
            remote,
            false,
        )?;
        area.set_cache(cfg.read_cache_mib << 20, cfg.readahead_kib << 10);
    }
    let l = *area.layout();
    if reg.slot >= l.nslots {
        return Err(fs_err(
            libc::EPROTO,
            "daemon handed out a slot out of range",
        ));
    }
    if l.slot_files != log.is_some() {
        return Err(fs_err(
            libc::EPROTO,
            "the daemon's descriptors do not match the store's format",
        ));
    }
    let rw = match log {
        Some(f) => f,
        None => std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&reg.nvm_path)?,
    };
    let map = Mapping::new(
        &rw,
        l.client_page_off(reg.slot),
        l.slot_file_bytes() as usize,
        true,
        true,
    )?;
    let ring = Ring::new(map, l.ring_bytes());
    ring.set_pid(pid)?;
    ring.set_reader_epoch(0)?;
    Ok((lock, ro, area, ring))
}

pub(super) fn lock_timeout(f: &File, what: &Path) -> io::Result<()> {
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
pub(super) fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

impl Inner {
    /// Connect to (or start) the daemon, register and map the slot.
    pub(crate) fn open(store: StoreDir, create: bool) -> io::Result<Inner> {
        let pid = std::process::id();
        // A daemon that dies between accepting and answering (killed, or stopping) is
        // replaced: reconnect (auto-starting a new one) for up to 10 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (conn, reg, fds) = loop {
            let attempt = Conn::connect(&store, create)
                .and_then(|mut c| c.roundtrip(&Request::Register { pid }).map(|r| (c, r)));
            match attempt {
                Ok((c, Response::Registered(r))) => match LogFds::recv(&c, &r) {
                    Ok(fds) => break (c, r, fds),
                    Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    Err(e) => return Err(e),
                },
                Ok((_, r)) => return Err(response_error("register with the daemon", r)),
                Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        match Inner::attach(store, create, conn, reg, fds, pid) {
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
    pub(super) fn attach(
        store: StoreDir,
        create: bool,
        conn: Conn,
        reg: Registration,
        fds: Option<LogFds>,
        pid: u32,
    ) -> Result<Inner, (io::Error, Conn, Registration)> {
        let r = map_slot(&store, &reg, fds, pid);
        let (lock, nvm, area, ring) = match r {
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
        Ok(Inner {
            conn: Mutex::new(Some(conn)),
            conn_epoch: AtomicU64::new(1),
            upcall_epoch: AtomicU64::new(1),
            upcall: Mutex::new(Some(upcall)),
            upcall_thread_fd: std::sync::atomic::AtomicI32::new(-1),
            closing: AtomicBool::new(false),
            lease_lost: std::sync::RwLock::new(None),
            lease_gen_off,
            locks: crate::lock::ClientLocks::new(),
            link_root: std::sync::RwLock::new(None),
            store,
            create,
            cred: std::sync::RwLock::new(std::sync::Arc::new(Cred {
                uid: reg.uid,
                gid: reg.gid,
                groups,
            })),
            umask: std::sync::atomic::AtomicU32::new(umask),
            nvm_path: PathBuf::from(&reg.nvm_path),
            nvm,
            pid,
            slot: reg.slot,
            slot_gen: reg.slot_gen,
            threshold_pct: reg.digest_threshold_pct.clamp(1, 100) as u64,
            slot_lock: lock,
            st: Mutex::new(State {
                leases: LeaseTable::new(lease_gen),
                objs: InoMap::default(),
                attached: InoMap::default(),
                seen: Default::default(),
                log: LogWriter::new(ring, reg.head_lsn, reg.head_seq, reg.credits),
                inodes: reg.inodes,
                ov: Overlay::new(),
                handles: Handles::default(),
                long_pins: Vec::new(),
            }),
            area,
        })
    }

    pub(crate) fn store_dir(&self) -> &Path {
        &self.store.path
    }

    pub(super) fn lock_state(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lock_conn(&self) -> MutexGuard<'_, Option<Conn>> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the state lock and catch up with the daemon's progress: the slot's
    /// `lease_gen` (one atomic load; when it changed, every lease and cached state is
    /// dropped) and the published head.
    pub(crate) fn begin(&self) -> io::Result<MutexGuard<'_, State>> {
        let mut st = self.lock_state();
        let g = self.area.map().load_u64(self.lease_gen_off)?;
        if g != st.leases.gen() {
            self.leases_lost(&mut st, g);
        }
        self.refresh(&mut st)?;
        Ok(st)
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
                        let a = st.leases.acquiring();
                        drop(st);
                        self.acquire(ino, write, a)?;
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

    /// In a child after `fork`: close the descriptors this client shares with its parent
    /// (daemon connections, the slot lock) without a word to the daemon, so that the
    /// parent's death is seen when the parent dies. The caller then leaks the `Inner`.
    /// Lock requests another thread had in flight at the fork keep their channel open.
    pub(crate) fn abandon(&self) {
        use std::os::fd::AsRawFd;
        // Once: a second abandon would close descriptor numbers the child reused.
        if self.closing.swap(true, Ordering::SeqCst) {
            return;
        }
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

    /// Whether one of the descriptors this client holds open (its daemon connections,
    /// its slot lock, the NVM file, the descriptors of its POSIX locks) is in
    /// `[first, last]`, or `None` while another thread holds one of them and they cannot
    /// be read. Allocates nothing and waits for nothing (a program may close a
    /// descriptor in a signal handler).
    pub(crate) fn holds_descriptor_in(&self, first: usize, last: usize) -> Option<bool> {
        use std::os::fd::AsRawFd;
        let hit = |fd: std::os::fd::RawFd| fd >= 0 && (first..=last).contains(&(fd as usize));
        let conn = self.conn.try_lock().ok()?;
        let upcall = self.upcall.try_lock().ok()?;
        Some(
            hit(self.slot_lock.as_raw_fd())
                || hit(self.nvm.as_raw_fd())
                || conn.as_ref().is_some_and(|c| hit(c.as_raw_fd()))
                || upcall.as_ref().is_some_and(|u| hit(u.as_raw_fd()))
                || hit(self.upcall_thread_fd.load(Ordering::SeqCst))
                || self.locks.holds_descriptor(hit)?,
        )
    }

    /// The credentials permissions are checked with now.
    pub(crate) fn cred(&self) -> std::sync::Arc<Cred> {
        self.cred.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The process changed its credentials: from now on they are the ones its calls are
    /// checked with, here and by the daemon (which digests what was logged before with
    /// the old ones and reads the new ones from the kernel: PROTOCOL.md, "Credentials").
    /// If the daemon cannot be told, this client still takes the new credentials (read
    /// from the kernel here), so the process never keeps rights it gave up.
    pub(crate) fn credentials_changed(&self) -> io::Result<()> {
        let told = self.run(|st| {
            let req = Request::Credentials {
                tail_lsn: st.log.tail(),
            };
            match self.request(st, &req)? {
                Response::Credentials { uid, gid, groups } => Ok(Cred { uid, gid, groups }),
                r => Err(response_error("credentials", r)),
            }
        });
        let (cred, r) = match told {
            Ok(c) => (c, Ok(())),
            Err(e) => (crate::meta::process_cred(), Err(e)),
        };
        *self.cred.write().unwrap_or_else(|p| p.into_inner()) = std::sync::Arc::new(cred);
        r
    }

    /// Read the published head (one atomic load) and drop the overlay entries it passed.
    pub(super) fn refresh(&self, st: &mut State) -> io::Result<()> {
        let ph = self.area.published_head(self.slot)?;
        if st.log.head_moved(ph) {
            st.ov.digested_up_to(ph);
        }
        Ok(())
    }

    /// Re-attach to a restarted daemon (`start`: starting one if none runs), sending
    /// the leases held (none if `lease_gen` changed: `begin` drops them).
    pub(super) fn reattach(
        &self,
        st: &mut State,
        conn: &mut Option<Conn>,
        start: bool,
    ) -> io::Result<()> {
        let mut c = if start {
            Conn::connect(&self.store, self.create)?
        } else {
            Conn::connect_only(&self.store)?
        };
        let g = self.area.map().load_u64(self.lease_gen_off)?;
        // Shared-write mode does not outlive the daemon: those inodes are leased anew.
        let leases = st.leases.for_reattach(g);
        let State {
            objs, leases: held, ..
        } = &mut *st;
        objs.retain(|&i, _| held.contains(i));
        match c.roundtrip(&Request::Reattach {
            pid: self.pid,
            slot: self.slot,
            slot_gen: self.slot_gen,
            leases,
            pinned: st.handles.pinned().collect(),
        })? {
            Response::Registered(reg) => {
                st.inodes = reg.inodes;
                st.log.reattached(reg.credits);
                *conn = Some(c);
                self.conn_epoch.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            r => Err(response_error("reattach to the restarted daemon", r)),
        }
    }

    /// [`Inner::reattach`], starting a daemon if none runs, for up to 10 s while the
    /// daemon is stopping (`ESHUTDOWN`) or goes away during the re-attach (killed: the
    /// next attempt starts another).
    pub(super) fn reattach_patiently(
        &self,
        st: &mut State,
        conn: &mut Option<Conn>,
    ) -> io::Result<()> {
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

    /// A request of the caller's (`Fs::sj_reserve` …) answered by the daemon, after this
    /// client's log is digested when `digested`; an `Error` answer is returned as it is.
    pub(crate) fn daemon_call(&self, req: &Request, digested: bool) -> io::Result<Response> {
        self.run(|st| {
            if digested && !st.log.digested() {
                self.digest_wait(st)?;
            }
            self.request(st, req)
        })
    }

    /// Have the daemon pin `ino` for us (`Request::Pin`: an unnamed file we create, or
    /// an open file we remove the last name of), and remember it: our last close sends
    /// `Unpin`.
    pub(super) fn pin(&self, st: &mut State, ino: u64) -> io::Result<()> {
        match self.request(st, &Request::Pin { ino })? {
            Response::Ok => {
                st.handles.pin(ino);
                Ok(())
            }
            r => Err(crate::conn::response_error("pin", r)),
        }
    }

    /// One request/response, reconnecting (and re-attaching) once if the daemon went away.
    pub(super) fn request(&self, st: &mut State, req: &Request) -> io::Result<Response> {
        self.request_fds(st, req).map(|(r, _)| r)
    }

    /// [`Inner::request`], with the descriptors the daemon sends after the response
    /// ([`Response::fds_following`]).
    pub(super) fn request_fds(
        &self,
        st: &mut State,
        req: &Request,
    ) -> io::Result<(Response, Vec<std::os::fd::OwnedFd>)> {
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
                Ok(r) => {
                    let n = r.fds_following();
                    if n == 0 {
                        return Ok((r, Vec::new()));
                    }
                    return match c.recv_fds(n) {
                        Ok(fds) => Ok((r, fds)),
                        Err(e) => {
                            *conn = None;
                            Err(fs_err(
                                libc::EIO,
                                format!("the daemon's descriptors did not arrive: {e}"),
                            ))
                        }
                    };
                }
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

    /// Ask for an asynchronous digest once the log passes the threshold; tell the daemon
    /// whether more than half of it is undigested (it then digests in slices).
    pub(super) fn maybe_request_digest(&self, st: &mut State) {
        st.log.update_pressure(false);
        if st.log.used() * 100 > self.threshold_pct * st.log.ring().bytes() {
            self.request_digest(st);
        }
    }

    /// Ask for an asynchronous digest of the whole log (unless one is pending). Returns
    /// whether one is pending now.
    fn request_digest(&self, st: &mut State) -> bool {
        if st.log.pending().is_some() {
            return true;
        }
        self.top_up_credits(st);
        let mut conn = self.lock_conn();
        if conn.is_none() && self.reattach(st, &mut conn, true).is_err() {
            return false;
        }
        let req = Request::Digest {
            upto_lsn: st.log.tail(),
            wait: false,
        };
        match conn.as_mut().expect("connected").send_only(&req) {
            Ok(()) => st.log.requested(),
            Err(_) => *conn = None,
        }
        st.log.pending().is_some()
    }

    /// The log is full: wait until the digest moved the published head (an asynchronous
    /// digest is asked for if none is pending). The daemon publishes a long batch in
    /// slices, so a writer that outruns the digest goes on as soon as a slice is
    /// published instead of waiting for the whole log. Without progress for
    /// [`STALL_LIMIT`] (the request was lost, the digest failed) the log is digested
    /// synchronously, which reports why.
    pub(super) fn wait_for_room(&self, st: &mut State) -> io::Result<()> {
        let seen = st.log.head();
        st.log.update_pressure(true);
        let deadline = Instant::now() + STALL_LIMIT;
        while st.log.head() == seen && Instant::now() < deadline {
            if !self.request_digest(st) {
                break;
            }
            self.area
                .wait_published_head(self.slot, seen, Duration::from_millis(10))?;
            self.refresh(st)?;
        }
        if st.log.head() == seen {
            self.digest_wait(st)?;
        }
        Ok(())
    }

    /// Digest the whole log now and wait for it.
    pub(crate) fn digest_wait(&self, st: &mut State) -> io::Result<()> {
        let upto = st.log.tail();
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

    /// Before an asynchronous digest is asked for (while none of ours runs, so the
    /// daemon answers at once), bring the space credits up to a log's worth of blocks
    /// if they fell below half of that: a writer streaming into its log then does not
    /// ask for credits while the digest keeps the daemon busy. Best effort:
    /// [`Inner::ensure_credits`] deals with a refusal when credits are really short.
    fn top_up_credits(&self, st: &mut State) {
        let want = (st.log.ring().bytes() / BLOCK_SIZE_U64).min(self.area.layout().credit_share());
        if st.log.credits() >= want / 2 {
            return;
        }
        if let Ok(Response::Credits { granted }) = self.request(
            st,
            &Request::Credits {
                blocks: want - st.log.credits(),
            },
        ) {
            st.log.granted(granted);
        }
    }

    pub(super) fn ensure_credits(&self, st: &mut State, need: u64) -> io::Result<()> {
        for attempt in 0..2 {
            if st.log.credits() >= need {
                return Ok(());
            }
            // A chunk at a time, but no more than a fair share of a small store.
            let chunk = CREDIT_CHUNK.min(self.area.layout().credit_share());
            let want = chunk.max(need - st.log.credits());
            match self.request(st, &Request::Credits { blocks: want })? {
                Response::Credits { granted } => st.log.granted(granted),
                r => return Err(response_error("space credits", r)),
            }
            if st.log.credits() >= need {
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
                st.log.credits()
            ),
        ))
    }

    pub(super) fn alloc_ino(&self, st: &mut State) -> io::Result<(u64, u64)> {
        // The daemon frees the inodes of unlinked files when it digests them: with none
        // left, wait for a digest of this log (which may be running in the background)
        // and ask once more before calling the store full.
        for attempt in 0..2 {
            if !st.inodes.is_empty() {
                break;
            }
            match self.request(st, &Request::Inodes { count: INODE_BATCH })? {
                Response::Inodes(v) => st.inodes = v,
                r => return Err(response_error("inode numbers", r)),
            }
            st.inodes.reverse();
            if st.inodes.is_empty() && attempt == 0 {
                self.digest_wait(st)?;
            }
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
