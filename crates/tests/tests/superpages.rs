//! Superpages in the NVM tier: filled and promoted 2 MiB ranges are PMD-mapped in LibFS,
//! through `File::map` and through the shim, small files are not and cost 4 KiB blocks;
//! internal fragmentation stays under 1% on mixed sizes; the daemon killed during
//! promotion and demotion loses nothing and leaks nothing.

use cairn_media::huge::{pmd_mapped_kib, HUGE_PAGE};
use cairn_proto::SuperpageStatus;
use cairn_tests::harness::StoreSize;
use cairn_tests::shim::python;
use cairn_tests::TestStore;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn store(nvm: &'static str) -> TestStore {
    TestStore::with_size(StoreSize {
        nvm,
        log: "8M",
        clients: 4,
        inodes: Some(4096),
        tiers: None,
    })
}

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn superpages(fs: &cairn::Fs) -> SuperpageStatus {
    *fs.status()
        .unwrap()
        .superpages
        .expect("a daemon with superpages")
}

/// Wait until `ok` holds for the superpage status (the background pass runs every
/// 100 ms).
fn wait_for(fs: &cairn::Fs, what: &str, ok: impl Fn(&SuperpageStatus) -> bool) -> SuperpageStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = superpages(fs);
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Write `data` to `path` in appends of `piece` bytes, each digested on its own (no
/// digest ever fills a 2 MiB range: the file lands in 4 KiB blocks).
fn append_in_pieces(fs: &cairn::Fs, path: &str, data: &[u8], piece: usize) {
    let f = cairn::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(fs, path)
        .unwrap();
    for (k, c) in data.chunks(piece).enumerate() {
        let mut done = 0;
        while done < c.len() {
            done += f.write_at(&c[done..], (k * piece + done) as u64).unwrap();
        }
        fs.digest().unwrap();
    }
}

/// Kibibytes of this process's mappings of the NVM file that are PMD-mapped.
fn nvm_pmd_kib(nvm: &std::path::Path) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let name = nvm.to_string_lossy();
    let mut total = 0;
    let mut mine = false;
    for l in smaps.lines() {
        let head = l.split_whitespace().next().unwrap_or("");
        if head.contains('-') && head.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            mine = l.ends_with(name.as_ref());
            continue;
        }
        if mine {
            if let Some(v) = l.strip_prefix("ShmemPmdMapped:") {
                total += v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
    }
    total
}

#[test]
fn promoted_files_are_pmd_mapped_and_small_files_cost_4k() {
    let store = store("256M");
    let fs = store.fs();
    let before = superpages(&fs);
    assert!(before.enabled, "{before:?}");
    // Filled by one write: placed in extents at its digest. Grown by 64 KiB appends:
    // 4 KiB blocks, promoted in the background.
    let big = content(1, 8 * MIB);
    fs.write("/big", &big).unwrap();
    fs.digest().unwrap();
    let grown = content(2, 6 * MIB + 12345);
    append_in_pieces(&fs, "/grown", &grown, 64 << 10);
    let s = wait_for(&fs, "promotion of /grown", |s| {
        s.promotions >= 3 && s.candidates == 0 && s.extent_bytes >= 14 * MIB as u64
    });
    assert_eq!(s.extent_bytes, 14 * MIB as u64, "{s:?}");
    assert_eq!(fs.read("/big").unwrap(), big);
    assert_eq!(fs.read("/grown").unwrap(), grown);
    // 200 files of 4 KiB cost one 4 KiB block each (a one-block map is direct: no map
    // node), plus directory buckets: about 800 KiB, not 400 MB (a 2 MiB page each, as on
    // a `huge=always` tmpfs).
    let used = |fs: &cairn::Fs| fs.status().unwrap().tiers[0].used_bytes;
    let u0 = used(&fs);
    for i in 0..200 {
        fs.write(format!("/small{i}"), content(100 + i, 4096))
            .unwrap();
    }
    fs.digest().unwrap();
    let cost = used(&fs) - u0;
    assert!(
        (800 << 10..=900 << 10).contains(&cost),
        "200 files of 4 KiB cost {cost} bytes"
    );
    if !s.huge_pages {
        eprintln!(
            "huge pages refused ({:?}): PMD checks skipped",
            s.huge_pages_refusal
        );
        return;
    }
    // Let the pass collapse the extents placed at the last digests.
    std::thread::sleep(Duration::from_millis(300));
    let collapses = cairn_media::huge::vmstat("thp_collapse_alloc").unwrap_or(0);
    assert!(collapses > 0, "no collapse ever happened on this machine");
    // LibFS's mapping of the shared area: reading the files maps their extents with
    // PMDs.
    fs.read("/big").unwrap();
    fs.read("/grown").unwrap();
    let nvm = store.path().join("cairn.toml");
    let cfg = std::fs::read_to_string(nvm).unwrap();
    let nvm_path = cfg
        .lines()
        .find_map(|l| l.strip_prefix("nvm_path = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let pmd = nvm_pmd_kib(std::path::Path::new(&nvm_path));
    assert!(
        pmd >= 14 * 1024,
        "LibFS maps {pmd} KiB of the NVM tier with PMDs"
    );
    // `File::map`: the extents in place at 2 MiB-aligned addresses, PMD-mapped.
    let f = cairn::OpenOptions::new()
        .read(true)
        .open(&fs, "/grown")
        .unwrap();
    let m = f.map(0, grown.len()).unwrap();
    assert_eq!(
        m.mapped_in_place(),
        6 * MIB + 12288,
        "all but the last partial page"
    );
    let mut b = vec![0u8; grown.len()];
    m.read(0, &mut b).unwrap();
    assert!(b == grown, "the view differs from the file");
    let at = m.as_ptr() as usize;
    let pmd = pmd_mapped_kib(0, at, at + 6 * MIB).unwrap();
    assert_eq!(pmd, 6 * 1024, "File::map of a promoted file");
    let small = cairn::OpenOptions::new()
        .read(true)
        .open(&fs, "/small7")
        .unwrap();
    let sm = small.map(0, 4096).unwrap();
    let at = sm.as_ptr() as usize;
    assert_eq!(pmd_mapped_kib(0, at, at + 4096).unwrap(), 0, "a small file");
    drop((m, sm));
    // Through the shim: a private mapping of the file (Python's mmap, ACCESS_COPY).
    let out = python(
        &store,
        &format!(
            r#"import ctypes, mmap, os
fd = os.open('/cairn/big', os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
s = sum(m[i] for i in range(0, len(m), 4096))
a = ctypes.addressof(ctypes.c_char.from_buffer(m))
kb = 0
lo = hi = None
for l in open('/proc/self/smaps'):
    f = l.split()
    if '-' in f[0] and len(f) > 1 and f[1][0] in 'r-':
        lo, hi = (int(x, 16) for x in f[0].split('-'))
    elif f[0] == 'ShmemPmdMapped:' and lo is not None and lo < a + len(m) and hi > a:
        kb += int(f[1])
print(kb, a % {HUGE_PAGE}, s)
"#
        ),
    );
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let want: u64 = big.iter().step_by(4096).map(|&x| x as u64).sum();
    assert_eq!(v[2], want, "the shim's mapping reads the file");
    assert_eq!(v[1], 0, "the shim placed the mapping 2 MiB aligned");
    assert_eq!(v[0], 8 * 1024, "the shim's mapping of a file in extents");
}

#[test]
fn internal_fragmentation_stays_below_one_percent_on_mixed_sizes() {
    let store = store("512M");
    let fs = store.fs();
    // Sizes from 1 KiB to 24 MiB, log-uniform, some written whole and some appended.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut total = 0usize;
    for i in 0..60 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = (1024f64 * (24.0f64 * 1024.0).powf((x % 1000) as f64 / 1000.0)) as usize;
        total += size;
        let data = content(i, size);
        if i % 3 == 0 {
            append_in_pieces(&fs, &format!("/m{i}"), &data, 256 << 10);
        } else {
            fs.write(format!("/m{i}"), &data).unwrap();
        }
    }
    fs.digest().unwrap();
    let s = wait_for(&fs, "promotions", |s| s.candidates == 0);
    assert!(
        s.extent_bytes > (total as u64) / 2,
        "most data in extents: {s:?} of {total}"
    );
    assert!(
        s.internal_fragmentation < 0.01,
        "internal fragmentation {:.3}% ({s:?})",
        s.internal_fragmentation * 100.0
    );
    eprintln!(
        "{} MiB in files, {} MiB in extents, internal fragmentation {:.3}%",
        total >> 20,
        s.extent_bytes >> 20,
        s.internal_fragmentation * 100.0
    );
}

#[test]
fn killing_the_daemon_during_promotion_and_demotion_loses_nothing() {
    let store = store("256M");
    // Slow promotion (8 MiB/s) so that kills land in the middle of it.
    store.set_config("superpage_rate_mib", "8");
    store.stop();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut promoted = 0;
    for round in 0..12u64 {
        let fs = store.fs();
        // A file grown in pieces (promotion candidate) and one with holes punched into
        // its extents (demotion candidate).
        let name = format!("/g{round}");
        let data = content(round, 4 * MIB + next(MIB as u64) as usize);
        append_in_pieces(&fs, &name, &data, 128 << 10);
        files.push((name, data));
        let name = format!("/p{round}");
        let mut data = content(1000 + round, 4 * MIB);
        fs.write(&name, &data).unwrap();
        let f = cairn::OpenOptions::new()
            .write(true)
            .open(&fs, name.as_str())
            .unwrap();
        let (off, len) = (HUGE_PAGE + 4096 * next(16) as usize, 400 * 4096);
        f.punch_hole(off as u64, len as u64).unwrap();
        data[off..off + len].fill(0);
        fs.digest().unwrap();
        files.push((name, data));
        drop(f);
        // Kill at a random point of the background work.
        std::thread::sleep(Duration::from_millis(next(400)));
        promoted = superpages(&fs).promotions;
        drop(fs);
        store.kill_daemon();
        let fs = store.fs();
        for (n, d) in &files {
            assert!(fs.read(n).unwrap() == *d, "round {round}: {n} differs");
        }
    }
    let fs = store.fs();
    let s = wait_for(&fs, "the last promotions", |s| s.candidates == 0);
    assert!(s.promotions > 0 && promoted > 0, "{s:?}");
    assert!(s.demotions > 0, "{s:?}");
    for (n, d) in &files {
        assert!(fs.read(n).unwrap() == *d, "{n} differs at the end");
    }
    drop(fs);
    store.fsck_clean();
}

#[test]
fn killing_the_daemon_during_compaction_loses_nothing() {
    let store = store("64M");
    store.set_config("superpage_rate_mib", "16");
    store.stop();
    let fs = store.fs();
    // Small files until no extent is free, then every other one goes: free space in
    // every chunk, no free extent.
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut i = 0u64;
    while superpages(&fs).extents_free > 0 {
        let name = format!("/s{i}");
        let data = content(i, 48 << 10);
        fs.write(&name, &data).unwrap();
        fs.digest().unwrap();
        files.push((name, data));
        i += 1;
    }
    let mut kept = Vec::new();
    for (k, f) in files.into_iter().enumerate() {
        if k % 2 == 1 {
            fs.remove_file(&f.0).unwrap();
        } else {
            kept.push(f);
        }
    }
    fs.digest().unwrap();
    let s = superpages(&fs);
    assert_eq!((s.extents_free, s.extent_bytes), (0, 0), "{s:?}");
    // Ranges filled in 4 KiB blocks want extents: compaction makes them.
    let big = content(7, 4 * MIB);
    append_in_pieces(&fs, "/big", &big, 64 << 10);
    kept.push(("/big".into(), big));
    drop(fs);
    let mut rng = 0x1234_5678_9abc_def1u64;
    for round in 0..8 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(rng % 300));
        store.kill_daemon();
        let fs = store.fs();
        for (n, d) in &kept {
            assert!(fs.read(n).unwrap() == *d, "round {round}: {n} differs");
        }
    }
    // No extent was free and no file went since: every extent in use or free now was
    // made by compaction. (Its counter may miss a round a kill cut short: the files
    // it switched stay switched, the count is written when the round ends.)
    let fs = store.fs();
    let s = wait_for(&fs, "compaction and promotion", |s| {
        s.extent_bytes >= 4 * MIB as u64
    });
    eprintln!("{s:?}");
    for (n, d) in &kept {
        assert!(fs.read(n).unwrap() == *d, "{n} differs at the end");
    }
    drop(fs);
    store.fsck_clean();
}

/// A store whose NVM file is on a tmpfs mounted `huge=within_size`, in a private mount
/// namespace (`unshare -m`: no system-wide change): extents and 4 KiB files work as on
/// `/dev/shm`, and a program's mapping of a file in extents is PMD-mapped.
#[test]
fn a_store_on_a_private_huge_tmpfs_works() {
    let ok = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("no private mount namespace here (unshare -m): skipped");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("cairn-test-")
        .tempdir()
        .unwrap();
    let mnt = dir.path().join("huge");
    std::fs::create_dir(&mnt).unwrap();
    let store = dir.path().join("store");
    let cairn = cairn_tests::harness::cairn_bin();
    let prog = dir.path().join("map.py");
    std::fs::write(
        &prog,
        r#"import mmap, os, ctypes
fd = os.open('/cairn/big', os.O_RDONLY)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
s = sum(m[i] for i in range(0, len(m), 4096))
a = ctypes.addressof(ctypes.c_char.from_buffer(m))
kb = 0
lo = None
for l in open('/proc/self/smaps'):
    f = l.split()
    if '-' in f[0] and len(f) > 1 and f[1][0] in 'r-':
        lo, hi = (int(x, 16) for x in f[0].split('-'))
    elif f[0] == 'ShmemPmdMapped:' and lo is not None and lo < a + len(m) and hi > a:
        kb += int(f[1])
print('pmd', kb)
"#,
    )
    .unwrap();
    let script = format!(
        r#"set -e
mount -t tmpfs -o huge=within_size,size=256M cairn-huge '{mnt}'
C='{cairn}'
trap '"$C" --store "{store}" stop >/dev/null 2>&1' EXIT
"$C" mkfs --store '{store}' --nvm-size 128M --log-size 8M --nvm-path '{mnt}/x.nvm' >/dev/null
head -c 8388608 /dev/urandom > '{dir}/big'
"$C" --store '{store}' put '{dir}/big' /big
for i in 1 2 3; do echo small$i | "$C" --store '{store}' put - /small$i; done
"$C" --store '{store}' cat /big | cmp - '{dir}/big'
sleep 1
"$C" --store '{store}' run -- python3 '{prog}'
"$C" --store '{store}' status --json
"#,
        mnt = mnt.display(),
        cairn = cairn.display(),
        store = store.display(),
        dir = dir.path().display(),
        prog = prog.display(),
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pmd: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pmd "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let json = &stdout[stdout.find('{').unwrap()..];
    let r: cairn_proto::StatusReport = serde_json::from_str(json).unwrap();
    let s = r.superpages.unwrap();
    assert_eq!(s.extent_bytes, 8 * MIB as u64, "{s:?}");
    assert_eq!(pmd, 8 * 1024, "the mapping of /big on a huge tmpfs");
}
