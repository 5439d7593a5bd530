//! System-test support for Cairn: a store with its daemon for the duration of a test, a
//! common interface over Cairn and a reference file system (`std::fs` on tmpfs), a
//! deterministic operation generator, and whole-tree snapshots to compare the two.

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
