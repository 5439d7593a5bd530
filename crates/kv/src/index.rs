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
//! ([`Index::key_hash`]: SipHash-1-3, the keys random for each index, which lives in
//! memory only and is rebuilt at every open): a client cannot choose keys that all land
//! in one neighbourhood of buckets, which would make inserts probe far and then fail as
//! if the table were full.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// Entries per bucket.
pub const SLOTS: usize = 7;
/// Buckets an insert probes before the table counts as full.
const MAX_PROBE: usize = 32;

/// One cache-line pair: version, overflow flag, hashes, locations (0 = empty).
#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    version: AtomicU64,
    overflow: AtomicU64,
    hash: [AtomicU64; SLOTS],
    loc: [AtomicU64; SLOTS],
}

/// Wait for a bucket's writer: spin a little, then let other threads run (the writer
/// may be one that was preempted: with more busy threads than CPUs, as a server and its
/// clients on two cores, spinning on would burn the time slice it needs).
fn wait(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// The index.
pub struct Index {
    buckets: Box<[Bucket]>,
    /// The keys of [`Index::key_hash`].
    keys: std::hash::RandomState,
}

/// A write lock on a bucket (released at drop).
pub struct Locked<'a> {
    b: &'a Bucket,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.b.version.fetch_add(1, Ordering::Release);
    }
}

impl Index {
    /// A table for about `entries` entries (buckets about 70% full).
    pub fn new(entries: u64) -> Index {
        let n = ((entries as f64 / (SLOTS as f64 * 0.7)).ceil() as usize).max(16);
        Index {
            buckets: (0..n).map(|_| Bucket::default()).collect(),
            keys: std::hash::RandomState::new(),
        }
    }

    /// The hash of `key` in this index (keyed: see the module docs).
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        self.keys.hash_one(key)
    }

    /// The home bucket of `hash` (its high bits scaled to the table: any size works).
    fn home(&self, hash: u64) -> usize {
        ((hash as u128 * self.buckets.len() as u128) >> 64) as usize
    }

    /// The bucket after `i` (wrapping).
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.buckets.len() {
            0
        } else {
            i + 1
        }
    }

    fn lock(&self, i: usize) -> Locked<'_> {
        let b = &self.buckets[i];
        let mut spins = 0u32;
        loop {
            let v = b.version.load(Ordering::Relaxed);
            if v & 1 == 0
                && b.version
                    .compare_exchange_weak(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return Locked { b };
            }
            wait(&mut spins);
        }
    }

    /// The location of the entry for `hash` that `is_key` accepts, read optimistically.
    pub fn get(&self, hash: u64, is_key: &dyn Fn(u64) -> bool) -> Option<u64> {
        let mut i = self.home(hash);
        let mut spins = 0u32;
        for _ in 0..MAX_PROBE {
            let b = &self.buckets[i];
            let (found, more) = loop {
                let v = b.version.load(Ordering::Acquire);
                if v & 1 == 1 {
                    wait(&mut spins);
                    continue;
                }
                let mut found = None;
                for s in 0..SLOTS {
                    if b.hash[s].load(Ordering::Acquire) == hash {
                        let loc = b.loc[s].load(Ordering::Acquire);
                        if loc != 0 && is_key(loc) {
                            found = Some(loc);
                            break;
                        }
                    }
                }
                let more = b.overflow.load(Ordering::Acquire) != 0;
                if b.version.load(Ordering::Acquire) == v {
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
        let home = &self.buckets[self.home(hash)];
        let mut spins = 0u32;
        loop {
            let v = home.version.load(Ordering::Acquire);
            if v & 1 == 1 {
                wait(&mut spins);
                continue;
            }
            let r = self.get(hash, is_key).map(&mut f);
            std::sync::atomic::fence(Ordering::Acquire);
            if home.version.load(Ordering::Relaxed) == v {
                return r;
            }
        }
    }

    /// Buckets in the table.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The locations of the entries in bucket `i`, read optimistically (for scans).
    pub fn bucket_locations(&self, i: usize) -> Vec<u64> {
        let b = &self.buckets[i];
        loop {
            let v = b.version.load(Ordering::Acquire);
            if v & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let locs: Vec<u64> = b
                .loc
                .iter()
                .map(|l| l.load(Ordering::Acquire))
                .filter(|&l| l != 0)
                .collect();
            if b.version.load(Ordering::Acquire) == v {
                return locs;
            }
        }
    }

    /// Buckets' bytes (for the store's memory figures).
    pub fn bytes(&self) -> u64 {
        std::mem::size_of_val(&*self.buckets) as u64
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
        debug_assert!(std::ptr::eq(held.b, &self.buckets[i]));
        for _ in 0..MAX_PROBE {
            let b = &self.buckets[i];
            for s in 0..SLOTS {
                let l = b.loc[s].load(Ordering::Acquire);
                if l != 0 && b.hash[s].load(Ordering::Acquire) == hash && is_key(l) {
                    return Some(l);
                }
            }
            if b.overflow.load(Ordering::Acquire) == 0 {
                return None;
            }
            i = self.next(i);
        }
        None
    }

    /// The lock on the home bucket of `hash`, if no one holds it.
    pub fn try_lock_key(&self, hash: u64) -> Option<Locked<'_>> {
        let b = &self.buckets[self.home(hash)];
        let v = b.version.load(Ordering::Relaxed);
        (v & 1 == 0
            && b.version
                .compare_exchange(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok())
        .then(|| Locked { b })
    }

    /// Whether `held` is the lock on the home bucket of `hash`.
    pub fn covers(&self, held: &Locked<'_>, hash: u64) -> bool {
        std::ptr::eq(held.b, &self.buckets[self.home(hash)])
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
        debug_assert!(std::ptr::eq(held.b, &self.buckets[home]));
        let mut i = home;
        for _ in 0..MAX_PROBE {
            let b = &self.buckets[i];
            for s in 0..SLOTS {
                let l = b.loc[s].load(Ordering::Acquire);
                if l != 0 && b.hash[s].load(Ordering::Acquire) == hash && is_key(l) {
                    if loc == 0 {
                        b.hash[s].store(0, Ordering::Release);
                    }
                    b.loc[s].store(loc, Ordering::Release);
                    return Ok(l);
                }
            }
            if b.overflow.load(Ordering::Acquire) == 0 {
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
            let b = &self.buckets[j];
            for s in 0..SLOTS {
                if b.loc[s]
                    .compare_exchange(0, loc, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    b.hash[s].store(hash, Ordering::Release);
                    return Ok(0);
                }
            }
            b.overflow.store(1, Ordering::Release);
            j = self.next(j);
        }
        Err(())
    }

    /// Every location in the table (no concurrent writer).
    #[cfg(test)]
    pub fn locations(&self) -> impl Iterator<Item = u64> + '_ {
        self.buckets
            .iter()
            .flat_map(|b| b.loc.iter().map(|l| l.load(Ordering::Acquire)))
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
    #[test]
    fn keys_chosen_to_collide_do_not_collide() {
        let idx = Index::new(10_000);
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
        let plain = Index::new(10_000);
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
            Index::new(16).key_hash(b"k0"),
            Index::new(16).key_hash(b"k0")
        );
    }

    #[test]
    fn set_get_remove_with_collisions_and_overflow() {
        let idx = Index::new(400);
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
        let idx = std::sync::Arc::new(Index::new(1000));
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
}
