//! Scale: a directory with 1,000,000 entries (indexed lookup), thousands of open files,
//! and a file as large as the tier allows.

use cairn_tests::harness::StoreSize;
use cairn_tests::TestStore;
use std::time::Instant;

#[test]
fn a_million_entries_in_one_directory() {
    // Hard links keep the inode table small: the directory still holds 1,000,000 names,
    // links to one of 17 files (a file takes at most LINK_MAX = 65,000 names).
    let n: usize = std::env::var("CAIRN_SCALE_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let store = TestStore::with_size(StoreSize {
        nvm: "1G",
        log: "32M",
        clients: 2,
        inodes: Some(4096),
        tiers: None,
    });
    let fs = store.fs();
    fs.create_dir("/big").unwrap();
    const PER: usize = 60_000;
    for k in 0..n.div_ceil(PER) {
        fs.write(format!("/target{k}"), b"t").unwrap();
    }
    let t = Instant::now();
    for i in 0..n {
        fs.hard_link(format!("/target{}", i / PER), format!("/big/entry-{i:07}"))
            .unwrap();
    }
    let link_s = t.elapsed().as_secs_f64();
    fs.digest().unwrap();
    // Lookups are indexed: a few thousand random lookups take milliseconds, not a scan each.
    let t = Instant::now();
    for i in (0..n).step_by((n / 5000).max(1)) {
        assert_eq!(fs.metadata(format!("/big/entry-{i:07}")).unwrap().len(), 1);
    }
    let lookups = t.elapsed();
    assert!(fs.metadata("/big/entry-missing").is_err());
    assert_eq!(
        fs.metadata("/target0").unwrap().nlink(),
        PER.min(n) as u64 + 1
    );
    let count = fs.read_dir("/big").unwrap().count();
    assert_eq!(count, n);
    eprintln!("{n} links in {link_s:.1} s; 5000 lookups in {lookups:?}");
}

#[test]
fn thousands_of_open_files() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.create_dir("/open").unwrap();
    let files: Vec<cairn::File> = (0..5000)
        .map(|i| {
            cairn::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .open(&fs, format!("/open/{i}"))
                .unwrap()
        })
        .collect();
    for (i, f) in files.iter().enumerate() {
        f.write_at(format!("file {i}").as_bytes(), 0).unwrap();
    }
    for (i, f) in files.iter().enumerate() {
        let mut b = vec![0u8; 32];
        let n = f.read_at(&mut b, 0).unwrap();
        assert_eq!(&b[..n], format!("file {i}").as_bytes());
    }
}

#[test]
fn a_file_nearly_as_large_as_the_tier() {
    let store = TestStore::with_size(StoreSize {
        nvm: "512M",
        log: "8M",
        clients: 2,
        inodes: Some(1024),
        tiers: None,
    });
    let fs = store.fs();
    let st = fs.status().unwrap();
    let free = st.tiers[0].capacity_bytes - st.tiers[0].used_bytes;
    // 90% of the free space in 1 MiB writes, then read it all back.
    let total = (free / 10 * 9) & !((1 << 20) - 1);
    let f = cairn::File::create(&fs, "/huge").unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for (i, off) in (0..total).step_by(1 << 20).enumerate() {
        buf.fill(i as u8);
        f.write_at(&buf, off).unwrap();
    }
    drop(f);
    drop(fs);
    let fs = store.fs();
    let f = cairn::File::open(&fs, "/huge").unwrap();
    assert_eq!(f.metadata().unwrap().len(), total);
    for (i, off) in (0..total).step_by(1 << 20).enumerate() {
        f.read_at(&mut buf, off).unwrap();
        assert!(buf.iter().all(|&b| b == i as u8), "block at {off}");
    }
}
