//! The connection to the store's daemon, and starting the daemon when none runs
//! (PROTOCOL.md, "Daemon start and auto-start").

use cairn_area::{fs_err, StoreDir};
use cairn_proto::{recv_with, send_with, Request, Response};
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long LibFS keeps trying to connect after starting a daemon.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection to `cairnd`.
pub struct Conn {
    stream: UnixStream,
    /// Reused for every message, so that requests on the write path (space credits,
    /// digests) do not allocate.
    buf: Vec<u8>,
}

impl std::os::fd::AsRawFd for Conn {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

impl Conn {
    /// Connect without starting a daemon.
    pub fn connect_only(store: &StoreDir) -> io::Result<Conn> {
        let stream = UnixStream::connect(store.socket_path())?;
        Ok(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Connect, starting the daemon if none answers. `create`: this is the default store,
    /// which the daemon creates on first use.
    pub fn connect(store: &StoreDir, create: bool) -> io::Result<Conn> {
        if let Ok(c) = Conn::connect_only(store) {
            return Ok(c);
        }
        if !create && !store.exists() {
            // Gives the "no Cairn store at ..." error with its errno.
            store.load_config()?;
        }
        let mut started = start_daemon(store, create)?;
        if !started.ok {
            // A user who may use the store but not run its daemon (a member of its
            // trusted group): starting again would not help.
            if let Some(s) = started.stderr().filter(|s| s.contains(DENIED)) {
                return Err(fs_err(
                    libc::EACCES,
                    format!(
                        "no daemon serves {}, and this user cannot start one: {s}",
                        store.path.display()
                    ),
                ));
            }
        }
        let mut started_at = Instant::now();
        let deadline = started_at + START_TIMEOUT;
        let mut last;
        loop {
            match Conn::connect_only(store) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                break;
            }
            // `start_daemon` returns once the new daemon listens or has failed; if it
            // still does not answer, it died (killed while starting, say): start another
            // (a start while one runs fails harmlessly with "already serves").
            if started_at.elapsed() >= Duration::from_millis(500) {
                started = start_daemon(store, create)?;
                started_at = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let detail = started
            .stderr()
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        Err(fs_err(
            libc::ECONNREFUSED,
            format!(
                "cannot connect to the daemon of {} ({last}); started `{}` but it did not \
                 answer within {} s (see {}){detail}",
                store.path.display(),
                started.command,
                START_TIMEOUT.as_secs(),
                store.daemon_log_path().display()
            ),
        ))
    }

    /// The pid of the process at the other end (the daemon), from the kernel.
    pub fn peer_pid(&self) -> Option<u32> {
        cairn_media::sys::peer_cred(&self.stream).ok().map(|c| c.0)
    }

    /// Send a request and wait for its response (transport errors only; a daemon's
    /// `Response::Error` is returned as a response).
    pub fn roundtrip(&mut self, req: &Request) -> io::Result<Response> {
        send_with(&mut self.stream, req, &mut self.buf)?;
        recv_with(&mut self.stream, &mut self.buf).map_err(|e| {
            if cairn_proto::undecodable(&e) {
                fs_err(
                    libc::EPROTO,
                    cairn_proto::version_mismatch("the daemon", &e),
                )
            } else {
                e
            }
        })
    }

    /// Receive the `n` descriptors the daemon sends after some responses
    /// (`cairn_proto::send_fds`: a `Registration` with `log_fds`).
    pub fn recv_fds(&self, n: usize) -> io::Result<Vec<std::os::fd::OwnedFd>> {
        cairn_proto::recv_fds(&self.stream, n)
    }

    /// Send a request that gets no response (`Digest { wait: false }`).
    pub fn send_only(&mut self, req: &Request) -> io::Result<()> {
        send_with(&mut self.stream, req, &mut self.buf)
    }
}

/// Turn a daemon's error response into an `io::Error`.
pub fn response_error(op: &str, r: Response) -> io::Error {
    match r {
        Response::Error { errno, message } => fs_err(errno, format!("{op}: {message}")),
        other => fs_err(
            libc::EPROTO,
            format!("{op}: unexpected answer from the daemon: {other:?}"),
        ),
    }
}

/// What a daemon says when its user may not run it (`cairn_daemon`'s `open_nvm`).
const DENIED: &str = "may run its daemon";

/// A daemon start in progress: the command run, whether it started (or found one
/// running), and what it printed on stderr.
struct Started {
    command: String,
    ok: bool,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Started {
    fn stderr(&self) -> Option<String> {
        self.stderr
            .recv_timeout(Duration::from_millis(200))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }
}

/// The binary set with [`set_daemon_binary`], if any.
static DAEMON_BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Use `bin` to start daemons from this process, whatever its environment says later
/// (the `LD_PRELOAD` library sets it from the environment it saw when loaded: some
/// programs, nginx for one, clear their environment at start). The first call wins.
pub fn set_daemon_binary(bin: PathBuf) {
    let _ = DAEMON_BIN.set(bin);
}

/// The `cairn` binary: the one set with [`set_daemon_binary`], else `$CAIRN_BIN`, else
/// `cairn` next to the current executable or in its parent directory (test binaries live
/// in `target/*/deps`), else `cairn` on `PATH`.
pub fn cairn_bin() -> PathBuf {
    if let Some(b) = DAEMON_BIN.get() {
        return b.clone();
    }
    if let Some(b) = std::env::var_os("CAIRN_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(b);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            for d in [Some(dir), dir.parent()].into_iter().flatten() {
                let c = d.join("cairn");
                if c.is_file() {
                    return c;
                }
            }
        }
    }
    PathBuf::from("cairn")
}

fn start_daemon(store: &StoreDir, create: bool) -> io::Result<Started> {
    let bin = cairn_bin();
    let mut cmd = Command::new(&bin);
    cmd.arg("daemon")
        .arg("--store")
        .arg(&store.path)
        .arg("--background");
    if create {
        cmd.arg("--create");
    }
    let command = format!("{cmd:?}").replace('"', "");
    // The daemon never runs under the interposition library of the process starting it.
    cmd.env_remove("LD_PRELOAD");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::ENOENT),
            format!(
                "no daemon answers on {} and starting one failed: cannot run {} ({e}); \
                 set CAIRN_BIN or put `cairn` on PATH",
                store.socket_path().display(),
                bin.display()
            ),
        )
    })?;
    // The detached daemon may keep the pipe open: read it on a thread, never block on it.
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut err) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            let _ = tx.send(s);
        });
    }
    let ok = child.wait()?.success();
    Ok(Started {
        command,
        ok,
        stderr: rx,
    })
}
