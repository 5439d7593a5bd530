//! The server: `run_daemon` takes the store's daemon lock, opens and recovers the tier,
//! listens on `cairnd.sock` and holds idle connections in one `epoll` set (`front`),
//! serving a request, or a registered client's connection, on a worker thread of a
//! bounded pool. A 100 ms timer thread reclaims retired blocks and recovers dead clients. Asynchronous digest requests
//! go to a pool of digest workers (`crate::digest::parallel`) so that different clients' logs
//! are digested in parallel; everything else takes the core with `CoreLock::serial`. SIGTERM/SIGINT and the
//! `Shutdown` request stop the daemon cleanly.

use crate::core::Core;

use crate::offline::mkfs::{mkfs, MkfsOptions};

use cairn_area::{errno_of, fs_err, StoreDir};

use cairn_media::sys;

use cairn_proto::{recv, send, Request, Response};

use std::fs::OpenOptions;

use std::io;

use std::os::unix::net::{UnixListener, UnixStream};

use std::path::PathBuf;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::sync::{Arc, MutexGuard};

use std::time::{Duration, Instant};

mod front;
mod requests;

pub(crate) use requests::mark_xattr_inodes;
use requests::{handle, take_refusal};

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
    /// The daemon log (`util::log_to`), every daemon thread's default.
    log: tracing::Dispatch,
    /// Where `log` writes (`cairnd.log`), for the fail-stop hook of each thread.
    log_path: PathBuf,
    next_conn: AtomicU64,
    uid: u32,
    /// The lease manager (shared with `core`; its own mutex).
    leases: Arc<crate::sharing::leases::Leases>,
    /// Migration and cleaning rounds (one at a time).
    migrator: crate::tiers::migrate::Migrator,
    /// Held by a superpage promotion from its allocation of an extent to its switch
    /// (`Superpages::gate`): a stop waits for it.
    superpage_gate: Arc<std::sync::Mutex<()>>,
    /// Extended attributes (their own mutex: `core` may be taken while holding it, never
    /// the other way round).
    xattrs: std::sync::Mutex<crate::xattr::Xattrs>,
    /// The segment registry (its own mutex; `core` may be taken while holding it).
    sj: std::sync::Mutex<crate::sj::Registry>,
    /// Held while a backup runs (one at a time; `core` is taken while holding it).
    backup_running: std::sync::Mutex<()>,
    /// The newest backup this daemon took.
    last_backup: std::sync::Mutex<Option<cairn_proto::BackupReport>>,
    /// The store directory it serves, as it was at the start.
    store_dir: StoreIdentity,
}

/// A store directory: its path and which directory was there (device, inode).
struct StoreIdentity {
    path: PathBuf,
    id: (u64, u64),
}

impl StoreIdentity {
    fn of(path: &std::path::Path) -> io::Result<StoreIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path)?;
        Ok(StoreIdentity {
            path: path.to_path_buf(),
            id: (m.dev(), m.ino()),
        })
    }

    /// Whether the directory at the path is still this one (not removed, not replaced
    /// by another store).
    fn still_there(&self) -> bool {
        StoreIdentity::of(&self.path).is_ok_and(|now| now.id == self.id)
    }
}

impl Daemon {
    /// Take a backup now (after the one running, if any) into the pool `url` (`None`:
    /// the store's), logging it, and keep its report for `cairn status`.
    fn backup(&self, url: Option<&str>) -> io::Result<cairn_proto::BackupReport> {
        let _one = self
            .backup_running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let r = crate::backup::take(&self.core, url)?;
        tracing::info!(
            "backup {} into {}: {} objects written ({} KiB), {} kept, {} removed; snapshot {} ms, {} ms in all",
            r.seq,
            r.url,
            r.objects_written,
            r.bytes_written >> 10,
            r.objects_kept,
            r.objects_removed,
            r.snapshot_ms,
            r.total_ms
        );
        *self.last_backup.lock().unwrap_or_else(|e| e.into_inner()) = Some(r.clone());
        Ok(r)
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.serial()
    }

    fn sj_registry(&self) -> MutexGuard<'_, crate::sj::Registry> {
        self.sj.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread serves this daemon: it logs to the daemon's log (while the
    /// guard lives), and a panic on it is fail-stop.
    fn mark_thread(&self) -> tracing::dispatcher::DefaultGuard {
        crate::util::daemon_thread(&self.log_path);
        tracing::dispatcher::set_default(&self.log)
    }
}

fn err_response(e: &io::Error) -> Response {
    Response::Error {
        errno: errno_of(e),
        message: cairn_area::error::message(e),
    }
}

/// What to do after a request.
enum Reply {
    Send(Response),
    /// Answer, then send these descriptors (`cairn_proto::send_fds`).
    SendFds(Response, Vec<std::os::fd::OwnedFd>),
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
    /// A digest worker found this client's log malformed.
    refusal: Arc<crate::digest::parallel::Refusal>,
}

/// The segment registry, without the ranges of segments whose file is gone.
fn open_sj_registry(store: &StoreDir, core: &Core) -> io::Result<crate::sj::Registry> {
    let mut reg = crate::sj::Registry::open(store.sj_registry_path())?;
    let dropped = reg
        .reconcile(|ino, gen| requests::segment_inode(core, ino, gen).is_ok_and(|i| i.is_some()))?;
    if dropped > 0 {
        tracing::info!("segment registry: {dropped} range(s) of removed segments dropped");
    }
    Ok(reg)
}

/// Run the daemon for `opts.store` until SIGTERM, SIGINT or a `Shutdown` request.
///
/// Errors: `ENOENT` when the store does not exist (without `create`), `EBUSY` when
/// another daemon serves it, and any error opening or recovering the tier.
pub fn run_daemon(opts: &DaemonOptions) -> io::Result<()> {
    let store = StoreDir::new(&opts.store);
    let lock = lock_store(&store, opts.create)?;
    crate::util::install_fail_stop();
    crate::util::daemon_thread(&store.daemon_log_path());
    let log = crate::util::log_to(&store.daemon_log_path(), !opts.background);
    let _log = tracing::dispatcher::set_default(&log);
    tracing::info!(
        "starting for store {} (pid {})",
        store.path.display(),
        std::process::id()
    );
    let (mut core, _report) = Core::open(&store).inspect_err(|e| {
        tracing::warn!("cannot start: {e}");
    })?;
    let (sock, listener) = listen(&store)?;
    if opts.background {
        detach(&store, &sock)?;
    }
    let xattrs = crate::offline::open_xattrs(&store, &core)?;
    mark_xattr_inodes(&mut core, &xattrs)?;
    core.sweep_host_objects();
    let sj = open_sj_registry(&store, &core)?;
    sys::install_termination_flag()?;
    tracing::info!("listening on {}", sock.display());
    let leases = core.leases.clone();
    let superpage_gate = core.sh.superpages.gate.clone();
    let d = Arc::new(Daemon {
        leases,
        core: crate::digest::parallel::CoreLock::new(core),
        pool: crate::digest::parallel::Pool::from_env(),
        stop: AtomicBool::new(false),
        log,
        log_path: store.daemon_log_path(),
        next_conn: AtomicU64::new(1),
        uid: sys::ids().0,
        migrator: Default::default(),
        superpage_gate,
        xattrs: std::sync::Mutex::new(xattrs),
        sj: std::sync::Mutex::new(sj),
        backup_running: Default::default(),
        last_backup: Default::default(),
        store_dir: StoreIdentity::of(&std::fs::canonicalize(&store.path)?)?,
    });
    let threads = spawn_threads(&d)?;
    let slots = d.core().sh.layout.nslots as usize;
    front::run(&d, &listener, slots)?;
    if sys::termination_requested() {
        tracing::info!("{}", "termination signal: stopping");
    }
    let r = d.quiesced_shutdown();
    d.stop.store(true, Ordering::SeqCst);
    let _ = std::fs::remove_file(&sock);
    d.pool.stop();
    for t in threads {
        let _ = t.join();
    }
    if let Err(e) = &r {
        tracing::warn!("unclean stop: {e}");
    }
    tracing::info!("{}", "stopped");
    drop(lock);
    r
}

/// Make the store if asked to (`create`) and take its daemon lock.
fn lock_store(store: &StoreDir, create: bool) -> io::Result<std::fs::File> {
    if !store.exists() {
        if !create {
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
    crate::offline::try_daemon_lock(store)?.ok_or_else(|| {
        fs_err(
            libc::EBUSY,
            format!(
                "another cairnd already serves the store at {}",
                store.path.display()
            ),
        )
    })
}

/// Bind the store's socket (a stale one removed first), open to everyone: clients
/// outside the trust domain get a clear refusal (crate::perm) instead of a bare
/// "permission denied".
fn listen(store: &StoreDir) -> io::Result<(PathBuf, UnixListener)> {
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
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))?;
    Ok((sock, listener))
}

/// `--background`: fork; the parent exits with status 0 once the socket listens, the
/// child goes on in a new session with its output in the daemon's log.
fn detach(store: &StoreDir, sock: &std::path::Path) -> io::Result<()> {
    let logf = OpenOptions::new()
        .create(true)
        .append(true)
        .open(store.daemon_log_path())?;
    match sys::fork_detach(&logf) {
        Ok(Some(_child)) => std::process::exit(0),
        Ok(None) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(sock);
            Err(fs_err(
                errno_of(&e),
                format!("cannot detach into the background: {e}"),
            ))
        }
    }
}

/// The daemon's own threads: the timer, one migration policy thread per tier that can
/// hold file data (NVM, SSD, HDD, remote; the lowest one only cleans), the superpage
/// policy, the remote tier's sweep and the digest workers.
fn spawn_threads(d: &Arc<Daemon>) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    let mut threads = Vec::new();
    let dd = d.clone();
    threads.push(
        std::thread::Builder::new()
            .name("cairnd-timer".into())
            .spawn(move || {
                let _log = dd.mark_thread();
                timer_loop(&dd)
            })?,
    );
    for from in 0..cairn_format::map::TIERS as u8 {
        let d = d.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("cairnd-migrate-{from}"))
                .spawn(move || {
                    let _log = d.mark_thread();
                    migrate_loop(&d, from)
                })?,
        );
    }
    let every = d.core().cfg.backup_interval_s;
    if every > 0 {
        let dd = d.clone();
        threads.push(
            std::thread::Builder::new()
                .name("cairnd-backup".into())
                .spawn(move || {
                    let _log = dd.mark_thread();
                    backup_loop(&dd, Duration::from_secs(every))
                })?,
        );
    }
    // Not joined at shutdown: a sweep waiting for an unreachable cluster would hold
    // the stop up to the remote tier's timeout.
    if let Some(t) = d.core().sh.remote.clone() {
        let dd = d.clone();
        std::thread::Builder::new()
            .name("cairnd-sweep".into())
            .spawn(move || {
                let _log = dd.mark_thread();
                sweep_loop(&dd, &t)
            })?;
    }
    let dd = d.clone();
    threads.push(
        std::thread::Builder::new()
            .name("cairnd-superpage".into())
            .spawn(move || {
                let _log = dd.mark_thread();
                superpage_loop(&dd)
            })?,
    );
    for _ in 0..d.pool.threads {
        let d = d.clone();
        threads.push(
            std::thread::Builder::new()
                .name("cairnd-digest".into())
                .spawn(move || {
                    let _log = d.mark_thread();
                    d.pool.work(&d.core)
                })?,
        );
    }
    tracing::info!(
        "{} digest workers (CAIRN_DIGEST_THREADS; 0: digests run serially)",
        d.pool.threads
    );
    Ok(threads)
}

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
        worked = background && d.migrator.tick(&d.core, from);
        if !worked {
            d.migrator.trim();
        }
    }
}

/// The remote tier's sweep of orphan objects (`crate::tiers::remote::sweep`): at start
/// (which also connects to the cluster), then every [`SWEEP_PERIOD`], and again a
/// minute after a sweep that failed; and the store's heartbeat in the pool.
fn sweep_loop(d: &Daemon, t: &cairn_remote::RadosTier) {
    let mut next = std::time::Instant::now();
    let mut beat = next;
    while !d.stop.load(Ordering::SeqCst) {
        let now = std::time::Instant::now();
        if now >= beat {
            crate::backup::heartbeat(&d.core, t.pool().ok().as_deref());
            beat = now + crate::backup::HEARTBEAT;
        }
        if now >= next {
            next = match crate::tiers::remote::sweep(&d.core, t) {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!("remote tier: {n} orphan object(s) removed");
                    }
                    now + SWEEP_PERIOD
                }
                Err(e) => {
                    tracing::warn!("remote tier: sweep of orphan objects failed: {e}");
                    now + Duration::from_secs(60)
                }
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The periodic backups (`backup_interval_s` of `cairn.toml`; 0: none): one every
/// interval, counted from the end of the previous one; a failed one is tried again after
/// the interval too.
fn backup_loop(d: &Daemon, every: Duration) {
    let mut next = std::time::Instant::now() + every;
    while !d.stop.load(Ordering::SeqCst) {
        if std::time::Instant::now() >= next {
            if let Err(e) = d.backup(None) {
                tracing::warn!("periodic backup failed: {e}");
            }
            next = std::time::Instant::now() + every;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How often the remote tier is swept.
const SWEEP_PERIOD: Duration = Duration::from_secs(600);

/// The superpage policy (`crate::superpage::pass`, then a compaction round when one is
/// needed: `crate::superpage::compact`): at once when a digest adds candidates, else
/// every 100 ms; at most a tenth of `superpage_rate_mib` of work per 100 ms window.
fn superpage_loop(d: &Daemon) {
    let tick = Duration::from_millis(100);
    let wake = d.core().sh.superpages.wake.clone();
    let mut seen = 0;
    let mut window = std::time::Instant::now();
    let mut spent = 0u64;
    while !d.stop.load(Ordering::SeqCst) {
        let (stopped, enabled, rate) = {
            let c = d.core();
            let sp = &c.sh.superpages;
            (c.stopped, sp.enabled, c.cfg.superpage_rate_mib.max(1))
        };
        if stopped {
            break;
        }
        let budget = (rate << 20) / 10;
        if window.elapsed() >= tick {
            window = std::time::Instant::now();
            spent = 0;
        }
        if enabled && spent < budget {
            spent += crate::superpage::pass(&d.core, budget - spent);
        }
        if enabled && spent < budget && crate::superpage::compact::needed(&d.core().sh) {
            let moved = d.migrator.compact(&d.core);
            spent += moved * cairn_format::BLOCK_SIZE_U64;
            if moved > 0 {
                let c = d.core();
                tracing::info!(
                    "compacted the NVM tier: {} KiB moved, {} extents free",
                    moved * 4,
                    c.sh.blocks.free_extents()
                );
            }
        }
        let rest = tick.saturating_sub(window.elapsed());
        if spent >= budget {
            // The window's budget is used up: wait for the next one.
            std::thread::sleep(rest);
        } else {
            seen = wake.wait(seen, rest.max(Duration::from_millis(1)));
        }
    }
}

impl Daemon {
    /// Stop the store (`Core::shutdown`) with no migration round and no superpage
    /// promotion in flight (their allocations would be saved as in use).
    fn quiesced_shutdown(&self) -> io::Result<()> {
        let paused = self.migrator.pause();
        let promoting = self
            .superpage_gate
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let r = self.core().shutdown();
        drop(promoting);
        drop(paused);
        r
    }
}

/// How often the lock files of freed inodes are removed.
const LOCK_SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How often the daemon checks that its store directory is still there.
const STORE_CHECK_EVERY: Duration = Duration::from_secs(2);

fn timer_loop(d: &Daemon) {
    let (mut swept, mut checked) = (Instant::now(), Instant::now());
    while !d.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if checked.elapsed() >= STORE_CHECK_EVERY {
            checked = Instant::now();
            if !d.store_dir.still_there() {
                // Removed (or replaced by another store): nothing to serve any more, and
                // a daemon left running would hold its memory for good. It stops at once,
                // as if killed, writing nothing more: its NVM file may be another store's
                // by now (`mkfs --force` of a new store at the same paths rewrites the same
                // file). Every acknowledged change is in a log, so the next daemon of
                // this store, if it comes back, recovers as after a crash.
                tracing::warn!(
                    "the store directory {} was removed or replaced: exiting at once, \
                     writing nothing more to the store",
                    d.store_dir.path.display()
                );
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
            }
        }
        let mut core = d.core();
        if core.stopped {
            break;
        }
        core.reclaim();
        core.recover_dead();
        core.lease_gate_tick();
        if swept.elapsed() >= LOCK_SWEEP_EVERY {
            core.sweep_host_objects();
            swept = Instant::now();
        }
    }
}

/// How long a connection that is no client's may leave an answer unread.
const UNREAD_ANSWER: Duration = Duration::from_secs(10);

/// Serve connection `w`, whose first request `w.buf` holds, on this thread: while it is
/// a registered client's connection or upcall channel, until it closes; a connection
/// that is no client's goes back to the front after each request.
fn serve(d: &Daemon, front: &front::Front, w: front::Waiting) {
    let front::Waiting {
        stream: mut s,
        id,
        peer: (pid, uid, gid),
        buf,
    } = w;
    let mut first = Some(buf);
    if let Err(e) = s.set_nonblocking(false) {
        tracing::warn!("pid {pid}: connection dropped: {e}");
        return;
    }
    let mut c = Conn {
        id,
        pid,
        uid,
        gid,
        slot: None,
        upcall_of: None,
        sock: s.try_clone().ok(),
        refusal: Arc::new(crate::digest::parallel::Refusal::new(s.try_clone().ok())),
    };
    // A peer that is no client's and does not read its answers loses the connection
    // rather than hold this thread.
    if let Err(e) = s.set_write_timeout(Some(UNREAD_ANSWER)) {
        tracing::warn!("pid {pid}: connection dropped: {e}");
        return;
    }
    let mut timed = true;
    loop {
        let req = match first.take() {
            Some(b) => recv(&mut b.as_slice()),
            None => recv(&mut s),
        };
        let req: Request = match req {
            Ok(r) => r,
            Err(e) if cairn_proto::undecodable(&e) => {
                tracing::info!("pid {pid}: {e}: answered EPROTO");
                let r = Response::Error {
                    errno: libc::EPROTO,
                    message: cairn_proto::version_mismatch("this client", &e),
                };
                if send(&mut s, &r).is_err() {
                    break;
                }
                continue;
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::info!("pid {pid}: bad message, closing: {e}");
                }
                break;
            }
        };
        if take_refusal(d, &mut c) {
            break;
        }
        // A panic here stops the daemon (fail-stop, `util::install_fail_stop`).
        let reply = handle(d, &mut c, req);
        if timed && (c.slot.is_some() || c.upcall_of.is_some()) {
            // A client's: its own thread, which only it can hold up.
            if s.set_write_timeout(None).is_err() {
                break;
            }
            timed = false;
        }
        let (resp, fds, close) = match reply {
            Reply::Send(r) => (Some(r), Vec::new(), false),
            Reply::SendFds(r, fds) => (Some(r), fds, false),
            Reply::Nothing => (None, Vec::new(), false),
            Reply::Close(r) => (r, Vec::new(), true),
        };
        if let Some(r) = resp {
            if send(&mut s, &r).is_err() {
                break;
            }
        }
        if !fds.is_empty() {
            use std::os::fd::AsFd;
            let fds: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            if cairn_proto::send_fds(&s, &fds).is_err() {
                break;
            }
        }
        if close || d.stop.load(Ordering::SeqCst) {
            break;
        }
        if c.slot.is_none() && c.upcall_of.is_none() {
            drop(c);
            front.give_back(front::Waiting {
                stream: s,
                id,
                peer: (pid, uid, gid),
                buf: Vec::new(),
            });
            return;
        }
    }
    take_refusal(d, &mut c);
    if let Some(slot) = c.upcall_of {
        d.leases.channel_closed(slot, c.id);
    }
    if let Some(slot) = c.slot {
        let mut core = d.core();
        if core.disconnected(slot, c.id) {
            tracing::warn!("slot {slot} (pid {}): connection closed without goodbye; its log is recovered once the client is gone",
                c.pid);
            core.recover_dead();
        }
    }
}
