//! Genomics data sets in address spaces (`cairn sam`, crate `cairn-genomics`): the tools'
//! results equal samtools' (flagstat's counts, both sort orders, region counts) on a
//! small generated data set, in the segment and on decoded BAM; every tool runs in a
//! process of its own, attaching the data set another process loaded; a load or a sort
//! killed with SIGKILL leaves the old data set or the new one, never a mix; a malformed
//! SAM record gets a clear error and loads nothing.
//!
//! samtools (Debian's, installed by scripts/setup.sh) is the reference.

use cairn_genomics::bamfile;
use cairn_genomics::ops::{FlagStat, Order};
use cairn_tests::harness::{self, StoreSize, TestStore};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const READS: &str = "20001";
const REGIONS: [&str; 5] = [
    "chr1:1000000-2000000",
    "chr2",
    "chrM",
    "chrM:100-5000",
    "chr10:5000000-5000100",
];

fn store() -> TestStore {
    TestStore::with_size(StoreSize {
        nvm: "512M",
        log: "4M",
        clients: 8,
        ..Default::default()
    })
}

fn cairn(s: &TestStore, args: &[&str]) -> Command {
    let mut c = Command::new(harness::cairn_bin());
    c.args(args)
        .env("CAIRN_STORE", s.path())
        .stdin(Stdio::null());
    c
}

fn ok(s: &TestStore, args: &[&str]) -> String {
    harness::output_ok(&mut cairn(s, args), &args.join(" "))
}

fn samtools(args: &[&str]) -> String {
    let out = Command::new("samtools")
        .args(args)
        .output()
        .expect("samtools (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "samtools {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Name, flag, reference and position of each record of a BAM file, in order.
fn order_of(bam: &Path) -> String {
    samtools(&["view", bam.to_str().unwrap()])
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').take(4).collect();
            format!("{}\n", f.join("\t"))
        })
        .collect()
}

/// A generated data set as SAM and BAM in the store's temporary directory.
fn data(s: &TestStore, reads: &str) -> (PathBuf, PathBuf) {
    let sam = s.path().join("reads.sam");
    let bam = s.path().join("reads.bam");
    ok(
        s,
        &[
            "sam",
            "gen",
            sam.to_str().unwrap(),
            "--reads",
            reads,
            "--bam",
            bam.to_str().unwrap(),
        ],
    );
    (sam, bam)
}

fn p(x: &Path) -> &str {
    x.to_str().unwrap()
}

#[test]
fn tools_on_a_data_set_equal_samtools() {
    let s = store();
    let (sam, bam) = data(&s, READS);
    let st_flagstat = samtools(&["flagstat", p(&bam)]);
    let by_name = s.path().join("name.bam");
    let by_coord = s.path().join("coord.bam");
    samtools(&["sort", "-n", "-o", p(&by_name), p(&bam)]);
    samtools(&["sort", "-o", p(&by_coord), p(&bam)]);
    samtools(&["index", p(&by_coord)]);

    // Loaded from BAM and from SAM, each tool a process of its own.
    ok(&s, &["sam", "load", p(&bam), "--name", "b"]);
    ok(&s, &["sam", "load", p(&sam), "--name", "s"]);
    for set in ["b", "s"] {
        assert_eq!(ok(&s, &["sam", "flagstat", set]), st_flagstat, "{set}");
        assert_eq!(
            ok(&s, &["sam", "sort", set, "--by", "name", "--print"]),
            order_of(&by_name),
            "{set}: sort by name"
        );
        assert_eq!(
            ok(&s, &["sam", "sort", set, "--by", "coord", "--print"]),
            order_of(&by_coord),
            "{set}: sort by coordinate"
        );
        ok(&s, &["sam", "index", set]);
        for r in REGIONS {
            assert_eq!(
                ok(&s, &["sam", "view", "-c", set, r]),
                samtools(&["view", "-c", p(&by_coord), r]),
                "{set}: {r}"
            );
        }
    }
    // Readers share the data set: two flagstats at once, each its own process.
    let a = cairn(&s, &["sam", "flagstat", "b"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let b = cairn(&s, &["sam", "flagstat", "b"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8(out.stdout).unwrap(), st_flagstat);
    }
    // Durable: after the daemon stops, the next tool finds all of it.
    s.stop();
    assert_eq!(
        ok(&s, &["sam", "view", "-c", "b", REGIONS[0]]),
        samtools(&["view", "-c", p(&by_coord), REGIONS[0]])
    );
    let info = ok(&s, &["sam", "info", "b"]);
    assert!(info.contains("reads      20001"), "{info}");
    assert!(
        info.contains("header reads by_name by_coord index"),
        "{info}"
    );
    assert_eq!(ok(&s, &["sam", "ls"]).lines().count(), 2);
    // A sort by coordinate drops the index of the order it replaces.
    ok(&s, &["sam", "sort", "b", "--by", "coord"]);
    let out = cairn(&s, &["sam", "view", "-c", "b", "chr2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no index"));
    ok(&s, &["sam", "rm", "b"]);
    ok(&s, &["sam", "rm", "s"]);
    assert_eq!(ok(&s, &["sam", "ls"]), "");
}

#[test]
fn decoded_bam_tools_equal_samtools() {
    let s = store();
    let (_, bam) = data(&s, READS);
    let f = bamfile::flagstat(&bam).unwrap();
    assert_eq!(f.text(), samtools(&["flagstat", p(&bam)]));
    assert_eq!(
        f.counts(),
        FlagStat::parse_counts(&samtools(&["flagstat", p(&bam)])).unwrap()
    );
    for (order, flag) in [(Order::Name, Some("-n")), (Order::Coord, None)] {
        let ours = s.path().join(format!("ours.{}.bam", order.as_str()));
        let theirs = s.path().join(format!("theirs.{}.bam", order.as_str()));
        bamfile::sort(&bam, &ours, order).unwrap();
        let mut a = vec!["sort", "-o", p(&theirs)];
        a.extend(flag);
        a.push(p(&bam));
        samtools(&a);
        assert_eq!(order_of(&ours), order_of(&theirs), "{order:?}");
        // samtools reads what we wrote.
        assert_eq!(
            samtools(&["flagstat", p(&ours)]),
            samtools(&["flagstat", p(&bam)])
        );
    }
    let sorted = s.path().join("ours.coord.bam");
    bamfile::index(&sorted).unwrap();
    samtools(&["index", p(&sorted)]);
    for r in REGIONS {
        let n = bamfile::query(&sorted, r, &mut |_| {}).unwrap();
        assert_eq!(
            n.to_string(),
            samtools(&["view", "-c", p(&sorted), r]).trim(),
            "{r}"
        );
    }
    // The index needs a coordinate order.
    assert!(bamfile::index(&bam).is_err());
}

fn roots(s: &TestStore, set: &str) -> Option<String> {
    let out = cairn(s, &["sam", "info", set]).output().unwrap();
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("roots").map(|r| r.trim().to_string()))
}

fn killed_after(mut c: Command, ms: u64) -> Output {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(ms));
    harness::kill9(child.id());
    child.wait_with_output().unwrap()
}

#[test]
fn a_load_or_a_sort_killed_leaves_the_old_or_the_new_data_set() {
    let s = store();
    let (_, bam) = data(&s, "60000");
    let st_flagstat = samtools(&["flagstat", p(&bam)]);
    let by_coord = s.path().join("coord.bam");
    samtools(&["sort", "-o", p(&by_coord), p(&bam)]);
    samtools(&["index", p(&by_coord)]);
    let region = "chr1:1000000-3000000";
    let st_count = samtools(&["view", "-c", p(&by_coord), region]);
    let (mut absent, mut whole) = (0, 0);
    for ms in [0u64, 20, 60, 120, 200, 300, 450, 700] {
        let out = killed_after(cairn(&s, &["sam", "load", p(&bam), "--name", "k"]), ms);
        match roots(&s, "k") {
            None => {
                absent += 1;
                // A load killed before its commit left nothing a tool can see; loading
                // again replaces what it left.
                let out2 = cairn(&s, &["sam", "flagstat", "k"]).output().unwrap();
                assert!(!out2.status.success(), "{ms} ms: {out:?}");
            }
            Some(r) => {
                whole += 1;
                assert_eq!(r, "header reads", "{ms} ms");
                assert_eq!(ok(&s, &["sam", "flagstat", "k"]), st_flagstat, "{ms} ms");
                ok(&s, &["sam", "rm", "k"]);
            }
        }
    }
    eprintln!("load killed: {absent} times nothing, {whole} times the whole data set");
    // A load killed while its segment was being created (the one point the timed kills
    // above rarely hit) left a segment file without its header; loading again replaces it.
    let out = cairn(&s, &["sam", "load", p(&bam), "--name", "k"])
        .env("CAIRN_SJ_CRASH", "creating")
        .output()
        .unwrap();
    assert!(!out.status.success(), "should have died: {out:?}");
    assert!(roots(&s, "k").is_none());
    ok(&s, &["sam", "load", p(&bam), "--name", "k"]);
    ok(&s, &["sam", "sort", "k", "--by", "coord"]);
    ok(&s, &["sam", "index", "k"]);
    // Sorts killed at points along their run: the old order and its index, or the new.
    let (mut old, mut new) = (0, 0);
    for ms in [0u64, 30, 80, 150, 250, 400, 600] {
        let by = if ms % 20 == 0 { "coord" } else { "name" };
        killed_after(cairn(&s, &["sam", "sort", "k", "--by", by]), ms);
        let r = roots(&s, "k").expect("the data set stays");
        assert_eq!(ok(&s, &["sam", "flagstat", "k"]), st_flagstat, "{ms} ms");
        if r.contains("index") {
            old += 1;
            assert_eq!(
                ok(&s, &["sam", "view", "-c", "k", region]),
                st_count,
                "{ms} ms"
            );
        } else {
            new += 1;
            assert!(
                r.starts_with("header reads") && r.contains("by_coord"),
                "{ms} ms: {r}"
            );
            ok(&s, &["sam", "index", "k"]);
            assert_eq!(
                ok(&s, &["sam", "view", "-c", "k", region]),
                st_count,
                "{ms} ms"
            );
        }
    }
    eprintln!("sort killed: {old} times the old order, {new} times the new one");
    ok(&s, &["sam", "rm", "k"]);
}

#[test]
fn malformed_input_gets_a_clear_error_and_loads_nothing() {
    let s = store();
    let (sam, _) = data(&s, "100");
    let text = std::fs::read_to_string(&sam).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let first = lines.iter().position(|l| !l.starts_with('@')).unwrap();
    // The third record: a position that is not a number.
    let mut f: Vec<String> = lines[first + 2].split('\t').map(str::to_string).collect();
    f[3] = "12x".into();
    lines[first + 2] = f.join("\t");
    let bad = s.path().join("bad.sam");
    std::fs::write(&bad, lines.join("\n") + "\n").unwrap();
    let out = cairn(&s, &["sam", "load", p(&bad), "--name", "bad"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("cairn: ") && err.contains("record 3"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(roots(&s, "bad").is_none());
    // Not a file at all, a bad name, a data set that does not exist.
    for (args, what) in [
        (
            vec!["sam", "load", "/nonexistent.bam", "--name", "x"],
            "No such file",
        ),
        (
            vec!["sam", "load", p(&sam), "--name", "a/b"],
            "data set name",
        ),
        (vec!["sam", "flagstat", "nope"], "no data set nope"),
        (vec!["sam", "sort", "nope", "--by", "size"], "name or coord"),
    ] {
        let out = cairn(&s, &args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(what), "{args:?}: {err}");
    }
    ok(&s, &["sam", "load", p(&sam), "--name", "a"]);
    let out = cairn(&s, &["sam", "view", "a", "chr1:5-1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sort it first") || !out.status.success()
    );
    let out = cairn(&s, &["sam", "load", p(&sam), "--name", "a"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
}
