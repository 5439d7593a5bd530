//! Work on a store whose daemon is not running: recovery without serving (what a daemon
//! start and a clean stop do), for `cairn fsck --repair` and the power-failure simulator.

use crate::core::Core;
use crate::util::Logger;
use cairn_area::{fs_err, StoreDir};
use cairn_media::sys;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Take the store's daemon lock, so that no daemon starts meanwhile. `EBUSY` with a clear
/// message when a daemon serves the store.
pub(crate) fn lock_store(store: &StoreDir, what: &str) -> io::Result<File> {
    if !store.exists() {
        return Err(fs_err(
            libc::ENOENT,
            format!("no Cairn store at {}", store.path.display()),
        ));
    }
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(store.daemon_lock_path())?;
    match sys::flock_exclusive(&lock, true) {
        Ok(()) => Ok(lock),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(fs_err(
            libc::EBUSY,
            format!(
                "a daemon serves the store at {}: stop it first (`cairn --store {} stop`) to {what}",
                store.path.display(),
                store.path.display()
            ),
        )),
        Err(e) => Err(e),
    }
}

/// Recover the store at `path` as a daemon start after a crash does (rebuild the
/// allocation state, replay every client's log), then stop cleanly (digest everything,
/// save the allocation state), without listening for clients. Messages go to the
/// store's `cairnd.log`. Errors: `EBUSY` when a daemon serves the store; what the start
/// would fail with.
pub fn recover(path: &Path) -> io::Result<()> {
    let store = StoreDir::new(path);
    let _lock = lock_store(&store, "recover it offline")?;
    let log = Logger::open(&store.daemon_log_path(), false);
    log.log(format!("offline recovery of {}", store.path.display()));
    let (mut core, _) = Core::open(&store, &log)?;
    core.shutdown(&log)
}
