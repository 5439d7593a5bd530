//! Owner words: a thread or a process named so that another process can tell whether
//! it is still there. A word is `id << 32 | h`, `id` a thread or process id and `h` a
//! hash of its start time (never 0), so a recycled id is not taken for the owner. Lock
//! tables and slot arrays that processes share in a mapping hold them: a process that
//! finds a word whose owner is gone ([`owner_dead`]) may take over what it held.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;

/// `(starttime, state)` of process or thread `id` from `/proc/<id>/stat`.
fn proc_stat(id: u32) -> Option<(u64, char)> {
    let s = std::fs::read_to_string(format!("/proc/{id}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); starttime is field 22.
    Some((f.get(19)?.parse().ok()?, f.first()?.chars().next()?))
}

fn hash32(v: u64) -> u64 {
    // A cheap mix; 0 is avoided so that a word is never 0 for a live owner.
    let h = v.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    (h & 0xffff_ffff).max(1)
}

/// Bumped in a child after `fork` that goes on using segments (a helper process): the
/// owner words cached before it are its parent's.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// In a child after `fork` (single-threaded): forget the owner words of the parent.
pub fn forked() {
    FORKS.fetch_add(1, SeqCst);
}

fn word_of(id: u32) -> u64 {
    let start = proc_stat(id).map_or(0, |s| s.0);
    (u64::from(id) << 32) | hash32(start)
}

/// The owner word of the calling thread (`tid << 32 | h`) and of the calling process.
pub fn thread_word() -> u64 {
    thread_local! {
        /// (`FORKS` when computed, the word).
        static WORD: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((u64::MAX, 0)) };
    }
    let forks = FORKS.load(SeqCst);
    WORD.with(|w| match w.get() {
        (f, word) if f == forks => word,
        _ => {
            let word = word_of(rustix::thread::gettid().as_raw_nonzero().get() as u32);
            w.set((forks, word));
            word
        }
    })
}

pub fn process_word() -> u64 {
    // No lock: a child after `fork` must not wait for one a parent's thread held.
    static AT: AtomicU64 = AtomicU64::new(u64::MAX);
    static WORD: AtomicU64 = AtomicU64::new(0);
    let forks = FORKS.load(SeqCst);
    if AT.load(SeqCst) == forks {
        return WORD.load(SeqCst);
    }
    let w = word_of(std::process::id());
    WORD.store(w, SeqCst);
    AT.store(forks, SeqCst);
    w
}

/// Whether process or thread `id` still runs: it exists and is not a zombie (which has
/// exited: its memory, binary and descriptors are released; only its parent has not
/// reaped it yet).
pub fn running(id: u32) -> bool {
    proc_stat(id).is_some_and(|(_, state)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// Whether the owner of word `w` (a thread or process id and a start-time hash) is gone:
/// no such task, a zombie, or another task that got the number since.
pub fn owner_dead(w: u64) -> bool {
    owner_dead_masked(w, 0xffff_ffff)
}

/// [`owner_dead`] for a word that keeps only the bits `mask` of the start-time hash (a
/// word packed with other fields).
pub fn owner_dead_masked(w: u64, mask: u64) -> bool {
    if w == 0 {
        return false;
    }
    let id = (w >> 32) as u32;
    match proc_stat(id) {
        None => true,
        Some((start, state)) => {
            matches!(state, 'Z' | 'X' | 'x') || hash32(start) & mask != (w & mask)
        }
    }
}

/// A lock in one word that processes share (a table of [`crate::words::Words`]): 0 when
/// free, else the [`thread_word`] of its holder. A waiter that finds the holder gone
/// (killed with the lock held) takes the lock over, and is told so
/// ([`Taken::FromDead`]): what the lock protects may be half changed, and the new
/// holder repairs it before it goes on.
#[derive(Clone, Copy)]
pub struct LockWord<'a>(pub &'a AtomicU64);

/// How a [`LockWord`] was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// From its last holder's release.
    Clean,
    /// From a holder that is gone (its owner word): repair what it protects.
    FromDead(u64),
}

impl LockWord<'_> {
    /// Take the lock if it is free or its holder is gone (`check_dead`: look, which
    /// reads `/proc`); `None` when a live thread holds it.
    fn attempt(&self, me: u64, check_dead: bool) -> Option<Taken> {
        let w = self.0.load(SeqCst);
        assert!(w != me, "a lock word taken twice by one thread");
        if w == 0 {
            return self
                .0
                .compare_exchange(0, me, SeqCst, SeqCst)
                .is_ok()
                .then_some(Taken::Clean);
        }
        (check_dead && owner_dead(w) && self.0.compare_exchange(w, me, SeqCst, SeqCst).is_ok())
            .then_some(Taken::FromDead(w))
    }

    /// Take the lock, waiting while a live thread holds it: spinning a little, then
    /// yielding, then sleeping (the holder may be a preempted thread that needs the
    /// CPU); whether the holder is gone is looked at now and then (it reads `/proc`).
    pub fn lock(&self) -> Taken {
        let me = thread_word();
        let mut spins = 0u32;
        loop {
            if let Some(t) = self.attempt(me, spins > 0 && spins.is_multiple_of(256)) {
                return t;
            }
            spins = spins.wrapping_add(1);
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// Release the lock (the calling thread holds it).
    pub fn unlock(&self) {
        let was = self.0.swap(0, SeqCst);
        debug_assert_eq!(was, thread_word(), "a lock word released by another thread");
    }

    /// Whether no one holds the lock now.
    pub fn is_free(&self) -> bool {
        self.0.load(SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock word held by a process that is killed: a waiter takes it over and is told
    /// whose it was.
    #[test]
    fn a_lock_word_held_by_a_killed_process_is_taken_over() {
        let path =
            std::env::temp_dir().join(format!("cairn-media-lockword-{}", std::process::id()));
        let words = crate::words::Words::file(&path, 1).unwrap();
        let lock = LockWord(&words.get()[0]);
        assert_eq!(lock.lock(), Taken::Clean);
        assert!(!lock.is_free());
        lock.unlock();
        assert!(lock.is_free());
        // The holder: another process (its owner word, as its thread would write it).
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let child_word = word_of(child.id());
        lock.0.store(child_word, SeqCst);
        assert_eq!(
            lock.attempt(thread_word(), true),
            None,
            "a live holder keeps it"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(lock.lock(), Taken::FromDead(child_word));
        lock.unlock();
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn owners_are_alive_or_dead() {
        assert!(!owner_dead(thread_word()));
        assert!(!owner_dead(process_word()));
        // A pid that does not exist, and ours with another start time.
        assert!(owner_dead((4_000_000u64 << 32) | 5));
        assert!(owner_dead(process_word() ^ 0x5555));
    }
}
