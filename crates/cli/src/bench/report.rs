//! The latency benchmark's results: JSON shape and the human table.

use crate::util::{human_bytes, human_ns};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// One (system, op, size) run.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub system: String,
    pub op: &'static str,
    pub size: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub mean_ns: u64,
    pub iterations: u64,
}

/// `cairn bench latency --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Each figure the median over `runs` runs.
    pub results: Vec<Measurement>,
    /// Runs measured (`--runs`).
    pub runs: u64,
    /// Type of the file system holding the host test file (`ext4`, `overlay`, …).
    pub host_fs: String,
    /// The store directory.
    pub store: String,
}

/// The measurements of several runs (each in the same order) combined: each figure is
/// its median over the runs ([`super::median`]).
pub fn medians(runs: &[Vec<Measurement>]) -> Vec<Measurement> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let med = |i: usize, f: fn(&Measurement) -> u64| {
        let v: Vec<f64> = runs.iter().map(|r| f(&r[i]) as f64).collect();
        super::median(&v).round() as u64
    };
    (0..first.len())
        .map(|i| {
            debug_assert!(runs.iter().all(|r| r[i].system == first[i].system
                && r[i].op == first[i].op
                && r[i].size == first[i].size));
            Measurement {
                p50_ns: med(i, |m| m.p50_ns),
                p99_ns: med(i, |m| m.p99_ns),
                p999_ns: med(i, |m| m.p999_ns),
                mean_ns: med(i, |m| m.mean_ns),
                ..first[i].clone()
            }
        })
        .collect()
}

impl Report {
    fn p50(&self, system: &str, op: &str, size: u64) -> Option<u64> {
        self.results
            .iter()
            .find(|m| m.system == system && m.op == op && m.size == size)
            .map(|m| m.p50_ns)
    }
}

fn ratio(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => format!("{:.2}x", a as f64 / b as f64),
        _ => "-".into(),
    }
}

/// The table and the p50 ratios.
pub fn human(r: &Report, host_name: &str, host_dir: &Path) -> String {
    let mut s = String::new();
    if r.runs > 1 {
        let _ = writeln!(
            s,
            "Cairn latency benchmark (medians of {} runs, the systems taking turns)",
            r.runs
        );
    } else {
        let _ = writeln!(s, "Cairn latency benchmark");
    }
    let _ = writeln!(
        s,
        "  cairn      store {}: File::write_at (durable on return), File::read_at",
        r.store
    );
    let _ = writeln!(
        s,
        "  {host_name:<10} {} ({}): pwrite + fdatasync per write, pread",
        host_dir.display(),
        r.host_fs
    );
    let _ = writeln!(s, "  tmpfs      /dev/shm: pwrite (no sync), pread");
    if r.results.iter().any(|m| m.system == "cairn-fuse") {
        let _ = writeln!(
            s,
            "  cairn-fuse the store through `cairn mount`: pwrite + fdatasync per write, pread"
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<12} {:<6} {:>7} {:>10} {:>11} {:>11} {:>11} {:>11}",
        "system", "op", "size", "iterations", "p50", "p99", "p99.9", "mean"
    );
    for m in &r.results {
        let _ = writeln!(
            s,
            "{:<12} {:<6} {:>7} {:>10} {:>11} {:>11} {:>11} {:>11}",
            m.system,
            m.op,
            human_bytes(m.size),
            m.iterations,
            human_ns(m.p50_ns as f64),
            human_ns(m.p99_ns as f64),
            human_ns(m.p999_ns as f64),
            human_ns(m.mean_ns as f64)
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "p50 ratios");
    let h1 = "cairn/tmpfs write";
    let h2 = format!("{host_name}/cairn write");
    let h3 = format!("{host_name}/cairn read");
    let h4 = format!("cairn-fuse/{host_name} write");
    let _ = writeln!(s, "{:<7} {h1:>18} {h2:>20} {h3:>20} {h4:>26}", "size");
    let mut sizes: Vec<u64> = r.results.iter().map(|m| m.size).collect();
    sizes.dedup();
    for size in sizes {
        let _ = writeln!(
            s,
            "{:<7} {:>18} {:>20} {:>20} {:>26}",
            human_bytes(size),
            ratio(r.p50("cairn", "write", size), r.p50("tmpfs", "write", size)),
            ratio(
                r.p50(host_name, "write", size),
                r.p50("cairn", "write", size)
            ),
            ratio(r.p50(host_name, "read", size), r.p50("cairn", "read", size)),
            ratio(
                r.p50("cairn-fuse", "write", size),
                r.p50(host_name, "write", size)
            ),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(system: &str, op: &'static str, size: u64, p50: u64) -> Measurement {
        Measurement {
            system: system.into(),
            op,
            size,
            p50_ns: p50,
            p99_ns: p50 * 2,
            p999_ns: p50 * 3,
            mean_ns: p50,
            iterations: 10,
        }
    }

    #[test]
    fn json_shape_and_ratios() {
        let r = Report {
            results: vec![
                m("cairn", "write", 4096, 2000),
                m("cairn", "read", 4096, 500),
                m("ext4", "write", 4096, 200_000),
                m("ext4", "read", 4096, 1000),
                m("tmpfs", "write", 4096, 1000),
                m("tmpfs", "read", 4096, 400),
            ],
            runs: 1,
            host_fs: "ext4".into(),
            store: "/s".into(),
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        let first = &v["results"][0];
        let mut keys: Vec<&str> = first
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "iterations",
                "mean_ns",
                "op",
                "p50_ns",
                "p999_ns",
                "p99_ns",
                "size",
                "system"
            ]
        );
        assert_eq!(v["host_fs"], "ext4");
        assert_eq!(v["store"], "/s");
        let h = human(&r, "ext4", Path::new("/s"));
        assert!(h.contains("2.00x"), "{h}"); // cairn / tmpfs write
        assert!(h.contains("100.00x"), "{h}"); // ext4 / cairn write
        assert_eq!(v["runs"], 1);
        assert!(h.contains("ext4/cairn read"), "{h}");
    }

    #[test]
    fn medians_of_runs() {
        let runs = vec![
            vec![
                m("cairn", "write", 4096, 900),
                m("tmpfs", "write", 4096, 700),
            ],
            vec![
                m("cairn", "write", 4096, 1200),
                m("tmpfs", "write", 4096, 300),
            ],
            vec![
                m("cairn", "write", 4096, 1000),
                m("tmpfs", "write", 4096, 500),
            ],
        ];
        let r = medians(&runs);
        assert_eq!(
            (r[0].system.as_str(), r[0].p50_ns, r[0].p99_ns),
            ("cairn", 1000, 2000)
        );
        assert_eq!(
            (r[1].system.as_str(), r[1].p50_ns, r[1].p999_ns),
            ("tmpfs", 500, 1500)
        );
        assert!(medians(&[]).is_empty());
    }
}
