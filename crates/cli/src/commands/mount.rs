//! `cairn mount` and `cairn umount`: the FUSE mount (crates/fuse).

use crate::error::{CliError, CliResult};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Whether a Cairn FUSE file system is mounted at `mp` (from /proc/self/mountinfo).
pub fn is_mounted(mp: &Path) -> bool {
    cairn::cairn_mounts().iter().any(|m| m.mountpoint == mp)
}

fn canonical(mp: &Path) -> CliResult<PathBuf> {
    let c = std::fs::canonicalize(mp).map_err(crate::error::ctx_msg(format!(
        "mount point {}",
        mp.display()
    )))?;
    if !c.is_dir() {
        return Err(CliError::new(format!(
            "mount point {}: not a directory",
            mp.display()
        )));
    }
    Ok(c)
}

/// `cairn mount`: serve the store at `mp`; in the background unless `foreground`. The
/// kernel caches names and attributes as `caching` says (attributes not at all in a
/// store with shared-write mode on: another writer does not revoke the mount's lease).
/// `quiet`: no "mounted" line (for `bench apps`, whose stdout may be JSON).
pub fn mount(
    store: Option<&Path>,
    mp: &Path,
    foreground: bool,
    caching: cairn_fuse::Caching,
    quiet: bool,
) -> CliResult {
    let mp = canonical(mp)?;
    if is_mounted(&mp) {
        return Err(CliError::new(format!(
            "{}: a Cairn store is already mounted there",
            mp.display()
        )));
    }
    if foreground {
        // Requests carry modes with the caller's umask applied: none of ours on top
        // (LibFS reads the umask when the client opens).
        cairn_media::sys::set_umask(0);
        let fs = super::open_fs(store)?;
        let mut caching = caching;
        let dir = cairn_area::StoreDir::new(fs.store_dir());
        if dir.load_config().is_ok_and(|c| c.shared_write) {
            eprintln!(
                "cairn mount: shared-write mode is on in this store: attributes are not cached"
            );
            caching.attr = Duration::ZERO;
        }
        return cairn_fuse::serve(fs, &mp, caching)
            .map_err(crate::error::ctx_msg(format!("mount {}", mp.display())));
    }
    // Background: the same command in the foreground, in its own process group, logging
    // to a file next to the store's daemon log; wait until the mount appears.
    let dir = cairn_area::StoreDir::resolve(store);
    let (log_path, log) = mount_log(&dir)?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    if let Some(s) = store {
        cmd.arg("--store").arg(s);
    }
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .args(["mount", "--foreground", "--attr-timeout"])
        .arg(caching.attr.as_secs_f64().to_string())
        .arg("--entry-timeout")
        .arg(caching.entry.as_secs_f64().to_string())
        .arg(&mp)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if is_mounted(&mp) {
            if !quiet {
                println!("mounted {} at {}", dir.path.display(), mp.display());
            }
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            return Err(CliError::new(format!(
                "mount {}: the mount process exited ({st}): {}",
                mp.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return Err(CliError::new(format!(
                "mount {}: not mounted after 15 s (see {})",
                mp.display(),
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `cairn umount`: unmount (the mount process then says goodbye to the daemon and exits).
pub fn umount(mp: &Path) -> CliResult {
    let mp = canonical(mp)?;
    if !is_mounted(&mp) {
        return Err(CliError::new(format!(
            "{}: no Cairn store is mounted there",
            mp.display()
        )));
    }
    let out = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(&mp)
        .output()
        .map_err(crate::error::ctx_msg("run fusermount3 (package fuse3)"))?;
    if !out.status.success() {
        return Err(CliError::new(format!(
            "umount {}: {}",
            mp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Where a background mount logs: `DIR/mount.log`, or, for a member of the trusted group
/// (who may not write in the store directory), `mount-<hash of DIR>.log` in the
/// directory of the user's default store (`~/.local/share/cairn`).
fn mount_log(dir: &cairn_area::StoreDir) -> Result<(std::path::PathBuf, std::fs::File), CliError> {
    let open = |p: &std::path::Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
    };
    let in_store = dir.path.join("mount.log");
    match open(&in_store) {
        Ok(f) => return Ok((in_store, f)),
        Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => {
            return Err(crate::error::ctx_msg(in_store.display())(e))
        }
        Err(_) => {}
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::canonicalize(&dir.path)
        .unwrap_or_else(|_| dir.path.clone())
        .hash(&mut h);
    let home = cairn_area::store::default_store_path();
    let home = home.parent().unwrap_or(std::path::Path::new("/tmp"));
    std::fs::create_dir_all(home).map_err(crate::error::ctx_msg(home.display()))?;
    let p = home.join(format!("mount-{:016x}.log", h.finish()));
    let f = open(&p).map_err(crate::error::ctx_msg(p.display()))?;
    Ok((p, f))
}
