//! Parsing and formatting helpers: sizes, byte counts, durations, modes and times.

/// Parse a size: a number with an optional binary unit suffix `K`, `M`, `G`, `T`
/// (case-insensitive, optionally followed by `iB` or `B`): `123`, `64K`, `256M`, `2G`,
/// `1T`, `4KiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return Err(format!(
            "invalid size `{s}`: expected a number with an optional unit K, M, G or T"
        ));
    }
    let n: u64 = t[..digits]
        .parse()
        .map_err(|_| format!("invalid size `{s}`: number too large"))?;
    let unit = t[digits..].trim().to_ascii_uppercase();
    let shift = match unit.as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "invalid size `{s}`: unknown unit `{}` (use K, M, G or T)",
                &t[digits..]
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("invalid size `{s}`: too large"))
}

pub use cairn_area::units::human_bytes;

/// The name of user `uid` as the host knows it (passwd, NSS), else the number.
pub fn user_name(uid: u32) -> String {
    static CACHE: std::sync::Mutex<Vec<(u32, String)>> = std::sync::Mutex::new(Vec::new());
    lookup(&CACHE, uid, |id| {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id))
            .ok()
            .flatten()
            .map(|u| u.name)
    })
}

/// The name of group `gid` as the host knows it (group, NSS), else the number.
pub fn group_name(gid: u32) -> String {
    static CACHE: std::sync::Mutex<Vec<(u32, String)>> = std::sync::Mutex::new(Vec::new());
    lookup(&CACHE, gid, |id| {
        nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id))
            .ok()
            .flatten()
            .map(|g| g.name)
    })
}

/// `id`'s name from `cache`, else from `find` (remembered), else the number.
fn lookup(
    cache: &std::sync::Mutex<Vec<(u32, String)>>,
    id: u32,
    find: impl FnOnce(u32) -> Option<String>,
) -> String {
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, n)) = c.iter().find(|(i, _)| *i == id) {
        return n.clone();
    }
    let name = find(id).unwrap_or_else(|| id.to_string());
    c.push((id, name.clone()));
    name
}

/// A duration in nanoseconds, in the largest unit that keeps it readable.
pub fn human_ns(ns: f64) -> String {
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// `ls -l`-style mode string of an `st_mode`: `-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & 0o170000 {
        0o040000 => 'd',
        0o100000 => '-',
        0o120000 => 'l',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 's',
        _ => '?',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    let bit = |m: u32, c: char| if mode & m != 0 { c } else { '-' };
    let special =
        |x: u32, special: u32, lower: char, upper: char| match (mode & x != 0, mode & special != 0)
        {
            (true, true) => lower,
            (false, true) => upper,
            (true, false) => 'x',
            (false, false) => '-',
        };
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(0o100, 0o4000, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(0o010, 0o2000, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(0o001, 0o1000, 't', 'T'));
    s
}

/// The file type named as stat(1) names it.
pub fn type_name(mode: u32, size: u64) -> &'static str {
    match mode & 0o170000 {
        0o040000 => "directory",
        0o100000 if size == 0 => "regular empty file",
        0o100000 => "regular file",
        0o120000 => "symbolic link",
        0o020000 => "character special file",
        0o060000 => "block special file",
        0o010000 => "fifo",
        0o140000 => "socket",
        _ => "unknown",
    }
}

/// `YYYY-MM-DD HH:MM` (UTC) of nanoseconds since the epoch, for `ls -l`.
pub fn format_minute(ns: i64) -> String {
    let mut s = cairn_area::time::date_time(ns, ' ');
    s.truncate(16);
    s
}

/// `YYYY-MM-DD HH:MM:SS.nnnnnnnnn +0000` (UTC) of nanoseconds since the epoch, for `stat`.
pub fn format_full(ns: i64) -> String {
    let sub = cairn_area::time::utc(ns).nanosecond();
    format!("{}.{sub:09} +0000", cairn_area::time::date_time(ns, ' '))
}

/// `v` as pretty JSON with a final newline (the `--json` outputs).
pub fn json_text<T: serde::Serialize>(v: &T, what: &str) -> crate::error::CliResult<String> {
    let mut s = serde_json::to_string_pretty(v)
        .map_err(|e| crate::error::CliError::new(format!("encoding {what}: {e}")))?;
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1MB"), Ok(1 << 20));
        assert_eq!(parse_size("0"), Ok(0));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5G").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("16777216T").is_err());
    }

    #[test]
    fn names_of_ids() {
        assert_eq!(user_name(0), "root");
        assert_eq!(group_name(0), "root");
        // An id the host does not know stays a number.
        assert_eq!(user_name(3_999_999_999), "3999999999");
        assert_eq!(group_name(3_999_999_999), "3999999999");
    }

    #[test]
    fn durations() {
        assert_eq!(human_ns(850.0), "850 ns");
        assert_eq!(human_ns(1_500.0), "1.50 µs");
        assert_eq!(human_ns(2_500_000.0), "2.50 ms");
    }

    #[test]
    fn modes() {
        assert_eq!(mode_string(0o100644), "-rw-r--r--");
        assert_eq!(mode_string(0o040755), "drwxr-xr-x");
        assert_eq!(mode_string(0o120777), "lrwxrwxrwx");
        assert_eq!(mode_string(0o104755), "-rwsr-xr-x");
        assert_eq!(mode_string(0o041777), "drwxrwxrwt");
        assert_eq!(mode_string(0o102644), "-rw-r-Sr--");
        assert_eq!(type_name(0o100644, 0), "regular empty file");
        assert_eq!(type_name(0o040755, 4096), "directory");
    }

    #[test]
    fn times() {
        assert_eq!(format_minute(0), "1970-01-01 00:00");
        assert_eq!(
            format_full(1_700_000_000_123_456_789),
            "2023-11-14 22:13:20.123456789 +0000"
        );
        assert_eq!(
            format_minute(951_782_400 * 1_000_000_000),
            "2000-02-29 00:00"
        );
        assert_eq!(format_full(-1), "1969-12-31 23:59:59.999999999 +0000");
    }
}
