//! Progress on stderr: bars (indicatif, drawn only when stderr is a terminal, so that
//! logs and pipes get no escape codes) and the benchmarks' status lines.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;

/// A bar for `len` bytes, `prefix` in front ("migrating nvm -> ssd").
pub fn bytes(prefix: &str, len: u64) -> ProgressBar {
    bar(
        prefix,
        len,
        "{prefix} [{bar:30}] {percent:>3}% {bytes} of {total_bytes} ({bytes_per_sec}, {eta} left)",
    )
}

/// A bar for `len` things of which `pos` are done, `unit` after the counts
/// ("inodes").
pub fn count(prefix: &str, len: u64, unit: &str) -> ProgressBar {
    bar(
        prefix,
        len,
        &format!("{{prefix}} [{{bar:30}}] {{pos}} of {{len}} {unit} ({{eta}} left)"),
    )
}

/// A spinner showing `prefix` and the latest message.
pub fn spinner(prefix: &str) -> ProgressBar {
    let p = ProgressBar::new_spinner();
    if let Ok(s) = ProgressStyle::with_template("{prefix} {spinner} {msg}") {
        p.set_style(s);
    }
    p.set_prefix(prefix.to_string());
    p
}

fn bar(prefix: &str, len: u64, template: &str) -> ProgressBar {
    let p = ProgressBar::new(len);
    if let Ok(s) = ProgressStyle::with_template(template) {
        p.set_style(s.progress_chars("#> "));
    }
    p.set_prefix(prefix.to_string());
    p
}

/// A benchmark's status line on stderr (a phase starting, a count as it goes).
pub fn note(msg: std::fmt::Arguments) {
    let _ = std::io::stderr().write_fmt(msg);
}
