//! The remote tier's device (`cairn_remote`) against a real Ceph cluster on this
//! machine (`cairn_tests::ceph::Cluster`: one monitor and one or three OSDs in RAM,
//! started for the test and stopped at its end).

use cairn_area::{errno_of, TierDevice};
use cairn_format::superblock::TierGeom;
use cairn_remote::{Pool, RadosTier, Spec, CHUNK};
use cairn_tests::ceph::{free_ports, Cluster};
use std::path::Path;
use std::time::{Duration, Instant};

/// Both parts against one cluster (starting one takes seconds).
#[test]
fn the_remote_tier_against_a_ceph_cluster() {
    let Some(c) = Cluster::start("one", 1) else {
        return;
    };
    a_segment_round_trips_through_objects(&c);
    the_cache_and_the_sweep(&c);
    bad_settings_get_clear_errors_not_hangs(&c);
    // Last: it stops the cluster's only OSD.
    a_cluster_that_stops_answering_times_out(&c);
}

fn spec(c: &Cluster) -> Spec {
    Spec::parse("ceph:cairn", Some(&c.conf), None).unwrap()
}

/// Tier `tier` of store `uuid`, made in the cluster's pool.
fn make(c: &Cluster, uuid: &[u8; 16], tier: u8, geom: TierGeom) -> RadosTier {
    RadosTier::create(&spec(c), Duration::from_secs(30), uuid, tier, geom).unwrap()
}

/// Wait until object `name` is gone (discards remove objects in the background).
fn gone(t: &RadosTier, name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if t.pool().unwrap().size(name).unwrap().is_none() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
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
    let t = make(c, &uuid, 3, geom);
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
            t.pool().unwrap().size(&t.object(3, 5, c)).unwrap(),
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
        assert!(gone(&t, &t.object(3, 5, c)), "chunk {c} removed");
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
    let s = t.stats();
    // Two segments of three objects each (empty ones past the data).
    assert!(
        s.connected && s.objects_written == 6 && s.bytes_written == (21 << 20),
        "{s:?}"
    );
}

fn the_cache_and_the_sweep(c: &Cluster) {
    let geom = TierGeom {
        segments: 16,
        segment_blocks: 256,
    };
    let uuid = *b"cairn-cache-swp!";
    make(c, &uuid, 3, geom);
    // Opened as the daemon does, with a cache: the first read of a block goes to the
    // cluster, the second does not; a new generation is never served from the cache.
    let t = RadosTier::open(&spec(c), Duration::from_secs(30), &uuid, 3, geom, 1 << 20);
    let sb = geom.segment_bytes();
    t.write_segment(2, 1, 2 * sb, &pattern(sb as usize, 7))
        .unwrap();
    let mut b = vec![0u8; 8192];
    t.read(2, 1, 2 * sb + 4096, &mut b).unwrap();
    let reads = t.stats().reads;
    t.read(2, 1, 2 * sb + 4096, &mut b).unwrap();
    assert_eq!(b, pattern(sb as usize, 7)[4096..4096 + 8192]);
    let s = t.stats();
    assert_eq!((s.reads, s.cache_hits), (reads, 2), "served from the cache");
    t.write_segment(2, 2, 2 * sb, &pattern(sb as usize, 8))
        .unwrap();
    t.read(2, 2, 2 * sb + 4096, &mut b).unwrap();
    assert_eq!(b, pattern(sb as usize, 8)[4096..4096 + 8192]);
    // Blocks partly cached: only the missing range is read.
    t.read(2, 2, 2 * sb, &mut b).unwrap();
    assert_eq!(b, pattern(sb as usize, 8)[..8192]);
    // The sweep keeps what `keep` names (and the header), removes the rest.
    t.write_segment(5, 3, 5 * sb, &pattern(100, 9)).unwrap();
    let removed = t.sweep(|seg, gen| (seg, gen) == (2, 2)).unwrap();
    assert_eq!(removed, 2, "segment 2 of generation 1 and segment 5");
    t.read(2, 2, 2 * sb, &mut b).unwrap();
    assert_eq!(
        errno_of(&t.read(5, 3, 5 * sb, &mut b).unwrap_err()),
        libc::ENOENT
    );
    assert!(!gone(&t, &t.header_object()) || panic!("the header was removed"));
    // Opening checks the header: another geometry, or a store never made there.
    let other = TierGeom {
        segments: 17,
        ..geom
    };
    let t2 = RadosTier::open(&spec(c), Duration::from_secs(30), &uuid, 3, other, 0);
    let e = t2.pool().err().unwrap();
    assert!(e.to_string().contains("geometry"), "{e}");
    assert_eq!(t2.stats().last_error.map(|(m, _)| m), Some(e.to_string()));
    let t3 = RadosTier::open(
        &spec(c),
        Duration::from_secs(30),
        b"never-made-here!",
        3,
        geom,
        0,
    );
    let e = t3.read(2, 2, 2 * sb, &mut b).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT);
    assert!(e.to_string().contains("holds no remote tier"), "{e}");
    t.discard(2, 2, 2 * sb, sb).unwrap();
}

fn a_cluster_that_stops_answering_times_out(c: &Cluster) {
    let geom = TierGeom {
        segments: 4,
        segment_blocks: 16,
    };
    let t = RadosTier::create(
        &spec(c),
        Duration::from_secs(3),
        b"cairn-timeouts!!",
        3,
        geom,
    )
    .unwrap();
    c.run("kill-osd", 0);
    let t0 = Instant::now();
    let e = t.write_segment(1, 1, 65536, &[1u8; 4096]).unwrap_err();
    assert_eq!(errno_of(&e), libc::ETIMEDOUT, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let mut b = vec![0u8; 4096];
    let e = t.read(1, 1, 65536, &mut b).unwrap_err();
    assert_eq!(errno_of(&e), libc::ETIMEDOUT, "{e}");
    assert!(t.stats().last_error.is_some());
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
    let t = make(&c, b"cairn-osd-kill!!", 3, geom);
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
