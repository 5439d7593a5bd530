//! LibFS's DRAM cache of lower-tier data (Strata's "file data cache": NVM is read in
//! place and never cached; SSD and HDD blocks are). Fixed-size 4 KiB slots, CLOCK
//! eviction (one reference bit per slot, cheap to keep on every hit), keyed by the
//! block's map entry (tier + block number) and valid only for the generation of its
//! segment it was read under: a segment is rewritten only after its generation was
//! bumped, so a hit never returns bytes of an earlier use of the segment.

use cairn_format::BLOCK_SIZE;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Hit and miss counters.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Blocks read from the device (the missed ones and read-ahead).
    pub blocks_read: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    gen: u64,
    used: bool,
    referenced: bool,
}

#[derive(Debug)]
struct Clock {
    slots: Vec<Slot>,
    data: Vec<u8>,
    index: HashMap<u64, usize>,
    hand: usize,
}

/// The cache (thread-safe).
#[derive(Debug)]
pub struct BlockCache {
    clock: Mutex<Clock>,
    pub stats: CacheStats,
}

impl BlockCache {
    /// A cache of `bytes` (rounded down to whole blocks); `None` below one block.
    pub fn new(bytes: u64) -> Option<BlockCache> {
        let n = (bytes / BLOCK_SIZE as u64) as usize;
        (n > 0).then(|| BlockCache {
            clock: Mutex::new(Clock {
                slots: vec![Slot::default(); n],
                data: vec![0; n * BLOCK_SIZE],
                index: HashMap::with_capacity(n),
                hand: 0,
            }),
            stats: CacheStats::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copy bytes `off..off + dst.len()` of block `key` if cached for generation `gen`.
    pub fn get(&self, key: u64, gen: u64, off: usize, dst: &mut [u8]) -> bool {
        let mut c = self.lock();
        let hit = match c.index.get(&key) {
            Some(&i) if c.slots[i].gen == gen => {
                c.slots[i].referenced = true;
                let s = i * BLOCK_SIZE + off;
                dst.copy_from_slice(&c.data[s..s + dst.len()]);
                true
            }
            _ => false,
        };
        let counter = if hit {
            &self.stats.hits
        } else {
            &self.stats.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        hit
    }

    /// Insert (or replace) block `key` of generation `gen` (4096 bytes).
    pub fn put(&self, key: u64, gen: u64, block: &[u8]) {
        debug_assert_eq!(block.len(), BLOCK_SIZE);
        let mut c = self.lock();
        let i = match c.index.get(&key) {
            Some(&i) => i,
            None => {
                // CLOCK: skip (and clear) referenced slots.
                let n = c.slots.len();
                let mut i = c.hand;
                while c.slots[i].used && c.slots[i].referenced {
                    c.slots[i].referenced = false;
                    i = (i + 1) % n;
                }
                c.hand = (i + 1) % n;
                if c.slots[i].used {
                    let old = c.slots[i].key;
                    c.index.remove(&old);
                }
                c.index.insert(key, i);
                i
            }
        };
        c.slots[i] = Slot {
            key,
            gen,
            used: true,
            referenced: false,
        };
        c.data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE].copy_from_slice(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_and_clock_eviction() {
        let c = BlockCache::new(2 * 4096).unwrap();
        let b = |x: u8| vec![x; 4096];
        let mut out = [0u8; 8];
        c.put(10, 1, &b(1));
        assert!(c.get(10, 1, 100, &mut out) && out == [1; 8]);
        assert!(
            !c.get(10, 2, 0, &mut out),
            "another generation of the segment"
        );
        c.put(11, 1, &b(2));
        // 10 was referenced by the hit: the clock passes it and evicts 11.
        c.put(12, 1, &b(3));
        assert!(c.get(10, 1, 0, &mut out));
        assert!(!c.get(11, 1, 0, &mut out));
        assert!(c.get(12, 1, 4088, &mut out) && out == [3; 8]);
        c.put(12, 5, &b(4));
        assert!(c.get(12, 5, 0, &mut out) && out == [4; 8]);
        assert_eq!(c.stats.hits.load(Ordering::Relaxed), 4);
        assert!(BlockCache::new(100).is_none());
    }
}
