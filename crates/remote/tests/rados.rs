//! The remote tier against a real Ceph cluster on this machine
//! (`scripts/ceph-dev-cluster.sh`: one monitor and one OSD in RAM, started for the test
//! and stopped at its end). In CI (`CI` set) a missing Ceph is a failure; elsewhere the
//! tests say so and pass.

use cairn_area::{errno_of, TierDevice};
use cairn_format::superblock::TierGeom;
use cairn_remote::{Pool, RadosTier, Spec, CHUNK};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A cluster started for a test, stopped (its daemons, by pid, and its directory) when
/// dropped.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-dev-cluster.sh")
}

/// Two free TCP ports in a row on 127.0.0.1 (the monitor's v1 and v2).
fn free_ports() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 65535 && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

impl Cluster {
    /// One monitor and `osds` OSDs in RAM (`tag` names its directory); `None` (outside
    /// CI) when Ceph is not installed.
    fn start(tag: &str, osds: u32) -> Option<Cluster> {
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
}

impl Cluster {
    fn run(&self, what: &str, osd: u32) {
        let out = Command::new(script())
            .args([what, &osd.to_string(), "--dir"])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{what} {osd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
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

/// Both parts against one cluster (starting one takes seconds).
#[test]
fn the_remote_tier_against_a_ceph_cluster() {
    let Some(c) = Cluster::start("one", 1) else {
        return;
    };
    a_segment_round_trips_through_objects(&c);
    bad_settings_get_clear_errors_not_hangs(&c);
}

fn pool(c: &Cluster) -> Pool {
    let spec = Spec::parse("ceph:cairn", Some(&c.conf), None).unwrap();
    Pool::connect(&spec, Duration::from_secs(30)).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 12) as u8)
        .collect()
}

fn a_segment_round_trips_through_objects(c: &Cluster) {
    // 40 MiB segments: three objects each (16, 16 and 8 MiB).
    let geom = TierGeom {
        segments: 8,
        segment_blocks: 10240,
    };
    let uuid = *b"cairn-test-uuid!";
    let t = RadosTier::new(pool(c), &uuid, 2, geom);
    let seg_bytes = geom.segment_bytes();
    let data = pattern(20 << 20, 1);
    t.write_segment(3, 5, 3 * seg_bytes, &data).unwrap();
    for c in 0..3 {
        let want = match c {
            0 => CHUNK,
            1 => (20 << 20) - CHUNK,
            _ => 0,
        };
        assert_eq!(
            t.pool().size(&t.object(3, 5, c)).unwrap(),
            Some(want),
            "chunk {c}"
        );
    }
    // Reads inside one chunk, across a chunk boundary, and past the data (zeros).
    let base = 3 * seg_bytes;
    for (off, len) in [
        (0u64, 4096usize),
        (CHUNK - 100, 300),
        (12345, 1 << 20),
        ((20 << 20) - 10, 4106),
    ] {
        let mut b = vec![0xeeu8; len];
        t.read(3, 5, base + off, &mut b).unwrap();
        for (i, &x) in b.iter().enumerate() {
            let at = off as usize + i;
            let want = data.get(at).copied().unwrap_or(0);
            assert_eq!(x, want, "byte {at}");
        }
    }
    // The same segment written again under a new generation: new objects; the old ones
    // stay what they were until discarded.
    let again = pattern(1 << 20, 2);
    t.write_segment(3, 6, base, &again).unwrap();
    let mut b = vec![0u8; 4096];
    t.read(3, 6, base, &mut b).unwrap();
    assert_eq!(b, again[..4096]);
    t.read(3, 5, base, &mut b).unwrap();
    assert_eq!(b, data[..4096]);
    t.discard(3, 5, base, seg_bytes).unwrap();
    for c in 0..3 {
        assert_eq!(t.pool().size(&t.object(3, 5, c)).unwrap(), None);
    }
    let e = t.read(3, 5, base, &mut b).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT, "{e}");
    assert!(e.to_string().contains("cairn."), "names the object: {e}");
    t.discard(3, 6, base, seg_bytes).unwrap();
    // A write that is not a whole segment from its start, and a read outside the
    // segment it names, are refused.
    let e = t.write_segment(3, 7, base + 4096, &again).unwrap_err();
    assert_eq!(errno_of(&e), libc::EINVAL);
    let e = t.read(3, 6, base + seg_bytes, &mut b).unwrap_err();
    assert_eq!(errno_of(&e), libc::EINVAL);
}

fn bad_settings_get_clear_errors_not_hangs(c: &Cluster) {
    let e = Spec::parse("s3:bucket", None, None).unwrap_err();
    assert_eq!(errno_of(&e), libc::EINVAL);
    assert!(Spec::parse("ceph:", None, None).is_err());
    // No configuration file.
    let spec = Spec::parse(
        "ceph:cairn",
        Some(Path::new("/nonexistent/ceph.conf")),
        None,
    )
    .unwrap();
    let e = Pool::connect(&spec, Duration::from_secs(5)).err().unwrap();
    assert_eq!(errno_of(&e), libc::ENOENT, "{e}");
    // A pool that does not exist.
    let spec = Spec::parse("ceph:no-such-pool", Some(&c.conf), None).unwrap();
    let e = Pool::connect(&spec, Duration::from_secs(30)).err().unwrap();
    assert_eq!(errno_of(&e), libc::ENOENT, "{e}");
    assert!(e.to_string().contains("no-such-pool"), "{e}");
    // A user without a key.
    let spec = Spec::parse("ceph:cairn", Some(&c.conf), Some("nobody")).unwrap();
    let e = Pool::connect(&spec, Duration::from_secs(30)).err().unwrap();
    assert!(e.to_string().contains("client.nobody"), "{e}");
    // Monitors that do not answer: the configuration pointed at a port nobody serves.
    let conf = std::fs::read_to_string(&c.conf).unwrap();
    let port = free_ports();
    let dead = c.dir.join("dead.conf");
    let line = conf.lines().find(|l| l.starts_with("mon_host")).unwrap();
    std::fs::write(
        &dead,
        conf.replace(line, &format!("mon_host = v1:127.0.0.1:{port}")),
    )
    .unwrap();
    let spec = Spec::parse("ceph:cairn", Some(&dead), None).unwrap();
    let t = Instant::now();
    let e = Pool::connect(&spec, Duration::from_secs(3)).err().unwrap();
    assert_eq!(errno_of(&e), libc::ETIMEDOUT, "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// Three OSDs, three replicas (two needed to write): one OSD killed with SIGKILL while
/// segments are written. Every write finishes (after a stall while the cluster notices),
/// and every segment reads back, before and after the OSD comes back.
#[test]
fn an_osd_killed_while_segments_are_written_loses_nothing() {
    let Some(c) = Cluster::start("three", 3) else {
        return;
    };
    let geom = TierGeom {
        segments: 64,
        segment_blocks: 1024,
    };
    let t = RadosTier::new(pool(&c), b"cairn-osd-kill!!", 1, geom);
    let seg_bytes = geom.segment_bytes();
    let mut slowest = Duration::ZERO;
    for seg in 1..48u64 {
        if seg == 16 {
            c.run("kill-osd", 1);
        }
        let data = pattern(seg_bytes as usize, seg as u8);
        let t0 = Instant::now();
        t.write_segment(seg, 1, seg * seg_bytes, &data).unwrap();
        slowest = slowest.max(t0.elapsed());
    }
    let check = |when: &str| {
        for seg in 1..48u64 {
            let mut b = vec![0u8; seg_bytes as usize];
            t.read(seg, 1, seg * seg_bytes, &mut b).unwrap();
            assert!(
                b == pattern(seg_bytes as usize, seg as u8),
                "segment {seg} {when}"
            );
        }
    };
    check("with the OSD down");
    c.run("start-osd", 1);
    check("with the OSD back");
    eprintln!("47 segments of 4 MiB written, one OSD killed after 15: slowest write {slowest:?}");
}
