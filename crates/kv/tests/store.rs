//! The store against a model, across reopenings (recovery), under concurrency, and
//! across a process killed in the middle of its writes.

use cairn_kv::{KvError, Options, Store};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A pool file in /dev/shm, removed at drop.
struct PoolFile(PathBuf);

impl PoolFile {
    fn new(tag: &str) -> PoolFile {
        PoolFile(PathBuf::from(format!(
            "/dev/shm/cairn-kv-test-{tag}-{}.pool",
            std::process::id()
        )))
    }
}

impl Drop for PoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open(p: &Path, size: u64) -> Store {
    Store::open(
        p,
        &Options {
            size,
            ..Options::default()
        },
    )
    .unwrap()
}

fn get(s: &Store, k: &[u8]) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    s.get(k, &mut v).unwrap().map(|_| v)
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn operations_match_a_model_across_reopenings() {
    let pf = PoolFile::new("model");
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut rng = Rng(0x1234_5678);
    for round in 0..4 {
        let s = open(&pf.0, 64 << 20);
        assert_eq!(
            s.len(),
            model.len() as u64,
            "round {round}: keys after recovery"
        );
        for (k, v) in &model {
            assert_eq!(get(&s, k).as_ref(), Some(v), "round {round}");
        }
        for _ in 0..3000 {
            let k = format!("key-{}", rng.next() % 500).into_bytes();
            match rng.next() % 10 {
                0..=5 => {
                    let len = (rng.next() % 3000) as usize;
                    let v: Vec<u8> = (0..len).map(|i| (i as u64 ^ rng.0) as u8).collect();
                    s.put(&k, &v).unwrap();
                    model.insert(k, v);
                }
                6 | 7 => {
                    let was = s.delete(&k).unwrap();
                    assert_eq!(was, model.remove(&k).is_some());
                }
                _ => {
                    assert_eq!(get(&s, &k), model.get(&k).cloned());
                    assert_eq!(s.contains(&k).unwrap(), model.contains_key(&k));
                }
            }
        }
        assert_eq!(s.len(), model.len() as u64);
        let st = s.stats();
        assert!(st.live_bytes <= st.used_bytes && st.used_bytes <= st.pool_bytes);
    }
}

#[test]
fn bad_sizes_and_a_full_pool_are_errors() {
    let pf = PoolFile::new("full");
    // One log head: with a head per CPU, a thread that moves between CPUs opens a
    // segment in each, and heads are never compacted (a pool of three data segments
    // then has nothing to compact).
    let s = Store::open(
        &pf.0,
        &Options {
            size: 8 << 20,
            heads: Some(1),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(matches!(s.put(b"", b"x"), Err(KvError::TooBig(_))));
    assert!(matches!(
        s.put(&vec![1u8; 70_000], b"x"),
        Err(KvError::TooBig(_))
    ));
    assert!(matches!(
        s.put(b"k", &vec![0u8; 3 << 20]),
        Err(KvError::TooBig(_))
    ));
    // Three data segments of 2 MiB, one of them kept for compaction: 1 MiB values fill
    // two (nothing is dead, so compaction frees nothing).
    let v = vec![7u8; 1 << 20];
    let mut n = 0;
    let err = loop {
        match s.put(format!("k{n}").as_bytes(), &v) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, KvError::Full), "{err}");
    assert_eq!(n, 2);
    assert_eq!(get(&s, b"k1").unwrap(), v, "what was stored stays");
    // Deleting makes room again (a tombstone, then compaction of the dead value).
    assert!(s.delete(b"k0").unwrap());
    s.put(b"again", &v).unwrap();
    assert_eq!(get(&s, b"again").unwrap(), v);
}

#[test]
fn a_torn_record_ends_its_segment_at_recovery() {
    let pf = PoolFile::new("torn");
    {
        let s = open(&pf.0, 16 << 20);
        s.put(b"a", b"first").unwrap();
        s.put(b"b", b"second").unwrap();
    }
    // Tear the last record (b's) in the middle of its value.
    let data = std::fs::read(&pf.0).unwrap();
    let at = data
        .windows(6)
        .rposition(|w| w == b"second")
        .expect("b's value in the pool");
    let f = std::fs::OpenOptions::new().write(true).open(&pf.0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"XX", at as u64 + 2).unwrap();
    let s = open(&pf.0, 16 << 20);
    assert_eq!(get(&s, b"a").unwrap(), b"first");
    assert_eq!(get(&s, b"b"), None, "a torn record does not count");
    assert_eq!(s.len(), 1);
}

/// A value that names its key and version and carries a checksum: a reader can tell a
/// value that was written from anything else.
fn value_of(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(20));
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    let mut x = key ^ version.rotate_left(17) | 1;
    while v.len() < len.max(20) - 4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    let c = crc32c::crc32c(&v);
    v.extend_from_slice(&c.to_le_bytes());
    v
}

fn check_value(key: u64, v: &[u8]) -> u64 {
    let n = v.len();
    assert!(n >= 20, "value of key {key} too short");
    let c = u32::from_le_bytes(v[n - 4..].try_into().unwrap());
    assert_eq!(
        crc32c::crc32c(&v[..n - 4]),
        c,
        "key {key}: a torn or foreign value"
    );
    assert_eq!(u64::from_le_bytes(v[..8].try_into().unwrap()), key);
    u64::from_le_bytes(v[8..16].try_into().unwrap())
}

#[test]
fn concurrent_writers_and_readers_never_see_a_torn_value() {
    concurrent(256 << 20, 200, 2000, 20_000);
}

/// The same in a pool where compaction runs all along: 2,000 keys of 3–4 KiB (about
/// 7 MiB live) in 30 MiB of data segments (a head per CPU, compaction's own head and
/// the reserve take four of them).
#[test]
fn concurrent_writers_readers_and_compaction_never_see_a_torn_value() {
    concurrent(32 << 20, 2000, 4000, 15_000);
}

fn concurrent(pool: u64, keys: u64, max_len: u64, ops: u64) {
    let pf = PoolFile::new(&format!("conc-{pool}"));
    let s = Arc::new(open(&pf.0, pool));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(t + 1);
                for version in 1..ops {
                    let key = rng.next() % keys;
                    if rng.next().is_multiple_of(8) {
                        s.delete(&key.to_le_bytes()).unwrap();
                    } else {
                        let len = (max_len - 1000 + rng.next() % 1000) as usize;
                        if let Err(e) = s.put(&key.to_le_bytes(), &value_of(key, version, len)) {
                            panic!("{e}: {:?}", s.stats());
                        }
                    }
                }
            })
        })
        .collect();
    let reader = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for key in 0..keys {
                    if let Some(v) = get(&s, &key.to_le_bytes()) {
                        check_value(key, &v);
                        n += 1;
                    }
                }
            }
            n
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    // The index and the log agree after recovery too.
    let present = s.len();
    let st = s.stats();
    drop(s);
    let s = open(&pf.0, pool);
    assert_eq!(s.len(), present);
    if pool < 64 << 20 {
        assert!(st.compacted_segments > 0, "{st:?}");
    }
    for key in 0..keys {
        if let Some(v) = get(&s, &key.to_le_bytes()) {
            check_value(key, &v);
        }
    }
}

/// The worker of `acknowledged_writes_survive_kill_9`: puts and deletes, printing each
/// once it returned; versions from `CAIRN_KV_BASE` on.
fn worker(pool: &Path) {
    use std::io::Write;
    let base: u64 = std::env::var("CAIRN_KV_BASE").unwrap().parse().unwrap();
    let s = open(pool, 64 << 20);
    let mut out = std::io::stdout().lock();
    let mut rng = Rng(std::process::id() as u64);
    for version in base.. {
        let key = rng.next() % 300;
        if rng.next().is_multiple_of(6) {
            s.delete(&key.to_le_bytes()).unwrap();
            writeln!(out, "D {key} {version}").unwrap();
        } else {
            let len = 20 + (rng.next() % 4000) as usize;
            s.put(&key.to_le_bytes(), &value_of(key, version, len))
                .unwrap();
            writeln!(out, "P {key} {version}").unwrap();
        }
        out.flush().unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    if let Some(p) = std::env::var_os("CAIRN_KV_WORKER") {
        worker(Path::new(&p));
        return;
    }
    let pf = PoolFile::new("kill");
    // What each key must hold: the last acknowledged operation (a put's version, or a
    // deletion), over several workers killed in turn.
    let mut last: HashMap<u64, Option<u64>> = HashMap::new();
    for round in 0..5u64 {
        let base = (round + 1) * 1_000_000_000;
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "acknowledged_writes_survive_kill_9",
                "--nocapture",
            ])
            .env("CAIRN_KV_WORKER", &pf.0)
            .env("CAIRN_KV_BASE", base.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(150 + 50 * round));
        kill9(child.id());
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut acked = 0;
        let mut newest = base - 1;
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 3 || !(f[0] == "P" || f[0] == "D") {
                continue;
            }
            let (key, version): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
            last.insert(key, (f[0] == "P").then_some(version));
            newest = version;
            acked += 1;
        }
        assert!(acked > 0, "round {round}: the worker acknowledged nothing");
        // Every key holds its acknowledged state, but for one key: the call in flight
        // at the kill (version `newest + 1`) may have happened, whole.
        let s = open(&pf.0, 64 << 20);
        let mut in_flight = Vec::new();
        for key in 0..300u64 {
            let want = last.get(&key).copied().flatten();
            let got = get(&s, &key.to_le_bytes()).map(|v| check_value(key, &v));
            if got != want {
                in_flight.push((key, want, got));
            }
        }
        assert!(in_flight.len() <= 1, "round {round}: {in_flight:?}");
        if let Some(&(key, _, got)) = in_flight.first() {
            assert!(
                got.is_none_or(|g| g == newest + 1),
                "round {round}: key {key} holds {got:?}, not the call in flight"
            );
            last.insert(key, got);
        }
        assert_eq!(
            s.len(),
            last.values().filter(|v| v.is_some()).count() as u64
        );
    }
}

/// SIGKILL `pid` (through `kill(1)`: no `unsafe` in this crate).
fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

#[test]
fn churn_far_beyond_the_pool_is_compacted_and_recovers() {
    let pf = PoolFile::new("churn");
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = Rng(99);
    {
        // 15 data segments (30 MiB); about 20 MiB live at the end: compaction works at
        // up to two thirds of the pool, and 200 MiB go through it.
        let s = open(&pf.0, 32 << 20);
        for version in 1..50_000u64 {
            let key = rng.next() % 5_000;
            if rng.next().is_multiple_of(10) {
                s.delete(&key.to_le_bytes()).unwrap();
                model.remove(&key);
            } else {
                let v = value_of(key, version, 4000);
                s.put(&key.to_le_bytes(), &v).unwrap();
                model.insert(key, v);
            }
        }
        let st = s.stats();
        assert!(st.compacted_segments > 10, "{st:?}");
        assert_eq!(s.len(), model.len() as u64);
        for (k, v) in &model {
            assert_eq!(get(&s, &k.to_le_bytes()).as_ref(), Some(v));
        }
    }
    // After recovery (compacted copies, tombstones kept or dropped), the same.
    let s = open(&pf.0, 32 << 20);
    assert_eq!(s.len(), model.len() as u64);
    for key in 0..5_000u64 {
        assert_eq!(
            get(&s, &key.to_le_bytes()),
            model.get(&key).cloned(),
            "key {key}"
        );
    }
}

/// A thread compacting all along (`Store::compact`) while two threads write and read.
#[test]
fn compaction_racing_writers_and_readers() {
    let pf = PoolFile::new("race");
    let s = Arc::new(open(&pf.0, 32 << 20));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let c = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                s.compact(2).unwrap();
            }
        })
    };
    let ws: Vec<_> = (0..2u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(77 + t);
                for version in 1..15_000u64 {
                    let key = rng.next() % 1000;
                    if rng.next().is_multiple_of(8) {
                        s.delete(&key.to_le_bytes()).unwrap();
                    } else {
                        s.put(&key.to_le_bytes(), &value_of(key, version, 3000))
                            .unwrap();
                    }
                    if version.is_multiple_of(7) {
                        let _ = get(&s, &(key ^ 1).to_le_bytes());
                    }
                }
            })
        })
        .collect();
    for w in ws {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    c.join().unwrap();
    let _ = s.stats();
}
