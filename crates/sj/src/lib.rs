//! SpaceJMP on Cairn (docs/SPACEJMP.md): named, persistent segments at fixed virtual
//! addresses, grouped into named address spaces that processes attach to and switch
//! between, with failure-atomic commits.

#![forbid(unsafe_code)]

pub mod control;
pub mod heap;
