//! `cairnd`, the trusted daemon of Cairn: `mkfs`, the server (registration, log slots,
//! inode batches, space credits), digest (scan, coalesce, validate, apply out of place,
//! publish), epochs and reclamation, recovery and clean shutdown.
//!
//! The public API is [`mkfs`] with [`MkfsOptions`], and [`run_daemon`] with
//! [`DaemonOptions`]. Everything else is internal: the daemon is the only writer of the
//! shared area, and all of its writing goes through the modules below.
//!
//! * `alloc`: DRAM bitmaps of data blocks (next-fit) and inodes (with reservations).
//! * `shared`: the writable shared area (block and inode writes, slot heads, epochs).
//! * `maptree`: copy-on-write file maps. `dirhash`: linear-hashing directories.
//! * `digest`: scan, plan, validate, apply, publish.
//! * `recovery`: allocation state load/save/rebuild. `core`: clients and slots.
//! * `offline`: recovery without serving (`recover`). `fsck`: the store checker.
//! * `server`: socket, threads, signals, daemonising.

#![forbid(unsafe_code)]

mod alloc;
mod core;
mod digest;
mod dirhash;
mod fsck;
mod leases;
mod lock_server;
mod locks;
mod maptree;
mod migrate;
mod mkfs;
mod offline;
mod pardigest;
mod perm;
mod recovery;
mod server;
mod shared;
mod tiers;
mod util;
mod xattr;

#[cfg(test)]
mod tests;

pub use fsck::{fsck, FsckOptions, FsckReport};
pub use mkfs::{mkfs, MkfsOptions, TierOptions, DEFAULT_HDD_SEGMENT, DEFAULT_SSD_SEGMENT};
pub use offline::{recover, stored_xattrs, StoredXattrs};
pub use perm::resolve_group;
pub use server::{run_daemon, DaemonOptions};
