//! A process's share of huge pages from its cgroup's CPU weight, when the configuration
//! gives it none: `100 × cpu.weight` under cgroup v2 (weight 100 by default, so 10,000,
//! the daemon's default share), `10,000 × cpu.shares / 1024` under a v1 `cpu`
//! hierarchy (1024 by default). Read only: the daemon never writes to a cgroup.

use std::path::{Path, PathBuf};

/// The share the cgroup of the process whose `/proc/PID/cgroup` is `proc_cgroup` gives
/// it, with `mountinfo` the text of `/proc/self/mountinfo` and `read` a file reader;
/// `None` where no weight can be read (the root cgroup has none).
pub fn share_from(
    proc_cgroup: &str,
    mountinfo: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<f64> {
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (id, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let (file, scale) = if id == "0" && controllers.is_empty() {
            ("cpu.weight", 100.0)
        } else if controllers.split(',').any(|c| c == "cpu") {
            ("cpu.shares", 10_000.0 / 1024.0)
        } else {
            continue;
        };
        let Some(dir) = cgroup_dir(mountinfo, file == "cpu.weight", path) else {
            continue;
        };
        if let Some(v) = read(&dir.join(file)).and_then(|t| t.trim().parse::<f64>().ok()) {
            if v > 0.0 {
                return Some(v * scale);
            }
        }
    }
    None
}

/// The directory of cgroup `path` in the mounted hierarchy: the cgroup2 mount (`v2`) or
/// the v1 mount whose options name the `cpu` controller.
fn cgroup_dir(mountinfo: &str, v2: bool, path: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let (root, point) = (*left.get(3)?, *left.get(4)?);
        let ok = match (v2, *right.first()?) {
            (true, "cgroup2") => true,
            (false, "cgroup") => right.get(2)?.split(',').any(|o| o == "cpu"),
            _ => false,
        };
        if !ok {
            return None;
        }
        // A hierarchy mounted from below its root (in a container) shows paths
        // relative to that root.
        let rel = path
            .strip_prefix(root)
            .unwrap_or(path)
            .trim_start_matches('/');
        Some(Path::new(point).join(rel))
    })
}

/// [`share_from`] for process `pid` on this system.
pub fn share(pid: u32) -> Option<f64> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    share_from(&cg, &mi, |p| std::fs::read_to_string(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 31 0:37 /ctr /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn files(list: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: HashMap<PathBuf, String> = list
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |p| m.get(p).cloned()
    }

    #[test]
    fn v2_weight_scales_to_the_default_share() {
        let read = files(&[
            ("/sys/fs/cgroup/unified/a/cpu.weight", "100\n"),
            ("/sys/fs/cgroup/unified/b/cpu.weight", "300\n"),
        ]);
        // The hierarchy is mounted from /ctr: paths under it are relative to that.
        assert_eq!(share_from("0::/ctr/a\n", MOUNTS, &read), Some(10_000.0));
        assert_eq!(share_from("0::/b\n", MOUNTS, &read), Some(30_000.0));
        // The root cgroup has no weight.
        assert_eq!(share_from("0::/\n", MOUNTS, &read), None);
    }

    #[test]
    fn v1_cpu_shares_when_there_is_no_v2_weight() {
        let read = files(&[("/sys/fs/cgroup/cpu/batch/cpu.shares", "512\n")]);
        let cg = "4:memory:/x\n2:cpuacct:/batch\n1:cpu:/batch\n0::/\n";
        assert_eq!(share_from(cg, MOUNTS, &read), Some(5_000.0));
        // A controller list naming cpu among others is the cpu hierarchy too.
        let mounts = MOUNTS.replace("rw,cpu\n", "rw,cpu,cpuacct\n");
        assert_eq!(
            share_from("1:cpu,cpuacct:/batch\n", &mounts, &read),
            Some(5_000.0)
        );
        // Garbage and zero weights give nothing.
        assert_eq!(share_from("nonsense", MOUNTS, &read), None);
        let zero = files(&[("/sys/fs/cgroup/cpu/z/cpu.shares", "0")]);
        assert_eq!(share_from("1:cpu:/z\n", MOUNTS, &zero), None);
    }

    #[test]
    fn this_process_has_a_share_or_none() {
        // Whatever this machine's cgroups are, reading them must not fail loudly.
        if let Some(s) = share(std::process::id()) {
            assert!(s > 0.0);
        }
    }
}
