//! Multi-process model test: several processes run generated operations on one shared
//! directory at once (appends of unique records to two files, creates and removes of
//! their own entries, whole-file reads, listings) and log each operation's real-time
//! interval and result. The outcome must be explainable by an interleaving of the
//! acknowledged operations with POSIX visibility:
//!
//! * a read or listing sees every write that *completed before it started*, and nothing
//!   that *started after it ended*;
//! * appends are whole, each exactly once, each process's in its order;
//! * at the end every acknowledged operation is there.

use cairn_tests::TestStore;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct Op {
    id: u32,
    seq: u32,
    kind: String,
    target: String,
    t0: u128,
    t1: u128,
    result: String,
}

fn parse(line: &str) -> Op {
    let mut it = line.splitn(7, ' ');
    let mut next = || it.next().unwrap_or_default().to_string();
    Op {
        id: next().parse().unwrap(),
        seq: next().parse().unwrap(),
        kind: next(),
        target: next(),
        t0: next().parse().unwrap(),
        t1: next().parse().unwrap(),
        result: next(),
    }
}

/// One run; returns how many times a file entered shared-write mode.
fn run(procs: u32, n: usize, seed: u64, shared_write: bool) -> u64 {
    let store = TestStore::new();
    store.set_config("shared_write", &shared_write.to_string());
    {
        let fs = store.fs();
        fs.create_dir_all("/s/d").unwrap();
        fs.write("/s/f0", b"").unwrap();
        fs.write("/s/f1", b"").unwrap();
    }
    let children: Vec<_> = (0..procs)
        .map(|id| {
            std::process::Command::new(env!("CARGO_BIN_EXE_cairn-test-worker"))
                .arg("--mp")
                .arg(store.path())
                .args([id.to_string(), n.to_string(), seed.to_string()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ops = Vec::new();
    for (id, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "worker {id} failed");
        ops.extend(String::from_utf8(out.stdout).unwrap().lines().map(parse));
    }
    assert_eq!(ops.len(), procs as usize * n);
    // Every worker logged each of its operations once, in order.
    for id in 0..procs {
        let seqs: Vec<u32> = ops.iter().filter(|o| o.id == id).map(|o| o.seq).collect();
        assert_eq!(
            seqs,
            (0..n as u32).collect::<Vec<_>>(),
            "worker {id}'s trace"
        );
    }
    for o in &ops {
        assert!(!o.result.starts_with("ERR:"), "{o:?} failed");
    }
    let appends: Vec<&Op> = ops.iter().filter(|o| o.kind == "append").collect();
    // Reads: records of appends that completed before the read started are present;
    // records of appends that started after it ended are absent; records are whole.
    for r in ops.iter().filter(|o| o.kind == "read") {
        let recs: Vec<&str> = r.result.split_terminator(';').collect();
        for a in appends.iter().filter(|a| a.target == r.target) {
            let rec = a.result.trim_end_matches(';');
            let present = recs.contains(&rec);
            if a.t1 < r.t0 {
                assert!(
                    present,
                    "read {r:?} misses append {a:?} that completed before it"
                );
            }
            if a.t0 > r.t1 {
                assert!(
                    !present,
                    "read {r:?} sees append {a:?} that started after it"
                );
            }
        }
    }
    // Listings: the same rule for creates and removes.
    let mut life: HashMap<&str, (Option<&Op>, Option<&Op>)> = HashMap::new();
    for o in &ops {
        match o.kind.as_str() {
            "create" => life.entry(&o.target).or_default().0 = Some(o),
            "remove" => life.entry(&o.target).or_default().1 = Some(o),
            _ => {}
        }
    }
    for l in ops.iter().filter(|o| o.kind == "list") {
        let names: Vec<&str> = l.result.split(',').filter(|s| !s.is_empty()).collect();
        for (name, (c, r)) in &life {
            let present = names.contains(name);
            let c = c.expect("removed names were created");
            let must = c.t1 < l.t0 && r.is_none_or(|r| r.t0 > l.t1);
            let must_not = c.t0 > l.t1 || r.is_some_and(|r| r.t1 < l.t0);
            assert!(!must || present, "listing {l:?} misses {name}");
            assert!(!(must_not && present), "listing {l:?} shows {name}");
        }
    }
    // Final state: every append once, in each process's order; every entry as its last
    // operation left it.
    let fs = store.fs();
    let sharing = fs.status().unwrap().sharing;
    if sharing.mode_entries > 0 {
        assert!(
            sharing.commits > 0,
            "the mode entered but unused: {sharing:?}"
        );
    }
    for f in ["/s/f0", "/s/f1"] {
        let content = String::from_utf8(fs.read(f).unwrap()).unwrap();
        let recs: Vec<&str> = content.split_terminator(';').collect();
        let want: Vec<&Op> = appends.iter().copied().filter(|a| a.target == f).collect();
        assert_eq!(recs.len(), want.len(), "{f}: appends lost or duplicated");
        let mut last: HashMap<u32, u32> = HashMap::new();
        for rec in &recs {
            let (id, seq) = rec.split_once(':').expect("a whole record");
            let (id, seq): (u32, u32) = (id.parse().unwrap(), seq.parse().unwrap());
            if let Some(prev) = last.insert(id, seq) {
                assert!(seq > prev, "{f}: process {id}'s appends out of order");
            }
        }
    }
    for (name, (_, r)) in &life {
        assert_eq!(fs.exists(format!("/s/d/{name}")), r.is_none(), "{name}");
    }
    sharing.mode_entries
}

#[test]
fn four_processes_on_one_directory() {
    for seed in 0..3 {
        run(4, 300, seed, false);
    }
}

/// The same with shared-write mode on: the files the processes write at once go
/// through the daemon (`Commit`), which must keep every outcome explainable.
#[test]
fn four_processes_in_shared_write_mode() {
    // Whether the processes meet on a file at once (entering the mode) is up to the
    // scheduler: seeds run until two runs did (almost always the first two), so the
    // mode is always exercised and a loaded machine only takes longer.
    let mut entered = 0;
    for seed in 10..20 {
        if run(4, 300, seed, true) > 0 {
            entered += 1;
            if entered == 2 {
                return;
            }
        }
    }
    panic!("in ten runs shared-write mode was entered in {entered}, not 2");
}
