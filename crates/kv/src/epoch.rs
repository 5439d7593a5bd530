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
//!
//! The global epoch and the slots are [`Words`] (word 0, then [`SLOTS`] slots of 16
//! words, each alone in its cache lines: the owning process, the epoch, the pins now,
//! which opening of the store in that process), so threads of several processes can
//! share them. A thread claims a slot the first time it pins (a free one, or one whose
//! process is gone: `cairn_media::owner`) and gives it back when it exits; the slots of
//! an opening's threads still alive are given back when it closes (dropping its
//! [`Epochs`]), and their threads keep no reference to its table. A process that dies
//! pinned holds nothing back, since the minimum skips slots whose process is gone.

use cairn_media::owner::{owner_dead, process_word};
use cairn_media::words::Words;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Threads that can read one store at once (a thread past them waits for a slot).
pub const SLOTS: usize = 1024;
/// Words per slot, and where its fields are.
const SLOT_WORDS: usize = 16;
const OWNER: usize = 0;
const EPOCH: usize = 1;
const DEPTH: usize = 2;
/// The [`Epochs::id`] of the opening the slot's thread pins through (one process may
/// open a shared store more than once).
const OPENING: usize = 3;
/// The words of the epochs: the global epoch, then the slots (from word 16).
pub const WORDS: usize = SLOT_WORDS * (SLOTS + 1);

/// The epochs of one store, and what it retired.
pub struct Epochs {
    words: Arc<Words>,
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
    static MINE: RefCell<HashMap<u64, Claimed>> = RefCell::new(HashMap::new());
}

/// A thread's slot, given back when the thread exits (unless its store is closed:
/// closing gave it back).
struct Claimed {
    words: Weak<Words>,
    opening: u64,
    slot: usize,
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if let Some(words) = self.words.upgrade() {
            give_back(&words, self.slot, self.opening);
        }
    }
}

/// Give slot `i` back if it is still a slot of `opening` (the thread exiting and the
/// closing may both try; a thread may have claimed it since) and not pinned.
fn give_back(words: &Words, i: usize, opening: u64) {
    let w = slot_words(words, i);
    if w[DEPTH].load(Ordering::Acquire) == 0
        && w[OPENING]
            .compare_exchange(opening, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        w[OWNER].store(0, Ordering::Release);
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A new opening's id: unique in this process, and (a 64-bit mix of the process's
/// owner word and a counter) unlike any other process's, whose slots it may take over.
fn new_id() -> u64 {
    let mut z = process_word().wrapping_add(NEXT_ID.fetch_add(1, Ordering::Relaxed));
    // splitmix64's finalizer.
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// A pinned epoch (released at drop, on any thread).
pub struct Pin {
    words: Arc<Words>,
    slot: usize,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let w = slot_words(&self.words, self.slot);
        let depth = w[DEPTH].fetch_sub(1, Ordering::Relaxed);
        debug_assert!(depth >= 1, "a pin released twice");
        if depth == 1 {
            w[EPOCH].store(0, Ordering::Release);
        }
    }
}

impl Drop for Epochs {
    /// The store is closed: no thread of this process reads it any more, so the slots
    /// this opening's threads claimed go back now (each thread's own record of its slot
    /// holds no reference to the table, which is unmapped with this).
    fn drop(&mut self) {
        let me = process_word();
        for i in 0..SLOTS {
            let w = slot_words(&self.words, i);
            if w[OWNER].load(Ordering::Acquire) == me {
                give_back(&self.words, i, self.id);
            }
        }
    }
}

/// The words of slot `i`.
fn slot_words(words: &Words, i: usize) -> &[AtomicU64] {
    &words.get()[SLOT_WORDS * (i + 1)..SLOT_WORDS * (i + 2)]
}

impl Epochs {
    /// Epochs of the process's own.
    #[cfg(test)]
    pub fn new() -> io::Result<Epochs> {
        Epochs::on(Words::owned("cairn-kv-epochs", WORDS)?)
    }

    /// The epochs in `words` ([`WORDS`] of them: zeroed, or others' epochs, which this
    /// protocol keeps).
    pub fn on(words: Words) -> io::Result<Epochs> {
        if words.len() != WORDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("epochs of {} words, not {WORDS}", words.len()),
            ));
        }
        let _ = words.get()[0].compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
        Ok(Epochs {
            words: Arc::new(words),
            id: new_id(),
            retired: Mutex::new(Vec::new()),
        })
    }

    fn global(&self) -> &AtomicU64 {
        &self.words.get()[0]
    }

    /// This thread's slot (claimed on its first pin).
    fn my_slot(&self) -> usize {
        if let Some(i) = MINE.with(|m| m.borrow().get(&self.id).map(|c| c.slot)) {
            return i;
        }
        let slot = self.claim();
        let words = Arc::downgrade(&self.words);
        MINE.with(|m| {
            let mut m = m.borrow_mut();
            // The slots of stores closed since (given back at the closing).
            m.retain(|_, c| c.words.strong_count() > 0);
            m.insert(
                self.id,
                Claimed {
                    words,
                    opening: self.id,
                    slot,
                },
            )
        });
        slot
    }

    /// Claim a slot for this thread: a free one, else one whose process is gone (its
    /// fields reset), else wait for one.
    fn claim(&self) -> usize {
        let me = process_word();
        loop {
            for i in 0..SLOTS {
                let w = slot_words(&self.words, i);
                if w[OWNER]
                    .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    w[OPENING].store(self.id, Ordering::Relaxed);
                    return i;
                }
            }
            for i in 0..SLOTS {
                let w = slot_words(&self.words, i);
                let owner = w[OWNER].load(Ordering::Acquire);
                if owner != me
                    && owner_dead(owner)
                    && w[OWNER]
                        .compare_exchange(owner, me, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    w[DEPTH].store(0, Ordering::Relaxed);
                    w[EPOCH].store(0, Ordering::Release);
                    w[OPENING].store(self.id, Ordering::Relaxed);
                    return i;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Publish that this thread reads from now on (until the pin drops).
    pub fn pin(&self) -> Pin {
        let slot = self.my_slot();
        let w = slot_words(&self.words, slot);
        // A pin inside a pin keeps the outer (older) epoch.
        if w[DEPTH].fetch_add(1, Ordering::Relaxed) == 0 {
            let e = self.global().load(Ordering::Acquire);
            debug_assert!(e != 0, "epoch 0 pinned");
            w[EPOCH].store(e, Ordering::SeqCst);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        Pin {
            words: self.words.clone(),
            slot,
        }
    }

    /// The current epoch, then advance it (what is retired at the returned epoch can go
    /// once every pin is later).
    fn advance(&self) -> u64 {
        let e = self.global().fetch_add(1, Ordering::SeqCst);
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
    /// Slots of threads (of any process) that died pinned count as not reading.
    pub fn min_pinned(&self) -> u64 {
        let mut min = u64::MAX;
        for i in 0..SLOTS {
            let w = slot_words(&self.words, i);
            let e = w[EPOCH].load(Ordering::Acquire);
            if e != 0 && e < min && !owner_dead(w[OWNER].load(Ordering::Acquire)) {
                min = e;
            }
        }
        // The global epoch read after the slots: never earlier than a pinned one.
        debug_assert!(
            min == u64::MAX || min <= self.global().load(Ordering::SeqCst),
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

    /// Give every item up, quiescent or not (a process leaving a store others go on
    /// with: they take the items back another way).
    pub fn abandon(&mut self) -> Vec<u64> {
        self.list.drain(..).map(|(_, i)| i).collect()
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
        let e = Epochs::new().unwrap();
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
        let e = Epochs::new().unwrap();
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
        let e = Arc::new(Epochs::new().unwrap());
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
        let e = Epochs::new().unwrap();
        let _p = e.pin();
        e.retire(3);
        e.retire(3);
    }

    #[test]
    #[should_panic(expected = "an item retired twice")]
    fn check_finds_an_item_retired_twice() {
        let e = Epochs::new().unwrap();
        e.retire(3);
        let mut r = e.retired();
        r.list.push((u64::MAX, 3));
        r.check();
    }

    #[test]
    #[should_panic(expected = "retired out of order")]
    fn check_finds_retirements_out_of_order() {
        let e = Epochs::new().unwrap();
        e.retire(3);
        let mut r = e.retired();
        r.list.push((0, 4));
        r.check();
    }

    fn claimed(e: &Epochs) -> usize {
        (0..SLOTS)
            .filter(|&i| slot_words(&e.words, i)[OWNER].load(Ordering::Acquire) != 0)
            .count()
    }

    /// Threads give their slots back when they exit: many more threads than slots pin
    /// one after the other.
    #[test]
    fn exited_threads_give_their_slots_back() {
        let e = Arc::new(Epochs::new().unwrap());
        for _ in 0..(SLOTS + 200) / 50 {
            let ts: Vec<_> = (0..50)
                .map(|_| {
                    let e = e.clone();
                    std::thread::spawn(move || drop(e.pin()))
                })
                .collect();
            ts.into_iter().for_each(|t| t.join().unwrap());
        }
        assert_eq!(claimed(&e), 0);
        let _p = e.pin();
        assert_eq!(claimed(&e), 1);
    }

    /// The epochs file of [`a_process_killed_while_pinned_holds_nothing_back`].
    fn shared_at(path: &std::path::Path) -> Epochs {
        Epochs::on(Words::file(path, WORDS).unwrap()).unwrap()
    }

    /// Run by [`a_process_killed_while_pinned_holds_nothing_back`] in its child: pin,
    /// say so, and wait to be killed.
    #[test]
    #[ignore = "the other process of a_process_killed_while_pinned_holds_nothing_back"]
    fn epochs_child_process() {
        let Some(path) = std::env::var_os("CAIRN_KV_EPOCHS") else {
            return;
        };
        let e = shared_at(std::path::Path::new(&path));
        let _p = e.pin();
        println!("pinned");
        std::thread::sleep(std::time::Duration::from_secs(60));
    }

    /// Another process's pin holds retired items back while it lives; killed (SIGKILL,
    /// pinned), it holds nothing back, and its slot is taken by the next thread that
    /// needs one when none is free.
    #[test]
    fn a_process_killed_while_pinned_holds_nothing_back() {
        use std::io::BufRead;
        let path = std::env::temp_dir().join(format!("cairn-kv-epochs-{}", std::process::id()));
        let e = shared_at(&path);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "epoch::tests::epochs_child_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env("CAIRN_KV_EPOCHS", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("pinned") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        }
        std::fs::remove_file(&path).unwrap();
        e.retire(5);
        assert!(
            e.retired().take_quiescent().is_empty(),
            "the child's pin holds"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(items(e.retired().take_quiescent()), vec![5]);
        // Every other slot taken by a live owner: a new thread gets the dead one's.
        for i in 0..SLOTS {
            let _ = slot_words(&e.words, i)[OWNER].compare_exchange(
                0,
                process_word(),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        let e = Arc::new(e);
        let e2 = e.clone();
        let slot = std::thread::spawn(move || e2.my_slot()).join().unwrap();
        assert_eq!(slot_words(&e.words, slot)[EPOCH].load(Ordering::Acquire), 0);
    }

    /// Closing a store gives back the slots of its threads still alive and lets its
    /// table go at once; a second opening of the same shared table in this process keeps
    /// its own slots, and a thread of the closed one that exits later gives back nothing
    /// (its old slot may be another thread's by then).
    #[test]
    fn closing_gives_back_its_threads_slots_and_nothing_else() {
        let path =
            std::env::temp_dir().join(format!("cairn-kv-epochs-close-{}", std::process::id()));
        let (a, b) = (Arc::new(shared_at(&path)), Arc::new(shared_at(&path)));
        std::fs::remove_file(&path).unwrap();
        let mine = |e: &Epochs| {
            (0..SLOTS)
                .filter(|&i| {
                    let w = slot_words(&e.words, i);
                    w[OWNER].load(Ordering::Acquire) == process_word()
                        && w[OPENING].load(Ordering::Acquire) == e.id
                })
                .count()
        };
        // Three threads pin through each opening and stay alive.
        let (go, stop) = (
            Arc::new(std::sync::Barrier::new(7)),
            Arc::new(std::sync::Barrier::new(7)),
        );
        let threads: Vec<_> = (0..6)
            .map(|k| {
                let e = if k % 2 == 0 { a.clone() } else { b.clone() };
                let (go, stop) = (go.clone(), stop.clone());
                std::thread::spawn(move || {
                    drop(e.pin());
                    drop(e);
                    go.wait();
                    stop.wait();
                })
            })
            .collect();
        go.wait();
        assert_eq!((mine(&a), mine(&b)), (3, 3));
        let weak = Arc::downgrade(&a.words);
        drop(a);
        assert!(
            weak.upgrade().is_none(),
            "the closed store's table is let go"
        );
        assert_eq!(mine(&b), 3, "the other opening keeps its slots");
        assert_eq!(claimed(&b), 3, "the closed one's went back");
        // A new thread of the open one takes a slot the closed one gave back; the
        // closed one's threads exit and leave it alone.
        let b2 = b.clone();
        let held = std::thread::spawn(move || {
            let p = b2.pin();
            let slot = b2.my_slot();
            (p, slot)
        })
        .join()
        .unwrap();
        stop.wait();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let w = slot_words(&b.words, held.1);
        assert_eq!(w[OWNER].load(Ordering::Acquire), process_word());
        assert_eq!(w[DEPTH].load(Ordering::Acquire), 1, "still pinned");
        // The open one's three threads gave theirs back as they exited; the new
        // thread's slot stays claimed (it exited while its pin lived on elsewhere).
        drop(held);
        assert_eq!(mine(&b), 1);
    }
}
