//! Small helpers: errors, time, randomness, the daemon log.

use cairn_area::fs_err;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;

/// `EINVAL` with a message.
pub(crate) fn einval(msg: impl Into<String>) -> io::Error {
    fs_err(libc::EINVAL, msg)
}

/// `EIO` with a message.
pub(crate) fn eio(msg: impl Into<String>) -> io::Error {
    fs_err(libc::EIO, msg)
}

pub(crate) use cairn_area::time::now_ns;

/// `n` random bytes from the kernel (`getrandom(2)`): store uuids and NVM file names,
/// which must be unique, not secret.
pub(crate) fn random_bytes(n: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; n];
    getrandom::getrandom(&mut b)
        .map_err(|e| eio(format!("no random bytes from the kernel: {e}")))?;
    Ok(b)
}

/// Lower-case hex of `b`.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for nanoseconds since the epoch (UTC).
pub(crate) fn timestamp(ns: i64) -> String {
    let ms = cairn_area::time::utc(ns).millisecond();
    format!("{}.{ms:03}Z", cairn_area::time::date_time(ns, 'T'))
}

thread_local! {
    /// The daemon log of the daemon this thread serves (`None`: not a daemon thread).
    static DAEMON_LOG: std::cell::RefCell<Option<std::path::PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// Mark the calling thread as serving the daemon whose log is `log_path`: from now on a
/// panic on it (a failed assertion, an integer overflow in a checked build, any bug)
/// stops the process at once ([`install_fail_stop`]).
pub(crate) fn daemon_thread(log_path: &Path) {
    DAEMON_LOG.with(|l| *l.borrow_mut() = Some(log_path.to_path_buf()));
}

/// What a thread started by a daemon thread needs to serve the same daemon: its log
/// (the `tracing` default) and fail-stop ([`daemon_thread`]).
pub(crate) struct ThreadCtx {
    log_path: Option<std::path::PathBuf>,
    dispatch: tracing::Dispatch,
}

impl ThreadCtx {
    /// The calling thread's.
    pub(crate) fn current() -> ThreadCtx {
        ThreadCtx {
            log_path: DAEMON_LOG.with(|l| l.borrow().clone()),
            dispatch: tracing::dispatcher::get_default(|d| d.clone()),
        }
    }

    /// Make the calling thread serve the same daemon (its log while the guard lives).
    pub(crate) fn enter(&self) -> tracing::dispatcher::DefaultGuard {
        if let Some(p) = &self.log_path {
            daemon_thread(p);
        }
        tracing::dispatcher::set_default(&self.dispatch)
    }
}

/// Fail-stop: a panic on a daemon thread is written to that daemon's log (message and
/// source location) and aborts the process, before any unwinding. After a broken
/// invariant the daemon's memory (allocation bitmaps, maps, leases) may be wrong, and
/// going on could write that into the store; a stopped daemon is a crash like any
/// other: clients keep their logs, and the next daemon (a client starts one) recovers
/// the store from them. Panics on other threads go to the hook installed before.
pub(crate) fn install_fail_stop() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let Some(path) = DAEMON_LOG.with(|l| l.borrow().clone()) else {
                return previous(info);
            };
            let thread = std::thread::current();
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let msg = format!(
                "internal error on thread {}: {} (at {at}); stopping at once (the next \
                 start recovers the store from the client logs)",
                thread.name().unwrap_or("?"),
                info.payload_as_str()
                    .unwrap_or("a panic")
                    .replace('\n', " ")
            );
            let line = format!(
                "{} cairnd[{}] ERROR {msg}\n",
                timestamp(now_ns()),
                std::process::id()
            );
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
            {
                let _ = f.write_all(line.as_bytes());
            }
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                let _ = io::stderr().write_all(line.as_bytes());
            }
            std::process::abort();
        }));
    });
}

/// The daemon's log (`tracing`): timestamped lines with their level appended to
/// `cairnd.log` (`path`), and echoed to stderr with `echo` (a daemon in the foreground).
/// Each daemon thread makes it its default (`tracing::dispatcher::set_default`), so that
/// daemons run in one process (the tests) each log to their own store.
pub(crate) fn log_to(path: &Path, echo: bool) -> tracing::Dispatch {
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .ok();
    let to_file = Mutex::new(file.map_or_else(
        || Box::new(io::sink()) as Box<dyn Write + Send>,
        |f| Box::new(f) as Box<dyn Write + Send>,
    ));
    let writer = if echo {
        BoxMakeWriter::new(to_file.and(io::stderr))
    } else {
        BoxMakeWriter::new(to_file)
    };
    let sub = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_timer(Stamp)
        .with_target(false)
        .with_ansi(false)
        .finish();
    tracing::Dispatch::new(sub)
}

/// The log's timer: [`timestamp`] and the daemon's pid (which changes when it detaches).
struct Stamp;

impl tracing_subscriber::fmt::time::FormatTime for Stamp {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        write!(w, "{} cairnd[{}]", timestamp(now_ns()), std::process::id())
    }
}

/// Log to `path` (as [`log_to`], no echo) for as long as the guard lives: the daemon's
/// work done outside a daemon (`cairn fsck`, `recover`).
pub(crate) fn logging_to(path: &Path) -> tracing::dispatcher::DefaultGuard {
    tracing::dispatcher::set_default(&log_to(path, false))
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps() {
        assert_eq!(super::timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::timestamp(1_700_000_000_123_000_000),
            "2023-11-14T22:13:20.123Z"
        );
    }
}

/// A doorbell: a counter and a condition variable. Background threads wait on it with a
/// period; whoever has work for them rings it.
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    rung: std::sync::Mutex<u64>,
    cv: std::sync::Condvar,
}

impl Doorbell {
    /// Ring.
    pub(crate) fn ring(&self) {
        *self.rung.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.cv.notify_all();
    }

    /// Wait until rung after `seen` (the count a previous wait returned) or `timeout`
    /// passed; the count.
    pub(crate) fn wait(&self, seen: u64, timeout: std::time::Duration) -> u64 {
        let g = self.rung.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .cv
            .wait_timeout_while(g, timeout, |n| *n == seen)
            .unwrap_or_else(|e| e.into_inner());
        *g
    }
}
