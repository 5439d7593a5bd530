//! The index: an open-addressing hash table of cache-line buckets with optimistic
//! concurrency (Nibble's design). A bucket holds [`SLOTS`] entries (key hash, record
//! location) and a version word: readers read the version (even), scan, and read it
//! again (a change means a writer came by: retry); writers make it odd (a compare and
//! swap, the bucket's lock) for the whole operation on a key whose home it is, and even
//! again. A key lives in its home bucket (the hash scaled to the table) or, when that
//! was full, in one of the next buckets (each bucket remembers that an insert went past
//! it: `overflow`).
//! Free slots are claimed by compare-and-swap, so no other lock is ever taken while a
//! home lock is held (no lock order to keep). Hashes are 64-bit; every match is
//! confirmed by the caller against the key stored in the record.
//!
//! Keys come from the network (`cairn kv serve`), so their hash is keyed
//! ([`Index::key_hash`]: SipHash-1-3 under two random 64-bit keys chosen for each index,
//! which lives in memory only and is rebuilt at every open): a client cannot choose keys
//! that all land in one neighbourhood of buckets, which would make inserts probe far and
//! then fail as if the table were full.
//!
//! The table is [`Words`]: bucket `i` is words `16i .. 16i + 16` (a cache-line pair:
//! version, overflow flag, [`SLOTS`] hashes, [`SLOTS`] locations, 0 = empty), in the
//! process's memory or in a mapping processes share, where the same protocol holds
//! between processes.

use cairn_media::words::Words;
use std::hash::Hasher;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries per bucket.
pub const SLOTS: usize = 7;
/// Buckets an insert probes before the table counts as full.
const MAX_PROBE: usize = 32;
/// Words per bucket, and where its fields are.
const BUCKET_WORDS: usize = 16;
const VERSION: usize = 0;
const OVERFLOW: usize = 1;
const HASH: usize = 2;
const LOC: usize = HASH + SLOTS;
const _: () = assert!(LOC + SLOTS == BUCKET_WORDS);

/// One bucket's words.
#[derive(Clone, Copy)]
struct Bucket<'a>(&'a [AtomicU64]);

impl<'a> Bucket<'a> {
    fn version(self) -> &'a AtomicU64 {
        &self.0[VERSION]
    }

    fn overflow(self) -> &'a AtomicU64 {
        &self.0[OVERFLOW]
    }

    fn hash(self, s: usize) -> &'a AtomicU64 {
        &self.0[HASH + s]
    }

    fn loc(self, s: usize) -> &'a AtomicU64 {
        &self.0[LOC + s]
    }

    #[cfg(test)]
    fn locs(self) -> &'a [AtomicU64] {
        &self.0[LOC..LOC + SLOTS]
    }

    fn is(self, other: Bucket<'_>) -> bool {
        std::ptr::eq(self.0.as_ptr(), other.0.as_ptr())
    }
}

/// The bits of a locked bucket's word: odd, the holding process's id (22 bits, Linux's
/// largest `pid_max`), 20 bits of the hash of its start time
/// (`cairn_media::owner::process_word`), and 21 bits of the version it was locked at.
const PID_BITS: u32 = 22;
const HASH_BITS: u32 = 20;
const LOW_BITS: u32 = 21;
const _: () = assert!(1 + PID_BITS + HASH_BITS + LOW_BITS == 64);

/// The word of a bucket locked at version `v` (even) by the process of owner word
/// `owner`.
fn locked_word(owner: u64, v: u64) -> u64 {
    let pid = (owner >> 32) & ((1 << PID_BITS) - 1);
    let hash = owner & ((1 << HASH_BITS) - 1);
    let low = (v >> 1) & ((1 << LOW_BITS) - 1);
    1 | pid << 1 | hash << (1 + PID_BITS) | low << (1 + PID_BITS + HASH_BITS)
}

/// The holder of a locked bucket's word, as an owner word that keeps only the low
/// [`HASH_BITS`] of the hash.
fn holder(w: u64) -> u64 {
    let pid = (w >> 1) & ((1 << PID_BITS) - 1);
    let hash = (w >> (1 + PID_BITS)) & ((1 << HASH_BITS) - 1);
    pid << 32 | hash
}

/// The version a bucket taken over from a dead holder (its locked word `w`) is released
/// at: one no reader can have read before the holder took it (those agree with `w`'s
/// low bits of the version, this one does not).
fn version_after(w: u64) -> u64 {
    let low = (w >> (1 + PID_BITS + HASH_BITS)) + 1;
    (low & ((1 << LOW_BITS) - 1)) << 1
}

/// The index.
pub struct Index {
    table: Words,
    /// The keys of [`Index::key_hash`].
    keys: [u64; 2],
}

/// A write lock on a bucket (released at drop).
pub struct Locked<'a> {
    b: Bucket<'a>,
    /// The version it is released at.
    release: u64,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.b.version().store(self.release, Ordering::Release);
    }
}

impl Index {
    /// The buckets for about `entries` entries (about 70% full).
    pub fn buckets_for(entries: u64) -> usize {
        ((entries as f64 / (SLOTS as f64 * 0.7)).ceil() as usize).max(16)
    }

    /// The words of a table of `buckets` buckets.
    pub fn words_for(buckets: usize) -> usize {
        buckets * BUCKET_WORDS
    }

    /// A table of the process's own for about `entries` entries, under random keys.
    #[cfg(test)]
    pub fn new(entries: u64) -> io::Result<Index> {
        let n = Self::buckets_for(entries);
        let mut keys = [0u8; 16];
        getrandom::getrandom(&mut keys).map_err(|e| io::Error::other(e.to_string()))?;
        let k = |i: usize| u64::from_le_bytes(keys[i..i + 8].try_into().unwrap());
        Index::on(
            Words::owned("cairn-kv-index", Self::words_for(n))?,
            [k(0), k(8)],
        )
    }

    /// The index whose table is `table` (zeroed, or one this index's protocol keeps:
    /// another process's, which hashes under the same `keys`).
    pub fn on(table: Words, keys: [u64; 2]) -> io::Result<Index> {
        let n = table.len() / BUCKET_WORDS;
        if n == 0 || table.len() != n * BUCKET_WORDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("an index table of {} words", table.len()),
            ));
        }
        Ok(Index { table, keys })
    }

    /// The hash of `key` in this index (keyed: see the module docs).
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        let mut h = siphasher::sip::SipHasher13::new_with_keys(self.keys[0], self.keys[1]);
        h.write(key);
        h.finish()
    }

    fn bucket(&self, i: usize) -> Bucket<'_> {
        Bucket(&self.table.get()[i * BUCKET_WORDS..(i + 1) * BUCKET_WORDS])
    }

    /// The home bucket of `hash` (its high bits scaled to the table: any size works).
    fn home(&self, hash: u64) -> usize {
        ((hash as u128 * self.buckets() as u128) >> 64) as usize
    }

    /// The bucket after `i` (wrapping).
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.buckets() {
            0
        } else {
            i + 1
        }
    }

    /// Lock bucket `b` if it is free now.
    fn try_lock(b: Bucket<'_>) -> Option<Locked<'_>> {
        let v = b.version().load(Ordering::Relaxed);
        let me = locked_word(cairn_media::owner::process_word(), v);
        (v & 1 == 0
            && b.version()
                .compare_exchange(v, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok())
        // Made only once taken (a `Locked` releases the bucket when it drops).
        .then(|| Locked {
            b,
            release: v.wrapping_add(2),
        })
    }

    fn lock(&self, i: usize) -> Locked<'_> {
        let b = self.bucket(i);
        let mut spins = 0u32;
        loop {
            if let Some(l) = Self::try_lock(b) {
                return l;
            }
            self.wait(b, &mut spins);
        }
    }

    /// Wait for a bucket's writer: spin a little, then let other threads run (the
    /// writer may be one that was preempted: with more busy threads than CPUs, as a
    /// server and its clients on two cores, spinning on would burn the time slice it
    /// needs); now and then, look whether its process is gone (killed with the lock
    /// held: [`Index::break_dead`]).
    fn wait(&self, b: Bucket<'_>, spins: &mut u32) {
        *spins = spins.wrapping_add(1);
        if *spins < 64 {
            std::hint::spin_loop();
        } else {
            if spins.is_multiple_of(1024) {
                Self::break_dead(b);
            }
            std::thread::yield_now();
        }
    }

    /// Release bucket `b`'s lock if the process holding it is gone. Its change of a
    /// key is cut short, which leaves what readers and writers already tolerate: an
    /// entry not inserted yet (its record is durable, so a recovery finds it: a put in
    /// flight when its process died is not seen until the store is next rebuilt), an
    /// entry whose hash is cleared and location not yet (a deletion: found by no one,
    /// its slot lost until the next rebuild), a slot claimed for an entry not yet
    /// named (the same). Returns whether it did.
    fn break_dead(b: Bucket<'_>) -> bool {
        let w = b.version().load(Ordering::Acquire);
        if w & 1 == 0 || !cairn_media::owner::owner_dead_masked(holder(w), (1 << HASH_BITS) - 1) {
            return false;
        }
        let v = version_after(w);
        b.version()
            .compare_exchange(w, v, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The location of the entry for `hash` that `is_key` accepts, read optimistically.
    pub fn get(&self, hash: u64, is_key: &dyn Fn(u64) -> bool) -> Option<u64> {
        let mut i = self.home(hash);
        let mut spins = 0u32;
        for _ in 0..MAX_PROBE {
            let b = self.bucket(i);
            let (found, more) = loop {
                let v = b.version().load(Ordering::Acquire);
                if v & 1 == 1 {
                    self.wait(b, &mut spins);
                    continue;
                }
                let mut found = None;
                for s in 0..SLOTS {
                    if b.hash(s).load(Ordering::Acquire) == hash {
                        let loc = b.loc(s).load(Ordering::Acquire);
                        if loc != 0 && is_key(loc) {
                            found = Some(loc);
                            break;
                        }
                    }
                }
                let more = b.overflow().load(Ordering::Acquire) != 0;
                if b.version().load(Ordering::Acquire) == v {
                    break (found, more);
                }
            };
            if found.is_some() || !more {
                return found;
            }
            i = self.next(i);
        }
        None
    }

    /// Run `f` on the location of the entry for `hash` that `is_key` accepts, and return
    /// its result only if no writer held the home bucket meanwhile (a seqlock over the
    /// home bucket, whose lock every writer of the key holds, in-place writers included:
    /// `f` may see bytes being rewritten, and is then run again). `None`: no entry.
    pub fn read<R>(
        &self,
        hash: u64,
        is_key: &dyn Fn(u64) -> bool,
        mut f: impl FnMut(u64) -> R,
    ) -> Option<R> {
        let home = self.bucket(self.home(hash));
        let mut spins = 0u32;
        loop {
            let v = home.version().load(Ordering::Acquire);
            if v & 1 == 1 {
                self.wait(home, &mut spins);
                continue;
            }
            let r = self.get(hash, is_key).map(&mut f);
            std::sync::atomic::fence(Ordering::Acquire);
            if home.version().load(Ordering::Relaxed) == v {
                return r;
            }
        }
    }

    /// Buckets in the table.
    pub fn buckets(&self) -> usize {
        self.table.len() / BUCKET_WORDS
    }

    /// The locations of the entries in bucket `i`, read optimistically (for scans).
    pub fn bucket_locations(&self, i: usize) -> Vec<u64> {
        let b = self.bucket(i);
        let mut spins = 0u32;
        loop {
            let v = b.version().load(Ordering::Acquire);
            if v & 1 == 1 {
                self.wait(b, &mut spins);
                continue;
            }
            // Entries with a hash (one cleared is being removed).
            let locs: Vec<u64> = (0..SLOTS)
                .filter(|&s| b.hash(s).load(Ordering::Acquire) != 0)
                .map(|s| b.loc(s).load(Ordering::Acquire))
                .filter(|&l| l != 0)
                .collect();
            if b.version().load(Ordering::Acquire) == v {
                return locs;
            }
        }
    }

    /// The entries of the table (hash and location set), counted under every bucket's
    /// lock, then `with(count)` run before the locks go: to put right a count kept beside
    /// the table. The locks are taken in order, a dead holder's broken, so no writer is
    /// in the middle of a change meanwhile (readers wait). No deadlock: a writer never
    /// waits for a lock while it holds one (a batch only tries further ones).
    pub fn count_locked<R>(&self, with: impl FnOnce(u64) -> R) -> R {
        let locks: Vec<Locked<'_>> = (0..self.buckets()).map(|i| self.lock(i)).collect();
        let n = locks
            .iter()
            .map(|l| {
                (0..SLOTS)
                    .filter(|&s| {
                        l.b.hash(s).load(Ordering::Acquire) != 0
                            && l.b.loc(s).load(Ordering::Acquire) != 0
                    })
                    .count() as u64
            })
            .sum();
        with(n)
    }

    /// Buckets' bytes (for the store's memory figures).
    pub fn bytes(&self) -> u64 {
        self.table.len() as u64 * 8
    }

    /// [`Index::get`] for the holder of the key's lock ([`Index::lock_key`]): only the
    /// key's writers change its entry, so no version needs checking (and the home
    /// bucket's is odd: the caller's own lock).
    pub fn get_locked(
        &self,
        held: &Locked<'_>,
        hash: u64,
        is_key: &dyn Fn(u64) -> bool,
    ) -> Option<u64> {
        let mut i = self.home(hash);
        debug_assert!(held.b.is(self.bucket(i)));
        for _ in 0..MAX_PROBE {
            let b = self.bucket(i);
            for s in 0..SLOTS {
                let l = b.loc(s).load(Ordering::Acquire);
                if l != 0 && b.hash(s).load(Ordering::Acquire) == hash && is_key(l) {
                    return Some(l);
                }
            }
            if b.overflow().load(Ordering::Acquire) == 0 {
                return None;
            }
            i = self.next(i);
        }
        None
    }

    /// The lock on the home bucket of `hash`, if no one holds it.
    pub fn try_lock_key(&self, hash: u64) -> Option<Locked<'_>> {
        Self::try_lock(self.bucket(self.home(hash)))
    }

    /// Whether `held` is the lock on the home bucket of `hash`.
    pub fn covers(&self, held: &Locked<'_>, hash: u64) -> bool {
        held.b.is(self.bucket(self.home(hash)))
    }

    /// Lock the home bucket of `hash`: every change to a key happens under it.
    pub fn lock_key(&self, hash: u64) -> Locked<'_> {
        self.lock(self.home(hash))
    }

    /// Under the key's lock ([`Index::lock_key`]): set the location of the entry for
    /// `hash` that `is_key` accepts to `loc` (0 removes it), inserting it if there is
    /// none. Returns the previous location (0: none), or `Err(())` when the table has no
    /// room for a new entry. Only the key's writers (serialized by its home bucket's
    /// lock) change its entry; a free slot is claimed with a compare-and-swap of its
    /// location, so writers of other keys whose probes pass through never take the same
    /// slot; readers confirm every candidate against the record's key.
    pub fn set(
        &self,
        held: &Locked<'_>,
        hash: u64,
        is_key: &dyn Fn(u64) -> bool,
        loc: u64,
    ) -> Result<u64, ()> {
        let home = self.home(hash);
        debug_assert!(held.b.is(self.bucket(home)));
        let mut i = home;
        for _ in 0..MAX_PROBE {
            let b = self.bucket(i);
            for s in 0..SLOTS {
                let l = b.loc(s).load(Ordering::Acquire);
                if l != 0 && b.hash(s).load(Ordering::Acquire) == hash && is_key(l) {
                    if loc == 0 {
                        b.hash(s).store(0, Ordering::Release);
                    }
                    b.loc(s).store(loc, Ordering::Release);
                    return Ok(l);
                }
            }
            if b.overflow().load(Ordering::Acquire) == 0 {
                break;
            }
            i = self.next(i);
        }
        if loc == 0 {
            return Ok(0);
        }
        // A new entry: the first slot free from home on. The buckets passed on the way
        // remember it first, so that a reader that finds the entry found the way too.
        let mut j = home;
        for _ in 0..MAX_PROBE {
            let b = self.bucket(j);
            for s in 0..SLOTS {
                if b.loc(s)
                    .compare_exchange(0, loc, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    b.hash(s).store(hash, Ordering::Release);
                    return Ok(0);
                }
            }
            b.overflow().store(1, Ordering::Release);
            j = self.next(j);
        }
        Err(())
    }

    /// Every location in the table (no concurrent writer).
    #[cfg(test)]
    pub fn locations(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.buckets())
            .flat_map(|i| {
                self.bucket(i)
                    .locs()
                    .iter()
                    .map(|l| l.load(Ordering::Acquire))
            })
            .filter(|&l| l != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    /// Keys chosen to share one home bucket under an unkeyed hash (the directory hash,
    /// which this index used before) spread over the table under the keyed one, so
    /// inserting all of them works; under the unkeyed hash the table counts as full
    /// after a few hundred.
    /// A lock that is not taken changes nothing (a planted `then_some`, which builds
    /// the guard whatever the outcome and drops it, released other holders' locks);
    /// one held by a process that is gone is broken, at a version no reader saw.
    #[test]
    fn bucket_locks_name_their_process_and_die_with_it() {
        let idx = Index::new(100).unwrap();
        let h = idx.key_hash(b"k");
        let held = idx.lock_key(h);
        let word = held.b.version().load(Ordering::Relaxed);
        assert_eq!(holder(word) >> 32, u64::from(std::process::id()));
        assert!(idx.try_lock_key(h).is_none());
        assert_eq!(held.b.version().load(Ordering::Relaxed), word, "untouched");
        assert!(!Index::break_dead(held.b), "a live holder keeps it");
        drop(held);
        let b = idx.bucket(idx.home(h));
        let before = b.version().load(Ordering::Relaxed);
        assert_eq!(before & 1, 0);
        // Held by a process that is gone (a pid above Linux's largest).
        let dead = locked_word((4_194_303u64 << 32) | 7, before);
        b.version().store(dead, Ordering::Relaxed);
        assert!(Index::break_dead(b));
        let after = b.version().load(Ordering::Relaxed);
        assert!(
            after & 1 == 0 && after != before,
            "{before:x} then {after:x}"
        );
        assert!(idx.try_lock_key(h).is_some());
    }

    /// Counting under every lock sees every entry (overflowed ones too) and breaks the
    /// lock of a holder that is gone, which a count cannot wait for.
    #[test]
    fn entries_are_counted_under_every_lock_a_dead_holders_broken() {
        let idx = Index::new(400).unwrap();
        // Hashes 1 to 7 (0 is no entry's): few buckets, which overflow.
        let h = |k: u64| k % 7 + 1;
        for k in 1..=150u64 {
            let g = idx.lock_key(h(k));
            assert_eq!(idx.set(&g, h(k), &|l| l == k, k), Ok(0));
        }
        for k in (1..=150u64).step_by(5) {
            let g = idx.lock_key(h(k));
            assert_eq!(idx.set(&g, h(k), &|l| l == k, 0), Ok(k));
        }
        let b = idx.bucket(idx.home(3));
        let v = b.version().load(Ordering::Relaxed);
        b.version()
            .store(locked_word((4_194_303u64 << 32) | 7, v), Ordering::Relaxed);
        assert_eq!(idx.count_locked(|n| n), 120);
        assert!(
            idx.try_lock_key(3).is_some(),
            "the dead holder's lock is gone"
        );
    }

    #[test]
    fn keys_chosen_to_collide_do_not_collide() {
        let idx = Index::new(10_000).unwrap();
        let unkeyed = |k: &[u8]| idx.home(cairn_format::dir::hash(k));
        let target = unkeyed(b"k0");
        let chosen: Vec<Vec<u8>> = (0u64..)
            .map(|i| format!("k{i}").into_bytes())
            .filter(|k| unkeyed(k) == target)
            .take(2_000)
            .collect();
        let homes: HashSet<usize> = chosen.iter().map(|k| idx.home(idx.key_hash(k))).collect();
        assert!(homes.len() > 1_000, "{} homes for 2,000 keys", homes.len());
        for (i, k) in chosen.iter().enumerate() {
            let h = idx.key_hash(k);
            let g = idx.lock_key(h);
            idx.set(&g, h, &|_| false, i as u64 + 1)
                .expect("room in the table");
        }
        // Under the unkeyed hash the same keys fill the probe window and then fail.
        let plain = Index::new(10_000).unwrap();
        let failed = chosen.iter().enumerate().any(|(i, k)| {
            let h = cairn_format::dir::hash(k);
            let g = plain.lock_key(h);
            plain.set(&g, h, &|_| false, i as u64 + 1).is_err()
        });
        assert!(
            failed,
            "the unkeyed hash should have filled its neighbourhood"
        );
        // Two indexes (two opens) hash differently.
        assert_ne!(
            Index::new(16).unwrap().key_hash(b"k0"),
            Index::new(16).unwrap().key_hash(b"k0")
        );
    }

    #[test]
    fn set_get_remove_with_collisions_and_overflow() {
        let idx = Index::new(400).unwrap();
        // Keys are their locations here; every hash collides into few buckets, whose
        // entries overflow into the next ones.
        let mut model = HashMap::new();
        for k in 1..=200u64 {
            let h = k % 5;
            let g = idx.lock_key(h);
            assert_eq!(idx.set(&g, h, &|l| l == k, k), Ok(0));
            model.insert(k, h);
        }
        for (&k, &h) in &model {
            assert_eq!(idx.get(h, &|l| l == k), Some(k));
        }
        for k in (1..=200u64).step_by(3) {
            let h = model.remove(&k).unwrap();
            let g = idx.lock_key(h);
            assert_eq!(idx.set(&g, h, &|l| l == k, 0), Ok(k));
        }
        for k in 1..=200u64 {
            let want = model.get(&k).map(|_| k);
            assert_eq!(idx.get(k % 5, &|l| l == k), want, "key {k}");
        }
        assert_eq!(idx.locations().count(), model.len());
    }

    #[test]
    fn concurrent_readers_see_whole_entries() {
        let idx = std::sync::Arc::new(Index::new(1000).unwrap());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Location = key << 32 | round: a reader must find a location of its key.
        let writer = {
            let (idx, stop) = (idx.clone(), stop.clone());
            std::thread::spawn(move || {
                for round in 1..2000u64 {
                    for k in 1..50u64 {
                        let g = idx.lock_key(k);
                        idx.set(&g, k, &|l| l >> 32 == k, k << 32 | round).unwrap();
                    }
                }
                stop.store(true, Ordering::SeqCst);
            })
        };
        while !stop.load(Ordering::SeqCst) {
            for k in 1..50u64 {
                if let Some(l) = idx.get(k, &|l| l >> 32 == k) {
                    assert_eq!(l >> 32, k);
                }
            }
        }
        writer.join().unwrap();
    }

    /// The table file of [`two_processes_share_one_table`] and the index on it (the
    /// keys are fixed: both processes hash alike).
    fn shared_at(path: &std::path::Path) -> Index {
        Index::on(Words::file(path, Index::words_for(64)).unwrap(), [1, 2]).unwrap()
    }

    /// Rounds of updates of keys `first, first + 2, ...` (location = key << 32 |
    /// round), checking every key of both processes that is there meanwhile.
    fn update_half(idx: &Index, first: u64) {
        for round in 1..=300u64 {
            for k in (first..200).step_by(2) {
                let h = idx.key_hash(&k.to_le_bytes());
                let g = idx.lock_key(h);
                idx.set(&g, h, &|l| l >> 32 == k, k << 32 | round).unwrap();
                drop(g);
                let other = k ^ 1;
                let oh = idx.key_hash(&other.to_le_bytes());
                if let Some(l) = idx.get(oh, &|l| l >> 32 == other) {
                    assert_eq!(l >> 32, other);
                }
            }
        }
    }

    /// Run by [`two_processes_share_one_table`] in its child process.
    #[test]
    #[ignore = "the other process of two_processes_share_one_table"]
    fn index_child_process() {
        let Some(path) = std::env::var_os("CAIRN_KV_INDEX_TABLE") else {
            return;
        };
        update_half(&shared_at(std::path::Path::new(&path)), 1);
    }

    /// Two processes insert and update keys of one table in a shared mapping at once,
    /// each reading the other's meanwhile: the buckets' locks and versions work between
    /// processes, every entry ends at its last round, and no key is there twice.
    #[test]
    fn two_processes_share_one_table() {
        let path = std::env::temp_dir().join(format!("cairn-kv-index-{}", std::process::id()));
        let idx = shared_at(&path);
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["index::tests::index_child_process", "--exact", "--ignored"])
            .env("CAIRN_KV_INDEX_TABLE", &path)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        update_half(&idx, 0);
        let status = child.wait_with_output().unwrap().status;
        std::fs::remove_file(&path).unwrap();
        assert!(status.success(), "the child process: {status}");
        for k in 0..200u64 {
            let h = idx.key_hash(&k.to_le_bytes());
            assert_eq!(
                idx.get(h, &|l| l >> 32 == k),
                Some(k << 32 | 300),
                "key {k}"
            );
        }
        assert_eq!(idx.locations().count(), 200);
    }
}
