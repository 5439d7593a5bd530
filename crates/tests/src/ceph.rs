//! A Ceph cluster on this machine for a test (`scripts/ceph-dev-cluster.sh`: one
//! monitor and N OSDs in RAM, on free ports, in a directory of its own), stopped by pid
//! when dropped. In CI (`CI` set) a missing Ceph is a failure; elsewhere the test says so
//! and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A cluster started for a test.
pub struct Cluster {
    pub dir: PathBuf,
    /// Its configuration file (it names the monitor and the admin keyring).
    pub conf: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-dev-cluster.sh")
}

/// Two free TCP ports in a row on 127.0.0.1 (the monitor's v1 and v2).
pub fn free_ports() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 65535 && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

impl Cluster {
    /// One monitor and `osds` OSDs in RAM (`tag` names its directory), with the pool
    /// `cairn`; `None` (outside CI) when Ceph is not installed.
    pub fn start(tag: &str, osds: u32) -> Option<Cluster> {
        if Command::new("ceph-osd").arg("--version").output().is_err() {
            assert!(
                std::env::var_os("CI").is_none(),
                "ceph-osd is missing: scripts/setup.sh installs Ceph"
            );
            eprintln!("ceph-osd is missing (scripts/setup.sh installs it): not tested");
            return None;
        }
        let dir =
            std::env::temp_dir().join(format!("cairn-ceph-test-{tag}-{}", std::process::id()));
        let port = free_ports();
        let out = Command::new(script())
            .args(["start", "--dir"])
            .arg(&dir)
            .args(["--port", &port.to_string(), "--osds", &osds.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "starting a Ceph cluster: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Cluster {
            conf: dir.join("ceph.conf"),
            dir,
        })
    }

    /// `scripts/ceph-dev-cluster.sh WHAT OSD` (`kill-osd`, `start-osd`).
    pub fn run(&self, what: &str, osd: u32) {
        self.script(&[what, &osd.to_string()]);
    }

    /// Stop every daemon of the cluster (SIGSTOP): it no longer answers, and keeps its
    /// data (the OSDs keep theirs in RAM).
    pub fn pause(&self) {
        self.script(&["pause"]);
    }

    /// Let the daemons go on (SIGCONT).
    pub fn resume(&self) {
        self.script(&["resume"]);
    }

    fn script(&self, args: &[&str]) {
        let out = Command::new(script())
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The names of the pool's objects that start with `prefix` (`rados ls`).
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        let out = Command::new("rados")
            .arg("-c")
            .arg(&self.conf)
            .args(["-p", "cairn", "ls"])
            .output()
            .unwrap();
        assert!(out.status.success(), "rados ls: {out:?}");
        let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect();
        v.sort();
        v
    }

    /// `ceph ARGS…` against the cluster: its standard output.
    pub fn ceph(&self, args: &[&str]) -> String {
        let out = Command::new("ceph")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ceph {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `rados put NAME` of `data`.
    pub fn put(&self, name: &str, data: &[u8]) {
        let f = self.dir.join("put.tmp");
        std::fs::write(&f, data).unwrap();
        let out = Command::new("rados")
            .arg("-c")
            .arg(&self.conf)
            .args(["-p", "cairn", "put", name])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "rados put: {out:?}");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", "--dir"])
            .arg(&self.dir)
            .status();
    }
}
