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
            Logger::open(&path, std::io::IsTerminal::is_terminal(&std::io::stderr())).log(msg);
            std::process::abort();
        }));
    });
}

/// The daemon's log: timestamped lines appended to `cairnd.log`, and echoed to stderr
/// when the daemon runs in the foreground.
pub(crate) struct Logger {
    file: Mutex<Option<std::fs::File>>,
    echo: bool,
}

impl Logger {
    /// Open (append) the log file; `echo` also prints every line to stderr.
    pub(crate) fn open(path: &Path, echo: bool) -> Logger {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok();
        Logger {
            file: Mutex::new(file),
            echo,
        }
    }

    /// A logger that writes nowhere (tests of internals).
    #[cfg(test)]
    pub(crate) fn null() -> Logger {
        Logger {
            file: Mutex::new(None),
            echo: false,
        }
    }

    /// Stop echoing (after the daemon detached: stderr is the log file itself).
    pub(crate) fn set_echo(&mut self, echo: bool) {
        self.echo = echo;
    }

    /// Append one line.
    pub(crate) fn log(&self, msg: impl AsRef<str>) {
        let line = format!(
            "{} cairnd[{}]: {}\n",
            timestamp(now_ns()),
            std::process::id(),
            msg.as_ref()
        );
        if let Ok(mut g) = self.file.lock() {
            if let Some(f) = g.as_mut() {
                let _ = f.write_all(line.as_bytes());
            }
        }
        if self.echo {
            let _ = io::stderr().write_all(line.as_bytes());
        }
    }
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
