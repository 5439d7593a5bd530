//! Copying data in and out of the store: `put`, `get`, `cat`.

use super::open_fs;
use crate::error::{ctx, stdout_err, CliError, CliResult};
use cairn::Fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Bytes moved per read/write call.
const CHUNK: usize = 1 << 20;

fn is_dash(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// Read from `r` until `buf` is full or end of file; the number of bytes read.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// `dst`, or `dst/<file name of src>` when `dst` names a directory.
fn into_dir(dst: &Path, dst_is_dir: bool, src: &Path) -> CliResult<PathBuf> {
    let trailing_slash = dst.as_os_str().as_encoded_bytes().ends_with(b"/");
    if !(dst_is_dir || trailing_slash) {
        return Ok(dst.to_path_buf());
    }
    match src.file_name() {
        Some(name) if !is_dash(src) => Ok(dst.join(name)),
        _ => Err(CliError::new(format!(
            "{} is a directory: give the destination file's name",
            dst.display()
        ))),
    }
}

pub fn put(store: Option<&Path>, src: &Path, dst: &Path) -> CliResult {
    // Open the source first: a missing host file should not start a daemon.
    let (mut input, mode): (Box<dyn Read>, u32) = if is_dash(src) {
        (Box::new(io::stdin().lock()), 0o644)
    } else {
        let f = std::fs::File::open(src).map_err(ctx("open", src))?;
        let meta = f.metadata().map_err(ctx("stat", src))?;
        if meta.is_dir() {
            return Err(CliError::new(format!(
                "{} is a directory (put copies one file)",
                src.display()
            )));
        }
        (Box::new(f), meta.permissions().mode() & 0o7777)
    };
    let fs = open_fs(store)?;
    let dst_is_dir = fs.metadata(dst).map(|m| m.is_dir()).unwrap_or(false);
    let dst = into_dir(dst, dst_is_dir, src)?;
    let mut out = cairn::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&fs, &dst)
        .map_err(ctx("create", &dst))?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = fill(&mut input, &mut buf).map_err(ctx("read", src))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(ctx("write", &dst))?;
    }
    Ok(())
}

/// Open a regular file (or a symlink to one) of the store for reading.
fn open_for_read(fs: &Fs, path: &Path) -> CliResult<cairn::File> {
    let meta = fs.metadata(path).map_err(ctx("stat", path))?;
    if meta.is_dir() {
        return Err(CliError::new(format!("{} is a directory", path.display())));
    }
    cairn::File::open(fs, path).map_err(ctx("open", path))
}

/// Copy a store file to `out`; errors writing to `out` go through `out_err`.
fn copy_out(
    file: &mut cairn::File,
    path: &Path,
    out: &mut dyn Write,
    out_err: &dyn Fn(io::Error) -> CliError,
) -> CliResult {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = fill(file, &mut buf).map_err(ctx("read", path))?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(out_err)?;
    }
    Ok(())
}

pub fn get(store: Option<&Path>, src: &Path, dst: &Path) -> CliResult {
    let fs = open_fs(store)?;
    let mut file = open_for_read(&fs, src)?;
    if is_dash(dst) {
        let mut out = io::stdout().lock();
        copy_out(&mut file, src, &mut out, &stdout_err)?;
        return out.flush().map_err(stdout_err);
    }
    let dst = into_dir(dst, dst.is_dir(), src)?;
    let mut out = io::BufWriter::with_capacity(
        CHUNK,
        std::fs::File::create(&dst).map_err(ctx("create", &dst))?,
    );
    let dst_err = |e| ctx("write", &dst)(e);
    copy_out(&mut file, src, &mut out, &dst_err)?;
    out.flush().map_err(ctx("write", &dst))
}

pub fn cat(store: Option<&Path>, paths: &[PathBuf]) -> CliResult {
    let fs = open_fs(store)?;
    let mut out = io::stdout().lock();
    for p in paths {
        let mut file = open_for_read(&fs, p)?;
        copy_out(&mut file, p, &mut out, &stdout_err)?;
    }
    out.flush().map_err(stdout_err)
}
