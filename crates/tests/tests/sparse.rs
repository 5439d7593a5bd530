//! `SEEK_DATA` and `SEEK_HOLE` (`File::next_data`, `File::next_hole`): exact answers on
//! sparse files, from the log (undigested), from the shared area (digested), and
//! mixed, through the API, the `LD_PRELOAD` library and the FUSE mount. (The model
//! tests check every generated answer for validity against the reference's contents.)

use cairn_area::errno_of;
use cairn_tests::harness::cairn_bin;
use cairn_tests::TestStore;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn data(f: &cairn::File, off: u64) -> Result<u64, i32> {
    f.next_data(off).map_err(|e| errno_of(&e))
}

fn hole(f: &cairn::File, off: u64) -> Result<u64, i32> {
    f.next_hole(off).map_err(|e| errno_of(&e))
}

/// The layout of `/sparse` written by [`write_sparse`]: data in blocks 0, 256 and 768.
fn check_sparse(f: &cairn::File, when: &str) {
    let size = 3 * MIB + 150;
    let want = [
        (data(f, 0), Ok(0)),
        (hole(f, 0), Ok(4096)),
        (data(f, 5), Ok(5)),
        (data(f, 4096), Ok(MIB)),
        (hole(f, MIB), Ok(MIB + 4096)),
        (data(f, MIB + 4096), Ok(3 * MIB)),
        (hole(f, 3 * MIB), Ok(size)),
        (data(f, 3 * MIB + 140), Ok(3 * MIB + 140)),
        (data(f, size), Err(libc::ENXIO)),
        (hole(f, size), Err(libc::ENXIO)),
    ];
    for (i, (got, expect)) in want.iter().enumerate() {
        assert_eq!(got, expect, "{when}: check {i}");
    }
}

fn write_sparse(f: &cairn::File) {
    f.write_at(&[b'a'; 10], 0).unwrap();
    f.write_at(&[b'b'; 4096], MIB).unwrap();
    f.write_at(&[b'c'; 100], 3 * MIB + 50).unwrap();
}

#[test]
fn data_and_holes_through_the_api() {
    let store = TestStore::new();
    let fs = store.fs();
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "/sparse")
        .unwrap();
    write_sparse(&f);
    check_sparse(&f, "undigested");
    fs.digest().unwrap();
    check_sparse(&f, "digested");
    // Mixed: a logged write into a digested hole, and one inside a digested block.
    f.write_at(&[b'd'; 10], 2 * MIB + 10).unwrap();
    f.write_at(&[b'e'; 10], 100).unwrap();
    assert_eq!(data(&f, 4096), Ok(MIB));
    assert_eq!(data(&f, MIB + 4096), Ok(2 * MIB));
    assert_eq!(hole(&f, 2 * MIB), Ok(2 * MIB + 4096));
    assert_eq!(hole(&f, 0), Ok(4096));
    // A truncation makes holes of what it cuts, logged or digested.
    f.set_len(MIB + 100).unwrap();
    assert_eq!(data(&f, 4096), Ok(MIB));
    assert_eq!(hole(&f, MIB), Ok(MIB + 100));
    f.set_len(8 * MIB).unwrap();
    assert_eq!(data(&f, MIB + 4096), Err(libc::ENXIO));
    assert_eq!(hole(&f, MIB), Ok(MIB + 4096));
    fs.digest().unwrap();
    assert_eq!(data(&f, MIB + 4096), Err(libc::ENXIO));
    assert_eq!(hole(&f, MIB), Ok(MIB + 4096));
    // A byte at 1 TiB: found by skipping absent map subtrees, not by probing 2^28 blocks.
    let big = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .open(&fs, "/big")
        .unwrap();
    big.write_at(b"x", 1 << 40).unwrap();
    for when in ["undigested", "digested"] {
        let t = std::time::Instant::now();
        assert_eq!(data(&big, 0), Ok(1 << 40), "{when}");
        assert_eq!(hole(&big, 0), Ok(0), "{when}");
        assert_eq!(hole(&big, 1 << 40), Ok((1 << 40) + 1), "{when}");
        assert!(t.elapsed().as_secs() < 5, "{when}: {:?}", t.elapsed());
        fs.digest().unwrap();
    }
    // A directory has no data to seek.
    fs.create_dir("/d").unwrap();
    let e = cairn::File::open(&fs, "/d").and_then(|d| d.next_data(0));
    assert!(e.is_err());
}

/// The same layout seen by a program, through the library and through the mount.
#[test]
fn data_and_holes_through_the_shim_and_the_mount() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/seek_check.py");
    let store = TestStore::new();
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(store.path())
        .args(["run", "--", "python3", script, "/cairn"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = cairn_tests::mount::Mount::of(store, &[]);
    let out = Command::new("python3")
        .arg(script)
        .arg(m.dir())
        .output()
        .unwrap();
    drop(m);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ok\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Punched holes and zeroed ranges through the API: zeros at once (undigested), blocks
/// freed once digested (in `st_blocks` and the NVM tier's use), kept across a restart.
#[test]
fn holes_punched_and_zeroed_through_the_api() {
    let store = TestStore::new();
    let fs = store.fs();
    let bytes: Vec<u8> = (0..MIB as u32).map(|i| (i % 253) as u8 + 1).collect();
    fs.write("/p", &bytes).unwrap();
    fs.digest().unwrap();
    let used = || cairn::daemon_status(Some(store.path())).unwrap().tiers[0].used_bytes;
    let (blocks0, used0) = (fs.metadata("/p").unwrap().blocks(), used());
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, "/p")
        .unwrap();
    let mut want = bytes.clone();
    f.punch_hole(4096, 512 * 1024).unwrap();
    want[4096..4096 + 512 * 1024].fill(0);
    f.fallocate(libc::FALLOC_FL_ZERO_RANGE, 700_000, 100)
        .unwrap();
    want[700_000..700_100].fill(0);
    f.zero_range(MIB - 10, 4096, false).unwrap();
    want[MIB as usize - 10..].fill(0);
    want.resize(MIB as usize - 10 + 4096, 0);
    let check = |when: &str| {
        let got = fs.read("/p").unwrap();
        assert!(got == want, "{when}: contents differ");
        assert_eq!(hole(&f, 0), Ok(4096), "{when}");
        assert_eq!(data(&f, 4096), Ok(4096 + 512 * 1024), "{when}");
    };
    check("undigested");
    fs.digest().unwrap();
    check("digested");
    let blocks1 = fs.metadata("/p").unwrap().blocks();
    assert_eq!(blocks0 - blocks1, 128 * 8, "128 blocks of 8 sectors freed");
    let freed = used0 - used();
    assert!(freed >= 128 * 4096, "the NVM tier gave back {freed} bytes");
    // Linux's errors.
    let e = |r: std::io::Result<()>| errno_of(&r.unwrap_err());
    assert_eq!(
        e(f.fallocate(libc::FALLOC_FL_PUNCH_HOLE, 0, 1)),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        e(f.fallocate(libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096)),
        libc::EOPNOTSUPP
    );
    assert_eq!(e(f.fallocate(0, -1, 1)), libc::EINVAL);
    assert_eq!(e(f.punch_hole(1 << 62, 1 << 62)), libc::EFBIG);
    let ro = cairn::File::open(&fs, "/p").unwrap();
    assert_eq!(e(ro.punch_hole(0, 1)), libc::EBADF);
    drop((f, ro, fs));
    store.stop();
    let fs = store.fs();
    assert!(fs.read("/p").unwrap() == want, "after a restart");
}

/// The same `fallocate` script on the host file system, through the library and on the
/// mount: the same answers.
#[test]
fn fallocate_through_the_shim_and_the_mount() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/fallocate_check.py");
    let host = tempfile::tempdir().unwrap();
    let run = |c: &mut Command, what: &str| {
        let out = c.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "ok\n",
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(Command::new("python3").arg(script).arg(host.path()), "host");
    let store = TestStore::new();
    run(
        Command::new(cairn_bin())
            .arg("--store")
            .arg(store.path())
            .args(["run", "--", "python3", script, "/cairn"]),
        "shim",
    );
    let m = cairn_tests::mount::Mount::of(store, &[]);
    run(Command::new("python3").arg(script).arg(m.dir()), "mount");
}
