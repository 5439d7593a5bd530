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
        },
    )
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
    }
}
