//! A store's *host objects*: the files Cairn makes outside the store directory, in the
//! host's shared memory (`/dev/shm`, tmpfs: RAM), named after the store's UUID so that
//! every process finds the same one and nothing of another store is touched:
//!
//! * `cairn-<uuid>.map-<ino>-<gen>`: the map object of a file mapped shared (and
//!   `….new-<pid>` while one is being filled);
//! * `cairn-<uuid>.fifo-<ino>-<gen>`, `cairn-<uuid>.sock-<ino>-<gen>`: the rendezvous of
//!   a FIFO or a socket of the store;
//! * `cairn-<uuid>.sj-<ino>-<gen>` (and `….new-<pid>` while it is built), the resident
//!   copy of a segment; `cairn-<uuid>.sj-undo-<ino>-<gen>`, a segment writer's undo
//!   journal; `cairn-<uuid>.sj-ctl`, the store's segment lock table (crate `cairn-sj`);
//! * `cairn-<uuid>.lock-<ino>-<gen>` (and `….new-<pid>-<n>` while one is made): the lock
//!   file of an inode, whose kernel locks are the inode's advisory locks (`cairn::lock`).
//!
//! Every name starts with [`store_prefix`], so [`list`] finds them all (what `cairn rmfs`
//! removes and `cairn status` counts).

use std::io;
use std::path::{Path, PathBuf};

/// Where host objects live: the host's shared memory (tmpfs).
pub const HOST_OBJECT_DIR: &str = "/dev/shm";

/// A store's UUID in 32 lowercase hex digits, as host objects' names carry it.
pub fn uuid_hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// The prefix of every host object name of the store with `uuid`: `cairn-<uuid>.`.
pub fn store_prefix(uuid: &[u8; 16]) -> String {
    format!("cairn-{}.", uuid_hex(uuid))
}

/// The name prefix of the store's host objects of one kind (`map`, `fifo`, `sock`):
/// `cairn-<uuid>.<kind>-`.
pub fn kind_prefix(uuid: &[u8; 16], kind: &str) -> String {
    format!("{}{kind}-", store_prefix(uuid))
}

/// The host object of `kind` for inode `ino` of generation `gen`.
pub fn object_path(uuid: &[u8; 16], kind: &str, ino: u64, gen: u64) -> PathBuf {
    Path::new(HOST_OBJECT_DIR).join(format!("{}{ino}-{gen}", kind_prefix(uuid, kind)))
}

/// `(ino, generation)` of a host object's file name with `prefix` (from
/// [`kind_prefix`]), or `None` (another kind or store, or a temporary file).
pub fn parse_name(name: &str, prefix: &str) -> Option<(u64, u64)> {
    let (ino, gen) = name.strip_prefix(prefix)?.split_once('-')?;
    Some((ino.parse().ok()?, gen.parse().ok()?))
}

/// The UUID of the store at `store_dir`, from its NVM file's superblock (no client, no
/// daemon needed).
pub fn store_uuid(store_dir: &Path) -> io::Result<[u8; 16]> {
    let cfg = crate::StoreDir::new(store_dir).load_config()?;
    let area = crate::Area::open(&std::fs::File::open(&cfg.nvm_path)?, false)?;
    Ok(area.superblock().uuid)
}

/// Every host object of the store with `uuid` (paths, sorted).
pub fn list(uuid: &[u8; 16]) -> Vec<PathBuf> {
    let prefix = store_prefix(uuid);
    let mut out: Vec<PathBuf> = match std::fs::read_dir(HOST_OBJECT_DIR) {
        Ok(dir) => dir
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// Remove every host object of the store at `store_dir` (a test's or a benchmark's
/// store being thrown away; `cairn rmfs` lists what it removes itself).
pub fn remove_all(store_dir: &Path) {
    if let Ok(uuid) = store_uuid(store_dir) {
        for p in list(&uuid) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The mode of a host object clients write (segment files, lock files): read and write
/// for the owner, and for the group when the store's NVM file, of mode `nvm_mode`, may be
/// read by its group (the trusted group reads the NVM file and writes none of it).
pub fn object_mode(nvm_mode: u32) -> u32 {
    if nvm_mode & 0o040 != 0 {
        0o660
    } else {
        0o600
    }
}

/// Give host object `f` the store's trust domain: the group of the store's NVM file
/// `nvm` and [`object_mode`] (who may open the store may open its host objects; nobody
/// else). Only the object's owner may change them (`EPERM` otherwise); a group the
/// process is not in is left as it is.
pub fn share_with_store(f: &std::fs::File, nvm: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::metadata(nvm)?;
    let _ = std::os::unix::fs::fchown(f, None, Some(m.gid()));
    f.set_permissions(std::fs::Permissions::from_mode(object_mode(m.mode())))
}

/// Check that host object `f` (opened at `path`) is the store's: a regular file that
/// only the store's trust domain can have made and can write — owned by the NVM file's
/// owner or root, or (when the NVM file may be read by its group, the trusted group)
/// of the NVM file's group, which a process outside the group cannot give a file — and
/// that nobody else may write. Anyone may create files in the host's shared memory, so
/// a client that opens an object by name checks it before it trusts its bytes (a map
/// object's are written back into the file). `EACCES` naming what is wrong otherwise.
pub fn check_object(f: &std::fs::File, path: &Path, nvm: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let n = std::fs::metadata(nvm)?;
    let m = f.metadata()?;
    let maker_trusted =
        m.uid() == n.uid() || m.uid() == 0 || (n.mode() & 0o040 != 0 && m.gid() == n.gid());
    if m.file_type().is_file() && maker_trusted && m.mode() & 0o007 == 0 {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is not the store's (owner {}, group {}, mode {:o}; the store's objects are              made by its owner, root or its trusted group, and nobody else may write them):              not used; remove it",
            path.display(),
            m.uid(),
            m.gid(),
            m.mode() & 0o7777
        ),
    ))
}

/// Open the existing host object at `path` read-write (close-on-exec, not through a
/// symbolic link) and [`check_object`] it.
pub fn open_object(path: &Path, nvm: &Path) -> io::Result<std::fs::File> {
    let f = open_no_follow(path, true)?;
    check_object(&f, path, nvm)?;
    Ok(f)
}

/// The kind of host object a map object is (the shared mappings of a file).
pub const MAP_KIND: &str = "map";

/// Open the map object at `path` for the daemon, which alone creates and removes map
/// objects (mode 0600, its own): read-write or read-only, close-on-exec, not through a
/// symbolic link, and checked to be the store's ([`check_daemon_object`]).
pub fn open_daemon_object(path: &Path, nvm: &Path, write: bool) -> io::Result<std::fs::File> {
    let f = open_no_follow(path, write)?;
    check_daemon_object(&f, path, nvm)?;
    Ok(f)
}

/// Open the existing file at `path` for reading, and writing if `write`, close-on-exec
/// and not through a symbolic link.
fn open_no_follow(path: &Path, write: bool) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// Check that host object `f` (opened at `path`) is one the daemon made: a regular file
/// owned by the NVM file's owner or root that nobody else may read or write. A member
/// of the trusted group cannot make one, so it cannot plant bytes a writer would then
/// write back into a file it may not write itself. `EACCES` naming what is wrong.
pub fn check_daemon_object(f: &std::fs::File, path: &Path, nvm: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let n = std::fs::metadata(nvm)?;
    let m = f.metadata()?;
    if m.file_type().is_file() && (m.uid() == n.uid() || m.uid() == 0) && m.mode() & 0o077 == 0 {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{} is not the store's (owner {}, mode {:o}; the daemon makes map objects, \
             owned by the store's owner or root and open to nobody else): not used; remove it",
            path.display(),
            m.uid(),
            m.mode() & 0o7777
        ),
    ))
}

/// The name of the sealed `memfd` a program stored on Cairn runs from (the `LD_PRELOAD`
/// library's `execve`): `cairn-exec-<uuid>-<ino>-<gen>`, which the running process's
/// `/proc/PID/exe` shows as `/memfd:<name> (deleted)`.
pub fn exec_memfd_name(uuid: &[u8; 16], ino: u64, gen: u64) -> String {
    format!("cairn-exec-{}-{ino}-{gen}", uuid_hex(uuid))
}

/// Whether a process this one may inspect (its own user's; every process for root)
/// runs the program of inode `ino`/`gen` from its [`exec_memfd_name`] copy: the file is
/// *busy* (`ETXTBSY` for opening it to write or truncating it, as Linux answers for a
/// running program). Processes of other users cannot be seen (`/proc/PID/exe` needs
/// the right to trace them) and do not count.
pub fn text_busy(uuid: &[u8; 16], ino: u64, gen: u64) -> bool {
    let want = format!("/memfd:{} (deleted)", exec_memfd_name(uuid, ino, gen));
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        let name = e.file_name();
        name.to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            && std::fs::read_link(e.path().join("exe"))
                .is_ok_and(|t| t.as_os_str().as_encoded_bytes() == want.as_bytes())
    })
}

/// The kind of host object a lock file is.
pub const LOCK_KIND: &str = "lock";

/// The lock file of inode `ino` of generation `gen`.
pub fn lock_file_path(uuid: &[u8; 16], ino: u64, gen: u64) -> PathBuf {
    object_path(uuid, LOCK_KIND, ino, gen)
}

/// The kind of host object a SpaceJMP segment's resident copy is.
pub const SEGMENT_COPY_KIND: &str = "sj";
/// The kind of host object a SpaceJMP segment's undo log is.
pub const SEGMENT_UNDO_KIND: &str = "sj-undo";
/// The kinds of host object a SpaceJMP segment has (made and removed by the daemon).
pub const SEGMENT_KINDS: [&str; 2] = [SEGMENT_COPY_KIND, SEGMENT_UNDO_KIND];

/// The store's host objects of `kinds` that may go: those whose `(ino, gen)` is not
/// `live`, and the temporary ones of processes that died while making one.
pub fn stale_objects(
    uuid: &[u8; 16],
    kinds: &[&str],
    live: impl Fn(u64, u64) -> bool,
) -> Vec<PathBuf> {
    let prefixes: Vec<String> = kinds.iter().map(|k| kind_prefix(uuid, k)).collect();
    list(uuid)
        .into_iter()
        .filter(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            // The longest matching prefix: `sj-` is also the start of `sj-undo-`.
            let Some(prefix) = (prefixes.iter())
                .filter(|q| name.starts_with(q.as_str()))
                .max_by_key(|q| q.len())
            else {
                return false;
            };
            if let Some((_, tmp)) = name.rsplit_once(".new-") {
                let pid = tmp.split('-').next().and_then(|p| p.parse().ok());
                return pid.is_some_and(|p| !cairn_media::sys::pid_alive(p));
            }
            parse_name(&name, prefix).is_some_and(|(ino, gen)| !live(ino, gen))
        })
        .collect()
}

/// A new host object at `path` (exclusive create, read-write, close-on-exec) with the
/// store's trust domain as its permissions ([`share_with_store`], `nvm` the NVM file).
/// Made under a temporary name and put in place by the caller (a rename or a link), so
/// that nobody opens it before its permissions are set. Nothing is left on failure.
pub fn create_object(path: &Path, nvm: &Path) -> io::Result<std::fs::File> {
    let f = create_private_object(path)?;
    if let Err(e) = share_with_store(&f, nvm) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(f)
}

/// A new host object at `path` (exclusive create, read-write, close-on-exec) of mode
/// 0600: the caller's own (the daemon's map objects; [`create_object`] shares it).
pub fn create_private_object(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Bytes a file holds on its file system (allocated blocks; for tmpfs, memory).
pub fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).map_or(0, |m| m.blocks() * 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        let uuid = [0xabu8; 16];
        let p = object_path(&uuid, "map", 42, 7);
        let prefix = kind_prefix(&uuid, "map");
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(&store_prefix(&uuid)));
        assert_eq!(parse_name(name, &prefix), Some((42, 7)));
        assert_eq!(parse_name(&format!("{name}.new-12"), &prefix), None);
        assert_eq!(parse_name(name, &kind_prefix(&uuid, "fifo")), None);
        assert_eq!(parse_name(name, &kind_prefix(&[0; 16], "map")), None);
        assert!(p.starts_with(HOST_OBJECT_DIR));
    }

    #[test]
    fn stale_objects_are_dead_generations_and_dead_makers() {
        let mut uuid = [0u8; 16];
        uuid[..4].copy_from_slice(&std::process::id().to_le_bytes());
        uuid[4..].copy_from_slice(b"locktest-sta");
        let live = lock_file_path(&uuid, 5, 2);
        let dead = lock_file_path(&uuid, 5, 1);
        let making = PathBuf::from(format!("{}.new-{}-0", live.display(), std::process::id()));
        // No process has pid 0: a maker that died.
        let orphan = PathBuf::from(format!("{}.new-0-0", dead.display()));
        let copy = object_path(&uuid, SEGMENT_KINDS[0], 5, 2);
        let dead_undo = object_path(&uuid, SEGMENT_KINDS[1], 5, 1);
        let ctl = Path::new(HOST_OBJECT_DIR).join(format!("{}sj-ctl", store_prefix(&uuid)));
        let all = [&live, &dead, &making, &orphan, &copy, &dead_undo, &ctl];
        for p in all {
            std::fs::write(p, b"").unwrap();
        }
        let kinds = [LOCK_KIND, SEGMENT_KINDS[0], SEGMENT_KINDS[1]];
        let mut stale = stale_objects(&uuid, &kinds, |ino, gen| (ino, gen) == (5, 2));
        let locks_only = stale_objects(&uuid, &[LOCK_KIND], |ino, gen| (ino, gen) == (5, 2));
        stale.sort();
        let mut want = vec![dead.clone(), orphan.clone(), dead_undo.clone()];
        want.sort();
        for p in all {
            let _ = std::fs::remove_file(p);
        }
        assert_eq!(stale, want);
        assert_eq!(locks_only.len(), 2, "{locks_only:?}");
    }
}
