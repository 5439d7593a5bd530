//! The lease table, as one owned type: which leases this client holds (PROTOCOL.md,
//! "Leases"), for which generation of the slot's leases, and the bookkeeping that keeps
//! a grant from being trusted when a revocation of the same inode crossed it (the grant
//! is asked for without the state lock; the upcall thread may revoke meanwhile).
//!
//! Invariant (checked builds, after each change): revocations are remembered per inode
//! only while acquisitions are in flight (`revoked_at` is empty when `acquiring` is 0).

use crate::overlay::InoMap;

/// What this client holds on an inode (PROTOCOL.md, "Leases").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    Read,
    Write,
    /// Shared-write mode: read from the shared area, change through the daemon
    /// (`Commit`).
    Mediated,
}

/// The lease table (see the module documentation).
pub(crate) struct LeaseTable {
    held: InoMap<Lease>,
    /// The slot's `lease_gen` these leases belong to.
    gen: u64,
    /// Revocations answered so far, and per inode the count at its latest one (kept
    /// only while acquisitions are in flight).
    revokes: u64,
    revoked_at: InoMap<u64>,
    /// Acquisitions in flight (asked for without the state lock).
    acquiring: u32,
}

/// An acquisition in flight: the revocation count when it started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acquiring(u64);

impl LeaseTable {
    /// No lease, for generation `gen` of the slot's leases.
    pub(crate) fn new(gen: u64) -> LeaseTable {
        LeaseTable {
            held: InoMap::default(),
            gen,
            revokes: 0,
            revoked_at: InoMap::default(),
            acquiring: 0,
        }
    }

    fn check(&self) {
        debug_assert!(
            self.acquiring > 0 || self.revoked_at.is_empty(),
            "revocations remembered with no acquisition in flight"
        );
    }

    /// The lease held on `ino`.
    pub(crate) fn get(&self, ino: u64) -> Option<Lease> {
        self.held.get(&ino).copied()
    }

    pub(crate) fn contains(&self, ino: u64) -> bool {
        self.held.contains_key(&ino)
    }

    /// Hold `l` on `ino` (an inode this client just created holds the write lease).
    pub(crate) fn set(&mut self, ino: u64, l: Lease) {
        self.held.insert(ino, l);
    }

    /// No lease on `ino` any more.
    pub(crate) fn remove(&mut self, ino: u64) {
        self.held.remove(&ino);
    }

    /// The generation of the slot's leases these belong to.
    pub(crate) fn gen(&self) -> u64 {
        self.gen
    }

    /// The daemon took every lease away: none is held, for generation `gen`.
    pub(crate) fn lost_all(&mut self, gen: u64) {
        self.gen = gen;
        self.held.clear();
    }

    /// A restarted daemon is told the leases held (`(ino, write)`), except shared-write
    /// ones, which do not outlive a daemon and are dropped here; none if the slot's
    /// leases changed generation (`gen`) meanwhile.
    pub(crate) fn for_reattach(&mut self, gen: u64) -> Vec<(u64, bool)> {
        self.held.retain(|_, l| *l != Lease::Mediated);
        if gen != self.gen {
            return Vec::new();
        }
        self.held
            .iter()
            .map(|(&i, &l)| (i, l == Lease::Write))
            .collect()
    }

    /// An acquisition starts (without the state lock): finish it with
    /// [`LeaseTable::granted`] or [`LeaseTable::refused`].
    pub(crate) fn acquiring(&mut self) -> Acquiring {
        self.acquiring += 1;
        Acquiring(self.revokes)
    }

    /// Whether a revocation of `ino` was answered since acquisition `a` started (its
    /// grant may be the one revoked: it is not trusted). Ends the acquisition.
    fn end(&mut self, ino: u64, a: Acquiring) -> bool {
        debug_assert!(self.acquiring > 0, "an acquisition ended twice");
        self.acquiring = self.acquiring.saturating_sub(1);
        let crossed = self.revoked_at.get(&ino).is_some_and(|&r| r > a.0);
        if self.acquiring == 0 {
            self.revoked_at.clear();
        }
        self.check();
        crossed
    }

    /// Acquisition `a` of `ino` ended with a grant of `l` (`Lease::Read`,
    /// `Lease::Write` or `Lease::Mediated`). Returns whether it holds: not if a
    /// revocation of `ino` crossed it (then the caller asks again). A read grant does not
    /// take away a write lease held.
    pub(crate) fn granted(&mut self, ino: u64, a: Acquiring, l: Lease) -> bool {
        if self.end(ino, a) {
            return false;
        }
        let held = self.held.entry(ino).or_insert(l);
        if !(l == Lease::Read && *held == Lease::Write) {
            *held = l;
        }
        true
    }

    /// Acquisition `a` of `ino` ended without a grant.
    pub(crate) fn refused(&mut self, ino: u64, a: Acquiring) {
        self.end(ino, a);
    }

    /// The daemon revoked the lease on `ino` (the upcall thread).
    pub(crate) fn revoked(&mut self, ino: u64) {
        self.held.remove(&ino);
        self.revokes += 1;
        if self.acquiring > 0 {
            self.revoked_at.insert(ino, self.revokes);
        }
        self.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_crossed_by_a_revocation_of_its_inode_is_not_trusted() {
        let mut t = LeaseTable::new(1);
        let a = t.acquiring();
        let b = t.acquiring();
        t.revoked(5);
        assert!(!t.granted(5, a, Lease::Write), "crossed");
        assert_eq!(t.get(5), None);
        assert!(t.granted(6, b, Lease::Read), "another inode's revocation");
        assert_eq!(t.get(6), Some(Lease::Read));
        // Started after the revocation: trusted.
        let c = t.acquiring();
        assert!(t.granted(5, c, Lease::Write));
        let d = t.acquiring();
        assert!(t.granted(5, d, Lease::Read));
        assert_eq!(
            t.get(5),
            Some(Lease::Write),
            "a read grant keeps a write lease"
        );
        t.revoked(5);
        assert_eq!(t.get(5), None);
    }

    #[test]
    fn a_reattach_keeps_leases_of_the_same_generation_but_not_shared_write_ones() {
        let mut t = LeaseTable::new(3);
        t.set(1, Lease::Write);
        t.set(2, Lease::Mediated);
        t.set(4, Lease::Read);
        let mut l = t.for_reattach(3);
        l.sort_unstable();
        assert_eq!(l, vec![(1, true), (4, false)]);
        assert!(!t.contains(2));
        assert!(t.for_reattach(4).is_empty());
        t.lost_all(4);
        assert_eq!((t.get(1), t.gen()), (None, 4));
    }
}
