//! Sharing between clients: leases on inodes (advisory locks are the kernel's, on lock
//! files the clients make: `cairn::lock`).

pub(crate) mod leases;
