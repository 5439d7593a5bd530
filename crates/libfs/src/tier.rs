//! The remote tier as a client reads it: through the daemon (`Request::TierRead`),
//! which holds the store's one connection to the cluster and a cache every client
//! shares (docs/REMOTE.md, "Reads of cold data"). Linking librados into every process
//! would cost each one a cluster session and librados' own threads, inside programs
//! that never asked for them (the `LD_PRELOAD` shim); a hop through the daemon costs
//! tens of microseconds against a RADOS read's hundreds.

use crate::conn::{response_error, Conn};
use cairn_area::{fs_err, StoreDir, TierDevice};
use cairn_proto::{Request, Response, MAX_TIER_READ};
use std::io;
use std::sync::Mutex;

/// A lower tier read through the daemon. Connections of its own (not the client's
/// registered one, so that a slow read never holds up the client's other requests),
/// kept for reuse by the process that opened them.
pub(crate) struct DaemonTier {
    store: StoreDir,
    tier: u8,
    /// Idle connections and the pid that opened them (a forked child opens its own).
    idle: Mutex<(u32, Vec<Conn>)>,
}

impl DaemonTier {
    pub(crate) fn new(store: &StoreDir, tier: u8) -> DaemonTier {
        DaemonTier {
            store: store.clone(),
            tier,
            idle: Mutex::new((std::process::id(), Vec::new())),
        }
    }

    fn take(&self) -> io::Result<Conn> {
        let pid = std::process::id();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.0 != pid {
            // Inherited across fork: the parent's connections are the parent's.
            idle.1.clear();
            idle.0 = pid;
        }
        match idle.1.pop() {
            Some(c) => Ok(c),
            None => {
                drop(idle);
                Conn::connect_only(&self.store)
            }
        }
    }

    fn give_back(&self, c: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.0 == std::process::id() && idle.1.len() < 4 {
            idle.1.push(c);
        }
    }
}

fn read_only() -> io::Error {
    fs_err(libc::EROFS, "clients never write or discard lower tiers")
}

impl TierDevice for DaemonTier {
    fn read(&self, seg: u64, gen: u64, off: u64, buf: &mut [u8]) -> io::Result<()> {
        for (i, part) in buf.chunks_mut(MAX_TIER_READ as usize).enumerate() {
            let mut c = self.take()?;
            let req = Request::TierRead {
                tier: self.tier,
                seg,
                gen,
                off: off + (i * MAX_TIER_READ as usize) as u64,
                len: part.len() as u32,
            };
            match c.roundtrip(&req)? {
                Response::TierData(d) if d.len() == part.len() => {
                    part.copy_from_slice(&d);
                    self.give_back(c);
                }
                other => {
                    self.give_back(c);
                    return Err(response_error("read of the remote tier", other));
                }
            }
        }
        Ok(())
    }

    fn write_segment(&self, _seg: u64, _gen: u64, _off: u64, _data: &[u8]) -> io::Result<()> {
        Err(read_only())
    }

    fn discard(&self, _seg: u64, _gen: u64, _off: u64, _len: u64) -> io::Result<()> {
        Err(read_only())
    }
}
