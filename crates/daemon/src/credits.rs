//! Space credits a client can take without the core lock (ARCHITECTURE.md, "Space
//! credits").
//!
//! A client's log records are promised the blocks their digest may need (its *credits*),
//! asked for in chunks. The grant is counted against the free blocks under the core lock,
//! which a digest holds while it plans and allocates a batch: tens of milliseconds for a
//! slice of small random writes. A writer asking for credits then waited that long
//! for a few hundred more commits' worth. So every holder of the core lock sets part of
//! what it could grant aside in a *float*, under a lock of its own held for a few
//! instructions: a request the float covers is granted from it at once, and the blocks
//! taken are added to the client's credits the next time the core lock is held
//! ([`CreditFloat::drain`]).
//!
//! Invariant: the float's blocks (the pool and what each slot took) count as promised
//! ([`CreditFloat::held`]), so the core never grants them twice. Lock order: the core
//! lock, then the float's; [`CreditFloat::take`] takes only the float's.

use std::sync::{Mutex, MutexGuard};

/// The share of what the core could still grant that it sets aside in the pool.
const POOL_SHARE: u64 = 2;

#[derive(Debug)]
struct Float {
    /// Blocks set aside, promised to no client yet.
    pool: u64,
    /// Per slot: blocks taken from the pool, not yet added to the client's credits.
    taken: Vec<u64>,
}

/// The float (module documentation).
#[derive(Debug)]
pub(crate) struct CreditFloat {
    m: Mutex<Float>,
}

impl CreditFloat {
    pub(crate) fn new(nslots: usize) -> CreditFloat {
        CreditFloat {
            m: Mutex::new(Float {
                pool: 0,
                taken: vec![0; nslots],
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Float> {
        self.m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take `want` blocks for the client of `slot` if the pool holds them all (`false`:
    /// none taken; the caller grants under the core lock).
    pub(crate) fn take(&self, slot: u32, want: u64) -> bool {
        let mut f = self.lock();
        let Some(t) = f.taken.get(slot as usize).copied() else {
            return false;
        };
        if f.pool < want {
            return false;
        }
        f.pool -= want;
        f.taken[slot as usize] = t + want;
        true
    }

    /// Blocks in the float: promised, to a slot or to the pool.
    pub(crate) fn held(&self) -> u64 {
        let f = self.lock();
        f.pool + f.taken.iter().sum::<u64>()
    }

    /// Under the core lock: what `slot` took since the last call (the caller adds it to
    /// the client's credits, or drops it with a client that is gone).
    pub(crate) fn drain(&self, slot: u32) -> u64 {
        let mut f = self.lock();
        f.taken.get_mut(slot as usize).map_or(0, std::mem::take)
    }

    /// Under the core lock: give the pool back (the core grants it again).
    pub(crate) fn empty_pool(&self) {
        self.lock().pool = 0;
    }

    /// Under the core lock, which could still grant `available` blocks beyond the float:
    /// bring the pool up to a [`POOL_SHARE`]th of what the two hold together.
    pub(crate) fn refill(&self, available: u64) {
        let mut f = self.lock();
        let target = (available + f.pool) / POOL_SHARE;
        if f.pool < target {
            // target - pool <= available / POOL_SHARE: never more than the core has.
            f.pool = target;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_only_what_the_pool_holds_and_counts_it_held_until_drained() {
        let f = CreditFloat::new(2);
        assert!(!f.take(0, 1), "an empty pool grants nothing");
        f.refill(400 * POOL_SHARE);
        assert_eq!(f.held(), 400);
        assert!(f.take(0, 300));
        assert!(!f.take(1, 300), "100 left");
        assert!(!f.take(7, 1), "no such slot");
        assert_eq!(f.held(), 400, "taken blocks stay promised");
        assert_eq!(f.drain(0), 300);
        assert_eq!(f.drain(0), 0);
        assert_eq!(f.held(), 100);
        // The core could grant more: the pool grows to a share of what the two hold.
        f.refill(300 * POOL_SHARE - 100);
        assert_eq!(f.held(), 300);
        // It never shrinks by a refill (what it holds is promised already).
        f.refill(0);
        assert_eq!(f.held(), 300);
    }
}
