//! Errors with a POSIX errno and a message. `io::Error::kind()` is derived from the errno
//! (so `NotFound`, `AlreadyExists`, … work as with `std::fs`), and [`errno_of`] gives the
//! errno back.

use std::fmt;
use std::io;

/// The payload of Cairn's `io::Error`s.
#[derive(Debug)]
pub struct FsError {
    pub errno: i32,
    pub message: String,
    /// For [`elsewhere`]: the host path the call must go on with.
    pub host_path: Option<Vec<u8>>,
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = io::Error::from_raw_os_error(self.errno);
        write!(f, "{}: {}", self.message, os)
    }
}

impl std::error::Error for FsError {}

/// An `io::Error` for `errno` with a message saying what failed.
pub fn fs_err(errno: i32, message: impl Into<String>) -> io::Error {
    let kind = io::Error::from_raw_os_error(errno).kind();
    io::Error::new(
        kind,
        FsError {
            errno,
            message: message.into(),
            host_path: None,
        },
    )
}

/// A copy of `e` (an `io::Error` is not `Clone`): the same errno and message.
pub fn copy_err(e: &io::Error) -> io::Error {
    match e.get_ref().and_then(|x| x.downcast_ref::<FsError>()) {
        Some(f) => fs_err(f.errno, f.message.clone()),
        None => match e.raw_os_error() {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::new(e.kind(), e.to_string()),
        },
    }
}

/// The path being resolved left the store (an absolute symbolic link to a path outside
/// it, or `..` at its root, when the store is seen under a prefix: `Fs::set_link_root`):
/// the call must go on with the host path `host_path` (absolute). Its errno is `EXDEV`,
/// what a call that cannot follow it (a rename, a hard link) answers.
pub fn elsewhere(host_path: Vec<u8>, op: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::CrossesDevices,
        FsError {
            errno: libc::EXDEV,
            message: format!(
                "{op}: the path leads out of the store, to {}",
                String::from_utf8_lossy(&host_path)
            ),
            host_path: Some(host_path),
        },
    )
}

/// The host path of an [`elsewhere`] error.
pub fn elsewhere_path(e: &io::Error) -> Option<&[u8]> {
    e.get_ref()
        .and_then(|x| x.downcast_ref::<FsError>())
        .and_then(|fe| fe.host_path.as_deref())
}

/// The POSIX errno of an error (`EIO` when it carries none).
pub fn errno_of(e: &io::Error) -> i32 {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    if let Some(fe) = e.get_ref().and_then(|x| x.downcast_ref::<FsError>()) {
        return fe.errno;
    }
    match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::UnexpectedEof => libc::EPIPE,
        _ => libc::EIO,
    }
}

/// The message of an error made by [`fs_err`] (without the errno text `Display` adds),
/// else its `Display`.
pub fn message(e: &io::Error) -> String {
    match e.get_ref().and_then(|x| x.downcast_ref::<FsError>()) {
        Some(fe) => fe.message.clone(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_roundtrip() {
        let e = fs_err(libc::ENOENT, "open /a/b");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(errno_of(&e), libc::ENOENT);
        assert!(e.to_string().contains("open /a/b"));
        assert_eq!(
            errno_of(&io::Error::from_raw_os_error(libc::ENOSPC)),
            libc::ENOSPC
        );
        assert_eq!(elsewhere_path(&e), None);
    }

    #[test]
    fn elsewhere_carries_its_host_path() {
        let e = elsewhere(b"/etc/hosts".to_vec(), "open /cairn/l");
        assert_eq!(errno_of(&e), libc::EXDEV);
        assert_eq!(elsewhere_path(&e), Some(&b"/etc/hosts"[..]));
        assert!(message(&e).contains("/etc/hosts"));
    }
}
