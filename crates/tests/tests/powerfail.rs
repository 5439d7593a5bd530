//! Power failure: every crash image of traced workloads recovers to an allowed state
//! (`cairn_tests::powerfail`, docs/ARCHITECTURE.md "Persistence model").
//!
//! `CAIRN_PF_IMAGES` sets the number of distinct images to check (default 10,000 in all;
//! a long run: 1000000). `CAIRN_PF_SEED` picks the workload seed.

use cairn_tests::powerfail::{check, record, CheckOptions};

fn env_or(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

#[test]
fn every_crash_image_of_the_model_workload_recovers() {
    let seed = env_or("CAIRN_PF_SEED", 7);
    let n = env_or("CAIRN_PF_OPS", 60) as usize;
    let worker = std::path::Path::new(env!("CARGO_BIN_EXE_cairn-test-worker"));
    let rec = record(worker, seed, n, "/p", 15);
    if std::env::var_os("CAIRN_PF_SITES").is_some() {
        print_sites(&rec.trace);
    }
    let opts = CheckOptions {
        max_distinct: env_or("CAIRN_PF_IMAGES", 10_000) as usize,
        ..Default::default()
    };
    let rep = check(&rec, &opts);
    println!("power failure, model workload (seed {seed}, {n} calls): {rep}");
    for v in rep.violations.iter().take(5) {
        println!(
            "violation before event {} ({} acknowledged, in flight {:?}): {}",
            v.event, v.acked, v.in_flight, v.what
        );
    }
    assert!(
        rep.violations.is_empty(),
        "{} violations",
        rep.violations.len()
    );
}

/// Events per site and kind (`CAIRN_PF_SITES=1`).
fn print_sites(t: &cairn_crashsim::Trace) {
    use cairn_crashsim::Event;
    let mut m: std::collections::BTreeMap<(String, &str), usize> = Default::default();
    for e in &t.events {
        let (site, k) = match e {
            Event::Store { site, nt, .. } => (*site, if *nt { "nt-store" } else { "store" }),
            Event::Flush { site, .. } => (*site, "flush"),
            Event::Fence { site, .. } => (*site, "fence"),
            Event::Mark { .. } => (0, "mark"),
        };
        *m.entry((t.site_name(site), k)).or_default() += 1;
    }
    for ((s, k), n) in m {
        println!("{n:>8} {k:<9} {s}");
    }
}
