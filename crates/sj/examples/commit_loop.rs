//! A loop of small commits, to profile (`perf record -g`) or time one shape of commit
//! alone: `updates` stores of `bytes` bytes at random places of a 64 MiB segment, then a
//! commit, for `secs` seconds. Prints the rate and the p50/p99 latency. Modes: `explicit`
//! and `page` (the segment's commit mode), and `pages`: explicit mode, each store the
//! first 8 bytes of a random page declared whole first (`tx_add`), as a PMDK
//! transaction adding pages does.
//!
//! ```text
//! cargo run --release -p cairn-sj --example commit_loop -- explicit 1 8 5
//! cargo run --release -p cairn-sj --example commit_loop -- page 1 8 5
//! cargo run --release -p cairn-sj --example commit_loop -- pages 16 8 5
//! ```

use cairn_sj::{flags, prot, CommitMode, SegPtr, SpaceJmp, Target};
use std::time::{Duration, Instant};

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let pages = args.get(1).is_some_and(|a| a == "pages");
    let mode = match args.get(1).map(String::as_str) {
        Some("page") => CommitMode::Snapshot,
        _ => CommitMode::Explicit,
    };
    let (updates, mut bytes, secs) = (arg(2, 1), arg(3, 8).max(1), arg(4, 5).max(1));
    if pages {
        bytes = 4096;
    }
    let sj = SpaceJmp::open(None)?;
    let area = 64u64 << 20;
    let name = format!("commit-loop-{}", std::process::id());
    let seg = sj.seg_alloc(
        &name,
        None,
        area + (1 << 20),
        prot::RW,
        flags::LOCKABLE,
        0o600,
    )?;
    let vid = sj.vas_create(&name, 0o600)?;
    sj.seg_attach(Target::Vas(vid), seg, prot::RW)?;
    let vh = sj.vas_attach(vid, mode)?;
    // The loop in a closure, so that the segment goes whatever happens in it.
    let run = || -> std::io::Result<()> {
        let base = sj.seg_info(&name)?.base + (1 << 20);
        let mut x = 0x5eedu64;
        let data = vec![7u8; bytes as usize];
        let mut lat = Vec::new();
        let g = sj.enter(vh)?;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            let t = Instant::now();
            for _ in 0..updates {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = SegPtr(base + x % (area / bytes) * bytes);
                if pages {
                    g.tx_add(at, 4096)?;
                    g.write(at, &data[..8])?;
                } else {
                    g.write(at, &data)?;
                }
            }
            g.commit()?;
            lat.push(t.elapsed().as_nanos() as u64);
        }
        let rate = lat.len() as f64 / t0.elapsed().as_secs_f64();
        lat.sort_unstable();
        let p50 = lat[lat.len() / 2];
        let total: u64 = lat.iter().sum();
        let slow: u64 = lat.iter().filter(|&&l| l > 10 * p50).sum();
        println!(
            "{} commits/s  mean {} ns  p50 {p50} ns  p99 {} ns  p99.9 {} ns  max {} ns  \
             {:.0}% of the time in commits over 10x p50",
            rate as u64,
            total / lat.len() as u64,
            lat[lat.len() * 99 / 100],
            lat[lat.len() * 999 / 1000],
            lat[lat.len() - 1],
            100.0 * slow as f64 / total as f64
        );
        Ok(())
    };
    let r = run();
    sj.vas_detach(vh)?;
    sj.vas_remove(&name)?;
    sj.seg_free(&name)?;
    r
}
