//! Metadata types mirroring `std::fs`: [`Metadata`], [`FileType`], [`Permissions`],
//! [`ReadDir`] and [`DirEntry`]; and the POSIX permission checks.

use crate::fs::Inner;
use cairn_format::inode::{Attrs, Kind};
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

pub(crate) use cairn_area::time::{
    from_system_time as time_ns, now_ns, to_system_time as system_time,
};

/// The kind of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileType {
    pub(crate) kind: Kind,
}

impl FileType {
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }
    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind == Kind::Symlink
    }
    /// A FIFO (named pipe).
    pub fn is_fifo(&self) -> bool {
        self.kind == Kind::Fifo
    }
    /// A Unix-domain socket.
    pub fn is_socket(&self) -> bool {
        self.kind == Kind::Socket
    }
    /// A character device node.
    pub fn is_char_device(&self) -> bool {
        self.kind == Kind::CharDev
    }
    /// A block device node.
    pub fn is_block_device(&self) -> bool {
        self.kind == Kind::BlockDev
    }
    /// The `S_IFMT` bits of this type (`S_IFREG`, `S_IFDIR`, …).
    pub fn mode_bits(&self) -> u32 {
        self.kind.mode_bits()
    }
    /// The `d_type` of a directory entry of this type (`DT_REG`, `DT_FIFO`, …).
    pub fn dirent_type(&self) -> u8 {
        (self.kind.mode_bits() >> 12) as u8
    }
}

/// Permission bits of a file (`0o7777`), like `std::fs::Permissions` on Unix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permissions {
    mode: u32,
}

impl Permissions {
    /// Permissions from a mode (only the `0o7777` bits are kept).
    pub fn from_mode(mode: u32) -> Permissions {
        Permissions {
            mode: mode & 0o7777,
        }
    }
    /// The permission bits.
    pub fn mode(&self) -> u32 {
        self.mode
    }
    /// Whether no write bit is set.
    pub fn readonly(&self) -> bool {
        self.mode & 0o222 == 0
    }
    /// Clear (`true`) or set (`false`) every write bit, as `std` does on Unix.
    pub fn set_readonly(&mut self, readonly: bool) {
        if readonly {
            self.mode &= !0o222;
        } else {
            self.mode |= 0o222;
        }
    }
}

/// Metadata of a file, like `std::fs::Metadata` (plus the Unix `MetadataExt` fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    pub(crate) ino: u64,
    /// The inode number's generation (bumped each time the number is reused).
    pub(crate) generation: u64,
    pub(crate) attrs: Attrs,
    /// 512-byte units.
    pub(crate) blocks: u64,
}

impl Metadata {
    /// Size in bytes (for a symlink: the length of its target).
    pub fn len(&self) -> u64 {
        self.attrs.size
    }
    /// Whether the size is 0.
    pub fn is_empty(&self) -> bool {
        self.attrs.size == 0
    }
    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.attrs.kind == Kind::Dir
    }
    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.attrs.kind == Kind::File
    }
    /// A symbolic link (only from `symlink_metadata`).
    pub fn is_symlink(&self) -> bool {
        self.attrs.kind == Kind::Symlink
    }
    /// The file type.
    pub fn file_type(&self) -> FileType {
        FileType {
            kind: self.attrs.kind,
        }
    }
    /// The permission bits.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_mode(self.attrs.perm)
    }
    /// `st_mode`: file type bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.attrs.kind.mode_bits() | self.attrs.perm
    }
    /// Device number of a device node (`st_rdev`, glibc's encoding); 0 otherwise.
    pub fn rdev(&self) -> u64 {
        self.attrs.rdev
    }
    /// Inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The generation of the inode number: (ino, generation) names this file and no
    /// other, even once the number is reused.
    pub fn generation(&self) -> u64 {
        self.generation
    }
    /// Number of hard links (directories: 2 + subdirectories; 0 for an open file that was
    /// unlinked).
    pub fn nlink(&self) -> u64 {
        self.attrs.nlink
    }
    /// The inode's attributes as the store keeps them (for the permission rules of
    /// `cairn_format::perm`).
    pub fn attrs(&self) -> &Attrs {
        &self.attrs
    }
    /// Owner.
    pub fn uid(&self) -> u32 {
        self.attrs.uid
    }
    /// Group.
    pub fn gid(&self) -> u32 {
        self.attrs.gid
    }
    /// Space used, in 512-byte units (an estimate while writes are not digested yet).
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Last access (Cairn does not update it on reads: `noatime`).
    pub fn accessed(&self) -> SystemTime {
        system_time(self.attrs.atime)
    }
    /// Last modification of the contents.
    pub fn modified(&self) -> SystemTime {
        system_time(self.attrs.mtime)
    }
    /// Last change of the inode (`ctime`).
    pub fn changed(&self) -> SystemTime {
        system_time(self.attrs.ctime)
    }
    /// Creation (`btime`).
    pub fn created(&self) -> SystemTime {
        system_time(self.attrs.btime)
    }
    /// `atime` in ns since the Unix epoch.
    pub fn atime_ns(&self) -> i64 {
        self.attrs.atime
    }
    /// `mtime` in ns since the Unix epoch.
    pub fn mtime_ns(&self) -> i64 {
        self.attrs.mtime
    }
    /// `ctime` in ns since the Unix epoch.
    pub fn ctime_ns(&self) -> i64 {
        self.attrs.ctime
    }
}

/// Iterator over the entries of a directory (a snapshot taken by `Fs::read_dir`;
/// `.` and `..` are not included).
pub struct ReadDir {
    pub(crate) entries: std::vec::IntoIter<DirEntry>,
}

impl Iterator for ReadDir {
    type Item = io::Result<DirEntry>;
    fn next(&mut self) -> Option<io::Result<DirEntry>> {
        self.entries.next().map(Ok)
    }
}

/// One entry of a directory.
pub struct DirEntry {
    pub(crate) fs: Arc<Inner>,
    /// The directory a relative `dir` starts from (`read_dir` of an [`crate::At`]).
    pub(crate) base: u64,
    pub(crate) dir: PathBuf,
    pub(crate) name: Vec<u8>,
    pub(crate) ino: u64,
    pub(crate) kind: Kind,
}

impl std::fmt::Debug for DirEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirEntry")
            .field("path", &self.path())
            .field("ino", &self.ino)
            .finish()
    }
}

impl DirEntry {
    /// The entry's name.
    pub fn file_name(&self) -> OsString {
        OsString::from_vec(self.name.clone())
    }
    /// The directory's path joined with the name.
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.file_name())
    }
    /// Inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }
    /// The entry's type (symlinks are not followed).
    pub fn file_type(&self) -> io::Result<FileType> {
        Ok(FileType { kind: self.kind })
    }
    /// The entry's metadata (symlinks are not followed, as with `std`).
    pub fn metadata(&self) -> io::Result<crate::Metadata> {
        let p = self.path();
        self.fs.symlink_metadata(crate::At {
            dir: self.base,
            path: &p,
        })
    }
}

pub(crate) use cairn_format::perm::{Cred, R, W, X};

/// The current process's supplementary groups and umask, from `/proc/self/status`
/// (defaults: none and `0o022`).
pub(crate) fn groups_and_umask() -> (Vec<u32>, u32) {
    let mut groups = Vec::new();
    let mut umask = 0o022;
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        groups = cairn_format::perm::groups_of_status(&s).unwrap_or_default();
        if let Some(v) = s
            .lines()
            .find_map(|l| l.strip_prefix("Umask:"))
            .and_then(|u| u32::from_str_radix(u.trim(), 8).ok())
        {
            umask = v;
        }
    }
    (groups, umask)
}

/// This process's credentials (`cairn_format::perm::cred_of_status`); nobody's (65534)
/// if unreadable.
pub(crate) fn process_cred() -> Cred {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| cairn_format::perm::cred_of_status(&s))
        .unwrap_or(Cred {
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_credentials_are_the_kernels() {
        let me = process_cred();
        let (euid, egid) = cairn_media::sys::ids();
        assert_eq!((me.uid, me.gid), (euid, egid));
    }

    #[test]
    fn times_roundtrip() {
        for ns in [0i64, 1, 1_700_000_000_123_456_789, -5_000_000_001] {
            assert_eq!(time_ns(system_time(ns)), ns);
        }
        let mut p = Permissions::from_mode(0o100644);
        assert_eq!(p.mode(), 0o644);
        p.set_readonly(true);
        assert!(p.readonly());
        assert_eq!(p.mode(), 0o444);
    }
}
