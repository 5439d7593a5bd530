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
//! Several processes can open one pool at once ([`Store::open_shared`]): the state in
//! memory is then a region file they all map, and everything a process holds (a bucket
//! lock, the free list's lock, log heads, a compaction round) names it, so that the
//! others take it back if it is killed.
//!
//! Modules: `format` (the pool's on-media format, pure), `pool` (the file and its
//! mapping), `region` (the state in memory as one table of words, and the shared open
//! protocol), `index` (the optimistic hash index), `epoch` (readers' epochs), `segment`
//! (the segments' state and the free list), `head` (a process's log heads), `log` (the
//! store's state and the write path: appends, in-place updates), `recover`, `compact`
//! (compaction, its background thread, reaping dead processes), `store` (the API).
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
