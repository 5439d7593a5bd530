//! Temporary stores for tests, and finding the `cairn` binary that runs the daemon.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `cairn` binary: `$CAIRN_BIN`, else `target/<profile>/cairn` next to the running
/// test binary (which lives in `target/<profile>/deps`).
pub fn cairn_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CAIRN_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    for dir in exe.ancestors().skip(1).take(3) {
        let c = dir.join("cairn");
        if c.is_file() {
            return c;
        }
    }
    panic!(
        "the cairn binary was not found next to {}; build it first (cargo build -p cairn-cli, \
         same profile) or set CAIRN_BIN",
        exe.display()
    );
}

/// Run `cmd`; its stdout. Fails the test, with `what` and the command's stderr, unless
/// it succeeds.
pub fn output_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names in /dev/shm that start with `prefix` (what a test or benchmark left).
pub fn shm_leftovers(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .expect("/dev/shm")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// A figure of `/proc/PID/status` (`VmRSS` and `VmSize` in KiB, `Threads`), while the
/// process lives.
pub fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        l.strip_prefix(field)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// Let this process hold `n` descriptors and a hundred more (its soft limit raised as
/// far as the hard one allows); fails the test if the hard limit is lower.
pub fn allow_open_files(n: u64) {
    let l = cairn_media::sys::raise_open_files_limit().expect("raising RLIMIT_NOFILE");
    assert!(
        l >= n + 100,
        "this test holds {n} descriptors; the hard limit of open files is {l} (ulimit -Hn)"
    );
}

/// Make sure LibFS auto-starts daemons from the binary under test.
pub fn export_cairn_bin() {
    if std::env::var_os("CAIRN_BIN").is_none() {
        std::env::set_var("CAIRN_BIN", cairn_bin());
    }
}

/// A store in a temporary directory (NVM file inside it, so nothing leaks into
/// /dev/shm), stopped and removed when dropped.
pub struct TestStore {
    pub dir: tempfile::TempDir,
}

/// Size options for a test store.
#[derive(Debug, Clone)]
pub struct StoreSize {
    pub nvm: &'static str,
    pub log: &'static str,
    pub clients: u32,
    pub inodes: Option<u64>,
    /// Lower tiers: SSD and HDD sizes and the segment size (files in the store's
    /// temporary directory).
    pub tiers: Option<Tiers>,
}

/// Lower tiers of a test store.
#[derive(Debug, Clone)]
pub struct Tiers {
    /// SSD size (ignored with `ssd_device`).
    pub ssd: &'static str,
    /// A block device for the SSD tier instead of a file.
    pub ssd_device: Option<PathBuf>,
    pub hdd: Option<&'static str>,
    pub segment: &'static str,
}

impl Default for StoreSize {
    fn default() -> Self {
        StoreSize {
            nvm: "256M",
            log: "1M",
            clients: 8,
            inodes: None,
            tiers: None,
        }
    }
}

impl TestStore {
    /// A new store with default test sizes.
    pub fn new() -> TestStore {
        TestStore::with_size(StoreSize::default())
    }

    /// A new store with the given sizes. Its NVM file lives in /dev/shm (tmpfs, as in
    /// production) under the temporary directory's unique name.
    pub fn with_size(s: StoreSize) -> TestStore {
        TestStore::with_format(s, None)
    }

    /// A new store of the given sizes in on-media format `version` (`cairn mkfs
    /// --format-version`; `None`: the current one).
    pub fn with_format(s: StoreSize, version: Option<u32>) -> TestStore {
        export_cairn_bin();
        let dir = tempfile::Builder::new()
            .prefix("cairn-test-")
            .tempdir()
            .expect("tempdir");
        let nvm = Path::new("/dev/shm").join(format!(
            "{}.nvm",
            dir.path().file_name().unwrap().to_string_lossy()
        ));
        let mut cmd = Command::new(cairn_bin());
        cmd.arg("mkfs")
            .arg("--store")
            .arg(dir.path())
            .args(["--nvm-size", s.nvm, "--log-size", s.log])
            .arg("--nvm-path")
            .arg(&nvm)
            .args(["--max-clients", &s.clients.to_string()]);
        if let Some(n) = s.inodes {
            cmd.args(["--inodes", &n.to_string()]);
        }
        if let Some(v) = version {
            cmd.args(["--format-version", &v.to_string()]);
        }
        if let Some(t) = &s.tiers {
            match &t.ssd_device {
                Some(d) => cmd.arg("--ssd").arg(d).arg("--force"),
                None => cmd
                    .arg("--ssd")
                    .arg(dir.path().join("ssd.tier"))
                    .args(["--ssd-size", t.ssd]),
            };
            cmd.args(["--segment-size", t.segment]);
            if let Some(h) = t.hdd {
                cmd.arg("--hdd")
                    .arg(dir.path().join("hdd.tier"))
                    .args(["--hdd-size", h]);
            }
        }
        let out = cmd.output().expect("run cairn mkfs");
        assert!(
            out.status.success(),
            "cairn mkfs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        TestStore { dir }
    }

    /// A new store whose only lower tier is a remote one in the pool `cairn` of the
    /// cluster of `ceph_conf`: `nvm` of NVM, `remote` bytes in segments of `segment`.
    pub fn with_remote(ceph_conf: &Path, nvm: &str, remote: &str, segment: &str) -> TestStore {
        export_cairn_bin();
        let dir = tempfile::Builder::new()
            .prefix("cairn-test-")
            .tempdir()
            .expect("tempdir");
        let nvm_path = Path::new("/dev/shm").join(format!(
            "{}.nvm",
            dir.path().file_name().unwrap().to_string_lossy()
        ));
        output_ok(
            Command::new(cairn_bin())
                .args(["mkfs", "--store"])
                .arg(dir.path())
                .args(["--nvm-size", nvm, "--log-size", "1M", "--max-clients", "4"])
                .arg("--nvm-path")
                .arg(&nvm_path)
                .args(["--remote", "ceph:cairn", "--ceph-conf"])
                .arg(ceph_conf)
                .args(["--remote-size", remote, "--segment-size", segment]),
            "mkfs --remote",
        );
        TestStore { dir }
    }

    /// A new store (64 MiB of NVM, 4 clients) made by root with `--trusted-group gid`,
    /// so that members of `gid` may use it through LibFS.
    pub fn with_trusted_group(gid: u32) -> TestStore {
        let s = TestStore::with_size(StoreSize::default());
        // Re-make it with the trusted group.
        s.stop();
        let out = Command::new(cairn_bin())
            .args(["mkfs", "--force", "--store"])
            .arg(s.path())
            .args([
                "--nvm-size",
                "64M",
                "--log-size",
                "1M",
                "--max-clients",
                "4",
            ])
            .args(["--trusted-group", &gid.to_string()])
            .output()
            .expect("run cairn mkfs");
        assert!(
            out.status.success(),
            "mkfs --trusted-group: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("group {gid}")));
        s
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A new client of this store (auto-starts the daemon).
    pub fn fs(&self) -> cairn::Fs {
        cairn::Fs::open(self.path()).expect("open store")
    }

    /// Pid of the daemon serving this store, if one runs (from /proc).
    pub fn daemon_pid(&self) -> Option<u32> {
        daemon_pid(self.path())
    }

    /// Set a top-level key of `cairn.toml` (`value` in TOML syntax); it takes effect
    /// when the next daemon starts.
    pub fn set_config(&self, key: &str, value: &str) {
        let p = self.path().join("cairn.toml");
        let text = std::fs::read_to_string(&p).expect("read cairn.toml");
        let mut out: String = text
            .lines()
            .filter(|l| l.split('=').next().map(str::trim) != Some(key))
            .map(|l| format!("{l}\n"))
            .collect();
        // Top-level keys must come before any table: the configuration has none.
        out.push_str(&format!("{key} = {value}\n"));
        std::fs::write(&p, out).expect("write cairn.toml");
    }

    /// SIGKILL the daemon and wait until its socket refuses connections (a killed
    /// process closes its files only when its last thread is gone), so that the next
    /// connection reaches a new daemon (or until a client started a new one). False if
    /// no daemon ran.
    pub fn kill_daemon(&self) -> bool {
        let pids = daemon_pids(self.path());
        for &pid in &pids {
            kill9(pid);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let sock = self.path().join("cairnd.sock");
        while std::os::unix::net::UnixStream::connect(&sock).is_ok()
            && daemon_pids(self.path()).iter().all(|p| pids.contains(p))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the daemon does not die"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        !pids.is_empty()
    }

    /// Stop the daemon cleanly (if it runs).
    pub fn stop(&self) {
        let _ = cairn::daemon_shutdown(Some(self.path()));
    }

    /// Stop the daemon and check the store with `cairn fsck`: fails the test unless it
    /// is clean.
    pub fn fsck_clean(&self) {
        self.stop();
        output_ok(
            Command::new(cairn_bin())
                .args(["fsck", "--store"])
                .arg(self.path()),
            "fsck",
        );
    }
}

impl Default for TestStore {
    fn default() -> Self {
        TestStore::new()
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        // A mount's serving process outlives a lazy unmount while any file on the mount
        // is open (a program a test left behind), and would hold the test's output pipe.
        for pid in store_pids(self.path(), b"mount") {
            kill9(pid);
        }
        self.stop();
        if std::thread::panicking() {
            // Keep the evidence of a failed test: the store, its NVM file and cairnd.log.
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
            eprintln!("test failed: store kept at {}", dir.keep().display());
            return;
        }
        if let Some(pid) = self.daemon_pid() {
            kill9(pid);
        }
        // A daemon that stopped on an internal error (fail-stop: a failed assertion, an
        // overflow) is restarted by the next client, so the test may not have noticed.
        let log = std::fs::read_to_string(self.path().join("cairnd.log")).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("internal error")) {
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
            panic!(
                "the daemon stopped on an internal error (store kept at {}): {line}",
                dir.keep().display()
            );
        }
        // Host objects a test left: map objects, FIFO/socket rendezvous, resident
        // segments and the segment control file.
        cairn_area::host::remove_all(self.path());
        if let Ok(cfg) = cairn_area::StoreDir::new(self.path()).load_config() {
            let _ = cairn_area::store::remove_nvm_files(&cfg.nvm_path);
        }
    }
}

/// Find the pid of `cairn daemon --store <store>` by scanning /proc.
pub fn daemon_pid(store: &Path) -> Option<u32> {
    daemon_pids(store).into_iter().next()
}

/// Every live process running `cairn daemon --store <store>` (a daemon that detaches
/// runs as two processes for a moment).
pub fn daemon_pids(store: &Path) -> Vec<u32> {
    store_pids(store, b"daemon")
}

/// Every live process running `cairn --store <store> <command> …` or
/// `cairn <command> --store <store> …`.
pub fn store_pids(store: &Path, command: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    let want = store.as_os_str().as_encoded_bytes();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        if args.contains(&command) && args.contains(&want) {
            // Skip zombies.
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            if stat
                .rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
                == Some(true)
            {
                continue;
            }
            out.push(pid);
        }
    }
    out
}

/// SIGKILL a process.
pub fn kill9(pid: u32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

/// Deterministic content of version `v` of file `i`: `len` bytes (xorshift).
pub fn content(i: u32, v: u32, len: usize) -> Vec<u8> {
    let mut x = (i as u64) << 32 | v as u64 | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Check that every file `/f<i>` of `files` holds version `v` of its `len` bytes
/// ([`content`]).
pub fn verify_files(fs: &cairn::Fs, files: &std::collections::BTreeMap<u32, (u32, usize)>) {
    for (&i, &(v, len)) in files {
        let got = fs.read(format!("/f{i}")).unwrap();
        assert!(
            got == content(i, v, len),
            "file {i} differs from version {v} ({} bytes read, {len} expected)",
            got.len()
        );
    }
}

/// Compile the C program `src` into `exe` against one of Cairn's C libraries, built
/// next to the `cairn` binary: `lib` (`cairn_sj`, `cairn_kv`), its header under
/// `crates/<capi>/include`.
pub fn compile_c_against(src: &Path, exe: &Path, capi: &str, lib: &str) -> PathBuf {
    let bin_dir = cairn_bin().parent().unwrap().to_path_buf();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let so = bin_dir.join(format!("lib{lib}.so"));
    assert!(
        so.is_file(),
        "{} missing: build the workspace first",
        so.display()
    );
    let cc = Command::new("cc")
        .arg("-I")
        .arg(root.join("crates").join(capi).join("include"))
        .arg(src)
        .arg("-L")
        .arg(&bin_dir)
        .arg(format!("-l{lib}"))
        .arg(format!("-Wl,-rpath,{}", bin_dir.display()))
        .arg("-o")
        .arg(exe)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe.to_path_buf()
}
