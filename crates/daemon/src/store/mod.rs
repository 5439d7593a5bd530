//! The writable shared area and the structures in it: the daemon is its only writer.

pub(crate) mod alloc;
pub(crate) mod check;
pub(crate) mod dirhash;
pub(crate) mod maptree;
pub(crate) mod recovery;
pub(crate) mod shared;
