//! Operations run against Cairn and against a reference file system through one
//! interface, and a deterministic generator of operation sequences.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Kind of a node as seen by the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// The observable attributes compared between systems (times are not compared: the two
/// systems run at different moments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub perm: u32,
    pub size: u64,
    pub nlink: u64,
}

/// What the tests can do to a file system. Paths are absolute inside it.
pub trait FsOps {
    fn create(&self, p: &str) -> io::Result<()>;
    fn create_new(&self, p: &str) -> io::Result<()>;
    fn write_at(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()>;
    fn append(&self, p: &str, data: &[u8]) -> io::Result<()>;
    fn truncate(&self, p: &str, len: u64) -> io::Result<()>;
    fn read_at(&self, p: &str, off: u64, len: usize) -> io::Result<Vec<u8>>;
    fn read_all(&self, p: &str) -> io::Result<Vec<u8>>;
    fn mkdir(&self, p: &str) -> io::Result<()>;
    fn remove_file(&self, p: &str) -> io::Result<()>;
    fn remove_dir(&self, p: &str) -> io::Result<()>;
    fn rename(&self, a: &str, b: &str) -> io::Result<()>;
    /// `renameat2` with `RENAME_NOREPLACE` (1) or `RENAME_EXCHANGE` (2).
    fn rename2(&self, a: &str, b: &str, flags: u32) -> io::Result<()>;
    fn hard_link(&self, a: &str, b: &str) -> io::Result<()>;
    fn symlink(&self, target: &str, link: &str) -> io::Result<()>;
    fn read_link(&self, p: &str) -> io::Result<String>;
    fn chmod(&self, p: &str, mode: u32) -> io::Result<()>;
    fn meta(&self, p: &str, follow: bool) -> io::Result<Meta>;
    /// Sorted names in a directory.
    fn list(&self, p: &str) -> io::Result<Vec<String>>;
    /// Write through a handle with the cursor: seek to `off`, write `data` (one call, so
    /// that each generated operation is one system call for the crash tests).
    fn seek_write(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()>;
    /// Extended attributes (`*xattr`, or `l*xattr` unless `follow`).
    fn set_xattr(&self, p: &str, name: &str, v: &[u8], flags: i32, follow: bool) -> io::Result<()>;
    fn get_xattr(&self, p: &str, name: &str, follow: bool) -> io::Result<Vec<u8>>;
    /// Sorted `user.` names (the namespace the tests use; a host may add others).
    fn list_xattr(&self, p: &str, follow: bool) -> io::Result<Vec<String>>;
    fn remove_xattr(&self, p: &str, name: &str, follow: bool) -> io::Result<()>;
    /// `lseek(SEEK_DATA)` (`data`) or `lseek(SEEK_HOLE)` on a file opened read-only.
    fn seek_data(&self, p: &str, off: u64, data: bool) -> io::Result<u64>;
    /// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)` on a file opened for
    /// writing.
    fn punch_hole(&self, p: &str, off: u64, len: u64) -> io::Result<()>;
    /// A store through a shared writable mapping: open the file for reading and
    /// writing, map all of it (`MAP_SHARED`), copy in the part of `data` at `off` that
    /// lies inside the file (a mapping cannot grow it: nothing if `off` is at or past
    /// the end), write it back (`msync`) and unmap.
    fn map_write(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()>;
}

/// The part of `data` at `off` a mapping of a file of `size` bytes holds.
fn mapped_part(size: u64, off: u64, data: &[u8]) -> Option<&[u8]> {
    let n = size.checked_sub(off)?.min(data.len() as u64) as usize;
    (n > 0).then(|| &data[..n])
}

/// The `user.` names in a `listxattr` answer, sorted.
fn user_names<I: IntoIterator<Item = Vec<u8>>>(names: I) -> Vec<String> {
    let mut v: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with(b"user."))
        .map(|n| String::from_utf8_lossy(&n).into_owned())
        .collect();
    v.sort();
    v
}

/// A libc call's `ssize_t`/`int` result as `io::Result`.
fn host_call(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// The reference: `std::fs` under a root directory.
pub struct HostFs {
    pub root: PathBuf,
}

impl HostFs {
    fn p(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }
}

fn meta_of(m: &std::fs::Metadata) -> Meta {
    use std::os::unix::fs::MetadataExt;
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else {
        Kind::File
    };
    Meta {
        kind,
        perm: m.mode() & 0o7777,
        // Directory sizes differ between file systems by design.
        size: if kind == Kind::Dir { 0 } else { m.len() },
        nlink: m.nlink(),
    }
}

impl FsOps for HostFs {
    fn create(&self, p: &str) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.p(p))
            .map(|_| ())
    }
    fn create_new(&self, p: &str) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.p(p))
            .map(|_| ())
    }
    fn write_at(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.p(p))?
            .write_all_at(data, off)
    }
    fn append(&self, p: &str, data: &[u8]) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.p(p))?
            .write_all(data)
    }
    fn truncate(&self, p: &str, len: u64) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.p(p))?
            .set_len(len)
    }
    fn read_at(&self, p: &str, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let f = std::fs::File::open(self.p(p))?;
        let mut buf = vec![0u8; len];
        let mut n = 0;
        while n < len {
            let r = f.read_at(&mut buf[n..], off + n as u64)?;
            if r == 0 {
                break;
            }
            n += r;
        }
        buf.truncate(n);
        Ok(buf)
    }
    fn read_all(&self, p: &str) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        std::fs::File::open(self.p(p))?.read_to_end(&mut v)?;
        Ok(v)
    }
    fn mkdir(&self, p: &str) -> io::Result<()> {
        std::fs::create_dir(self.p(p))
    }
    fn remove_file(&self, p: &str) -> io::Result<()> {
        std::fs::remove_file(self.p(p))
    }
    fn remove_dir(&self, p: &str) -> io::Result<()> {
        std::fs::remove_dir(self.p(p))
    }
    fn rename(&self, a: &str, b: &str) -> io::Result<()> {
        std::fs::rename(self.p(a), self.p(b))
    }
    fn rename2(&self, a: &str, b: &str, flags: u32) -> io::Result<()> {
        cairn_media::sys::renameat2(&self.p(a), &self.p(b), flags)
    }
    fn hard_link(&self, a: &str, b: &str) -> io::Result<()> {
        std::fs::hard_link(self.p(a), self.p(b))
    }
    fn symlink(&self, target: &str, link: &str) -> io::Result<()> {
        std::os::unix::fs::symlink(target, self.p(link))
    }
    fn read_link(&self, p: &str) -> io::Result<String> {
        Ok(std::fs::read_link(self.p(p))?
            .to_string_lossy()
            .into_owned())
    }
    fn chmod(&self, p: &str, mode: u32) -> io::Result<()> {
        std::fs::set_permissions(self.p(p), std::fs::Permissions::from_mode(mode))
    }
    fn meta(&self, p: &str, follow: bool) -> io::Result<Meta> {
        let m = if follow {
            std::fs::metadata(self.p(p))?
        } else {
            std::fs::symlink_metadata(self.p(p))?
        };
        Ok(meta_of(&m))
    }
    fn list(&self, p: &str) -> io::Result<Vec<String>> {
        let mut v: Vec<String> = std::fs::read_dir(self.p(p))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?;
        v.sort();
        Ok(v)
    }
    fn seek_write(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).open(self.p(p))?;
        f.seek(SeekFrom::Start(off))?;
        f.write_all(data)
    }
    fn set_xattr(&self, p: &str, name: &str, v: &[u8], flags: i32, follow: bool) -> io::Result<()> {
        let (p, n) = (cstr(&self.p(p)), cstr(Path::new(name)));
        let f = if follow {
            libc::setxattr
        } else {
            libc::lsetxattr
        };
        // SAFETY: valid C strings and a buffer of `v.len()` bytes.
        host_call(unsafe { f(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags) } as isize)
            .map(|_| ())
    }
    fn get_xattr(&self, p: &str, name: &str, follow: bool) -> io::Result<Vec<u8>> {
        let (p, n) = (cstr(&self.p(p)), cstr(Path::new(name)));
        let f = if follow {
            libc::getxattr
        } else {
            libc::lgetxattr
        };
        let mut buf = vec![0u8; 65536];
        // SAFETY: valid C strings and a buffer of `buf.len()` bytes.
        let len =
            host_call(unsafe { f(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        buf.truncate(len);
        Ok(buf)
    }
    fn list_xattr(&self, p: &str, follow: bool) -> io::Result<Vec<String>> {
        let p = cstr(&self.p(p));
        let f = if follow {
            libc::listxattr
        } else {
            libc::llistxattr
        };
        let mut buf = vec![0u8; 65536];
        // SAFETY: a valid C string and a buffer of `buf.len()` bytes.
        let len = host_call(unsafe { f(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        Ok(user_names(
            buf[..len]
                .split(|&b| b == 0)
                .filter(|n| !n.is_empty())
                .map(<[u8]>::to_vec),
        ))
    }
    fn remove_xattr(&self, p: &str, name: &str, follow: bool) -> io::Result<()> {
        let (p, n) = (cstr(&self.p(p)), cstr(Path::new(name)));
        let f = if follow {
            libc::removexattr
        } else {
            libc::lremovexattr
        };
        // SAFETY: valid C strings.
        host_call(unsafe { f(p.as_ptr(), n.as_ptr()) } as isize).map(|_| ())
    }
    fn seek_data(&self, p: &str, off: u64, data: bool) -> io::Result<u64> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(self.p(p))?;
        if f.metadata()?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let whence = if data {
            libc::SEEK_DATA
        } else {
            libc::SEEK_HOLE
        };
        // SAFETY: a descriptor this function owns.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, whence) };
        host_call(r as isize).map(|o| o as u64)
    }
    fn punch_hole(&self, p: &str, off: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new().write(true).open(self.p(p))?;
        // SAFETY: a descriptor this function owns; no memory is passed.
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        host_call(r as isize).map(|_| ())
    }
    fn map_write(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.p(p))?;
        let size = f.metadata()?.len();
        if let Some(part) = mapped_part(size, off, data) {
            // The reference is on tmpfs: the mapping is the file's page cache, so the
            // store is the file's content at once (no write-back to wait for).
            let m = cairn_media::Mapping::new(&f, 0, size as usize, true, false)?;
            m.write(off as usize, part)?;
        }
        Ok(())
    }
}

fn cstr(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL in test paths")
}

/// Cairn through its Rust API.
pub struct CairnFs<'a> {
    pub fs: &'a cairn::Fs,
}

fn cairn_meta(m: &cairn::Metadata) -> Meta {
    let kind = if m.is_dir() {
        Kind::Dir
    } else if m.is_symlink() {
        Kind::Symlink
    } else {
        Kind::File
    };
    Meta {
        kind,
        perm: m.mode() & 0o7777,
        size: if kind == Kind::Dir { 0 } else { m.len() },
        nlink: m.nlink(),
    }
}

impl FsOps for CairnFs<'_> {
    fn create(&self, p: &str) -> io::Result<()> {
        cairn::OpenOptions::new()
            .write(true)
            .create(true)
            .open(self.fs, p)
            .map(|_| ())
    }
    fn create_new(&self, p: &str) -> io::Result<()> {
        cairn::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.fs, p)
            .map(|_| ())
    }
    fn write_at(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let f = cairn::OpenOptions::new().write(true).open(self.fs, p)?;
        let mut n = 0;
        while n < data.len() {
            n += f.write_at(&data[n..], off + n as u64)?;
        }
        Ok(())
    }
    fn append(&self, p: &str, data: &[u8]) -> io::Result<()> {
        cairn::OpenOptions::new()
            .append(true)
            .open(self.fs, p)?
            .write_all(data)
    }
    fn truncate(&self, p: &str, len: u64) -> io::Result<()> {
        cairn::OpenOptions::new()
            .write(true)
            .open(self.fs, p)?
            .set_len(len)
    }
    fn read_at(&self, p: &str, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let f = cairn::File::open(self.fs, p)?;
        let mut buf = vec![0u8; len];
        let mut n = 0;
        while n < len {
            let r = f.read_at(&mut buf[n..], off + n as u64)?;
            if r == 0 {
                break;
            }
            n += r;
        }
        buf.truncate(n);
        Ok(buf)
    }
    fn read_all(&self, p: &str) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        cairn::File::open(self.fs, p)?.read_to_end(&mut v)?;
        Ok(v)
    }
    fn mkdir(&self, p: &str) -> io::Result<()> {
        self.fs.create_dir(p)
    }
    fn remove_file(&self, p: &str) -> io::Result<()> {
        self.fs.remove_file(p)
    }
    fn remove_dir(&self, p: &str) -> io::Result<()> {
        self.fs.remove_dir(p)
    }
    fn rename(&self, a: &str, b: &str) -> io::Result<()> {
        self.fs.rename(a, b)
    }
    fn rename2(&self, a: &str, b: &str, flags: u32) -> io::Result<()> {
        match flags {
            libc::RENAME_NOREPLACE => self.fs.rename_noreplace(a, b),
            libc::RENAME_EXCHANGE => self.fs.rename_exchange(a, b),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
    fn hard_link(&self, a: &str, b: &str) -> io::Result<()> {
        self.fs.hard_link(a, b)
    }
    fn symlink(&self, target: &str, link: &str) -> io::Result<()> {
        self.fs.symlink(target, link)
    }
    fn read_link(&self, p: &str) -> io::Result<String> {
        Ok(self.fs.read_link(p)?.to_string_lossy().into_owned())
    }
    fn chmod(&self, p: &str, mode: u32) -> io::Result<()> {
        self.fs
            .set_permissions(p, cairn::Permissions::from_mode(mode))
    }
    fn meta(&self, p: &str, follow: bool) -> io::Result<Meta> {
        let m = if follow {
            self.fs.metadata(p)?
        } else {
            self.fs.symlink_metadata(p)?
        };
        Ok(cairn_meta(&m))
    }
    fn list(&self, p: &str) -> io::Result<Vec<String>> {
        let mut v: Vec<String> = self
            .fs
            .read_dir(p)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?;
        v.sort();
        Ok(v)
    }
    fn seek_write(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let mut f = cairn::OpenOptions::new().write(true).open(self.fs, p)?;
        f.seek(SeekFrom::Start(off))?;
        f.write_all(data)
    }
    fn set_xattr(&self, p: &str, name: &str, v: &[u8], flags: i32, follow: bool) -> io::Result<()> {
        self.fs.set_xattr(p, name.as_bytes(), v, flags, follow)
    }
    fn get_xattr(&self, p: &str, name: &str, follow: bool) -> io::Result<Vec<u8>> {
        self.fs.get_xattr(p, name.as_bytes(), follow)
    }
    fn list_xattr(&self, p: &str, follow: bool) -> io::Result<Vec<String>> {
        Ok(user_names(self.fs.list_xattr(p, follow)?))
    }
    fn remove_xattr(&self, p: &str, name: &str, follow: bool) -> io::Result<()> {
        self.fs.remove_xattr(p, name.as_bytes(), follow)
    }
    fn seek_data(&self, p: &str, off: u64, data: bool) -> io::Result<u64> {
        let f = cairn::File::open(self.fs, p)?;
        if data {
            f.next_data(off)
        } else {
            f.next_hole(off)
        }
    }
    fn punch_hole(&self, p: &str, off: u64, len: u64) -> io::Result<()> {
        cairn::OpenOptions::new()
            .write(true)
            .open(self.fs, p)?
            .punch_hole(off, len)
    }
    fn map_write(&self, p: &str, off: u64, data: &[u8]) -> io::Result<()> {
        let f = cairn::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.fs, p)?;
        let size = f.metadata()?.len();
        if let Some(part) = mapped_part(size, off, data) {
            let m = f.map_mut(0, size as usize)?;
            m.write(off as usize, part)?;
            // `msync`: the stores are logged (durable) when it returns; dropping the
            // mapping unmaps it and folds the map object.
            m.flush()?;
        }
        Ok(())
    }
}

/// One generated operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Create(String),
    CreateNew(String),
    WriteAt(String, u64, u32, u8),
    SeekWrite(String, u64, u32, u8),
    Append(String, u32, u8),
    Truncate(String, u64),
    ReadAt(String, u64, u32),
    Mkdir(String),
    RemoveFile(String),
    RemoveDir(String),
    Rename(String, String),
    /// `renameat2` with these flags.
    Rename2(String, String, u32),
    HardLink(String, String),
    Symlink(String, String),
    ReadLink(String),
    Chmod(String, u32),
    Stat(String, bool),
    List(String),
    /// Extended attributes: name (an index into `XATTR_NAMES`), value length and seed,
    /// `setxattr` flags, and whether a final symlink is followed.
    SetXattr(String, usize, u32, u8, i32, bool),
    GetXattr(String, usize, bool),
    ListXattr(String, bool),
    RemoveXattr(String, usize, bool),
    /// `lseek` with `SEEK_DATA` (true) or `SEEK_HOLE` from an offset.
    SeekData(String, u64, bool),
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: offset, length.
    PunchHole(String, u64, u64),
    /// A store through a shared mapping, written back: offset, length and data seed
    /// (`FsOps::map_write`). Only in sequences generated with `Extras::mapped`.
    MapWrite(String, u64, u32, u8),
}

/// The attribute names the generator uses.
pub const XATTR_NAMES: &[&str] = &["user.a", "user.b", "user.mime_type"];

/// Deterministic data for a write: `len` bytes from `seed`.
pub fn data(len: u32, seed: u8) -> Vec<u8> {
    (0..len as usize)
        .map(|i| seed.wrapping_add((i * 7 + i / 4096) as u8))
        .collect()
}

/// The small namespace the generator works in (so operations collide often).
const NAMES: &[&str] = &[
    "/a", "/b", "/d", "/d/a", "/d/b", "/d/e", "/d/e/a", "/e", "/e/b",
];

fn pick(r: &mut StdRng) -> String {
    NAMES[r.gen_range(0..NAMES.len())].to_string()
}

/// An extended-attribute operation drawn from `r`.
fn gen_xattr_op(r: &mut StdRng, path: String) -> Op {
    let name = r.gen_range(0..XATTR_NAMES.len());
    let follow = r.gen_range(0..4) != 0;
    match r.gen_range(0..10) {
        0..=4 => Op::SetXattr(
            path,
            name,
            r.gen_range(0..120),
            r.gen(),
            [0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE][r.gen_range(0..4)],
            follow,
        ),
        5..=6 => Op::GetXattr(path, name, follow),
        7 => Op::ListXattr(path, follow),
        _ => Op::RemoveXattr(path, name, follow),
    }
}

/// Operations a generated sequence has only when asked for (so that the sequences of
/// every seed stay what they were without them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// About one call in four more: a store through a shared mapping (`Op::MapWrite`).
    pub mapped: bool,
}

/// `n` operations from `seed`, under the directory `prefix` ("" for the root). About
/// one in twelve is an extended-attribute call and one in twelve a `SEEK_DATA` or
/// `SEEK_HOLE`, drawn from a second generator, and one in sixteen a punched hole, from a
/// third, so that the other operations are the same sequence they were before those
/// existed.
pub fn gen_ops(seed: u64, n: usize, prefix: &str) -> Vec<Op> {
    gen_ops_with(seed, n, prefix, Extras::default())
}

/// [`gen_ops`] with the `extras`, each drawn from a generator of its own.
pub fn gen_ops_with(seed: u64, n: usize, prefix: &str, extras: Extras) -> Vec<Op> {
    let mut rx = StdRng::seed_from_u64(seed ^ 0x0078_6174_7472);
    let mut rp = StdRng::seed_from_u64(seed ^ 0x0070_756e_6368);
    let mut rm = StdRng::seed_from_u64(seed ^ 0x006d_6d61_7073);
    let mut r = StdRng::seed_from_u64(seed);
    let mut v = Vec::with_capacity(n);
    let p = |s: String| format!("{prefix}{s}");
    for _ in 0..n {
        let len = match r.gen_range(0..10) {
            0 => 0,
            1..=6 => r.gen_range(1..2000),
            7 | 8 => r.gen_range(2000..12000),
            _ => r.gen_range(12000..70000),
        };
        let off = match r.gen_range(0..4) {
            0 => 0,
            1 => r.gen_range(0..4096),
            2 => r.gen_range(0..20000),
            _ => 4096 * r.gen_range(0..8),
        };
        let op = match r.gen_range(0..100) {
            0..=9 => Op::Create(p(pick(&mut r))),
            10..=12 => Op::CreateNew(p(pick(&mut r))),
            13..=32 => Op::WriteAt(p(pick(&mut r)), off, len, r.gen()),
            33..=37 => Op::SeekWrite(p(pick(&mut r)), off, len, r.gen()),
            38..=44 => Op::Append(p(pick(&mut r)), len, r.gen()),
            45..=50 => Op::Truncate(p(pick(&mut r)), off + r.gen_range(0..3) * 1000),
            51..=56 => Op::ReadAt(p(pick(&mut r)), off, len),
            57..=64 => Op::Mkdir(p(pick(&mut r))),
            65..=70 => Op::RemoveFile(p(pick(&mut r))),
            71..=74 => Op::RemoveDir(p(pick(&mut r))),
            75..=79 => Op::Rename(p(pick(&mut r)), p(pick(&mut r))),
            80..=82 => Op::Rename2(
                p(pick(&mut r)),
                p(pick(&mut r)),
                [libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE][r.gen_range(0..2)],
            ),
            83..=85 => Op::HardLink(p(pick(&mut r)), p(pick(&mut r))),
            86..=88 => {
                // Relative targets only: an absolute one would leave the reference root.
                let t = pick(&mut r).trim_start_matches('/').to_string();
                Op::Symlink(t, p(pick(&mut r)))
            }
            89..=90 => Op::ReadLink(p(pick(&mut r))),
            91..=93 => Op::Chmod(
                p(pick(&mut r)),
                [0o644, 0o600, 0o755, 0o700][r.gen_range(0..4)],
            ),
            94..=97 => Op::Stat(p(pick(&mut r)), r.gen()),
            _ => Op::List(p(pick(&mut r))),
        };
        v.push(op);
        if v.len() < n && rx.gen_range(0..12) == 0 {
            let path = p(pick(&mut rx));
            v.push(gen_xattr_op(&mut rx, path));
        }
        if v.len() < n && rx.gen_range(0..12) == 0 {
            let off = match rx.gen_range(0..3) {
                0 => 0,
                1 => 4096 * rx.gen_range(0..20),
                _ => rx.gen_range(0..80_000),
            };
            v.push(Op::SeekData(p(pick(&mut rx)), off, rx.gen()));
        }
        if v.len() < n && rp.gen_range(0..16) == 0 {
            let off = match rp.gen_range(0..3) {
                0 => 4096 * rp.gen_range(0..16),
                _ => rp.gen_range(0..70_000),
            };
            let len = match rp.gen_range(0..3) {
                0 => 4096 * rp.gen_range(1..8),
                1 => rp.gen_range(1..300),
                _ => rp.gen_range(1..40_000),
            };
            v.push(Op::PunchHole(p(pick(&mut rp)), off, len));
        }
        if extras.mapped && v.len() < n && rm.gen_range(0..4) == 0 {
            let off = match rm.gen_range(0..3) {
                0 => 0,
                1 => 4096 * rm.gen_range(0..3),
                _ => rm.gen_range(0..6_000),
            };
            let len = match rm.gen_range(0..3) {
                0 => rm.gen_range(1..64),
                1 => rm.gen_range(64..4096),
                _ => rm.gen_range(4096..12_000),
            };
            v.push(Op::MapWrite(p(pick(&mut rm)), off, len, rm.gen()));
        }
    }
    v.truncate(n);
    v
}

/// What an operation returned, reduced to what must agree between systems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Data(Vec<u8>),
    Text(String),
    Meta(Meta),
    Names(Vec<String>),
    Err(i32),
}

fn errno(e: &io::Error) -> i32 {
    let n = cairn_area::errno_of(e);
    // POSIX lets rename/rmdir of a non-empty directory say either.
    if n == libc::EEXIST || n == libc::ENOTEMPTY {
        libc::ENOTEMPTY
    } else {
        n
    }
}

fn out<T>(r: io::Result<T>, f: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => f(v),
        Err(e) => Outcome::Err(errno(&e)),
    }
}

/// Run one operation.
pub fn apply(fs: &dyn FsOps, op: &Op) -> Outcome {
    let ok = |_| Outcome::Ok;
    match op {
        Op::Create(p) => out(fs.create(p), ok),
        Op::CreateNew(p) => out(fs.create_new(p), ok),
        Op::WriteAt(p, off, len, s) => out(fs.write_at(p, *off, &data(*len, *s)), ok),
        Op::SeekWrite(p, off, len, s) => out(fs.seek_write(p, *off, &data(*len, *s)), ok),
        Op::Append(p, len, s) => out(fs.append(p, &data(*len, *s)), ok),
        Op::Truncate(p, len) => out(fs.truncate(p, *len), ok),
        Op::ReadAt(p, off, len) => out(fs.read_at(p, *off, *len as usize), Outcome::Data),
        Op::Mkdir(p) => out(fs.mkdir(p), ok),
        Op::RemoveFile(p) => out(fs.remove_file(p), ok),
        Op::RemoveDir(p) => out(fs.remove_dir(p), ok),
        Op::Rename(a, b) => out(fs.rename(a, b), ok),
        Op::Rename2(a, b, f) => out(fs.rename2(a, b, *f), ok),
        Op::HardLink(a, b) => out(fs.hard_link(a, b), ok),
        Op::Symlink(t, l) => out(fs.symlink(t, l), ok),
        Op::ReadLink(p) => out(fs.read_link(p), Outcome::Text),
        Op::Chmod(p, m) => out(fs.chmod(p, *m), ok),
        Op::Stat(p, follow) => out(fs.meta(p, *follow), Outcome::Meta),
        Op::List(p) => out(fs.list(p), Outcome::Names),
        Op::SetXattr(p, name, len, s, flags, follow) => out(
            fs.set_xattr(p, XATTR_NAMES[*name], &data(*len, *s), *flags, *follow),
            ok,
        ),
        Op::GetXattr(p, name, follow) => {
            out(fs.get_xattr(p, XATTR_NAMES[*name], *follow), Outcome::Data)
        }
        Op::ListXattr(p, follow) => out(fs.list_xattr(p, *follow), Outcome::Names),
        Op::RemoveXattr(p, name, follow) => {
            out(fs.remove_xattr(p, XATTR_NAMES[*name], *follow), ok)
        }
        Op::SeekData(p, off, data) => seek_outcome(fs, p, *off, *data),
        Op::PunchHole(p, off, len) => out(fs.punch_hole(p, *off, *len), ok),
        Op::MapWrite(p, off, len, s) => out(fs.map_write(p, *off, &data(*len, *s)), ok),
    }
}

/// `SEEK_DATA`/`SEEK_HOLE` checked against the file's contents rather than compared:
/// which 4 KiB blocks count as data is each file system's allocation (tmpfs keeps a
/// page written beyond a later truncation point, Cairn does not when the write and the
/// truncation are digested together). Valid means: a data answer skips only zeros and
/// stays inside the file; "no data" (`ENXIO` inside the file) means only zeros follow;
/// a hole answer lies inside the file (or at its end) and its block reads as zeros from
/// there.
fn seek_outcome(fs: &dyn FsOps, p: &str, off: u64, data: bool) -> Outcome {
    let r = fs.seek_data(p, off, data);
    let content = match fs.read_all(p) {
        Ok(c) => c,
        Err(e) => return Outcome::Err(errno(&e)),
    };
    let size = content.len() as u64;
    let zeros = |a: u64, b: u64| content[a as usize..b as usize].iter().all(|&x| x == 0);
    let valid = match &r {
        Err(e) if errno(e) == libc::ENXIO && off < size && data => zeros(off, size),
        Err(e) => return Outcome::Err(errno(e)),
        Ok(r) if data => *r >= off && *r < size && zeros(off, *r),
        Ok(r) => *r >= off && *r <= size && zeros(*r, (r / 4096 * 4096 + 4096).min(size)),
    };
    Outcome::Text(if valid {
        "valid".into()
    } else {
        format!("invalid: {r:?}")
    })
}

/// Join a prefix directory and a path for the reference root.
pub fn host_root(dir: &Path) -> HostFs {
    HostFs {
        root: dir.to_path_buf(),
    }
}
