//! Crash-test worker: runs the deterministic operation sequence `gen_ops(seed, n, prefix)`
//! on a Cairn store and prints `ACK <i>` after operation `i` returned (so the harness
//! knows which operations were acknowledged when it kills this process).
//!
//! Usage: cairn-crash-worker STORE SEED N PREFIX
//!        cairn-crash-worker --trace HOSTDIR SEED N PREFIX   (replay on a host directory,
//!        printing every operation and its outcome: for debugging a failed run)

use cairn_tests::{apply, gen_ops, CairnFs};
use std::io::Write;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 6 && a[1] == "--trace" {
        let host = cairn_tests::HostFs {
            root: a[2].clone().into(),
        };
        let ops = gen_ops(a[3].parse().expect("seed"), a[4].parse().expect("n"), &a[5]);
        cairn_tests::FsOps::mkdir(&host, &a[5]).unwrap();
        for (i, op) in ops.iter().enumerate() {
            println!("{i} {op:?} -> {:?}", apply(&host, op));
        }
        return;
    }
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
        // Operations fail the same way as on the reference (ENOENT, EEXIST, ...); an
        // I/O or connection error would be Cairn's fault, so report it.
        if let cairn_tests::Outcome::Err(e) = apply(&c, op) {
            if e == libc::EIO || e == libc::ECONNREFUSED || e == libc::EPROTO || e == libc::ENOSPC {
                eprintln!("cairn-crash-worker: op {i} {op:?} failed with errno {e}");
            }
        }
        writeln!(out, "ACK {i}").unwrap();
        out.flush().unwrap();
    }
    writeln!(out, "DONE").unwrap();
}
