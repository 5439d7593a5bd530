//! A store several processes open at once (`Store::open_shared`): they see each other's
//! writes as they happen, a process killed at any point loses nothing acknowledged and
//! holds the others back in nothing, and the store recovers to the same state.

use cairn_kv::{KvError, Options, Store, UpdatePolicy};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::{check_value, get, kill9, value_of, PoolFile, Rng};

/// A small pool: the writes below go through it several times, so compaction runs in
/// every process.
const POOL: u64 = 24 << 20;

fn opts() -> Options {
    Options {
        size: POOL,
        expected_keys: Some(20_000),
        ..Options::default()
    }
}

fn open_shared(p: &Path) -> Store {
    Store::open_shared(p, &opts()).unwrap()
}

/// The region file of the pool at `p` (see docs/KV.md).
fn region_of(p: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).unwrap();
    PathBuf::from(format!(
        "/dev/shm/cairn-kv-{:x}-{:x}.region",
        m.dev(),
        m.ino()
    ))
}

/// This test binary again, running `test` in the role `role` (an environment variable
/// the test looks at first).
fn child(test: &str, role: &str, pool: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("CAIRN_KV_ROLE", role)
        .env("CAIRN_KV_POOL", pool)
        .stdout(std::process::Stdio::piped());
    c
}

/// The role this process runs in, and the pool: `None` in the test's own process.
fn role() -> Option<(String, PathBuf)> {
    let r = std::env::var("CAIRN_KV_ROLE").ok()?;
    Some((r, std::env::var_os("CAIRN_KV_POOL")?.into()))
}

/// Read a child's output `out` until a line ends with `word` (the test harness prints
/// its own words first, on the same line too).
fn await_line(out: &mut impl std::io::BufRead, word: &str) {
    let mut line = String::new();
    while !line.trim_end().ends_with(word) {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended before it said {word}"
        );
    }
}

/// Abort the process if `f` does not return within `limit` (a store that a killed
/// process left locked would hang the test instead of failing it).
fn within<R>(limit: Duration, what: &str, f: impl FnOnce() -> R) -> R {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let what = what.to_string();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(limit).is_err() {
            eprintln!("{what}: not done after {limit:?}");
            std::process::abort();
        }
    });
    let r = f();
    let _ = tx.send(());
    let _ = watchdog.join();
    r
}

/// Writer `w`'s key `k`.
fn key(w: u64, k: u64) -> u64 {
    w << 32 | k
}

const KEYS: u64 = 1500;
const ROUNDS: u64 = 8;

/// What writer `w` of `processes_share_one_store` does: round after round over its keys,
/// a put of version `round` (a value of about 1 KiB) or, for one key in five, a
/// deletion.
fn write_rounds(s: &Store, w: u64) {
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let kb = key(w, k).to_le_bytes();
            if (k + round).is_multiple_of(5) {
                s.delete(&kb).unwrap();
            } else {
                s.put(&kb, &value_of(key(w, k), round, 600 + (k as usize % 800)))
                    .unwrap();
            }
        }
    }
}

/// Check that writer `w`'s keys hold what its last round left.
fn check_rounds(s: &Store, w: u64) {
    for k in 0..KEYS {
        let got = get(s, &key(w, k).to_le_bytes()).map(|v| check_value(key(w, k), &v));
        let want = (!(k + ROUNDS - 1).is_multiple_of(5)).then_some(ROUNDS - 1);
        assert_eq!(got, want, "writer {w}, key {k}");
    }
}

/// Three processes write their own keys through one store while each reads the
/// others': every value read is whole, and when they are done each sees what the
/// others wrote. The last to close removes the region; a store opened on its own
/// afterwards (a recovery) holds the same.
#[test]
fn processes_share_one_store() {
    if let Some((role, pool)) = role() {
        let w: u64 = role.parse().unwrap();
        let s = open_shared(&pool);
        write_rounds(&s, w);
        check_rounds(&s, w);
        println!("done {w}");
        return;
    }
    let pf = PoolFile::new("shared-three");
    let s = open_shared(&pf.0);
    let region = region_of(&pf.0);
    assert!(region.exists());
    let children: Vec<_> = (1..=2)
        .map(|w| {
            child("processes_share_one_store", &w.to_string(), &pf.0)
                .spawn()
                .unwrap()
        })
        .collect();
    // This process writes too, and reads the others' keys as they change.
    let mut seen = 0;
    within(Duration::from_secs(120), "three writers", || {
        write_rounds(&s, 0);
        for w in 1..=2 {
            for k in 0..KEYS {
                if let Some(v) = get(&s, &key(w, k).to_le_bytes()) {
                    check_value(key(w, k), &v);
                    seen += 1;
                }
            }
        }
    });
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "a writer failed: {:?}", out.status);
    }
    assert!(seen > 0, "no value of the others was seen");
    for w in 0..=2 {
        check_rounds(&s, w);
    }
    let st = s.stats();
    assert!(st.shared && st.compacted_segments > 0, "{st:?}");
    assert_eq!(st.keys, 3 * KEYS * 4 / 5, "{st:?}");
    drop(s);
    assert!(!region.exists(), "the last process left its region behind");
    // On its own, recovered from the pool.
    let s = Store::open(&pf.0, &opts()).unwrap();
    for w in 0..=2 {
        check_rounds(&s, w);
    }
    assert_eq!(s.len(), 3 * KEYS * 4 / 5);
}

/// The operations of a worker of `killed_processes_lose_nothing_acknowledged`, from its
/// seed: (key, deletion, value length); the parent replays them to know which call was
/// in flight when it killed the worker.
fn ops(slot: u64, seed: u64) -> impl Iterator<Item = (u64, bool, usize)> {
    let mut rng = Rng(seed);
    std::iter::from_fn(move || {
        let k = key(slot + 1, rng.next() % 300);
        let delete = rng.next().is_multiple_of(6);
        Some((k, delete, 20 + (rng.next() % 3000) as usize))
    })
}

/// A worker: puts and deletes on its slot's keys, each printed once it returned (with
/// whether it was done or refused).
fn worker(pool: &Path, slot: u64, seed: u64, base: u64) {
    let s = open_shared(pool);
    let mut out = std::io::stdout().lock();
    for (i, (k, delete, len)) in ops(slot, seed).enumerate() {
        let version = base + i as u64;
        let done = if delete {
            s.delete(&k.to_le_bytes()).map(|_| ())
        } else {
            s.put(&k.to_le_bytes(), &value_of(k, version, len))
        };
        match done {
            Ok(()) => writeln!(out, "{i} ok").unwrap(),
            // A full pool refuses (nothing written).
            Err(KvError::Full) => writeln!(out, "{i} full").unwrap(),
            Err(e) => panic!("{e}"),
        }
        out.flush().unwrap();
    }
}

/// What a key may hold: its last acknowledged state, and, when the call in flight at a
/// kill was on it, that call's too (a put whose record is durable but not yet in the
/// index is found by the next recovery).
#[derive(Clone, Debug, Default)]
struct Allowed(Vec<Option<u64>>);

/// Workers on two slots of keys, killed with SIGKILL at random points round after
/// round (with a bucket lock, the free list's lock, a compaction round or log heads in
/// their hands, as it happens): every key holds its last acknowledged state (or the
/// call in flight's), the store goes on serving this process after each kill, what the
/// dead held is reaped, and a recovery finds the same.
#[test]
fn killed_processes_lose_nothing_acknowledged() {
    if let Some((role, pool)) = role() {
        let f: Vec<u64> = role.split(',').map(|x| x.parse().unwrap()).collect();
        worker(&pool, f[0], f[1], f[2]);
        return;
    }
    let pf = PoolFile::new("shared-kill");
    let s = open_shared(&pf.0);
    let mut allowed: HashMap<u64, Allowed> = HashMap::new();
    let mut rng = Rng(7);
    for round in 0..6u64 {
        let workers: Vec<_> = (0..2u64)
            .map(|slot| {
                let (seed, base) = (rng.next() | 1, (round * 2 + slot + 1) * 1_000_000_000);
                let role = format!("{slot},{seed},{base}");
                let c = child("killed_processes_lose_nothing_acknowledged", &role, &pf.0)
                    .spawn()
                    .unwrap();
                (slot, seed, base, c)
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200 + rng.next() % 300));
        for (slot, seed, base, c) in workers {
            kill9(c.id());
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let refused: std::collections::HashSet<u64> = text
                .lines()
                .filter_map(|l| l.strip_suffix(" full")?.parse().ok())
                .collect();
            let acked = text
                .lines()
                .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
                .max()
                .map_or(0, |i| i + 1);
            assert!(
                acked > 0,
                "round {round}, slot {slot}: nothing acknowledged"
            );
            // Replay: the acknowledged calls, then the one in flight.
            for (i, (k, delete, _)) in ops(slot, seed).take(acked as usize + 1).enumerate() {
                let i = i as u64;
                let state = (!delete).then_some(base + i);
                let a = allowed.entry(k).or_default();
                if refused.contains(&i) {
                    continue;
                } else if i < acked {
                    *a = Allowed(vec![state]);
                } else {
                    a.0.push(state);
                }
            }
            // This process goes on (whatever the killed one held), and sees the slot's
            // keys as acknowledged.
            within(Duration::from_secs(60), "after a kill", || {
                for i in 0..300u64 {
                    let k = key(9, i);
                    s.put(&k.to_le_bytes(), &value_of(k, round, 2000)).unwrap();
                }
                check_allowed(&s, &allowed, slot);
            });
        }
    }
    within(Duration::from_secs(60), "a compaction round", || {
        s.compact(1).unwrap()
    });
    let st = s.stats();
    assert!(
        st.processes_reaped > 0,
        "no dead process was reaped: {st:?}"
    );
    // The key count is the keys there are (counted again after a writer died, which
    // may have changed the index and not the count).
    let present = allowed
        .keys()
        .filter(|&&k| get(&s, &k.to_le_bytes()).is_some())
        .count()
        + 300;
    assert_eq!(s.len() as usize, present, "{st:?}");
    drop(s);
    assert!(!region_of(&pf.0).exists());
    // A recovery, by the next process to open the store.
    let s = open_shared(&pf.0);
    for slot in 0..2 {
        check_allowed(&s, &allowed, slot);
    }
    for i in 0..300u64 {
        let v = get(&s, &key(9, i).to_le_bytes()).expect("this process's key");
        assert_eq!(check_value(key(9, i), &v), 5);
    }
}

/// Every key of `slot` holds one of the states it may.
fn check_allowed(s: &Store, allowed: &HashMap<u64, Allowed>, slot: u64) {
    for (&k, a) in allowed.iter().filter(|(&k, _)| k >> 32 == slot + 1) {
        let got = get(s, &k.to_le_bytes()).map(|v| check_value(k, &v));
        assert!(
            a.0.contains(&got),
            "key {k:x}: holds {got:?}, may hold {a:?}"
        );
    }
}

/// A pool is open either shared or by one process on its own; a shared store appends
/// updates (in place is refused).
#[test]
fn shared_and_sole_opens_exclude_each_other() {
    let pf = PoolFile::new("shared-modes");
    let s = open_shared(&pf.0);
    let again = open_shared(&pf.0);
    let kind = |r: Result<Store, KvError>| match r {
        Err(KvError::Io(e)) => e.kind(),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened"),
    };
    assert_eq!(
        kind(Store::open(&pf.0, &opts())),
        std::io::ErrorKind::WouldBlock
    );
    let in_place = Options {
        policy: UpdatePolicy::InPlace,
        ..opts()
    };
    assert_eq!(
        kind(Store::open_shared(&pf.0, &in_place)),
        std::io::ErrorKind::Unsupported
    );
    s.put(b"a", b"1").unwrap();
    assert_eq!(get(&again, b"a").as_deref(), Some(&b"1"[..]));
    drop(s);
    drop(again);
    assert!(!region_of(&pf.0).exists());
    let sole = Store::open(&pf.0, &opts()).unwrap();
    assert_eq!(get(&sole, b"a").as_deref(), Some(&b"1"[..]));
    let start = Instant::now();
    assert_eq!(
        kind(Store::open_shared(&pf.0, &opts())),
        std::io::ErrorKind::WouldBlock
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(!region_of(&pf.0).exists(), "a failed opening left a region");
    drop(sole);
}

/// A pool whose recovery takes a while (300,000 keys).
fn big() -> Options {
    Options {
        size: 256 << 20,
        expected_keys: Some(400_000),
        ..Options::default()
    }
}

/// The first process to open a pool builds the region by recovery; killed in the
/// middle of it, it leaves a region the next opener rebuilds (the pool whole), and no
/// one is admitted to a half-built one.
#[test]
fn a_first_opener_killed_while_it_recovers_leaves_nothing_half_built() {
    if let Some((role, pool)) = role() {
        assert_eq!(role, "recover");
        println!("opening");
        std::io::stdout().flush().unwrap();
        let _s = Store::open_shared(&pool, &big()).unwrap();
        println!("opened");
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let pf = PoolFile::new("shared-first-killed");
    {
        let s = Store::open(&pf.0, &big()).unwrap();
        for i in 0..300_000u64 {
            s.put(&i.to_le_bytes(), &value_of(i, 1, 40)).unwrap();
        }
    }
    let mut killed_while_opening = 0;
    for round in 0..3 {
        let mut c = child(
            "a_first_opener_killed_while_it_recovers_leaves_nothing_half_built",
            "recover",
            &pf.0,
        )
        .spawn()
        .unwrap();
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        await_line(&mut out, "opening");
        std::thread::sleep(Duration::from_millis([1, 20, 60][round]));
        kill9(c.id());
        c.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        killed_while_opening += usize::from(!rest.contains("opened"));
        let s = within(Duration::from_secs(60), "opening after a kill", || {
            Store::open_shared(&pf.0, &big()).unwrap()
        });
        assert_eq!(s.len(), 300_000, "round {round}");
        for i in (0..300_000u64).step_by(997) {
            let v = get(&s, &i.to_le_bytes()).expect("a key");
            assert_eq!(check_value(i, &v), 1);
        }
    }
    assert!(killed_while_opening > 0, "no kill landed during an opening");
    assert!(!region_of(&pf.0).exists());
}

/// A region left by processes that all died is removed at the next shared opening of
/// any pool, also when its pool was deleted meanwhile (it would stay in memory for good
/// otherwise); a region a live process uses stays, its pool deleted or not.
#[test]
fn regions_no_process_uses_are_swept() {
    if let Some((role, pool)) = role() {
        assert_eq!(role, "hold");
        let s = open_shared(&pool);
        s.put(b"k", b"v").unwrap();
        println!("open");
        std::io::stdout().flush().unwrap();
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    let (dead, alive, other) = (
        PoolFile::new("sweep-dead"),
        PoolFile::new("sweep-alive"),
        PoolFile::new("sweep-other"),
    );
    let hold = |p: &Path| {
        let mut c = child("regions_no_process_uses_are_swept", "hold", p)
            .spawn()
            .unwrap();
        await_line(
            &mut std::io::BufReader::new(c.stdout.take().unwrap()),
            "open",
        );
        c
    };
    let (mut d, mut a) = (hold(&dead.0), hold(&alive.0));
    let (rd, ra) = (region_of(&dead.0), region_of(&alive.0));
    assert!(rd.exists() && ra.exists());
    kill9(d.id());
    d.wait().unwrap();
    std::fs::remove_file(&dead.0).unwrap();
    std::fs::remove_file(&alive.0).unwrap();
    let s = open_shared(&other.0);
    assert!(!rd.exists(), "the region of processes that all died stays");
    assert!(ra.exists(), "a region in use was removed");
    kill9(a.id());
    a.wait().unwrap();
    drop(s);
    drop(open_shared(&other.0));
    assert!(!ra.exists(), "its process gone, the region stays");
}
