//! Cairn's power-failure simulator.
//!
//! `cairn_media::trace` records every store into an NVM mapping, every cache-line
//! write-back and every fence of every traced process into one trace with a global
//! order ([`trace::Trace`]). [`sim::Sim`] follows the trace with x86's persistence rules
//! and lists the images a power failure could leave at any point. The checks on an image
//! (recovery by the daemon's own code, `fsck`, the tree against the acknowledged calls)
//! live with the workloads in `crates/tests` (`powerfail`).

#![forbid(unsafe_code)]

pub mod sim;
pub mod trace;

pub use sim::{Choice, Sim, Target};
pub use trace::{Event, Trace};
