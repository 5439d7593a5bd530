//! The Rust interface's guards: a thread switched into an address space holds a
//! [`Switched`] guard, and reaches segment memory only through it, so that nothing read
//! through an address space outlives the switch that made it reachable.
//!
//! Segment memory is never lent out as Rust references (other processes change it, and
//! it may not even be mapped after a switch): values are copied in and out (`T: Pod`),
//! and a [`SegPtr`] is a plain address, checked at every use against the segments of
//! the address space the thread is in. A pointer kept past a switch back to the primary
//! gives `EFAULT`, never another segment's bytes at the same address.

use crate::space::{CommitStats, SegId, SpaceJmp, Vh};
use bytemuck::{Pod, Zeroable};
use std::io;
use std::marker::PhantomData;

/// An address in a segment: what pointer-rich structures in segments store. Valid in
/// every process and across restarts (segments never move).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Pod, Zeroable)]
#[repr(transparent)]
pub struct SegPtr(pub u64);

impl SegPtr {
    pub const NULL: SegPtr = SegPtr(0);

    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `off` bytes further.
    pub fn offset(self, off: u64) -> SegPtr {
        SegPtr(self.0 + off)
    }
}

/// The calling thread switched into an address space. Dropping it drops the stores not
/// committed and switches the thread back to the primary address space.
pub struct Switched<'a> {
    sj: &'a SpaceJmp,
    vh: Vh,
    /// Not `Send`: locks and the current address space are the thread's.
    _thread: PhantomData<*const ()>,
}

impl SpaceJmp {
    /// Switch the calling thread into `vh`, waiting for its locks.
    pub fn enter(&self, vh: Vh) -> io::Result<Switched<'_>> {
        self.enter_with(vh, true)
    }

    /// Switch into `vh` if its locks are free now; else `EWOULDBLOCK`.
    pub fn try_enter(&self, vh: Vh) -> io::Result<Switched<'_>> {
        self.enter_with(vh, false)
    }

    fn enter_with(&self, vh: Vh, block: bool) -> io::Result<Switched<'_>> {
        self.guard_enter()?;
        if let Err(e) = self.switch_to(vh, block, false) {
            self.guard_leave();
            return Err(e);
        }
        Ok(Switched {
            sj: self,
            vh,
            _thread: PhantomData,
        })
    }
}

impl Switched<'_> {
    pub fn handle(&self) -> Vh {
        self.vh
    }

    /// Make the stores so far durable and visible to others, all or nothing.
    pub fn commit(&self) -> io::Result<CommitStats> {
        self.sj.commit()
    }

    /// Drop the stores since the last commit.
    pub fn abort(&self) -> io::Result<()> {
        self.sj.abort()
    }

    /// The `T` at `p`.
    pub fn get<T: Pod>(&self, p: SegPtr) -> io::Result<T> {
        let mut v = T::zeroed();
        self.sj.read(p.0, bytemuck::bytes_of_mut(&mut v))?;
        Ok(v)
    }

    /// Store `v` at `p`.
    pub fn set<T: Pod>(&self, p: SegPtr, v: T) -> io::Result<()> {
        self.sj.write(p.0, bytemuck::bytes_of(&v))
    }

    /// Copy bytes at `p`.
    pub fn read(&self, p: SegPtr, buf: &mut [u8]) -> io::Result<()> {
        self.sj.read(p.0, buf)
    }

    /// Store bytes at `p`.
    pub fn write(&self, p: SegPtr, data: &[u8]) -> io::Result<()> {
        self.sj.write(p.0, data)
    }

    /// Declare `[p, p + len)` as changed by this transaction before storing to it
    /// through a raw pointer (explicit mode: its old bytes go to the undo log, and the
    /// commit logs it; [`Switched::write`] declares what it stores by itself). A no-op
    /// in snapshot mode.
    pub fn tx_add(&self, p: SegPtr, len: u64) -> io::Result<()> {
        self.sj.tx_add(p.0, len)
    }

    /// A new `T` in segment `seg`'s heap, set to `v`.
    pub fn alloc<T: Pod>(&self, seg: SegId, v: T) -> io::Result<SegPtr> {
        let p = SegPtr(self.sj.alloc(seg, std::mem::size_of::<T>() as u64)?);
        self.set(p, v)?;
        Ok(p)
    }

    /// `n` bytes of segment `seg`'s heap.
    pub fn alloc_bytes(&self, seg: SegId, n: u64) -> io::Result<SegPtr> {
        self.sj.alloc(seg, n).map(SegPtr)
    }

    pub fn free(&self, p: SegPtr) -> io::Result<()> {
        self.sj.free(p.0)
    }

    /// Root `name` of segment `seg`.
    pub fn root(&self, seg: SegId, name: &str) -> io::Result<Option<SegPtr>> {
        self.sj.root(seg, name).map(|r| r.map(SegPtr))
    }

    pub fn set_root(&self, seg: SegId, name: &str, p: SegPtr) -> io::Result<()> {
        self.sj.set_root(seg, name, p.0)
    }
}

impl Drop for Switched<'_> {
    fn drop(&mut self) {
        let _ = self.sj.switch_to(Vh::PRIMARY, true, false);
        self.sj.guard_leave();
    }
}
