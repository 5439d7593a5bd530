//! Sharing between clients: leases on inodes and advisory locks.

pub(crate) mod leases;
pub(crate) mod lock_server;
pub(crate) mod locks;
