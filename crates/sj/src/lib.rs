//! SpaceJMP on Cairn (docs/SPACEJMP.md): named, persistent segments at fixed virtual
//! addresses, grouped into named address spaces that processes attach to and switch
//! between, with failure-atomic commits.
//!
//! * A **segment** is a file of the store with a fixed base address in the segment
//!   window (recorded in its header and in the daemon's registry), kept resident in
//!   `/dev/shm` and mapped there by every process that attaches it: raw pointers inside
//!   it are valid in every process and after every restart.
//! * An **address space** is a file of the store listing segments and what it grants
//!   (read, or read-write); processes attach it (a handle) and threads switch into it.
//! * A **commit** makes a writer's stores durable and visible, all or nothing.
//!
//! [`SpaceJmp`] is the process's entry point; [`Switched`] the Rust interface's guard.

#![forbid(unsafe_code)]

pub mod control;
pub mod guard;
pub mod heap;
pub mod helper;
pub mod segment;
pub mod space;
pub mod undo;

pub use cairn_format::sj::{flags, prot};
pub use guard::{SegPtr, Switched};
pub use helper::InHelper;
pub use space::{
    seg_path, vas_path, CommitMode, CommitStats, SegId, SegInfo, SpaceJmp, Target, VasCtl, VasId,
    Vh,
};
