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

/// Whether the owner of word `w` (a thread or process id and a start-time hash) is gone:
/// no such task, a zombie, or another task that got the number since.
pub fn owner_dead(w: u64) -> bool {
    if w == 0 {
        return false;
    }
    let id = (w >> 32) as u32;
    match proc_stat(id) {
        None => true,
        Some((start, state)) => {
            matches!(state, 'Z' | 'X' | 'x') || hash32(start) != (w & 0xffff_ffff)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_alive_or_dead() {
        assert!(!owner_dead(thread_word()));
        assert!(!owner_dead(process_word()));
        // A pid that does not exist, and ours with another start time.
        assert!(owner_dead((4_000_000u64 << 32) | 5));
        assert!(owner_dead(process_word() ^ 0x5555));
    }
}
