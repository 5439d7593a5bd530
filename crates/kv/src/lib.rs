//! `cairn-kv`: a persistent log-structured key-value store in the manner of Nibble and
//! Nibble-2 (Merritt's dissertation), on a pool file in the NVM tier (docs/KV.md).
//!
//! Records are appended to 2 MiB segments of a pool file, one log head per core, each
//! record written with non-temporal stores and fenced before the call returns (durable
//! on return, on the medium's persistence model). An optimistic index of cache-line
//! buckets maps keys to their newest record. Opening a pool scans its segments: the
//! newest version of each key wins, deletions are tombstones.
//!
//! Compaction copies the current records of the segments with the best cost-benefit
//! and frees them once no reader can be in them (epochs).
//!
//! Modules: `format` (the pool's on-media format, pure), `pool` (the file and its
//! mapping), `index` (the optimistic hash index), `epoch` (readers' epochs), `segment` (the
//! segments' state and the free list), `head` (the log heads), `log` (the shared state and the write path:
//! appends, in-place updates), `recover`, `compact`
//! (compaction and its background threads), `store` (the API).
#![forbid(unsafe_code)]

mod batch;
mod compact;
mod epoch;
pub mod format;
mod head;
mod index;
mod log;
mod pool;
mod recover;
mod region;
mod segment;
mod store;

pub use batch::Batch;
pub use log::Change;
pub use store::{KvError, Options, Stats, Store, UpdatePolicy};
