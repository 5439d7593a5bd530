//! The command's error type: a message for `cairn: <message>` and an exit code.

use std::fmt::Display;
use std::io;
use std::path::Path;

/// A failed command.
#[derive(Debug)]
pub struct CliError {
    /// Printed as `cairn: <message>` unless empty.
    pub message: String,
    /// The process exit code.
    pub code: i32,
}

pub type CliResult<T = ()> = Result<T, CliError>;

impl CliError {
    /// An operational failure (exit code 1).
    pub fn new(message: impl Into<String>) -> CliError {
        CliError {
            message: message.into(),
            code: 1,
        }
    }

    /// Standard output was closed by the reader (`cairn cat f | head`): stop quietly.
    pub fn broken_pipe() -> CliError {
        CliError {
            message: String::new(),
            code: 0,
        }
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> CliError {
        CliError::new(clean(&e))
    }
}

/// An error's text without std's ` (os error N)` suffix.
/// Also drops a trailing `: <reason>` that the message before it already states
/// (`no such file or directory: No such file or directory`).
pub fn clean(e: &io::Error) -> String {
    let mut s = e.to_string();
    if let Some(i) = s.rfind(" (os error ") {
        if s.ends_with(')') {
            s.truncate(i);
        }
    }
    if let Some(i) = s.rfind(": ") {
        let reason = s[i + 2..].to_lowercase();
        if !reason.is_empty() && s[..i].to_lowercase().contains(&reason) {
            s.truncate(i);
        }
    }
    s
}

/// Context for an error: `<what> <path>: <error>`, unless the error text already names
/// the path.
pub fn ctx(what: &str, path: &Path) -> impl FnOnce(io::Error) -> CliError {
    let what = what.to_string();
    let p = path.display().to_string();
    move |e| {
        let text = clean(&e);
        if !p.is_empty() && text.contains(&p) {
            CliError::new(text)
        } else {
            CliError::new(format!("{what} {p}: {text}"))
        }
    }
}

/// Context without a path.
pub fn ctx_msg(what: impl Display) -> impl FnOnce(io::Error) -> CliError {
    move |e| CliError::new(format!("{what}: {}", clean(&e)))
}

/// Map an error writing to standard output: a broken pipe ends the command quietly.
pub fn stdout_err(e: io::Error) -> CliError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        CliError::broken_pipe()
    } else {
        CliError::new(format!("writing to standard output: {}", clean(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_strips_os_error() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(clean(&e), "No such file or directory");
        let e = io::Error::other("plain (text)");
        assert_eq!(clean(&e), "plain (text)");
        let e = io::Error::other("stat /a: no such file or directory: No such file or directory");
        assert_eq!(clean(&e), "stat /a: no such file or directory");
        let e = io::Error::other("open /a: permission denied");
        assert_eq!(clean(&e), "open /a: permission denied");
    }

    #[test]
    fn ctx_does_not_repeat_the_path() {
        let p = Path::new("/a/b");
        let e = ctx("cat", p)(io::Error::other("open /a/b: No such file"));
        assert_eq!(e.message, "open /a/b: No such file");
        let e = ctx("cat", p)(io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(e.message, "cat /a/b: No such file or directory");
        assert_eq!(e.code, 1);
    }
}
