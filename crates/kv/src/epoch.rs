//! Epochs for safe reuse (Nibble's distributed epochs, with a global counter instead of
//! the time-stamp counter): every thread that reads records publishes, in a slot of its
//! own, the epoch it started reading under ([`Epochs::pin`]; 0 = not reading). A segment
//! emptied by compaction is retired at the current epoch, which then advances
//! ([`Epochs::retire`]); it is reused only once every pinned slot shows a later epoch
//! ([`Retired::take_quiescent`], which alone makes the [`Quiescent`] that freeing a
//! segment takes).
//!
//! The invariants: the global epoch is never 0 (a slot's 0 means not reading) and only
//! grows; a pinned slot's epoch is never later than the global one; nesting pins keeps
//! the outer epoch, and a pin releases only what it pinned; an item is retired at most
//! once (until it is taken back), at an epoch later than every item retired before it;
//! an item is handed back only when every pinned epoch is later than its retirement's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// One thread's slot, alone in its cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    epoch: AtomicU64,
    /// Pins of the owning thread now (only it touches this).
    depth: AtomicU64,
}

/// The epochs of one store, and what it retired.
pub struct Epochs {
    global: AtomicU64,
    slots: Mutex<Vec<Weak<Slot>>>,
    id: u64,
    /// Items (segments emptied by compaction) by the epoch they were retired at, oldest
    /// first.
    retired: Mutex<Vec<(u64, u64)>>,
}

/// A retired item no reader can be in any more: only [`Retired::take_quiescent`] makes
/// one.
#[derive(Debug)]
pub struct Quiescent(u64);

impl Quiescent {
    pub fn item(&self) -> u64 {
        self.0
    }

    /// One for a unit test that has no epochs.
    #[cfg(test)]
    pub fn for_test(item: u64) -> Quiescent {
        Quiescent(item)
    }
}

/// The retired list, locked.
pub struct Retired<'a> {
    epochs: &'a Epochs,
    list: MutexGuard<'a, Vec<(u64, u64)>>,
}

thread_local! {
    /// This thread's slot in each store's epochs (by `Epochs::id`).
    static MINE: RefCell<HashMap<u64, Arc<Slot>>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A pinned epoch (released at drop).
pub struct Pin {
    slot: Arc<Slot>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let depth = self.slot.depth.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(depth >= 1, "a pin released twice");
        if depth == 1 {
            self.slot.epoch.store(0, Ordering::Release);
        }
    }
}

impl Epochs {
    pub fn new() -> Epochs {
        Epochs {
            global: AtomicU64::new(1),
            slots: Mutex::new(Vec::new()),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Publish that this thread reads from now on (until the pin drops).
    pub fn pin(&self) -> Pin {
        let slot = MINE.with(|m| {
            m.borrow_mut()
                .entry(self.id)
                .or_insert_with(|| {
                    let s = Arc::new(Slot::default());
                    self.slots
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Arc::downgrade(&s));
                    s
                })
                .clone()
        });
        // A pin inside a pin keeps the outer (older) epoch.
        if slot.depth.fetch_add(1, Ordering::Relaxed) == 0 {
            let e = self.global.load(Ordering::Acquire);
            debug_assert!(e != 0, "epoch 0 pinned");
            slot.epoch.store(e, Ordering::SeqCst);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        Pin { slot }
    }

    /// The current epoch, then advance it (what is retired at the returned epoch can go
    /// once every pin is later).
    fn advance(&self) -> u64 {
        let e = self.global.fetch_add(1, Ordering::SeqCst);
        assert!(e != 0 && e != u64::MAX, "the global epoch wrapped");
        e
    }

    /// Retire `item` (its index entries switched away already: no reader that pins
    /// from now on can find it) at the current epoch, which advances; the epoch.
    pub fn retire(&self, item: u64) -> u64 {
        let mut list = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            list.iter().all(|&(_, i)| i != item),
            "{item}: retired twice"
        );
        let at = self.advance();
        assert!(
            list.last().is_none_or(|&(e, _)| e < at),
            "retired at {at}, after an item retired later"
        );
        list.push((at, item));
        at
    }

    /// Lock the retired list.
    pub fn retired(&self) -> Retired<'_> {
        Retired {
            epochs: self,
            list: self.retired.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The oldest epoch a thread reads under (`u64::MAX`: none reads).
    pub fn min_pinned(&self) -> u64 {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|w| w.strong_count() > 0);
        let min = slots
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| s.epoch.load(Ordering::Acquire))
            .filter(|&e| e != 0)
            .min()
            .unwrap_or(u64::MAX);
        // The global epoch read after the slots: never earlier than a pinned one.
        debug_assert!(
            min == u64::MAX || min <= self.global.load(Ordering::SeqCst),
            "epoch {min} pinned, later than the global epoch"
        );
        min
    }
}

impl Retired<'_> {
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The retired items, oldest first.
    pub fn items(&self) -> impl Iterator<Item = u64> + '_ {
        self.list.iter().map(|&(_, i)| i)
    }

    /// Take the items that no reader can be in any more: retired at an epoch before
    /// every pinned one. The oldest pinned epoch is read under the list's lock: every
    /// item retired by then had its index entries switched before, so a reader that
    /// pins later cannot find it.
    pub fn take_quiescent(&mut self) -> Vec<Quiescent> {
        let min = self.epochs.min_pinned();
        let mut quiet = Vec::new();
        self.list.retain(|&(e, i)| {
            let keep = e >= min;
            if !keep {
                assert!(e < min, "{i}: taken back at {e}, a reader at {min}");
                quiet.push(Quiescent(i));
            }
            keep
        });
        quiet
    }

    /// Check that the list is in retirement order, each item once (for a quiescent
    /// store).
    pub fn check(&self) {
        for w in self.list.windows(2) {
            assert!(w[0].0 < w[1].0, "retired out of order: {w:?}");
        }
        let mut items: Vec<u64> = self.items().collect();
        items.sort_unstable();
        let n = items.len();
        items.dedup();
        assert_eq!(items.len(), n, "an item retired twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_hold_back_the_minimum() {
        let e = Epochs::new();
        assert_eq!(e.min_pinned(), u64::MAX);
        let p = e.pin();
        let at = e.advance();
        assert_eq!(e.min_pinned(), at);
        {
            let _inner = e.pin();
            e.advance();
            assert_eq!(e.min_pinned(), at, "a nested pin keeps the outer epoch");
        }
        assert_eq!(
            e.min_pinned(),
            at,
            "the outer pin holds after the inner one"
        );
        drop(p);
        assert_eq!(e.min_pinned(), u64::MAX);
        let e2 = std::sync::Arc::new(e);
        let t = {
            let e2 = e2.clone();
            std::thread::spawn(move || {
                let _p = e2.pin();
                std::thread::sleep(std::time::Duration::from_millis(50));
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(e2.min_pinned() < u64::MAX, "another thread's pin counts");
        t.join().unwrap();
        assert_eq!(e2.min_pinned(), u64::MAX);
    }

    fn items(q: Vec<Quiescent>) -> Vec<u64> {
        q.iter().map(Quiescent::item).collect()
    }

    #[test]
    fn retired_items_wait_for_the_readers_before_them() {
        let e = Epochs::new();
        let a = e.retire(7);
        assert_eq!(
            items(e.retired().take_quiescent()),
            vec![7],
            "no reader: at once"
        );
        let p = e.pin();
        let b = e.retire(8);
        assert!(b > a, "each retirement advances the epoch");
        let q = {
            // A reader that pins after the retirement cannot find the item: it does not
            // hold it back.
            let _late = e.pin();
            e.retire(9)
        };
        let mut retired = e.retired();
        assert!(
            retired.take_quiescent().is_empty(),
            "the early pin holds both"
        );
        assert_eq!(
            (retired.len(), retired.items().collect::<Vec<_>>()),
            (2, vec![8, 9])
        );
        retired.check();
        drop(retired);
        drop(p);
        let _later = e.pin();
        assert!(q > b);
        assert_eq!(items(e.retired().take_quiescent()), vec![8, 9]);
        assert!(e.retired().is_empty());
        // Taken back, an item can be retired again (a segment reused and emptied).
        e.retire(7);
    }

    #[test]
    fn a_reader_in_another_thread_holds_retired_items() {
        let e = Arc::new(Epochs::new());
        let (pinned, release) = (
            Arc::new(std::sync::Barrier::new(2)),
            Arc::new(std::sync::Barrier::new(2)),
        );
        let t = {
            let (e, pinned, release) = (e.clone(), pinned.clone(), release.clone());
            std::thread::spawn(move || {
                let _p = e.pin();
                pinned.wait();
                release.wait();
            })
        };
        pinned.wait();
        e.retire(3);
        assert!(e.retired().take_quiescent().is_empty());
        release.wait();
        t.join().unwrap();
        assert_eq!(items(e.retired().take_quiescent()), vec![3]);
    }

    #[test]
    #[should_panic(expected = "3: retired twice")]
    fn retiring_twice_is_caught() {
        let e = Epochs::new();
        let _p = e.pin();
        e.retire(3);
        e.retire(3);
    }

    #[test]
    #[should_panic(expected = "an item retired twice")]
    fn check_finds_an_item_retired_twice() {
        let e = Epochs::new();
        e.retire(3);
        let mut r = e.retired();
        r.list.push((u64::MAX, 3));
        r.check();
    }

    #[test]
    #[should_panic(expected = "retired out of order")]
    fn check_finds_retirements_out_of_order() {
        let e = Epochs::new();
        e.retire(3);
        let mut r = e.retired();
        r.list.push((0, 4));
        r.check();
    }
}
