//! System-test support for Cairn: a store with its daemon for the duration of a test, a
//! common interface over Cairn and a reference file system (`std::fs` on tmpfs), a
//! deterministic operation generator, and whole-tree snapshots to compare the two.

pub mod ceph;
pub mod harness;
pub mod mount;
pub mod ops;
pub mod powerfail;
pub mod raw;
pub mod shim;
pub mod snapshot;

pub use harness::TestStore;
pub use ops::{apply, gen_ops, gen_ops_with, CairnFs, Extras, FsOps, HostFs, Op, Outcome};
pub use snapshot::{diff, snapshot, Node, Snapshot};

/// The churn worker's (`cairn-test-worker --churn`): what its step `i` leaves, by name and
/// content (`None`: the counter step).
pub fn churn_step(id: u32, i: usize) -> Option<(String, Vec<u8>)> {
    let body = format!("{id}:{i}").into_bytes();
    match i % 4 {
        0 | 1 => Some((format!("f{i}"), body)),
        2 => Some((format!("r{i}"), body)),
        _ => None,
    }
}
