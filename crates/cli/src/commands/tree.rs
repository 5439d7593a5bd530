//! The namespace: `ls`, `mkdir`, `rm`, `mv`, `ln`, `stat`.

use super::open_fs;
use crate::error::{ctx, stdout_err, CliError, CliResult};
use crate::util::{format_full, format_minute, group_name, mode_string, type_name, user_name};
use cairn::{Fs, Metadata};
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// One `ls -l` row before column alignment.
struct Row {
    mode: String,
    nlink: String,
    uid: String,
    gid: String,
    size: String,
    mtime: String,
    name: String,
}

fn row(fs: &Fs, path: &Path, name: String, meta: &Metadata) -> Row {
    let mut name = name;
    if meta.is_symlink() {
        match fs.read_link(path) {
            Ok(t) => name = format!("{name} -> {}", t.display()),
            Err(_) => name = format!("{name} -> ?"),
        }
    }
    Row {
        mode: mode_string(meta.mode()),
        nlink: meta.nlink().to_string(),
        uid: user_name(meta.uid()),
        gid: group_name(meta.gid()),
        size: meta.len().to_string(),
        mtime: format_minute(meta.mtime_ns()),
        name,
    }
}

fn print_rows(rows: &[Row], out: &mut impl Write) -> io::Result<()> {
    let w = |f: fn(&Row) -> &String| rows.iter().map(|r| f(r).len()).max().unwrap_or(0);
    let (wl, wu, wg, ws) = (
        w(|r| &r.nlink),
        w(|r| &r.uid),
        w(|r| &r.gid),
        w(|r| &r.size),
    );
    for r in rows {
        writeln!(
            out,
            "{} {:>wl$} {:>wu$} {:>wg$} {:>ws$} {} {}",
            r.mode, r.nlink, r.uid, r.gid, r.size, r.mtime, r.name
        )?;
    }
    Ok(())
}

pub fn ls(store: Option<&Path>, path: &Path, long: bool, all: bool) -> CliResult {
    let fs = open_fs(store)?;
    let lmeta = fs.symlink_metadata(path).map_err(ctx("ls", path))?;
    // Like ls(1): a symlink to a directory is listed through, except with -l.
    let list_dir = if lmeta.is_symlink() && !long {
        fs.metadata(path).map(|m| m.is_dir()).unwrap_or(false)
    } else {
        lmeta.is_dir()
    };
    let mut out = io::stdout().lock();
    if !list_dir {
        let shown = path.display().to_string();
        if long {
            let r = row(&fs, path, shown, &lmeta);
            print_rows(&[r], &mut out).map_err(stdout_err)?;
        } else {
            writeln!(out, "{shown}").map_err(stdout_err)?;
        }
        return out.flush().map_err(stdout_err);
    }
    let mut entries: Vec<(OsString, PathBuf)> = Vec::new();
    for e in fs.read_dir(path).map_err(ctx("ls", path))? {
        let e = e.map_err(ctx("ls", path))?;
        let name = e.file_name();
        if !all && name.as_encoded_bytes().first() == Some(&b'.') {
            continue;
        }
        entries.push((name, e.path()));
    }
    entries.sort_by(|a, b| a.0.as_encoded_bytes().cmp(b.0.as_encoded_bytes()));
    if long {
        let mut rows = Vec::with_capacity(entries.len());
        for (name, p) in &entries {
            // An entry removed meanwhile by another client is skipped.
            match fs.symlink_metadata(p) {
                Ok(m) => rows.push(row(&fs, p, name.to_string_lossy().into_owned(), &m)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ctx("stat", p)(e)),
            }
        }
        print_rows(&rows, &mut out).map_err(stdout_err)?;
    } else {
        for (name, _) in &entries {
            writeln!(out, "{}", name.to_string_lossy()).map_err(stdout_err)?;
        }
    }
    out.flush().map_err(stdout_err)
}

pub fn mkdir(store: Option<&Path>, paths: &[PathBuf], parents: bool) -> CliResult {
    let fs = open_fs(store)?;
    for p in paths {
        if parents {
            fs.create_dir_all(p).map_err(ctx("mkdir", p))?;
        } else {
            fs.create_dir(p).map_err(ctx("mkdir", p))?;
        }
    }
    Ok(())
}

/// Whether `p` names the root directory (`/`, `.`, `/./`, empty).
fn is_root(p: &Path) -> bool {
    p.components()
        .all(|c| matches!(c, Component::RootDir | Component::CurDir))
}

pub fn rm(store: Option<&Path>, paths: &[PathBuf], recursive: bool, force: bool) -> CliResult {
    if let Some(p) = paths.iter().find(|p| is_root(p)) {
        return Err(CliError::new(format!(
            "refusing to remove the root directory ({})",
            p.display()
        )));
    }
    let fs = open_fs(store)?;
    for p in paths {
        let meta = match fs.symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if force && e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ctx("rm", p)(e)),
        };
        if meta.is_dir() {
            if !recursive {
                return Err(CliError::new(format!(
                    "cannot remove {}: is a directory (use rm -r)",
                    p.display()
                )));
            }
            fs.remove_dir_all(p).map_err(ctx("rm", p))?;
        } else {
            fs.remove_file(p).map_err(ctx("rm", p))?;
        }
    }
    Ok(())
}

pub fn mv(store: Option<&Path>, from: &Path, to: &Path) -> CliResult {
    if is_root(from) {
        return Err(CliError::new("cannot move the root directory"));
    }
    let fs = open_fs(store)?;
    // Check the source first so that its absence is reported as such.
    fs.symlink_metadata(from).map_err(ctx("mv", from))?;
    let to = match fs.metadata(to) {
        Ok(m) if m.is_dir() => match from.file_name() {
            Some(name) => to.join(name),
            None => to.to_path_buf(),
        },
        _ => to.to_path_buf(),
    };
    fs.rename(from, &to).map_err(|e| {
        CliError::new(format!(
            "mv {} {}: {}",
            from.display(),
            to.display(),
            crate::error::clean(&e)
        ))
    })
}

pub fn ln(store: Option<&Path>, target: &Path, link: &Path, symbolic: bool) -> CliResult {
    let fs = open_fs(store)?;
    if symbolic {
        fs.symlink(target, link).map_err(ctx("ln -s", link))
    } else {
        fs.hard_link(target, link).map_err(ctx("ln", link))
    }
}

/// Nanoseconds since the epoch (negative before it).
fn system_time_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

fn format_stat(fs: &Fs, path: &Path, m: &Metadata) -> String {
    let mode = m.mode();
    let mut name = path.display().to_string();
    if m.is_symlink() {
        if let Ok(t) = fs.read_link(path) {
            name = format!("{name} -> {}", t.display());
        }
    }
    format!(
        "  File: {name}\n  \
         Size: {size:<15} Blocks: {blocks:<10} IO Block: 4096   {kind}\n \
         Inode: {ino:<15} Links: {nlink}\n\
         Access: ({perm:04o}/{mstr})  Uid: ({uid:>5}/{uname:>8})   Gid: ({gid:>5}/{gname:>8})\n\
         Access: {atime}\n\
         Modify: {mtime}\n\
         Change: {ctime}\n \
         Birth: {btime}\n",
        size = m.len(),
        blocks = m.blocks(),
        kind = type_name(mode, m.len()),
        ino = m.ino(),
        nlink = m.nlink(),
        perm = mode & 0o7777,
        mstr = mode_string(mode),
        uid = m.uid(),
        gid = m.gid(),
        uname = user_name(m.uid()),
        gname = group_name(m.gid()),
        atime = format_full(m.atime_ns()),
        mtime = format_full(m.mtime_ns()),
        ctime = format_full(m.ctime_ns()),
        btime = format_full(system_time_ns(m.created())),
    )
}

pub fn stat(store: Option<&Path>, paths: &[PathBuf], dereference: bool) -> CliResult {
    let fs = open_fs(store)?;
    let mut out = io::stdout().lock();
    for p in paths {
        let m = if dereference {
            fs.metadata(p)
        } else {
            fs.symlink_metadata(p)
        }
        .map_err(ctx("stat", p))?;
        out.write_all(format_stat(&fs, p, &m).as_bytes())
            .map_err(stdout_err)?;
    }
    out.flush().map_err(stdout_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_paths() {
        assert!(is_root(Path::new("/")));
        assert!(is_root(Path::new("/./")));
        assert!(is_root(Path::new(".")));
        assert!(is_root(Path::new("")));
        assert!(!is_root(Path::new("/a")));
        assert!(!is_root(Path::new("a/..")));
    }

    #[test]
    fn epoch_nanoseconds() {
        use std::time::Duration;
        assert_eq!(system_time_ns(UNIX_EPOCH), 0);
        assert_eq!(
            system_time_ns(UNIX_EPOCH + Duration::new(2, 5)),
            2_000_000_005
        );
        assert_eq!(system_time_ns(UNIX_EPOCH - Duration::from_nanos(7)), -7);
    }
}
