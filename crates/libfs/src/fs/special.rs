//! Special files: FIFOs, Unix-domain sockets and device nodes (ARCHITECTURE.md,
//! "Special files").
//!
//! They are inodes like any other: kind and device number in the inode, no data. What
//! opening them reaches lives in the kernel, outside the store:
//!
//! * A FIFO is a kernel pipe, and every process that opens the same FIFO must get the
//!   same pipe. Through Cairn a process opens the FIFO's *rendezvous*, one host FIFO per
//!   store, inode and generation: `/dev/shm/cairn-<uuid>.fifo-<ino>-<gen>`, made by the
//!   first opener. Where the store is mounted (`cairn mount`), the mount's path of the
//!   FIFO instead: the kernel's pipe of the mounted inode, which processes using the mount
//!   open too.
//! * A socket bound at a Cairn path is a host socket bound at its rendezvous
//!   (`…sock-<ino>-<gen>`), or at the mount's path where the store is mounted; `connect`
//!   to the Cairn path goes to the same place.
//! * A device node opens the host device its numbers name (`/sys/dev/{char,block}/M:m`
//!   gives its `/dev` name).
//!
//! Cairn's permission bits are checked before the host object is opened, and the host
//! object's own checks apply too (the stricter of the two wins). A rendezvous is removed
//! when its inode's last link goes, and `cairn stop` removes those of inodes that no
//! longer exist (a crash between the two).

use super::{At, CreateOpts, Inner, State};
use crate::meta::{R, W};
use cairn_area::host;
use cairn_area::{errno_of, fs_err};
use cairn_format::inode::Kind;
use cairn_format::ROOT_INO;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Largest major and minor numbers a Linux device number can hold (12 and 20 bits).
const MAX_MAJOR: u64 = (1 << 12) - 1;
const MAX_MINOR: u64 = (1 << 20) - 1;

/// `makedev(major, minor)` in glibc's 64-bit `dev_t` encoding (the one `st_rdev` uses).
pub fn makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xfff) << 8) | ((major & !0xfff) << 32) | (minor & 0xff) | ((minor & !0xff) << 12)
}

/// `(major, minor)` of a device number in glibc's encoding.
pub fn major_minor(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

/// The rendezvous name prefix of a store's FIFOs (`fifo`) or sockets (`sock`).
fn rendezvous_prefix(uuid: &[u8; 16], what: &str) -> String {
    host::kind_prefix(uuid, what)
}

fn rendezvous_path(uuid: &[u8; 16], kind: Kind, ino: u64, gen: u64) -> PathBuf {
    let what = if kind == Kind::Fifo { "fifo" } else { "sock" };
    host::object_path(uuid, what, ino, gen)
}

/// The host rendezvous files (FIFOs and sockets) of the store at `store_dir`.
pub fn rendezvous_files(store_dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(list_rendezvous(&host::store_uuid(store_dir)?)
        .into_iter()
        .map(|(p, ..)| p)
        .collect())
}

/// `(path, kind, ino, gen)` of every rendezvous of the store with `uuid`.
fn list_rendezvous(uuid: &[u8; 16]) -> Vec<(PathBuf, Kind, u64, u64)> {
    let prefixes = [
        (rendezvous_prefix(uuid, "fifo"), Kind::Fifo),
        (rendezvous_prefix(uuid, "sock"), Kind::Socket),
    ];
    let mut out = Vec::new();
    for path in host::list(uuid) {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for (prefix, kind) in &prefixes {
            if let Some((ino, gen)) = host::parse_name(&name, prefix) {
                out.push((path.clone(), *kind, ino, gen));
            }
        }
    }
    out
}

/// The `/dev` path of the host device `rdev` of `kind`, from sysfs.
fn host_device(kind: Kind, rdev: u64) -> io::Result<PathBuf> {
    let (major, minor) = major_minor(rdev);
    let class = if kind == Kind::CharDev {
        "char"
    } else {
        "block"
    };
    let uevent = format!("/sys/dev/{class}/{major}:{minor}/uevent");
    let text = std::fs::read_to_string(&uevent).map_err(|_| {
        fs_err(
            libc::ENXIO,
            format!("no such device: {class} device {major}:{minor} is not on this host"),
        )
    })?;
    let name = text
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .ok_or_else(|| {
            fs_err(
                libc::ENXIO,
                format!("{class} device {major}:{minor} has no /dev name"),
            )
        })?;
    Ok(Path::new("/dev").join(name))
}

/// Undo the octal escapes of a `/proc/self/mountinfo` field (`\040` for a space, …);
/// an escape that is not a byte stays as it is.
pub fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The file-system name `cairn mount` gives the mount of the store at `store`:
/// `cairn:<canonical store path>` (shown by `df`, and how [`cairn_mounts`] tells which
/// store a mount serves), or plain `cairn` when the path cannot be a mount option.
pub fn mount_fsname(store: &Path) -> String {
    let p = std::fs::canonicalize(store).unwrap_or_else(|_| store.to_path_buf());
    match p.to_str() {
        Some(s) if !s.contains([',', ' ', '\t', '\n', '\\']) => format!("cairn:{s}"),
        _ => "cairn".to_string(),
    }
}

/// A FUSE mount of a Cairn store (`cairn mount`), from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CairnMount {
    pub mountpoint: PathBuf,
    /// The store it serves (`None`: a mount that does not say).
    pub store: Option<PathBuf>,
}

/// The Cairn FUSE mounts this process sees.
pub fn cairn_mounts() -> Vec<CairnMount> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let path = |b: Vec<u8>| {
        PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(b))
    };
    text.lines()
        .filter_map(|l| {
            // ID parent major:minor root MOUNTPOINT options ... - FSTYPE SOURCE options
            let (pre, post) = l.split_once(" - ")?;
            let mountpoint = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let (fstype, source) = (post.next()?, post.next()?);
            if !fstype.starts_with("fuse") {
                return None;
            }
            let source = unescape_mountinfo(source);
            let store = match source.strip_prefix(b"cairn:") {
                Some(s) => Some(path(s.to_vec())),
                None if source == b"cairn" => None,
                None => return None,
            };
            Some(CairnMount {
                mountpoint: path(unescape_mountinfo(mountpoint)),
                store,
            })
        })
        .collect()
}

/// Where the store at `store_dir` is mounted, if it is.
fn mount_point(store_dir: &Path) -> Option<PathBuf> {
    let want = std::fs::canonicalize(store_dir).ok()?;
    cairn_mounts()
        .into_iter()
        .find(|m| m.store.as_deref() == Some(want.as_path()))
        .map(|m| m.mountpoint)
}

/// The host object a special file's open, bind or connect reaches.
struct Target {
    kind: Kind,
    path: PathBuf,
    /// `path` is the inode's rendezvous (else the mount's path or a host device).
    rendezvous: bool,
}

impl Inner {
    /// `mknod(p, mode, rdev)`: a regular file (type 0 or `S_IFREG`), FIFO, socket or
    /// (root only, as `CAP_MKNOD`) device node, with `mode & 0o7777` minus the umask.
    pub(crate) fn mknod(&self, p: At<'_>, mode: u32, rdev: u64) -> io::Result<()> {
        let op = format!("mknod {}", p.display());
        p.named(&op)?;
        let kind = match mode & 0o170000 {
            0 => Kind::File,
            m => Kind::from_mode(m)
                .ok_or_else(|| fs_err(libc::EINVAL, format!("{op}: bad file type")))?,
        };
        match kind {
            Kind::Dir => {
                return Err(fs_err(
                    libc::EPERM,
                    format!("{op}: use mkdir to make a directory"),
                ))
            }
            Kind::Symlink => {
                return Err(fs_err(libc::EINVAL, format!("{op}: use symlink")));
            }
            k if k.is_device() => {
                if !self.cred().is_root() {
                    return Err(fs_err(
                        libc::EPERM,
                        format!("{op}: only root may make device nodes"),
                    ));
                }
                let (major, minor) = major_minor(rdev);
                if major > MAX_MAJOR || minor > MAX_MINOR {
                    return Err(fs_err(
                        libc::EINVAL,
                        format!("{op}: device number {major}:{minor} out of range"),
                    ));
                }
            }
            _ => {}
        }
        let perm = mode & 0o7777 & !self.umask.load(Ordering::Relaxed);
        self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            let Some(name) = w.name.filter(|_| w.found.is_none()) else {
                return Err(fs_err(libc::EEXIST, format!("{op}: file exists")));
            };
            if w.trailing_slash {
                return Err(fs_err(libc::ENOENT, format!("{op}: trailing slash")));
            }
            self.create_in(
                st,
                w.parent,
                &name,
                CreateOpts {
                    kind,
                    perm,
                    rdev: if kind.is_device() { rdev } else { 0 },
                },
                None,
                &op,
            )?;
            Ok(())
        })
    }

    /// The path of directory `dir` inside the store (`a/b`; empty for the root), by its
    /// parent pointers and a search of each parent for its name.
    fn dir_path(&self, st: &State, dir: u64, op: &str) -> io::Result<PathBuf> {
        let mut names = Vec::new();
        let mut d = dir;
        while d != ROOT_INO {
            let (_, a) = self.attrs(st, d)?;
            let name = self
                .list(st, a.parent)?
                .into_iter()
                .find(|e| e.1 == d)
                .map(|e| e.0)
                .ok_or_else(|| fs_err(libc::ENOENT, format!("{op}: directory was removed")))?;
            names.push(name);
            if names.len() > 4096 {
                return Err(fs_err(libc::ELOOP, format!("{op}: directory loop")));
            }
            d = a.parent;
        }
        let mut p = PathBuf::new();
        for n in names.iter().rev() {
            p.push(std::ffi::OsStr::from_bytes(n));
        }
        Ok(p)
    }

    /// The path of `name` in `dir` through the mount of this store, if it is mounted.
    fn mount_path(
        &self,
        st: &State,
        dir: u64,
        name: &[u8],
        op: &str,
    ) -> io::Result<Option<PathBuf>> {
        let Some(mp) = mount_point(self.store_dir()) else {
            return Ok(None);
        };
        Ok(Some(
            mp.join(self.dir_path(st, dir, op)?)
                .join(std::ffi::OsStr::from_bytes(name)),
        ))
    }

    /// Resolve `p` (following symlinks) to a special file and the host object it reaches,
    /// after checking `want` access (`R`/`W` bits).
    fn special_target(&self, p: At<'_>, want: u32, op: &str) -> io::Result<Target> {
        self.run(|st| {
            let w = self.walk(st, p, true, op)?;
            let (ino, kind) = w
                .found
                .ok_or_else(|| fs_err(libc::ENOENT, format!("{op}: no such file or directory")))?;
            let (gen, a) = self.attrs(st, ino)?;
            if !matches!(
                kind,
                Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev
            ) {
                return Err(fs_err(libc::EINVAL, format!("{op}: not a special file")));
            }
            if !self.cred().may(&a, want) {
                return Err(fs_err(libc::EACCES, format!("{op}: permission denied")));
            }
            let (path, rendezvous) = if kind.is_device() {
                let p = host_device(kind, a.rdev)
                    .map_err(|e| fs_err(libc::ENXIO, format!("{op}: {e}")))?;
                (p, false)
            } else if let Some(name) = w.name.as_deref() {
                match self.mount_path(st, w.parent, name, op)? {
                    Some(m) => (m, false),
                    None => (rendezvous_path(&self.uuid(), kind, ino, gen), true),
                }
            } else {
                return Err(fs_err(libc::EINVAL, format!("{op}: not a special file")));
            };
            Ok(Target {
                kind,
                path,
                rendezvous,
            })
        })
    }

    /// Open the special file `p` with `open(2)` `flags` (access mode, `O_NONBLOCK`,
    /// `O_CLOEXEC`, …): a FIFO's pipe, a device. The state lock is not held while the
    /// open blocks (a FIFO waits for its other end).
    pub(crate) fn open_special(&self, p: At<'_>, flags: i32) -> io::Result<OwnedFd> {
        let op = format!("open {}", p.display());
        let want = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => R,
            libc::O_WRONLY => W,
            _ => R | W,
        };
        let t = self.special_target(p, want, &op)?;
        if t.kind == Kind::Socket {
            return Err(fs_err(
                libc::ENXIO,
                format!("{op}: a socket is not opened, it is connected to"),
            ));
        }
        // Through the mount the kernel's pipe of the mounted inode is there already.
        if t.kind == Kind::Fifo && t.rendezvous {
            make_fifo(&t.path).map_err(|e| {
                fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("{op}: making the rendezvous {}: {e}", t.path.display()),
                )
            })?;
        }
        let acc = flags & libc::O_ACCMODE;
        let f = std::fs::OpenOptions::new()
            .read(acc != libc::O_WRONLY)
            .write(acc != libc::O_RDONLY)
            .custom_flags(flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC))
            .open(&t.path)
            .map_err(|e| fs_err(e.raw_os_error().unwrap_or(libc::EIO), format!("{op}: {e}")))?;
        Ok(f.into())
    }

    /// `bind` of a Unix-domain socket to the Cairn path `p`: the host path to bind the
    /// socket to, and whether Cairn made the socket inode (remove it with
    /// [`Inner::remove_file`] if the bind fails). Where the store is mounted, the mount's
    /// path (the kernel makes the inode through the mount).
    pub(crate) fn bind_socket(&self, p: At<'_>, perm: u32) -> io::Result<(PathBuf, bool)> {
        let op = format!("bind {}", p.display());
        let mounted = self.run(|st| {
            let w = self.walk(st, p, false, &op)?;
            if w.found.is_some() {
                return Err(fs_err(libc::EADDRINUSE, format!("{op}: address in use")));
            }
            let Some(name) = w.name.as_deref() else {
                return Err(fs_err(libc::EADDRINUSE, format!("{op}: address in use")));
            };
            self.mount_path(st, w.parent, name, &op)
        })?;
        if let Some(m) = mounted {
            return Ok((m, false));
        }
        self.mknod(p, libc::S_IFSOCK | (perm & 0o7777), 0)
            .map_err(|e| match errno_of(&e) {
                libc::EEXIST => fs_err(libc::EADDRINUSE, format!("{op}: address in use")),
                _ => e,
            })?;
        let t = self.special_target(p, 0, &op)?;
        let _ = std::fs::remove_file(&t.path); // a stale one of an earlier store session
        Ok((t.path, true))
    }

    /// The host path a `connect` (or `sendto`) to the socket at Cairn path `p` goes to.
    pub(crate) fn socket_address(&self, p: At<'_>) -> io::Result<PathBuf> {
        let op = format!("connect {}", p.display());
        let t = self
            .special_target(p, W, &op)
            .map_err(|e| match errno_of(&e) {
                libc::EINVAL => fs_err(libc::ECONNREFUSED, format!("{op}: not a socket")),
                _ => e,
            })?;
        if t.kind != Kind::Socket {
            return Err(fs_err(libc::ECONNREFUSED, format!("{op}: not a socket")));
        }
        Ok(t.path)
    }

    /// Remove the rendezvous of FIFO or socket `ino` (the removal of its last link is
    /// committed).
    pub(super) fn drop_rendezvous(&self, kind: Kind, ino: u64, gen: u64) {
        let _ = std::fs::remove_file(rendezvous_path(&self.uuid(), kind, ino, gen));
    }

    /// Remove the rendezvous of FIFOs and sockets that no longer exist (`cairn stop`).
    /// Returns how many were removed.
    pub(crate) fn remove_stale_rendezvous(&self) -> io::Result<usize> {
        let mut n = 0;
        for (path, kind, ino, gen) in list_rendezvous(&self.uuid()) {
            let live = self.area.layout().ino_valid(ino)
                && self.run(|st| {
                    Ok(match self.attrs(st, ino) {
                        Ok((g, a)) => g == gen && a.kind == kind && a.nlink > 0,
                        Err(_) => false,
                    })
                })?;
            if !live && std::fs::remove_file(&path).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Make the host FIFO `p` (mode 0666: Cairn checked the caller) unless it exists.
fn make_fifo(p: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    match cairn_media::sys::mkfifo(&c, 0o666) {
        Ok(()) => {
            // The umask applied at creation; the rendezvous must open for every user.
            let _ =
                std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o666));
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_round_trip() {
        for (ma, mi) in [(1, 3), (8, 0), (259, 1), (4095, (1 << 20) - 1), (0, 256)] {
            assert_eq!(major_minor(makedev(ma, mi)), (ma, mi));
        }
        // glibc: makedev(1, 3) == 0x103; makedev(259, 65536) has the minor split.
        assert_eq!(makedev(1, 3), 0x103);
        assert_eq!(makedev(259, 0x10000), 0x1001_0300);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), b"/a b");
        assert_eq!(unescape_mountinfo(r"/a\\"), br"/a\\");
        assert_eq!(unescape_mountinfo("/plain"), b"/plain");
        assert_eq!(unescape_mountinfo(r"/a\777"), br"/a\777", "not a byte");
    }
}
