//! The type of the file system holding a directory (`ext4`, `xfs`, `btrfs`, `overlay`,
//! `tmpfs`, …), from `/proc/self/mountinfo` (which, unlike `statfs`'s magic number,
//! tells ext4 from ext2/ext3), falling back to `stat -f -c %T`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The type of the mount that holds `path` (absolute, canonical) according to the
/// mountinfo text: the deepest mount point that is a prefix of `path`, the last one listed
/// when several are mounted on the same point.
pub fn fs_type_from_mountinfo(mountinfo: &str, path: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let Some(fstype) = right.split_whitespace().next() else {
            continue;
        };
        let mp = PathBuf::from(
            <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(
                cairn::unescape_mountinfo(mount_point),
            ),
        );
        if !path.starts_with(&mp) {
            continue;
        }
        let depth = mp.components().count();
        let deeper = match &best {
            Some((d, _)) => depth >= *d,
            None => true,
        };
        if deeper {
            best = Some((depth, fstype.to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// The file system type of `dir`.
pub fn fs_type(dir: &Path) -> io::Result<String> {
    let canon = dir.canonicalize()?;
    if let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") {
        if let Some(t) = fs_type_from_mountinfo(&text, &canon) {
            return Ok(t);
        }
    }
    let out = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&canon)
        .output()?;
    let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || t.is_empty() {
        return Err(io::Error::other(format!(
            "cannot tell the file system type of {}",
            canon.display()
        )));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684100k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 25 0:27 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684100k
31 27 0:40 / /mnt/my\\040disk rw,relatime shared:5 - xfs /dev/vdb rw
32 27 0:41 / /data rw,relatime master:1 - btrfs /dev/vdc rw
";

    #[test]
    fn deepest_mount_wins() {
        let t = |p: &str| fs_type_from_mountinfo(INFO, Path::new(p));
        assert_eq!(t("/root/.local/share/cairn").as_deref(), Some("ext4"));
        assert_eq!(t("/dev/shm/x").as_deref(), Some("tmpfs"));
        assert_eq!(t("/mnt/my disk/store").as_deref(), Some("xfs"));
        assert_eq!(t("/data").as_deref(), Some("btrfs"));
        assert_eq!(t("/database").as_deref(), Some("ext4"));
        assert_eq!(fs_type_from_mountinfo("garbage\n", Path::new("/")), None);
    }

    #[test]
    fn real_dirs() {
        assert!(!fs_type(Path::new("/")).unwrap().is_empty());
        if Path::new("/dev/shm").is_dir() {
            assert_eq!(fs_type(Path::new("/dev/shm")).unwrap(), "tmpfs");
        }
    }
}
