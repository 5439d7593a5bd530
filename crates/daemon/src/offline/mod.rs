//! Work on a store whose daemon is not running: recovery without serving (what a daemon
//! start and a clean stop do), for `cairn fsck --repair` and the power-failure simulator.

pub(crate) mod fsck;
pub(crate) mod mkfs;
pub(crate) mod restore;

use crate::core::Core;
use cairn_area::{fs_err, StoreDir};
use cairn_media::sys;
use std::collections::{BTreeMap, HashMap};
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
    try_daemon_lock(store)?.ok_or_else(|| {
        fs_err(
            libc::EBUSY,
            format!(
                "a daemon serves the store at {}: stop it first (`cairn --store {} stop`) to {what}",
                store.path.display(),
                store.path.display()
            ),
        )
    })
}

/// Take `cairnd.lock` (exclusive, without waiting); `None` if a daemon holds it.
pub(crate) fn try_daemon_lock(store: &StoreDir) -> io::Result<Option<File>> {
    let path = store.daemon_lock_path();
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| {
            let why = match store.load_config() {
                Ok(cfg) if e.kind() == io::ErrorKind::PermissionDenied => {
                    format!(" ({})", crate::core::only_the_owner(&cfg))
                }
                _ => String::new(),
            };
            fs_err(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("cannot open {}: {e}{why}", path.display()),
            )
        })?;
    match sys::flock_exclusive(&lock, true) {
        Ok(()) => Ok(Some(lock)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
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
    let _log = crate::util::logging_to(&store.daemon_log_path());
    tracing::info!("offline recovery of {}", store.path.display());
    let (mut core, _) = Core::open(&store)?;
    // The extended-attribute journal as a start replays it (a torn record cut off).
    let xattrs = open_xattrs(&store, &core)?;
    crate::server::mark_xattr_inodes(&mut core, &xattrs)?;
    core.shutdown()
}

/// A stopped store's extended attributes, from its journal: (inode, generation) → name →
/// value.
pub type StoredXattrs = HashMap<(u64, u64), BTreeMap<Vec<u8>, Vec<u8>>>;

/// The extended attributes the journal of the stopped store at `path` holds (read only,
/// as a daemon start replays it; none without a journal). Errors: `EBUSY` when a daemon
/// serves the store; `EIO` for a journal that is not this store's.
pub fn stored_xattrs(path: &Path) -> io::Result<StoredXattrs> {
    let store = StoreDir::new(path);
    let _lock = lock_store(&store, "read its extended attributes")?;
    let b = match std::fs::read(store.xattr_path()) {
        Ok(b) if !b.is_empty() => b,
        Ok(_) => return Ok(StoredXattrs::new()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(StoredXattrs::new()),
        Err(e) => return Err(e),
    };
    let cfg = store.load_config()?;
    let uuid = cairn_area::Area::open(&File::open(&cfg.nvm_path)?, false)?
        .superblock()
        .uuid;
    match crate::xattr::replay(&b) {
        Ok(r) if r.uuid == uuid => Ok(r.map),
        Ok(_) => Err(crate::util::eio(
            "the extended-attribute journal of another store",
        )),
        Err(e) => Err(crate::util::eio(format!(
            "the extended-attribute journal: {e}"
        ))),
    }
}

/// Open (and replay) the store's extended-attribute journal, as a start does.
pub(crate) fn open_xattrs(store: &StoreDir, core: &Core) -> io::Result<crate::xattr::Xattrs> {
    let gid = core.cfg.trusted_gid;
    crate::xattr::Xattrs::open(
        &store.xattr_path(),
        core.sh.area.superblock().uuid,
        Box::new(move |p| crate::offline::mkfs::restrict(p, gid, 0o600, 0o640)),
        &|note| tracing::info!("extended attributes: {note}"),
    )
}
