//! The server: `run_daemon` takes the store's daemon lock, opens and recovers the tier,
//! listens on `cairnd.sock` and serves each connection on its own thread. A 100 ms timer
//! thread reclaims retired blocks and recovers dead clients. Asynchronous digest requests
//! go to a pool of digest workers (`crate::digest::parallel`) so that different clients' logs
//! are digested in parallel; everything else takes the core with `CoreLock::serial`. SIGTERM/SIGINT and the
//! `Shutdown` request stop the daemon cleanly.

use crate::core::{Core, MAX_INODES_PER_REQUEST};
use crate::digest::DigestError;
use crate::offline::mkfs::{mkfs, MkfsOptions};
use crate::sharing::leases::Grant;
use crate::util::Logger;
use cairn_area::{errno_of, fs_err, StoreDir};
use cairn_media::sys;
use cairn_proto::{recv, send, Request, Response};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

/// Options of [`run_daemon`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonOptions {
    /// The store directory.
    pub store: PathBuf,
    /// Detach once the socket is listening: `fork`, new session, stdio to `cairnd.log`;
    /// the starting process exits with status 0. Requires a single-threaded caller.
    pub background: bool,
    /// Create the store with the default configuration if it does not exist.
    pub create: bool,
}

impl DaemonOptions {
    /// Foreground daemon for `store`, no creation.
    pub fn new(store: impl Into<PathBuf>) -> DaemonOptions {
        DaemonOptions {
            store: store.into(),
            background: false,
            create: false,
        }
    }
}

struct Daemon {
    /// The core under its lock (`CoreLock::serial` for everything but parallel digests).
    core: crate::digest::parallel::CoreLock,
    /// Asynchronous digests of different clients run in parallel on its workers.
    pool: crate::digest::parallel::Pool,
    stop: AtomicBool,
    log: Logger,
    next_conn: AtomicU64,
    uid: u32,
    /// Advisory locks (their own mutex: waiting requests never hold `core`).
    locks: crate::sharing::locks::LockService,
    /// The lease manager (shared with `core`; its own mutex).
    leases: Arc<crate::sharing::leases::Leases>,
    /// Migration and cleaning rounds (one at a time).
    migrator: crate::tiers::migrate::Migrator,
    /// Extended attributes (their own mutex: `core` may be taken while holding it, never
    /// the other way round).
    xattrs: std::sync::Mutex<crate::xattr::Xattrs>,
}

impl Daemon {
    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.serial()
    }
}

fn err_response(e: &io::Error) -> Response {
    let message = match e
        .get_ref()
        .and_then(|x| x.downcast_ref::<cairn_area::error::FsError>())
    {
        Some(fe) => fe.message.clone(),
        None => e.to_string(),
    };
    Response::Error {
        errno: errno_of(e),
        message,
    }
}

/// What to do after a request.
enum Reply {
    Send(Response),
    Nothing,
    /// Answer (if any) and close the connection.
    Close(Option<Response>),
}

struct Conn {
    id: u64,
    pid: u32,
    uid: u32,
    gid: u32,
    slot: Option<u32>,
    /// This connection is the upcall channel of that slot's client (leases).
    upcall_of: Option<u32>,
    /// A second handle of the socket (upcalls are written through it).
    sock: Option<UnixStream>,
    /// Lock-channel state (`lock_server`).
    locks: crate::sharing::lock_server::ConnLocks,
    /// A digest worker found this client's log malformed.
    refusal: Arc<crate::digest::parallel::Refusal>,
}

/// Run the daemon for `opts.store` until SIGTERM, SIGINT or a `Shutdown` request.
///
/// Errors: `ENOENT` when the store does not exist (without `create`), `EBUSY` when
/// another daemon serves it, and any error opening or recovering the tier.
pub fn run_daemon(opts: &DaemonOptions) -> io::Result<()> {
    let store = StoreDir::new(&opts.store);
    if !store.exists() {
        if !opts.create {
            return Err(fs_err(
                libc::ENOENT,
                format!(
                    "no Cairn store at {} (create one with `cairn mkfs --store {}`)",
                    store.path.display(),
                    store.path.display()
                ),
            ));
        }
        match mkfs(&MkfsOptions::new(&store.path)) {
            Ok(_) => {}
            Err(e) if errno_of(&e) == libc::EEXIST && store.exists() => {}
            Err(e) => return Err(e),
        }
    }
    let Some(lock) = crate::offline::try_daemon_lock(&store)? else {
        return Err(fs_err(
            libc::EBUSY,
            format!(
                "another cairnd already serves the store at {}",
                store.path.display()
            ),
        ));
    };
    let mut log = Logger::open(&store.daemon_log_path(), !opts.background);
    log.log(format!(
        "starting for store {} (pid {})",
        store.path.display(),
        std::process::id()
    ));
    let (mut core, _report) = Core::open(&store, &log).inspect_err(|e| {
        log.log(format!("cannot start: {e}"));
    })?;
    let sock = store.socket_path();
    match std::fs::remove_file(&sock) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&sock).map_err(|e| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("cannot bind {}: {e}", sock.display()),
        )
    })?;
    // Anyone may connect: clients outside the trust domain get a clear refusal
    // (crate::perm) instead of a bare "permission denied".
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))?;
    }
    if opts.background {
        let logf = OpenOptions::new()
            .create(true)
            .append(true)
            .open(store.daemon_log_path())?;
        match sys::fork_detach(&logf) {
            Ok(Some(_child)) => std::process::exit(0),
            Ok(None) => log.set_echo(false),
            Err(e) => {
                let _ = std::fs::remove_file(&sock);
                return Err(fs_err(
                    errno_of(&e),
                    format!("cannot detach into the background: {e}"),
                ));
            }
        }
    }
    let xattrs = crate::offline::open_xattrs(&store, &core, &log)?;
    mark_xattr_inodes(&mut core, &xattrs)?;
    sys::install_termination_flag()?;
    log.log(format!("listening on {}", sock.display()));
    let leases = core.leases.clone();
    let d = Arc::new(Daemon {
        leases,
        core: crate::digest::parallel::CoreLock::new(core),
        pool: crate::digest::parallel::Pool::from_env(),
        stop: AtomicBool::new(false),
        log,
        next_conn: AtomicU64::new(1),
        uid: sys::ids().0,
        locks: crate::sharing::locks::LockService::default(),
        migrator: Default::default(),
        xattrs: std::sync::Mutex::new(xattrs),
    });
    d.locks.set_recaller(d.leases.clone());
    let timer = {
        let d = d.clone();
        std::thread::Builder::new()
            .name("cairnd-timer".into())
            .spawn(move || timer_loop(&d))?
    };
    // One policy thread per tier that can hold file data: NVM, SSD, HDD (the last one
    // only cleans).
    let mut migrators = Vec::new();
    for from in 0..3u8 {
        let d = d.clone();
        migrators.push(
            std::thread::Builder::new()
                .name(format!("cairnd-migrate-{from}"))
                .spawn(move || migrate_loop(&d, from))?,
        );
    }
    let mut workers = Vec::new();
    for _ in 0..d.pool.threads {
        let d = d.clone();
        workers.push(
            std::thread::Builder::new()
                .name("cairnd-digest".into())
                .spawn(move || d.pool.work(&d.core, &d.log))?,
        );
    }
    d.log.log(format!(
        "{} digest workers (CAIRN_DIGEST_THREADS; 0: digests run serially)",
        d.pool.threads
    ));
    listener.set_nonblocking(true)?;
    while !d.stop.load(Ordering::SeqCst) && !sys::termination_requested() {
        // Woken at once by a connection; every 100 ms to look at the stop flags.
        match sys::wait_readable(&listener, Duration::from_millis(100)) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                d.log.log(format!("waiting for connections failed: {e}"));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        match listener.accept() {
            Ok((s, _)) => {
                let d2 = d.clone();
                let spawned = s.set_nonblocking(false).and_then(|()| {
                    std::thread::Builder::new()
                        .name("cairnd-conn".into())
                        .spawn(move || serve(&d2, s))
                });
                if let Err(e) = spawned {
                    d.log.log(format!("cannot serve a connection: {e}"));
                }
            }
            // Taken by nobody else, but a connection may have gone before `accept`.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                d.log.log(format!("accept failed: {e}"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    if sys::termination_requested() {
        d.log.log("termination signal: stopping");
    }
    // No migration round is in flight while the store stops.
    let paused = d.migrator.pause();
    let r = d.core().shutdown(&d.log);
    drop(paused);
    d.stop.store(true, Ordering::SeqCst);
    let _ = std::fs::remove_file(&sock);
    let _ = timer.join();
    for m in migrators {
        let _ = m.join();
    }
    d.pool.stop();
    for w in workers {
        let _ = w.join();
    }
    if let Err(e) = &r {
        d.log.log(format!("unclean stop: {e}"));
    }
    d.log.log("stopped");
    drop(lock);
    r
}

/// Free NVM blocks a digest that failed for lack of space asks the migrator for (4 MiB,
/// or the log's size if larger).
const DIGEST_ROOM: u64 = 1024;

/// The background migration and cleaning policy of tier `from` (`Migrator::tick`), every
/// 100 ms, when a digest or a credit request found NVM above the high watermark, and at
/// once again while it finds work.
fn migrate_loop(d: &Daemon, from: u8) {
    let mut seen = 0;
    let mut worked = false;
    while !d.stop.load(Ordering::SeqCst) {
        if !worked {
            seen = d.migrator.wait(seen, Duration::from_millis(100));
        }
        let (stopped, background) = {
            let c = d.core();
            (c.stopped, c.cfg.background_migration)
        };
        if stopped {
            break;
        }
        worked = background && d.migrator.tick(&d.core, from, &d.log);
    }
}

fn timer_loop(d: &Daemon) {
    while !d.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let mut core = d.core();
        if core.stopped {
            break;
        }
        core.reclaim();
        core.recover_dead(&d.log);
        core.lease_gate_tick(&d.log);
    }
}

fn serve(d: &Daemon, mut s: UnixStream) {
    let (pid, uid, gid) = match sys::peer_cred(&s) {
        Ok(c) => c,
        Err(e) => {
            d.log
                .log(format!("connection without credentials refused: {e}"));
            return;
        }
    };
    let mut c = Conn {
        id: d.next_conn.fetch_add(1, Ordering::SeqCst),
        pid,
        uid,
        gid,
        slot: None,
        upcall_of: None,
        sock: s.try_clone().ok(),
        locks: crate::sharing::lock_server::ConnLocks::new(&s),
        refusal: Arc::new(crate::digest::parallel::Refusal::new(s.try_clone().ok())),
    };
    loop {
        let req: Request = match recv(&mut s) {
            Ok(r) => r,
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    d.log.log(format!("pid {pid}: bad message, closing: {e}"));
                }
                break;
            }
        };
        if take_refusal(d, &mut c) {
            break;
        }
        let reply =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handle(d, &mut c, req)))
                .unwrap_or_else(|_| {
                    d.log.log(format!(
                        "pid {pid}: internal error (panic) while serving a request"
                    ));
                    Reply::Close(Some(Response::Error {
                        errno: libc::EIO,
                        message: "internal daemon error".into(),
                    }))
                });
        let (resp, close) = match reply {
            Reply::Send(r) => (Some(r), false),
            Reply::Nothing => (None, false),
            Reply::Close(r) => (r, true),
        };
        if let Some(r) = resp {
            if send(&mut s, &r).is_err() {
                break;
            }
        }
        if close || d.stop.load(Ordering::SeqCst) {
            break;
        }
    }
    take_refusal(d, &mut c);
    // A client's locks die with its registered connection (waiters proceed at once).
    d.locks.remove_client(c.id);
    if let Some(slot) = c.upcall_of {
        d.leases.channel_closed(slot, c.id);
    }
    if let Some(slot) = c.slot {
        let mut core = d.core();
        if core.disconnected(slot, c.id) {
            d.log.log(format!(
                "slot {slot} (pid {}): connection closed without goodbye; its log is recovered once the client is gone",
                c.pid
            ));
            core.recover_dead(&d.log);
        }
    }
}

fn not_registered() -> Response {
    Response::Error {
        errno: libc::EINVAL,
        message: "not registered (send Register first)".into(),
    }
}

fn handle(d: &Daemon, c: &mut Conn, req: Request) -> Reply {
    match req {
        Request::Register { pid: claimed } => {
            if c.slot.is_some() {
                return Reply::Send(Response::Error {
                    errno: libc::EINVAL,
                    message: "this connection is already registered".into(),
                });
            }
            // A client that exited or disconnected has its log digested before another
            // client registers. Its socket may close a moment before the kernel drops its
            // slot lock, so wait (at most 2 s) for such clients to be recoverable.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let mut core = loop {
                let mut core = d.core();
                core.recover_dead(&d.log);
                if !core.dead_recovery_due() || std::time::Instant::now() >= deadline {
                    break core;
                }
                drop(core);
                std::thread::sleep(std::time::Duration::from_millis(2));
            };
            match core.register(c.pid, c.uid, c.gid, c.id) {
                Ok(r) => {
                    c.slot = Some(r.slot);
                    d.locks.add_client(c.id, c.pid, r.slot, r.slot_gen);
                    d.log.log(format!(
                        "slot {} (pid {}, claimed {claimed}, uid {}): client registered, generation {}",
                        r.slot, c.pid, c.uid, r.slot_gen
                    ));
                    Reply::Send(Response::Registered(r))
                }
                Err(e) => {
                    d.log
                        .log(format!("pid {}: registration refused: {e}", c.pid));
                    Reply::Send(err_response(&e))
                }
            }
        }
        Request::Reattach {
            pid: _,
            slot,
            slot_gen,
            leases,
            pinned,
        } => {
            if c.slot.is_some() {
                return Reply::Send(Response::Error {
                    errno: libc::EINVAL,
                    message: "this connection is already registered".into(),
                });
            }
            let mut core = d.core();
            match core.reattach(c.pid, c.uid, c.gid, slot, slot_gen, c.id) {
                Ok(r) => {
                    c.slot = Some(slot);
                    d.locks.add_client(c.id, c.pid, slot, slot_gen);
                    // Revocations the previous daemon had acknowledged may not have been
                    // digested: digest the committed log before any lease is granted.
                    if let Err(e) = core.digest_committed(slot) {
                        d.log.log(format!("slot {slot}: digest at re-attach: {e}"));
                    }
                    for ino in pinned {
                        core.pin(slot, ino);
                    }
                    if !d.leases.reattached(slot, &leases) {
                        d.log.log(format!(
                            "slot {slot}: leases sent at re-attach conflict with granted ones: all taken away"
                        ));
                        if let Err(e) = core.sh.bump_lease_gen(slot) {
                            d.log
                                .log(format!("slot {slot}: cannot increment lease_gen: {e}"));
                        }
                    }
                    d.log.log(format!(
                        "slot {slot} (pid {}): client re-attached, generation {slot_gen}",
                        c.pid
                    ));
                    Reply::Send(Response::Registered(r))
                }
                Err(e) => {
                    d.log.log(format!(
                        "pid {}: re-attach to slot {slot} refused: {e}",
                        c.pid
                    ));
                    Reply::Send(err_response(&e))
                }
            }
        }
        Request::Digest { upto_lsn, wait } => {
            let Some(slot) = c.slot else {
                return if wait {
                    Reply::Send(not_registered())
                } else {
                    Reply::Nothing
                };
            };
            if !wait && d.pool.threads > 0 {
                // Digests of different clients run in parallel (crate::digest::parallel).
                d.pool.submit(slot, c.id, upto_lsn, &c.refusal);
                return Reply::Nothing;
            }
            let mut core = d.core();
            let mut r = core.digest_client(slot, upto_lsn);
            let full = matches!(&r, Err(DigestError::Failed(e)) if errno_of(e) == libc::ENOSPC);
            if full && !core.sh.tiers.is_empty() {
                // NVM is full (a restarted daemon may have promised space a log still
                // needed): move cold data down and try once more.
                let want = core.sh.layout.log_blocks.max(DIGEST_ROOM);
                drop(core);
                d.migrator.free_nvm(
                    &d.core,
                    &|c| {
                        c.reclaim();
                        c.sh.blocks.free_count() < want
                    },
                    &d.log,
                );
                core = d.core();
                r = core.digest_client(slot, upto_lsn);
            }
            if crate::tiers::migrate::Migrator::nvm_high(&core.sh, core.cfg.migrate_high_pct) {
                d.migrator.kick();
            }
            match r {
                Ok(o) => {
                    if wait {
                        Reply::Send(Response::Digested {
                            head_lsn: o.head_lsn,
                            head_seq: o.head_seq,
                        })
                    } else {
                        Reply::Nothing
                    }
                }
                Err(e) => digest_failed(d, &mut core, c, slot, e, wait, "digest"),
            }
        }
        Request::Inodes { count } => {
            let Some(slot) = c.slot else {
                return Reply::Send(not_registered());
            };
            let mut core = d.core();
            let n = (count as u64).min(MAX_INODES_PER_REQUEST);
            Reply::Send(Response::Inodes(core.sh.inodes.reserve(slot, n)))
        }
        Request::Credits { blocks } => {
            let Some(slot) = c.slot else {
                return Reply::Send(not_registered());
            };
            let mut core = d.core();
            core.reclaim();
            if crate::tiers::migrate::Migrator::nvm_high(&core.sh, core.cfg.migrate_high_pct) {
                d.migrator.kick();
            }
            let mut granted = core.grant(slot, blocks);
            if granted < blocks && !core.sh.tiers.is_empty() {
                // NVM is full: move its coldest data down now, then grant again.
                drop(core);
                let want = blocks - granted;
                d.migrator.free_nvm(
                    &d.core,
                    &|c| {
                        c.reclaim();
                        c.available_credits() < want
                    },
                    &d.log,
                );
                let mut core = d.core();
                core.reclaim();
                granted += core.grant(slot, blocks - granted);
            }
            Reply::Send(Response::Credits { granted })
        }
        Request::Status => match d.core().status() {
            Ok(mut r) => {
                r.migration = d.migrator.progress();
                Reply::Send(Response::Status(r))
            }
            Err(e) => Reply::Send(err_response(&e)),
        },
        Request::Migrate {
            from,
            to,
            max_bytes,
        } => {
            if to != from + 1 || d.core().sh.tier(to).is_none() {
                return Reply::Send(err_response(&fs_err(
                    libc::EINVAL,
                    format!(
                        "cannot migrate from tier {from} to tier {to}: data moves one tier \
                         down, to a tier the store has"
                    ),
                )));
            }
            let max = max_bytes.div_ceil(cairn_format::BLOCK_SIZE_U64);
            let n = d.migrator.migrate(&d.core, from, max, &d.log);
            let (used, _) = crate::tiers::migrate::Migrator::usage(&d.core().sh, from);
            Reply::Send(Response::Migrated {
                bytes: n * cairn_format::BLOCK_SIZE_U64,
                used_bytes: used * cairn_format::BLOCK_SIZE_U64,
            })
        }
        Request::Clean { tier } => {
            if tier == 0 || d.core().sh.tier(tier).is_none() {
                return Reply::Send(err_response(&fs_err(
                    libc::EINVAL,
                    format!("cannot clean tier {tier}: only a lower tier the store has is cleaned"),
                )));
            }
            let n = d.migrator.clean(&d.core, tier, &d.log);
            let (used, _) = crate::tiers::migrate::Migrator::usage(&d.core().sh, tier);
            Reply::Send(Response::Migrated {
                bytes: n * cairn_format::BLOCK_SIZE_U64,
                used_bytes: used * cairn_format::BLOCK_SIZE_U64,
            })
        }
        Request::Goodbye { tail_lsn } => {
            let Some(slot) = c.slot else {
                return Reply::Close(Some(Response::Ok));
            };
            let mut core = d.core();
            match core.digest_client(slot, tail_lsn) {
                Ok(_) => match core.release(slot, None) {
                    Ok(()) => {
                        c.slot = None;
                        d.log
                            .log(format!("slot {slot} (pid {}): client left", c.pid));
                        Reply::Close(Some(Response::Ok))
                    }
                    Err(e) => Reply::Send(err_response(&e)),
                },
                Err(e) => digest_failed(d, &mut core, c, slot, e, true, "goodbye"),
            }
        }
        Request::Lease { ino, write } => lease(d, c, ino, write),
        Request::Xattr { ino, op } => {
            let Some(slot) = c.slot else {
                return Reply::Send(not_registered());
            };
            Reply::Send(xattr_call(d, slot, ino, op).unwrap_or_else(|e| err_response(&e)))
        }
        Request::UpcallChannel { slot, slot_gen } => upcall_channel(d, c, slot, slot_gen),
        Request::Commit {
            lsn,
            len,
            seq,
            versions,
        } => commit(d, c, lsn, len, seq, &versions),
        Request::UpcallAck {
            ino,
            tail_lsn,
            open,
        } => {
            if let Some(slot) = c.upcall_of {
                upcall_ack(d, slot, ino, tail_lsn, open);
            }
            Reply::Nothing
        }
        Request::Unpin { ino, tail_lsn } => {
            let Some(slot) = c.slot else {
                return Reply::Send(not_registered());
            };
            let mut core = d.core();
            // Its records about the inode are applied before it may be freed.
            if let Err(e) = core.digest_client(slot, tail_lsn) {
                return digest_failed(d, &mut core, c, slot, e, true, "unpin");
            }
            match core.unpin(slot, Some(ino)) {
                Ok(()) => Reply::Send(Response::Ok),
                Err(e) => Reply::Send(err_response(&e)),
            }
        }
        Request::Pin { ino } => {
            let Some(slot) = c.slot else {
                return Reply::Send(not_registered());
            };
            let mut core = d.core();
            if core.sh.inodes.reserved_by(ino) != Some(slot) {
                return Reply::Send(err_response(&crate::util::einval(format!(
                    "pin: inode {ino} is not a number this client reserved"
                ))));
            }
            core.pin(slot, ino);
            Reply::Send(Response::Ok)
        }
        req @ (Request::LockChannel { .. }
        | Request::Lock { .. }
        | Request::Unlock { .. }
        | Request::GetLock { .. }
        | Request::ReleaseLocks { .. }
        | Request::Delegate { .. }
        | Request::ReturnLocks { .. }) => {
            let registered = c.slot.is_some();
            match crate::sharing::lock_server::handle(
                &d.locks,
                &mut c.locks,
                c.pid,
                registered,
                req,
            ) {
                Some(r) => Reply::Send(r),
                None => Reply::Close(None),
            }
        }
        Request::Shutdown => {
            if c.uid != d.uid && c.uid != 0 {
                return Reply::Send(Response::Error {
                    errno: libc::EPERM,
                    message: "only the daemon's user can stop it".into(),
                });
            }
            d.log.log(format!("shutdown requested by pid {}", c.pid));
            let paused = d.migrator.pause();
            let r = d.core().shutdown(&d.log);
            drop(paused);
            d.stop.store(true, Ordering::SeqCst);
            match r {
                Ok(()) => Reply::Close(Some(Response::Ok)),
                Err(e) => Reply::Close(Some(err_response(&e))),
            }
        }
    }
}

/// `Xattr`: an extended-attribute call on `ino` by `slot`'s client, checked against the
/// inode as published (the client digested its own records about it first, and holds a
/// lease, so no other client has unpublished changes to it) and the client's
/// credentials (`cairn_format::xattr` has the rules).
fn xattr_call(d: &Daemon, slot: u32, ino: u64, op: cairn_proto::XattrOp) -> io::Result<Response> {
    use cairn_format::inode::Kind;
    use cairn_format::xattr::{self as rules, Access};
    use cairn_proto::XattrOp;
    let (inode, cred) = {
        let core = d.core();
        if !core.sh.layout.ino_valid(ino) {
            return Err(fs_err(
                libc::EINVAL,
                format!("xattr: bad inode number {ino}"),
            ));
        }
        (core.sh.inode(ino)?, crate::perm::slot_cred(&core.sh, slot)?)
    };
    if inode.attrs.kind == Kind::Free {
        return Err(fs_err(
            libc::ENOENT,
            format!("xattr: inode {ino} does not exist"),
        ));
    }
    let generation = inode.generation;
    let checked = |name: &[u8], access: Access, what: &str| -> io::Result<()> {
        let shown = String::from_utf8_lossy(name);
        let ns = rules::namespace(name).map_err(|n| {
            fs_err(
                n,
                format!("{what} {shown}: not a name Cairn stores (user., trusted. or security.)"),
            )
        })?;
        rules::check(&cred, &inode.attrs, ns, access).map_err(|n| {
            let why = match n {
                libc::ENODATA => "no such attribute",
                libc::EACCES => "permission denied",
                _ => "not permitted for this caller or file type",
            };
            fs_err(n, format!("{what} {shown}: {why}"))
        })
    };
    let live = |i: u64, g: u64| {
        let core = d.core();
        core.sh
            .inode(i)
            .is_ok_and(|n| n.attrs.kind != Kind::Free && n.generation == g)
    };
    let mut x = d.xattrs.lock().unwrap_or_else(|p| p.into_inner());
    Ok(match op {
        XattrOp::List => Response::XattrNames(
            x.of(ino, generation)
                .into_iter()
                .flat_map(|a| a.keys())
                .filter(|n| rules::listed(&cred, n))
                .cloned()
                .collect(),
        ),
        XattrOp::Get { name } => {
            checked(&name, Access::Get, "getxattr")?;
            match x.of(ino, generation).and_then(|a| a.get(&name)) {
                Some(v) => Response::XattrValue(v.clone()),
                None => {
                    return Err(fs_err(
                        libc::ENODATA,
                        format!(
                            "getxattr {}: no such attribute",
                            String::from_utf8_lossy(&name)
                        ),
                    ))
                }
            }
        }
        XattrOp::Set { name, value, flags } => {
            checked(&name, Access::Change, "setxattr")?;
            // The inode is flagged before the attribute is durable: a crash in between
            // leaves a flag without attributes, which only costs readers a request.
            flag_xattrs(d, ino, generation, true, &[])?;
            let dropped = x.change(ino, generation, &name, Some(&value), flags, &live)?;
            flag_xattrs(d, ino, generation, true, &dropped)?;
            Response::Ok
        }
        XattrOp::Remove { name } => {
            checked(&name, Access::Change, "removexattr")?;
            let dropped = x.change(ino, generation, &name, None, 0, &live)?;
            flag_xattrs(
                d,
                ino,
                generation,
                x.of(ino, generation).is_some(),
                &dropped,
            )?;
            Response::Ok
        }
    })
}

/// Keep the inodes' `xattrs` flags (readers skip the daemon for inodes without it):
/// `(ino, generation)` has attributes (`has`) or not; `dropped` inodes (gone, their
/// attributes dropped by a journal rewrite) are forgotten.
fn flag_xattrs(
    d: &Daemon,
    ino: u64,
    generation: u64,
    has: bool,
    dropped: &[(u64, u64)],
) -> io::Result<()> {
    let mut core = d.core();
    for k in dropped {
        core.sh.xattr_inodes.remove(k);
    }
    let changed = if has {
        core.sh.xattr_inodes.insert((ino, generation))
    } else {
        core.sh.xattr_inodes.remove(&(ino, generation))
    };
    let inode = core.sh.inode(ino)?;
    if changed && inode.generation == generation {
        // Written again as it is: `Shared::write_inode` sets the flag.
        core.sh.write_inode(ino, &inode)?;
    }
    Ok(())
}

/// At start: the inodes the attribute journal names are flagged (a daemon that stopped
/// between the journal and the flag, or a store older than the flag).
pub(crate) fn mark_xattr_inodes(core: &mut Core, x: &crate::xattr::Xattrs) -> io::Result<()> {
    for (ino, generation) in x.inodes() {
        core.sh.xattr_inodes.insert((ino, generation));
        match core.sh.inode(ino) {
            Ok(i) if i.generation == generation && !i.xattrs => core.sh.write_inode(ino, &i)?,
            _ => {}
        }
    }
    Ok(())
}

/// `Lease`: wait until granted (PROTOCOL.md, "Leases"). Runs without the core lock
/// except for the work between waits (expiring a holder, closing the restart gate).
fn lease(d: &Daemon, c: &mut Conn, ino: u64, write: bool) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    if !d.core().sh.layout.ino_valid(ino) {
        return Reply::Send(Response::Error {
            errno: libc::EINVAL,
            message: format!("lease: inode number {ino} out of range"),
        });
    }
    // An inode reserved for another live client may be one it created and has not
    // digested yet (its number reached this client out of band: an inherited
    // descriptor). The creator holds its write lease, so that lease is revoked — its
    // log digested — before this one is granted.
    let creator = d.core().sh.inodes.reserved_by(ino);
    if let Some(s) = creator.filter(|&s| s != slot) {
        d.leases.record_created(s, &[ino]);
    }
    // Only regular files enter shared-write mode (when it is on at all).
    let file = d.leases.shared_write()
        && d.core()
            .sh
            .area
            .read_inode(ino)
            .is_ok_and(|i| i.attrs.kind == cairn_format::inode::Kind::File);
    loop {
        match d.leases.acquire(slot, ino, write, file) {
            Ok(Grant::Lease) => return Reply::Send(Response::Leased { ino, write }),
            Ok(Grant::Mediated) => return Reply::Send(Response::Mediated { ino }),
            Err(crate::sharing::leases::Step::Expire(h)) => d.core().expire_leases(h, &d.log),
            Err(crate::sharing::leases::Step::GateDue) => d.core().lease_gate_tick(&d.log),
            Err(crate::sharing::leases::Step::NotLive) => {
                return Reply::Send(Response::Error {
                    errno: libc::ESTALE,
                    message: "lease: this client's slot is no longer live".into(),
                })
            }
        }
    }
}

/// `Commit` (shared-write mode, PROTOCOL.md): check the client's unsealed transaction
/// and the inode sequence words it claims, seal it and digest the log up to its end,
/// all under the core lock, so that commits writing one inode are applied one at a
/// time, each to the state the previous one published.
fn commit(d: &Daemon, c: &mut Conn, lsn: u64, len: u32, seq: u64, claimed: &[(u64, u64)]) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    let mut core = d.core();
    let written = match crate::digest::unsealed_writes(&core.sh, slot, lsn, len, seq) {
        Ok(w) => w,
        Err(e) => return Reply::Send(err_response(&e)),
    };
    let mut current = Vec::with_capacity(written.len());
    for &ino in &written {
        match core.sh.area.inode_seq(ino) {
            Ok(w) => current.push((ino, w)),
            Err(e) => return Reply::Send(err_response(&e)),
        }
    }
    if let Err(ended) = d.leases.check_commit(slot, claimed, &current) {
        return Reply::Send(Response::Stale { ended });
    }
    if let Err(e) = crate::digest::seal(&core.sh, slot, lsn) {
        return Reply::Send(err_response(&e));
    }
    if let Err(e) = core.digest_client(slot, lsn + len as u64) {
        return digest_failed(d, &mut core, c, slot, e, true, "commit");
    }
    let ended = d.leases.committed(slot, &written);
    Reply::Send(Response::Committed { ended })
}

/// `UpcallChannel`: this connection carries `slot`'s upcalls (same process only).
fn upcall_channel(d: &Daemon, c: &mut Conn, slot: u32, slot_gen: u64) -> Reply {
    let refuse = |m: &str| {
        Reply::Close(Some(Response::Error {
            errno: libc::EINVAL,
            message: format!("upcall channel: {m}"),
        }))
    };
    if c.slot.is_some() || c.upcall_of.is_some() {
        return refuse("this connection is already in use");
    }
    let ok = {
        let core = d.core();
        matches!(core.clients.get(slot as usize), Some(Some(cl))
            if cl.slot_gen == slot_gen && cl.pid == c.pid && cl.conn.is_some())
    };
    if !ok {
        return refuse("no such client of this process");
    }
    let Some(mut sock) = c.sock.take() else {
        return refuse("cannot duplicate the socket");
    };
    // The answer goes first: `channel_open` sends the revocations waiting for this
    // channel on it at once, and the client reads `Ok` before any upcall.
    if send(&mut sock, &Response::Ok).is_err() {
        return Reply::Close(None);
    }
    c.upcall_of = Some(slot);
    d.leases.channel_open(slot, c.id, sock);
    Reply::Nothing
}

/// `UpcallAck`: `slot` gave the lease on `ino` up; a writer's log is digested up to the
/// tail it answered before the lease counts as released. An inode the client has open
/// is pinned first, so that an unlink logged by the next holder keeps it.
fn upcall_ack(d: &Daemon, slot: u32, ino: u64, tail_lsn: u64, open: bool) {
    if open {
        d.core().pin(slot, ino);
    }
    let Some(was_writer) = d.leases.ack_begin(slot, ino) else {
        return;
    };
    if was_writer {
        let mut core = d.core();
        match core.digest_client(slot, tail_lsn) {
            Ok(_) => {}
            Err(DigestError::Malformed { msg, .. }) => {
                d.log.log(format!(
                    "slot {slot}: revocation answer with a bad tail ({msg}): digesting its committed log instead"
                ));
                if let Err(e) = core.digest_committed(slot) {
                    d.log.log(format!("slot {slot}: {e}"));
                }
            }
            Err(DigestError::Failed(e)) => d.log.log(format!(
                "slot {slot}: cannot digest its log for a revoked lease on inode {ino}: {e}"
            )),
        }
    }
    d.leases.ack_done(slot, ino);
}

/// A digest worker found the client's log malformed: refuse it (as [`digest_failed`]).
/// True if there was such a finding (the connection closes).
fn take_refusal(d: &Daemon, c: &mut Conn) -> bool {
    let Some((slot, msg, discard_lsn)) = c.refusal.take() else {
        return false;
    };
    if c.slot == Some(slot) {
        let mut core = d.core();
        let e = DigestError::Malformed { msg, discard_lsn };
        let _ = digest_failed(d, &mut core, c, slot, e, false, "digest");
    }
    true
}

/// A digest for a client failed: a malformed log refuses the client (its log is
/// discarded, the slot released, the connection closed); other failures are reported.
fn digest_failed(
    d: &Daemon,
    core: &mut Core,
    c: &mut Conn,
    slot: u32,
    e: DigestError,
    wait: bool,
    what: &str,
) -> Reply {
    match e {
        DigestError::Malformed { msg, discard_lsn } => {
            d.log.log(format!(
                "slot {slot} (pid {}): malformed log refused ({what}): {msg}; log discarded up to {discard_lsn}, slot released",
                c.pid
            ));
            if let Err(e) = core.release(slot, Some(discard_lsn)) {
                d.log.log(format!("slot {slot}: cannot release: {e}"));
            }
            c.slot = None;
            let resp = wait.then(|| Response::Error {
                errno: libc::EBADMSG,
                message: format!("malformed log: {msg}"),
            });
            Reply::Close(resp)
        }
        DigestError::Failed(e) => {
            d.log.log(format!(
                "slot {slot} (pid {}): {what} failed: {e}; the log stays authoritative",
                c.pid
            ));
            if wait {
                Reply::Send(err_response(&e))
            } else {
                Reply::Nothing
            }
        }
    }
}
