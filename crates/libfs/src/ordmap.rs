//! An ordered map from `u64` keys that allocates only when it holds more entries than it
//! ever held before: a B+-tree of two levels. Entries live in *leaves* of up to [`LEAF`]
//! sorted keys and values (a slab of leaves with a free list: a leaf emptied by removals
//! keeps its memory for later inserts), and a sorted *index* holds one separator key per
//! leaf. A search is a binary search of the index (contiguous keys: a few cache lines
//! even with a million entries) and one of a leaf, so its cost barely grows with the
//! number of entries, where a skip list's walked a cache line per node. It backs the
//! overlay's interval maps ([`crate::extents`]), which the write path updates on every
//! call and the digest path prunes.
//!
//! Invariants ([`OrdMap::check`], asserted by the tests after every operation): the index
//! is empty exactly when the map is; its first separator is 0 and separators increase;
//! every leaf holds 1 to [`LEAF`] keys, increasing, at or above its separator and below
//! the next one.

/// Most entries in a leaf (small in tests, so that they split and merge often).
#[cfg(not(test))]
const LEAF: usize = 64;
#[cfg(test)]
const LEAF: usize = 4;

/// A leaf: keys and their values, in key order.
#[derive(Debug, Clone)]
struct Leaf<V> {
    keys: Vec<u64>,
    vals: Vec<V>,
}

impl<V> Leaf<V> {
    fn new() -> Leaf<V> {
        // One more than a full leaf: an insert into a full leaf splits it after.
        Leaf {
            keys: Vec::with_capacity(LEAF + 1),
            vals: Vec::with_capacity(LEAF + 1),
        }
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// The position of the first key at or above `key`.
    fn lower_bound(&self, key: u64) -> usize {
        self.keys.partition_point(|&k| k < key)
    }
}

#[derive(Debug, Clone)]
pub struct OrdMap<V> {
    /// (separator, leaf) in key order.
    index: Vec<(u64, u32)>,
    leaves: Vec<Leaf<V>>,
    /// Leaves in no index entry, emptied.
    free: Vec<u32>,
    len: usize,
    /// The index position the last search ended at: a search whose key is in the same
    /// leaf's range (sequential writes, a run of writes to one place) skips the index.
    hint: std::cell::Cell<usize>,
}

impl<V> Default for OrdMap<V> {
    fn default() -> Self {
        OrdMap {
            index: Vec::new(),
            leaves: Vec::new(),
            free: Vec::new(),
            len: 0,
            hint: std::cell::Cell::new(0),
        }
    }
}

impl<V: Copy> OrdMap<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many entries its leaves hold when full: about how many it can hold without
    /// allocating.
    pub fn capacity(&self) -> usize {
        self.leaves.len() * LEAF
    }

    fn leaf(&self, i: usize) -> &Leaf<V> {
        &self.leaves[self.index[i].1 as usize]
    }

    fn leaf_mut(&mut self, i: usize) -> &mut Leaf<V> {
        &mut self.leaves[self.index[i].1 as usize]
    }

    /// The index position of the leaf whose range holds `key` (0 when there is none).
    fn find_leaf(&self, key: u64) -> usize {
        let h = self.hint.get();
        let in_hint = h < self.index.len()
            && self.index[h].0 <= key
            && self.index.get(h + 1).is_none_or(|n| key < n.0);
        if in_hint {
            return h;
        }
        let i = self.index.partition_point(|s| s.0 <= key).saturating_sub(1);
        self.hint.set(i);
        i
    }

    /// The position of `key`: (index position, slot in that leaf) of the first entry at
    /// or above it, or the end of the leaf whose range holds it.
    fn position(&self, key: u64) -> (usize, usize) {
        if self.index.is_empty() {
            return (0, 0);
        }
        let i = self.find_leaf(key);
        (i, self.leaf(i).lower_bound(key))
    }

    /// The entry at (`i`, `slot`) if the leaf has one there, else the first of the next
    /// leaf: its index position and slot.
    fn at_or_next(&self, i: usize, slot: usize) -> Option<(usize, usize)> {
        if i < self.index.len() && slot < self.leaf(i).len() {
            Some((i, slot))
        } else if i + 1 < self.index.len() {
            Some((i + 1, 0))
        } else {
            None
        }
    }

    /// The entry just before (`i`, `slot`).
    fn before(&self, i: usize, slot: usize) -> Option<(usize, usize)> {
        if self.index.is_empty() {
            None
        } else if slot > 0 {
            Some((i, slot - 1))
        } else if i > 0 {
            Some((i - 1, self.leaf(i - 1).len() - 1))
        } else {
            None
        }
    }

    fn entry(&self, (i, slot): (usize, usize)) -> (u64, V) {
        let l = self.leaf(i);
        (l.keys[slot], l.vals[slot])
    }

    /// The last entry whose key is below `key`.
    pub fn last_before(&self, key: u64) -> Option<(u64, V)> {
        let (i, slot) = self.position(key);
        self.before(i, slot).map(|p| self.entry(p))
    }

    /// The first entry whose key is in `[lo, hi)`.
    pub fn first_in(&self, lo: u64, hi: u64) -> Option<(u64, V)> {
        let (i, slot) = self.position(lo);
        self.at_or_next(i, slot)
            .map(|p| self.entry(p))
            .filter(|e| e.0 < hi)
    }

    /// Insert or replace the entry at `key`.
    pub fn insert(&mut self, key: u64, value: V) {
        let mut c = self.cursor_mut(key);
        match c.next_mut() {
            Some((k, v)) if k == key => *v = value,
            _ => c.insert(value),
        }
    }

    /// A leaf from the free list, or a new one.
    fn take_leaf(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.leaves.push(Leaf::new());
            // Room to free every leaf without allocating.
            self.free.reserve(self.leaves.len() - self.free.len());
            (self.leaves.len() - 1) as u32
        })
    }

    /// Put `key`, `value` at slot `slot` of leaf `i` (where it keeps the leaf in order);
    /// a leaf that overflows is split in two: in halves, or, when the new entry went at
    /// its end (keys inserted in increasing order: appends), with the new entry alone in
    /// the second, so that such inserts leave full leaves behind.
    fn put(&mut self, i: usize, slot: usize, key: u64, value: V) {
        if self.index.is_empty() {
            let id = self.take_leaf();
            self.index.push((0, id));
        }
        let l = self.leaf_mut(i);
        l.keys.insert(slot, key);
        l.vals.insert(slot, value);
        self.len += 1;
        if self.leaf(i).len() > LEAF {
            let id = self.take_leaf();
            let at = self.index[i].1 as usize;
            let half = if slot == LEAF { LEAF } else { LEAF.div_ceil(2) };
            let [lo, hi] = self
                .leaves
                .get_disjoint_mut([at, id as usize])
                .expect("a free leaf is not in the index");
            hi.keys.extend(lo.keys.drain(half..));
            hi.vals.extend(lo.vals.drain(half..));
            self.index.insert(i + 1, (hi.keys[0], id));
        }
    }

    /// Remove the entry at slot `slot` of leaf `i`; a leaf left empty leaves the index.
    /// Whether it did.
    fn take(&mut self, i: usize, slot: usize) -> (u64, V, bool) {
        let l = self.leaf_mut(i);
        let (k, v) = (l.keys.remove(slot), l.vals.remove(slot));
        self.len -= 1;
        let emptied = self.leaf(i).len() == 0;
        if emptied {
            let (_, id) = self.index.remove(i);
            self.free.push(id);
            if let Some(first) = self.index.first_mut() {
                first.0 = 0;
            }
        }
        (k, v, emptied)
    }

    /// A cursor at `key`: between the last entry below it and the first at or after it,
    /// found with one search; the entries on either side are then read, removed and a
    /// new one inserted there without searching again.
    pub fn cursor_mut(&mut self, key: u64) -> CursorMut<'_, V> {
        let (i, slot) = self.position(key);
        CursorMut {
            map: self,
            i,
            slot,
            key,
        }
    }

    /// Remove every entry, keeping the memory.
    pub fn clear(&mut self) {
        for &(_, id) in &self.index {
            let l = &mut self.leaves[id as usize];
            l.keys.clear();
            l.vals.clear();
            self.free.push(id);
        }
        self.index.clear();
        self.len = 0;
    }

    /// Keep only the entries for which `keep` holds, in one pass. A leaf that fits into
    /// the one before it after the pass is merged into it, so that the leaves stay more
    /// than half full on average.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &V) -> bool) {
        let mut out = 0;
        for i in 0..self.index.len() {
            let (sep, id) = self.index[i];
            let l = &mut self.leaves[id as usize];
            let mut w = 0;
            for r in 0..l.len() {
                if keep(l.keys[r], &l.vals[r]) {
                    l.keys[w] = l.keys[r];
                    l.vals[w] = l.vals[r];
                    w += 1;
                }
            }
            self.len -= l.len() - w;
            l.keys.truncate(w);
            l.vals.truncate(w);
            let into = (out > 0).then(|| self.index[out - 1].1 as usize);
            match into {
                _ if w == 0 => self.free.push(id),
                Some(prev) if self.leaves[prev].len() + w <= LEAF => {
                    let [p, l] = self
                        .leaves
                        .get_disjoint_mut([prev, id as usize])
                        .expect("two leaves of the index");
                    p.keys.append(&mut l.keys);
                    p.vals.append(&mut l.vals);
                    self.free.push(id);
                }
                _ => {
                    self.index[out] = (sep, id);
                    out += 1;
                }
            }
        }
        self.index.truncate(out);
        if let Some(first) = self.index.first_mut() {
            first.0 = 0;
        }
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.index.iter().flat_map(move |&(_, id)| {
            let l = &self.leaves[id as usize];
            l.keys.iter().copied().zip(l.vals.iter().copied())
        })
    }

    /// Assert the invariants (module documentation).
    #[cfg(test)]
    fn check(&self) {
        assert_eq!(self.index.is_empty(), self.len == 0);
        assert_eq!(self.index.first().map_or(0, |f| f.0), 0);
        let mut n = 0;
        for (i, &(sep, id)) in self.index.iter().enumerate() {
            let l = &self.leaves[id as usize];
            let next = self.index.get(i + 1).map(|s| s.0);
            assert!((1..=LEAF).contains(&l.len()) && l.keys.len() == l.vals.len());
            assert!(l.keys.windows(2).all(|w| w[0] < w[1]));
            assert!(l.keys[0] >= sep);
            assert!(next.is_none_or(|n| sep < n && l.keys[l.len() - 1] < n));
            n += l.len();
        }
        assert_eq!(n, self.len);
        assert_eq!(self.index.len() + self.free.len(), self.leaves.len());
    }
}

/// A position in an [`OrdMap`] (see [`OrdMap::cursor_mut`]): every entry before it has
/// a key below `key`, every entry after it a key at or above `key`. It is slot `slot` of
/// the leaf at index position `i`, whose range holds `key`.
pub struct CursorMut<'a, V> {
    map: &'a mut OrdMap<V>,
    i: usize,
    slot: usize,
    key: u64,
}

impl<V: Copy> CursorMut<'_, V> {
    /// The entry just before the position.
    pub fn prev_mut(&mut self) -> Option<(u64, &mut V)> {
        let (i, slot) = self.map.before(self.i, self.slot)?;
        let l = self.map.leaf_mut(i);
        Some((l.keys[slot], &mut l.vals[slot]))
    }

    /// The entry just after the position.
    pub fn next_mut(&mut self) -> Option<(u64, &mut V)> {
        let (i, slot) = self.map.at_or_next(self.i, self.slot)?;
        let l = self.map.leaf_mut(i);
        Some((l.keys[slot], &mut l.vals[slot]))
    }

    /// Remove the entry just after the position; its key and value.
    pub fn remove_next(&mut self) -> Option<(u64, V)> {
        let (i, slot) = self.map.at_or_next(self.i, self.slot)?;
        let (k, v, emptied) = self.map.take(i, slot);
        if emptied && i == self.i {
            // The cursor's leaf went: its range is now the previous leaf's (at its end),
            // or, for the first leaf, the next one's (at its start).
            if self.i > 0 {
                self.i -= 1;
                self.slot = self.map.leaf(self.i).len();
            } else {
                self.slot = 0;
            }
        }
        Some((k, v))
    }

    /// Insert (`key`, `value`) at the position: `key` is the cursor's and no entry has
    /// it. Ends the cursor (the position is taken).
    pub fn insert(self, value: V) {
        debug_assert!(
            self.map
                .at_or_next(self.i, self.slot)
                .is_none_or(|p| self.map.entry(p).0 > self.key),
            "cursor insert over an existing entry or out of order"
        );
        // An empty map's cursor is at (0, 0): `put` makes the first leaf there.
        debug_assert!(!self.map.index.is_empty() || (self.i, self.slot) == (0, 0));
        self.map.put(self.i, self.slot, self.key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Retain(u32),
        Clear,
        Query(u64, u64),
        /// Through a cursor at the key: read both neighbours, remove the entries up to
        /// `key + span`, insert the value.
        Splice(u64, u64, u32),
    }

    /// Remove the entry at `k` through a cursor.
    fn remove<V: Copy>(m: &mut OrdMap<V>, k: u64) -> Option<V> {
        let mut c = m.cursor_mut(k);
        match c.next_mut() {
            Some((at, _)) if at == k => c.remove_next().map(|e| e.1),
            _ => None,
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0u64..200, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            2 => (0u64..200).prop_map(Op::Remove),
            1 => (1u32..5).prop_map(Op::Retain),
            1 => Just(Op::Clear),
            3 => (0u64..210, 0u64..210).prop_map(|(a, b)| Op::Query(a, b)),
            3 => (0u64..200, 0u64..30, any::<u32>()).prop_map(|(k, n, v)| Op::Splice(k, n, v)),
        ]
    }

    proptest! {
        /// Every operation and query agrees with a `BTreeMap`.
        #[test]
        fn matches_btreemap(ops in proptest::collection::vec(op(), 1..300)) {
            let mut m = OrdMap::default();
            let mut r = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => {
                        m.insert(k, v);
                        r.insert(k, v);
                    }
                    Op::Remove(k) => prop_assert_eq!(remove(&mut m, k), r.remove(&k)),
                    Op::Retain(d) => {
                        m.retain(|_, v| v % d != 0);
                        r.retain(|_, v| *v % d != 0);
                    }
                    Op::Clear => {
                        m.clear();
                        r.clear();
                    }
                    Op::Splice(k, span, v) => {
                        let mut c = m.cursor_mut(k);
                        let want = r.range(..k).next_back().map(|(k, v)| (*k, *v));
                        prop_assert_eq!(c.prev_mut().map(|(k, v)| (k, *v)), want);
                        while let Some((at, _)) = c.next_mut() {
                            // The cursor stays between the keys below `k` and the rest.
                            prop_assert!(at >= k);
                            if at >= k + span {
                                break;
                            }
                            prop_assert_eq!(c.remove_next().map(|e| e.1), r.remove(&at));
                        }
                        let want = r.range(k..).next().map(|(k, v)| (*k, *v));
                        prop_assert_eq!(c.next_mut().map(|(k, v)| (k, *v)), want);
                        if want.is_none_or(|w| w.0 != k) {
                            c.insert(v);
                            r.insert(k, v);
                        }
                    }
                    Op::Query(a, b) => {
                        let want = r.range(..a).next_back().map(|(k, v)| (*k, *v));
                        prop_assert_eq!(m.last_before(a), want);
                        let want = r.range(a..b.max(a)).next().map(|(k, v)| (*k, *v));
                        prop_assert_eq!(m.first_in(a, b.max(a)), want);
                        let got = m.cursor_mut(a).next_mut().filter(|e| e.0 == a).map(|e| *e.1);
                        prop_assert_eq!(got, r.get(&a).copied());
                    }
                }
                m.check();
                prop_assert_eq!(m.len(), r.len());
                let all: Vec<_> = m.iter().collect();
                let want: Vec<_> = r.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(all, want);
            }
        }
    }

    /// The memory it holds: leaves, and the capacities of the index and free list.
    fn memory<V: Copy>(m: &OrdMap<V>) -> (usize, usize, usize, usize) {
        (
            m.leaves.len(),
            m.leaves.capacity(),
            m.index.capacity(),
            m.free.capacity(),
        )
    }

    #[test]
    fn cleared_map_reuses_its_memory() {
        let mut m = OrdMap::default();
        for k in 0..1000 {
            m.insert(k * 7 % 1000, k);
        }
        for k in 0..1000 {
            if k % 3 != 0 {
                remove(&mut m, k);
            }
        }
        m.check();
        m.clear();
        m.check();
        let before = memory(&m);
        for k in 0..1000 {
            m.insert(k, k);
        }
        m.check();
        // 1000 entries in order fill their leaves half: no more than the first round.
        assert_eq!(memory(&m), before);
        assert!(m.iter().map(|e| e.0).eq(0..1000));
    }

    #[test]
    fn removed_slots_are_reused() {
        let mut m = OrdMap::default();
        for k in 0..1000 {
            m.insert(k, k);
        }
        let mem = memory(&m);
        for round in 0..10 {
            m.retain(|_, _| false);
            assert!(m.is_empty());
            m.check();
            for k in 0..1000 {
                m.insert(k * 7 + round, k);
            }
            m.check();
        }
        assert_eq!(memory(&m), mem);
    }

    #[test]
    fn retain_merges_thinned_leaves() {
        let mut m = OrdMap::default();
        for k in 0..10_000 {
            m.insert(k, k);
        }
        let leaves = m.index.len();
        m.retain(|k, _| k % 10 == 0);
        m.check();
        assert_eq!(m.len(), 1000);
        // Half-full leaves thinned to a tenth: merged about five into one.
        assert!(
            m.index.len() * 4 < leaves,
            "{} of {leaves} leaves",
            m.index.len()
        );
    }
}
