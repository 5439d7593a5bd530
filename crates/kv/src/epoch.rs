//! Epochs for safe reuse (Nibble's distributed epochs, with a global counter instead of
//! the time-stamp counter): every thread that reads records publishes, in a slot of its
//! own, the epoch it started reading under ([`Epochs::pin`]; 0 = not reading). A segment
//! emptied by compaction is retired at the current epoch, which then advances; it is
//! reused only once every pinned slot shows a later epoch ([`Epochs::min_pinned`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// One thread's slot, alone in its cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    epoch: AtomicU64,
    /// Pins of the owning thread now (only it touches this).
    depth: AtomicU64,
}

/// The epochs of one store.
pub struct Epochs {
    global: AtomicU64,
    slots: Mutex<Vec<Weak<Slot>>>,
    id: u64,
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
        if self.slot.depth.fetch_sub(1, Ordering::Relaxed) == 1 {
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
            slot.epoch
                .store(self.global.load(Ordering::Acquire), Ordering::SeqCst);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        Pin { slot }
    }

    /// The current epoch, then advance it (what is retired at the returned epoch can go
    /// once every pin is later).
    pub fn advance(&self) -> u64 {
        self.global.fetch_add(1, Ordering::SeqCst)
    }

    /// The oldest epoch a thread reads under (`u64::MAX`: none reads).
    pub fn min_pinned(&self) -> u64 {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|w| w.strong_count() > 0);
        slots
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| s.epoch.load(Ordering::Acquire))
            .filter(|&e| e != 0)
            .min()
            .unwrap_or(u64::MAX)
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
}
