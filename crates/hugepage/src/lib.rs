//! Ingens (OSDI'16) for ordinary processes on an unmodified Linux 6.x, from user space
//! (issue 18): the policy ([`policy`]: access history, utilization-based promotion,
//! share-proportional fairness; shares from cgroup weights in [`cgroup`]), the
//! fragmentation index ([`fmfi`]), what can be read of and done to a watched process
//! through `/proc` ([`scan`]), the daemon ([`daemon`]), and a simulator of
//! what user space cannot reach ([`sim`]), driven by synthetic traces or by traces
//! of real processes recorded with the scanner ([`trace`]).

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod daemon;
pub mod fmfi;
pub mod policy;
pub mod scan;
pub mod sim;
pub mod trace;
