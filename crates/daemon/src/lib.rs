//! `cairnd`, the trusted daemon of Cairn: `mkfs`, the server (registration, log slots,
//! inode batches, space credits), digest (scan, coalesce, validate, apply out of place,
//! publish), epochs and reclamation, recovery and clean shutdown.
//!
//! The public API is [`mkfs`] with [`MkfsOptions`], and [`run_daemon`] with
//! [`DaemonOptions`]. Everything else is internal: the daemon is the only writer of the
//! shared area, and all of its writing goes through the modules below.
//!
//! Modules, by layer:
//!
//! | module | what |
//! |---|---|
//! | `store` | the writable shared area: `shared` (block and inode writes, slot heads, epochs), `alloc` (DRAM bitmaps of data blocks and inodes, 2 MiB chunks and extents), `maptree` (copy-on-write file maps), `dirhash` (linear-hashing directories), `recovery` (allocation state load, save and rebuild) |
//! | `core` | the daemon's state under its lock: clients and slots, credits, inode batches, digests of a slot, reclamation |
//! | `digest` | a client log applied to the shared area: scan, fold, validate, apply, publish; `digest::parallel` runs independent files' maps on both cores |
//! | `sharing` | `leases` (grant, revoke, the upcall channels); advisory locks are the kernel's, on lock files (`Core::sweep_host_objects` removes stale ones) |
//! | `tiers` | the lower tiers' segment allocation; `tiers::migrate`: migration, promotion, evacuation, cleaning and NVM compaction rounds and their background policy |
//! | `superpage` | superpage extents of the NVM tier: promotion, demotion, the background pass, status; `superpage::compact`: when compaction is due and what it moves |
//! | `server` | the socket, client threads, signals, daemonising (`run_daemon`), and one function per request |
//! | `offline` | what runs without serving: `mkfs`, recovery (`recover`), the checker (`fsck`) |
//! | `mapobj` | map objects of shared mappings: made, handed out after a permission check, and removed by the daemon alone |
//! | `sjobj` | SpaceJMP segments' resident copies and undo logs: built, handed out after a permission check, refreshed and removed by the daemon alone |
//! | `perm` | permission checks of a client's transaction |
//! | `xattr` | the extended-attribute journal |
//! | `util` | the daemon's log, errors, time and random helpers |

#![forbid(unsafe_code)]

mod backup;
mod core;
mod credits;
mod digest;
mod mapobj;
mod offline;
mod perm;
mod server;
mod sharing;
mod sj;
mod sjobj;
mod store;
mod superpage;
mod tiers;
mod util;
mod xattr;

#[cfg(test)]
mod tests;

pub use cairn_remote::backup::Manifest as BackupManifest;
pub use offline::fsck::{fsck, FsckOptions, FsckReport};
pub use offline::mkfs::{
    mkfs, MkfsOptions, RemoteOptions, TierOptions, DEFAULT_HDD_SEGMENT, DEFAULT_REMOTE_SIZE,
    DEFAULT_SSD_SEGMENT,
};
pub use offline::restore::{list_backups, restore, RestoreOptions};
pub use offline::{recover, stored_xattrs, StoredXattrs};
pub use perm::resolve_group;
pub use server::{run_daemon, DaemonOptions};
