//! Crash-test worker: runs the deterministic operation sequence `gen_ops(seed, n, prefix)`
//! on a Cairn store and prints `ACK <i>` after operation `i` returned (so the harness
//! knows which operations were acknowledged when it kills this process).
//!
//! Usage: cairn-crash-worker STORE SEED N PREFIX

use cairn_tests::{apply, gen_ops, CairnFs};
use std::io::Write;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 {
        eprintln!("usage: cairn-crash-worker STORE SEED N PREFIX");
        std::process::exit(2);
    }
    let seed: u64 = a[2].parse().expect("seed");
    let n: usize = a[3].parse().expect("n");
    let fs = match cairn::Fs::open(&a[1]) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("cairn-crash-worker: open {}: {e}", a[1]);
            std::process::exit(1);
        }
    };
    let c = CairnFs { fs: &fs };
    let ops = gen_ops(seed, n, &a[4]);
    let mut out = std::io::stdout().lock();
    for (i, op) in ops.iter().enumerate() {
        let _ = apply(&c, op);
        writeln!(out, "ACK {i}").unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "DONE").unwrap();
}
