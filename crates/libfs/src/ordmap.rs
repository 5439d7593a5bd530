//! An ordered map from `u64` keys that allocates only when it holds more entries than it
//! ever held before: a skip list whose nodes live in a slab (`Vec`) with a free list, so
//! removing entries keeps their slots for later inserts. It backs the overlay's interval
//! maps ([`crate::extents`]), which the write path updates on every call and the
//! digest path prunes: a `BTreeMap` there allocated and freed nodes all along.

/// Levels of the skip list (with a branching factor of 4: about 16 million entries
/// before searches slow down).
const LEVELS: usize = 12;
/// No node.
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node<V> {
    key: u64,
    value: V,
    /// The levels it is linked on: `0..height`.
    height: u8,
    next: [u32; LEVELS],
}

#[derive(Debug, Clone)]
pub struct OrdMap<V> {
    nodes: Vec<Node<V>>,
    free: Vec<u32>,
    head: [u32; LEVELS],
    len: usize,
    rng: u64,
    /// The predecessors found by the last search, and its key (`NO_FINGER`: none): the
    /// next search for a key at or above it starts from them, so that writes going up a
    /// file (appends, sequential writes) find their place in a step or two instead of
    /// a walk down from the head. Every node in it is linked at its level (a removal
    /// puts the removed node's predecessor in its place; `retain` and `clear` drop it).
    finger: std::cell::Cell<([u32; LEVELS], u64)>,
}

/// No finger.
const NO_FINGER: u64 = u64::MAX;

impl<V> Default for OrdMap<V> {
    fn default() -> Self {
        OrdMap {
            nodes: Vec::new(),
            free: Vec::new(),
            head: [NIL; LEVELS],
            len: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
            finger: std::cell::Cell::new(([NIL; LEVELS], NO_FINGER)),
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

    /// How many entries it can hold without allocating.
    pub fn capacity(&self) -> usize {
        self.nodes.capacity()
    }

    fn next_of(&self, at: u32, level: usize) -> u32 {
        if at == NIL {
            self.head[level]
        } else {
            self.nodes[at as usize].next[level]
        }
    }

    fn set_next(&mut self, at: u32, level: usize, to: u32) {
        if at == NIL {
            self.head[level] = to;
        } else {
            self.nodes[at as usize].next[level] = to;
        }
    }

    /// For each level, the last node whose key is below `key` (`NIL`: the head).
    fn preds(&self, key: u64) -> [u32; LEVELS] {
        let mut preds = [NIL; LEVELS];
        let mut at = NIL;
        let (finger, from) = self.finger.get();
        let from_finger = from != NO_FINGER && from <= key;
        for level in (0..LEVELS).rev() {
            if from_finger {
                // The finger's node at this level is below `key` too: start from it if it
                // is further on than the node the level above ended at.
                let f = finger[level];
                if f != NIL
                    && (at == NIL || self.nodes[f as usize].key > self.nodes[at as usize].key)
                {
                    at = f;
                }
            }
            loop {
                let n = self.next_of(at, level);
                if n == NIL || self.nodes[n as usize].key >= key {
                    break;
                }
                at = n;
            }
            preds[level] = at;
        }
        self.finger.set((preds, key));
        preds
    }

    /// The first node whose key is at least `key`.
    fn first_at_or_after(&self, key: u64) -> u32 {
        self.next_of(self.preds(key)[0], 0)
    }

    /// The last entry whose key is below `key`.
    pub fn last_before(&self, key: u64) -> Option<(u64, V)> {
        let p = self.preds(key)[0];
        (p != NIL).then(|| (self.nodes[p as usize].key, self.nodes[p as usize].value))
    }

    /// The first entry whose key is in `[lo, hi)`.
    pub fn first_in(&self, lo: u64, hi: u64) -> Option<(u64, V)> {
        let n = self.first_at_or_after(lo);
        (n != NIL && self.nodes[n as usize].key < hi)
            .then(|| (self.nodes[n as usize].key, self.nodes[n as usize].value))
    }

    fn level(&mut self) -> usize {
        // xorshift64: each further level with probability 1/4.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (1 + self.rng.trailing_zeros() as usize / 2).min(LEVELS)
    }

    /// Insert or replace the entry at `key`.
    pub fn insert(&mut self, key: u64, value: V) {
        let preds = self.preds(key);
        let n = self.next_of(preds[0], 0);
        if n != NIL && self.nodes[n as usize].key == key {
            self.nodes[n as usize].value = value;
            return;
        }
        self.link(&preds, key, value);
    }

    /// Link a new node (`key`, `value`) after `preds` (the predecessors of `key` at every
    /// level; no entry has `key`).
    fn link(&mut self, preds: &[u32; LEVELS], key: u64, value: V) {
        let height = self.level();
        let node = Node {
            key,
            value,
            height: height as u8,
            next: [NIL; LEVELS],
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                // Room to free every node without allocating.
                self.free.reserve(self.nodes.len() - self.free.len());
                (self.nodes.len() - 1) as u32
            }
        };
        for (level, &p) in preds.iter().enumerate().take(height) {
            let after = self.next_of(p, level);
            self.nodes[id as usize].next[level] = after;
            self.set_next(p, level, id);
        }
        self.len += 1;
    }

    /// Unlink node `n`, the successor of `preds[0]`; its value.
    fn unlink(&mut self, preds: &[u32; LEVELS], n: u32) -> V {
        let (mut finger, from) = self.finger.get();
        for (level, &p) in preds.iter().enumerate() {
            if self.next_of(p, level) == n {
                let after = self.nodes[n as usize].next[level];
                self.set_next(p, level, after);
            }
            if finger[level] == n {
                finger[level] = p;
            }
        }
        self.finger.set((finger, from));
        self.free.push(n);
        self.len -= 1;
        self.nodes[n as usize].value
    }

    /// A cursor at `key`: between the last entry below it and the first at or after it,
    /// found with one search; the entries on either side are then read, removed and a
    /// new one inserted there without searching again.
    pub fn cursor_mut(&mut self, key: u64) -> CursorMut<'_, V> {
        let preds = self.preds(key);
        CursorMut {
            map: self,
            preds,
            key,
        }
    }

    /// Remove every entry, keeping the memory: the next entries are laid out from the
    /// start of the slab again (contiguous, whatever order earlier ones were freed in).
    pub fn clear(&mut self) {
        self.finger.set(([NIL; LEVELS], NO_FINGER));
        self.nodes.clear();
        self.free.clear();
        self.head = [NIL; LEVELS];
        self.len = 0;
    }

    /// Keep only the entries for which `keep` holds, in one pass over every level.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &V) -> bool) {
        self.finger.set(([NIL; LEVELS], NO_FINGER));
        let mut last = [NIL; LEVELS];
        let mut at = self.head[0];
        self.head = [NIL; LEVELS];
        while at != NIL {
            let node = &self.nodes[at as usize];
            let next = node.next[0];
            if keep(node.key, &node.value) {
                let height = node.height as usize;
                for (level, l) in last.iter_mut().enumerate().take(height) {
                    self.set_next(*l, level, at);
                    *l = at;
                }
            } else {
                self.free.push(at);
                self.len -= 1;
            }
            at = next;
        }
        for (level, &l) in last.iter().enumerate() {
            self.set_next(l, level, NIL);
        }
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        let mut at = self.head[0];
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let n = &self.nodes[at as usize];
            at = n.next[0];
            Some((n.key, n.value))
        })
    }
}

/// A position in an [`OrdMap`] (see [`OrdMap::cursor_mut`]): every entry before it has
/// a key below `key`, every entry after it a key at or above `key`.
pub struct CursorMut<'a, V> {
    map: &'a mut OrdMap<V>,
    preds: [u32; LEVELS],
    key: u64,
}

impl<V: Copy> CursorMut<'_, V> {
    /// The entry just before the position.
    pub fn prev_mut(&mut self) -> Option<(u64, &mut V)> {
        let p = self.preds[0];
        (p != NIL).then(|| {
            let n = &mut self.map.nodes[p as usize];
            (n.key, &mut n.value)
        })
    }

    /// The entry just after the position.
    pub fn next_mut(&mut self) -> Option<(u64, &mut V)> {
        let at = self.map.next_of(self.preds[0], 0);
        (at != NIL).then(|| {
            let n = &mut self.map.nodes[at as usize];
            (n.key, &mut n.value)
        })
    }

    /// Remove the entry just after the position; its key and value.
    pub fn remove_next(&mut self) -> Option<(u64, V)> {
        let at = self.map.next_of(self.preds[0], 0);
        if at == NIL {
            return None;
        }
        let key = self.map.nodes[at as usize].key;
        Some((key, self.map.unlink(&self.preds, at)))
    }

    /// Insert (`key`, `value`) at the position: `key` is the cursor's and no entry has
    /// it. Ends the cursor (the position is taken).
    pub fn insert(self, value: V) {
        let key = self.key;
        debug_assert!(
            {
                let at = self.map.next_of(self.preds[0], 0);
                at == NIL || self.map.nodes[at as usize].key > key
            },
            "cursor insert over an existing entry or out of order"
        );
        self.map.link(&self.preds, key, value);
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
                prop_assert_eq!(m.len(), r.len());
                let all: Vec<_> = m.iter().collect();
                let want: Vec<_> = r.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(all, want);
            }
        }
    }

    #[test]
    fn cleared_map_reuses_its_memory_from_the_start() {
        let mut m = OrdMap::default();
        for k in 0..1000 {
            m.insert(k * 7 % 1000, k);
        }
        for k in 0..1000 {
            if k % 3 != 0 {
                remove(&mut m, k);
            }
        }
        let cap = m.capacity();
        m.clear();
        assert!(m.is_empty() && m.capacity() == cap);
        for k in 0..1000 {
            m.insert(k, k);
        }
        // Laid out in insertion order from slot 0, and nothing allocated.
        assert_eq!(m.capacity(), cap);
        assert!(m
            .nodes
            .iter()
            .take(1000)
            .enumerate()
            .all(|(i, n)| n.key == i as u64));
    }

    #[test]
    fn removed_slots_are_reused() {
        let mut m = OrdMap::default();
        for k in 0..1000 {
            m.insert(k, k);
        }
        let cap = (m.nodes.capacity(), m.free.capacity());
        for round in 0..10 {
            m.retain(|_, _| false);
            assert!(m.is_empty());
            for k in 0..1000 {
                m.insert(k * 7 + round, k);
            }
        }
        assert_eq!((m.nodes.capacity(), m.free.capacity()), cap);
    }
}
