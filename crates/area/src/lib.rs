//! The shared area's read side and the store directory.
//!
//! * [`store`]: the store directory (`cairn.toml`, socket, locks, default location).
//! * [`reader`]: consistent reads of the shared area through a mapping — inodes under
//!   their seqlock, map walks, file data with holes, directory lookup and listing. LibFS
//!   uses it through a read-only mapping, the daemon through its read-write one.
//! * [`cache`]: LibFS's DRAM cache of lower-tier (SSD, HDD) blocks.
//! * [`error`]: `io::Error`s that carry a POSIX errno and a message.
//! * [`time`]: wall-clock time in nanoseconds since the epoch, and its UTC calendar.
//! * [`users`]: a uid's groups and what it may write, by the user and group databases.

#![forbid(unsafe_code)]

pub mod cache;
pub mod error;
pub mod host;
pub mod reader;
pub mod store;
pub mod tier;
pub mod time;
pub mod units;
pub mod users;

pub use error::{copy_err, errno_of, fs_err};
pub use reader::Area;
pub use store::{StoreConfig, StoreDir};
pub use tier::{FileTier, SharedBuf, TierDevice};
