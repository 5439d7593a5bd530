//! The system tests' worker process. Default mode (crash tests): run the deterministic
//! operation sequence `gen_ops(seed, n, prefix)` on a Cairn store and print `ACK <i>` after
//! operation `i` returned (so the harness knows which operations were acknowledged when
//! it kills this process). Other modes serve the reclamation, load and multi-process
//! tests and debugging (see the usage).
//!
//! Usage: cairn-test-worker STORE SEED N PREFIX   (marks each call's start and end in the
//!        persistence trace when `CAIRN_PM_TRACE` is set; `CAIRN_WORKER_DIGEST_EVERY=K`
//!        asks for a digest after every K calls; `CAIRN_WORKER_RANGE=FROM:TO` runs only
//!        calls FROM..TO; `CAIRN_WORKER_HOLD=1` stays, after DONE, until stdin closes;
//!        `CAIRN_WORKER_MIGRATE_EVERY=K` moves data NVM → SSD after every K calls, and
//!        SSD → HDD after every 2K; `CAIRN_WORKER_CLEAN=1` adds a cleaning round on the
//!        SSD and the HDD after each migration; `CAIRN_WORKER_MAPPED=1` adds stores
//!        through shared mappings to the sequence: `Extras::mapped`;
//!        `CAIRN_WORKER_STEP=1` prints READY, then runs the calls whose indices stdin
//!        gives, one per line, acknowledging each, and at EOF prints `SHARING <mode
//!        entries> <commits>`: workers taking turns on one sequence)
//!        cairn-test-worker --pin-epoch STORE   (register, publish the current epoch as
//!        this client's reader epoch, print PINNED and sleep: a reader stuck mid-read)
//!        cairn-test-worker --load STORE ID N   (N operations: private ones under /p<ID>,
//!        and every 5th one shared: an O_APPEND record to /shared/log and a new entry in
//!        /shared/d; exits non-zero on any unexpected error)
//!        cairn-test-worker --churn STORE ID N   (N steps under /c/<ID>, each printed as
//!        `ACK <i>` once it returned: step i creates f<i> holding `<ID>:<i>`; every 4th
//!        renames it to r<i> as well; every 4th after that adds one to the 8-byte counter
//!        /shared/counter under a POSIX write lock instead; each step reads the previous
//!        one's file back; `DONE` at the end, exit 1 on any error)
//!        cairn-test-worker --mp STORE ID N SEED   (N operations on the shared directory
//!        /s: appends of unique records to /s/f0 and /s/f1, creates and removes of this
//!        worker's own entries in /s/d, whole-file reads and listings; prints one line per
//!        operation: `ID SEQ KIND TARGET START_NS END_NS RESULT`)
//!        cairn-test-worker --trace HOSTDIR SEED N PREFIX   (replay on a host directory,
//!        printing every operation and its outcome: for debugging a failed run;
//!        `CAIRN_WORKER_MAPPED` as above)

use cairn_tests::{apply, gen_ops, gen_ops_with, CairnFs, Extras};

/// The sequence of the crash and power-failure tests: `gen_ops_with` with the extras
/// `CAIRN_WORKER_MAPPED` asks for.
fn sequence(seed: u64, n: usize, prefix: &str) -> Vec<cairn_tests::Op> {
    let mapped = std::env::var("CAIRN_WORKER_MAPPED").is_ok_and(|v| v == "1");
    gen_ops_with(seed, n, prefix, Extras { mapped })
}
use std::io::Write;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 3 && a[1] == "--pin-epoch" {
        pin_epoch(&a[2]);
    }
    if a.len() == 5 && a[1] == "--load" {
        load(&a[2], a[3].parse().expect("id"), a[4].parse().expect("n"));
    }
    if a.len() == 5 && a[1] == "--churn" {
        churn(&a[2], a[3].parse().expect("id"), a[4].parse().expect("n"));
    }
    if a.len() == 6 && a[1] == "--mp" {
        multiproc(
            &a[2],
            a[3].parse().expect("id"),
            a[4].parse().expect("n"),
            a[5].parse().expect("seed"),
        );
    }
    if a.len() == 6 && a[1] == "--trace" {
        let host = cairn_tests::HostFs {
            root: a[2].clone().into(),
        };
        let ops = sequence(a[3].parse().expect("seed"), a[4].parse().expect("n"), &a[5]);
        cairn_tests::FsOps::mkdir(&host, &a[5]).unwrap();
        for (i, op) in ops.iter().enumerate() {
            println!("{i} {op:?} -> {:?}", apply(&host, op));
        }
        return;
    }
    if a.len() != 5 {
        eprintln!("usage: cairn-test-worker STORE SEED N PREFIX");
        std::process::exit(2);
    }
    let seed: u64 = a[2].parse().expect("seed");
    let n: usize = a[3].parse().expect("n");
    let fs = match cairn::Fs::open(&a[1]) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("cairn-test-worker: open {}: {e}", a[1]);
            std::process::exit(1);
        }
    };
    let c = CairnFs { fs: &fs };
    let ops = sequence(seed, n, &a[4]);
    let every = |k: &str| -> usize {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (digest_every, migrate_every, clean) = (
        every("CAIRN_WORKER_DIGEST_EVERY"),
        every("CAIRN_WORKER_MIGRATE_EVERY"),
        every("CAIRN_WORKER_CLEAN") > 0,
    );
    // `CAIRN_WORKER_RANGE=FROM:TO`: only calls FROM..TO (a second client continues the
    // sequence); `CAIRN_WORKER_HOLD=1`: after DONE, stay (holding leases) until stdin
    // closes.
    let (from, to) = std::env::var("CAIRN_WORKER_RANGE")
        .ok()
        .and_then(|r| {
            let (a, b) = r.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or((0, n));
    // One call, with its marks and the digests, migrations and cleaning asked for.
    let run = |i: usize| {
        let op = &ops[i];
        // The call's boundaries, for the power-failure simulator (when tracing).
        cairn_media::trace::mark(cairn_tests::powerfail::MARK_BEGIN, i as u64);
        // Operations fail the same way as on the reference (ENOENT, EEXIST, ...); an
        // I/O or connection error would be Cairn's fault, so report it.
        let outcome = apply(&c, op);
        if let cairn_tests::Outcome::Err(e) = outcome {
            if e == libc::EIO || e == libc::ECONNREFUSED || e == libc::EPROTO || e == libc::ENOSPC {
                eprintln!("cairn-test-worker: op {i} {op:?} failed with errno {e}");
            }
        }
        cairn_media::trace::mark(cairn_tests::powerfail::MARK_END, i as u64);
        if std::env::var_os("CAIRN_WORKER_VERBOSE").is_some() {
            eprintln!("{i} {op:?} -> {outcome:?}");
        }
        if digest_every > 0 && (i + 1).is_multiple_of(digest_every) {
            if let Err(e) = fs.digest() {
                eprintln!("cairn-test-worker: digest after op {i}: {e}");
            }
        }
        if migrate_every > 0 && (i + 1).is_multiple_of(migrate_every) {
            // Everything digested first, so that there is data to move.
            let _ = fs.digest();
            let store = Some(std::path::Path::new(&a[1]));
            // SSD → HDD every other time, so that data stays in the SSD a while and its
            // segments are left partly dead by later writes.
            let down: &[u8] = if (i + 1).is_multiple_of(2 * migrate_every) {
                &[0, 1]
            } else {
                &[0]
            };
            for &from in down {
                if let Err(e) = cairn::daemon_migrate(store, from, from + 1, 1 << 30) {
                    eprintln!("cairn-test-worker: migrate from tier {from} after op {i}: {e}");
                }
            }
            if clean {
                for tier in [1u8, 2] {
                    if let Err(e) = cairn::daemon_clean(store, tier) {
                        eprintln!("cairn-test-worker: clean tier {tier} after op {i}: {e}");
                    }
                }
            }
        }
    };
    let mut out = std::io::stdout().lock();
    if std::env::var_os("CAIRN_WORKER_STEP").is_some() {
        // Step mode: run the calls stdin names, one per line, each acknowledged before
        // the next is read (several workers then take turns on one sequence); at the
        // end, the daemon's shared-write counters.
        writeln!(out, "READY").unwrap();
        out.flush().unwrap();
        for line in std::io::stdin().lines() {
            let i: usize = line.expect("stdin").trim().parse().expect("a call's index");
            run(i);
            writeln!(out, "ACK {i}").unwrap();
            out.flush().unwrap();
        }
        let sh = fs.status().expect("status").sharing;
        writeln!(out, "SHARING {} {}", sh.mode_entries, sh.commits).unwrap();
        return;
    }
    for i in from..to.min(ops.len()) {
        run(i);
        writeln!(out, "ACK {i}").unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "DONE").unwrap();
    out.flush().unwrap();
    if std::env::var_os("CAIRN_WORKER_HOLD").is_some() {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    }
}

/// Register a client, then pin the current global epoch in its client page forever.
fn pin_epoch(store: &str) -> ! {
    drop(cairn::Fs::open(store).expect("open store")); // make sure a daemon runs
    let c = cairn_tests::raw::RawClient::connect(std::path::Path::new(store));
    c.pin_epoch(c.area.global_epoch().unwrap());
    println!("PINNED");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Length of one record appended to the shared log.
pub const RECORD: usize = 32;

/// The load-test worker (see the usage above).
fn load(store: &str, id: u32, n: usize) -> ! {
    let fs = cairn::Fs::open(store).expect("open store");
    let c = CairnFs { fs: &fs };
    let prefix = format!("/p{id}");
    cairn_tests::FsOps::mkdir(&c, &prefix).expect("mkdir private dir");
    let private = gen_ops(id as u64, n, &prefix);
    let mut shared = 0u32;
    for (i, op) in private.iter().enumerate() {
        if i % 5 == 4 {
            let rec = format!("P{id:02} S{shared:05} {:>20}\n", "");
            assert_eq!(rec.len(), RECORD);
            let f = cairn::OpenOptions::new()
                .append(true)
                .open(&fs, "/shared/log");
            if let Err(e) = f.and_then(|mut f| std::io::Write::write_all(&mut f, rec.as_bytes())) {
                eprintln!("worker {id}: append {shared}: {e}");
                std::process::exit(1);
            }
            if let Err(e) = fs.write(format!("/shared/d/{id}-{shared}"), rec.as_bytes()) {
                eprintln!("worker {id}: create {shared}: {e}");
                std::process::exit(1);
            }
            shared += 1;
        } else if let cairn_tests::Outcome::Err(e) = apply(&c, op) {
            if e == libc::EIO || e == libc::ENOSPC || e == libc::EPROTO || e == libc::ECONNREFUSED {
                eprintln!("worker {id}: op {i} {op:?} failed with errno {e}");
                std::process::exit(1);
            }
        }
    }
    std::process::exit(0);
}

fn churn(store: &str, id: u32, n: usize) -> ! {
    let fail = |what: String, e: std::io::Error| -> ! {
        eprintln!("churn worker {id}: {what}: {e}");
        std::process::exit(1)
    };
    let fs = cairn::Fs::open(store).unwrap_or_else(|e| fail("open".into(), e));
    let dir = format!("/c/{id}");
    fs.create_dir(&dir)
        .unwrap_or_else(|e| fail(format!("mkdir {dir}"), e));
    let out = std::io::stdout();
    let mut out = out.lock();
    for i in 0..n {
        match cairn_tests::churn_step(id, i) {
            Some((name, body)) => {
                let f = format!("{dir}/f{i}");
                fs.write(&f, &body)
                    .unwrap_or_else(|e| fail(format!("write {f}"), e));
                if name != format!("f{i}") {
                    let to = format!("{dir}/{name}");
                    fs.rename(&f, &to)
                        .unwrap_or_else(|e| fail(format!("rename {f} {to}"), e));
                }
            }
            None => {
                let c = cairn::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&fs, "/shared/counter")
                    .unwrap_or_else(|e| fail("open the counter".into(), e));
                let locked = c.lock(cairn::LockKind::Posix, cairn::LockType::Write, 0, 0, true);
                locked.unwrap_or_else(|e| fail("lock the counter".into(), e));
                let mut b = [0u8; 8];
                let got = c
                    .read_at(&mut b, 0)
                    .unwrap_or_else(|e| fail("read the counter".into(), e));
                assert_eq!(got, 8, "the counter's length");
                let next = (u64::from_le_bytes(b) + 1).to_le_bytes();
                c.write_at(&next, 0)
                    .unwrap_or_else(|e| fail("write the counter".into(), e));
                // Closing the file drops the lock (the last descriptor of the inode in
                // this process).
            }
        }
        if let Some((name, body)) = i
            .checked_sub(1)
            .and_then(|j| cairn_tests::churn_step(id, j))
        {
            let f = format!("{dir}/{name}");
            let got = fs.read(&f).unwrap_or_else(|e| fail(format!("read {f}"), e));
            assert_eq!(got, body, "{f} read back");
        }
        let _ = writeln!(out, "ACK {i}");
        let _ = out.flush();
    }
    let _ = writeln!(out, "DONE");
    let _ = out.flush();
    std::process::exit(0)
}

/// Now, in nanoseconds since the Unix epoch (as the records carry it).
fn now_ns() -> u128 {
    cairn_area::time::now_ns() as u128
}

/// The multi-process visibility worker (see the usage above).
fn multiproc(store: &str, id: u32, n: usize, seed: u64) -> ! {
    use rand::{Rng, SeedableRng};
    let fs = cairn::Fs::open(store).expect("open store");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((id as u64) << 32));
    let mut created: Vec<u32> = Vec::new();
    let out = std::io::stdout();
    let mut out = out.lock();
    for seq in 0..n as u32 {
        let t0 = now_ns();
        let (kind, target, result): (&str, String, String) = match rng.gen_range(0..10) {
            0..=2 => {
                let f = format!("/s/f{}", rng.gen_range(0..2));
                let rec = format!("{id:02}:{seq:05};");
                let r = cairn::OpenOptions::new()
                    .append(true)
                    .open(&fs, &f)
                    .and_then(|mut h| std::io::Write::write_all(&mut h, rec.as_bytes()));
                (
                    "append",
                    f,
                    r.map(|_| rec).unwrap_or_else(|e| format!("ERR:{e}")),
                )
            }
            3 | 4 => {
                let name = format!("{id}-{seq}");
                let r = fs.write(format!("/s/d/{name}"), b"x");
                if r.is_ok() {
                    created.push(seq);
                }
                (
                    "create",
                    name,
                    r.map(|_| "ok".into())
                        .unwrap_or_else(|e| format!("ERR:{e}")),
                )
            }
            5 if !created.is_empty() => {
                let j = created.swap_remove(rng.gen_range(0..created.len()));
                let name = format!("{id}-{j}");
                let r = fs.remove_file(format!("/s/d/{name}"));
                (
                    "remove",
                    name,
                    r.map(|_| "ok".into())
                        .unwrap_or_else(|e| format!("ERR:{e}")),
                )
            }
            5..=7 => {
                let f = format!("/s/f{}", rng.gen_range(0..2));
                let r = fs
                    .read(&f)
                    .map(|v| String::from_utf8_lossy(&v).into_owned());
                ("read", f, r.unwrap_or_else(|e| format!("ERR:{e}")))
            }
            _ => {
                let r = fs.read_dir("/s/d").and_then(|it| {
                    it.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                        .collect::<std::io::Result<Vec<_>>>()
                });
                (
                    "list",
                    "/s/d".into(),
                    r.map(|v| v.join(","))
                        .unwrap_or_else(|e| format!("ERR:{e}")),
                )
            }
        };
        let t1 = now_ns();
        std::io::Write::write_all(
            &mut out,
            format!("{id} {seq} {kind} {target} {t0} {t1} {result}\n").as_bytes(),
        )
        .unwrap();
    }
    std::process::exit(0);
}
