//! The persistence model: which stores a power failure keeps.
//!
//! x86 with `clwb`/`clflushopt` and `sfence`, no eADR:
//!
//! * A store sits in the CPU cache until its line is written back. A write-back of a line
//!   by thread T (`clwb`), followed by a fence of T, makes every store to that line made
//!   before the write-back durable. A non-temporal store by T is durable at T's next
//!   fence (the media layer writes back the unaligned head and tail itself).
//! * A store that is not durable yet may be lost at a power failure, or reach the media
//!   at any time (the cache evicts lines when it likes). Stores to one cache line reach
//!   it in their order, so a line holds the state after some **prefix** of its pending
//!   stores. Stores are split into 8-byte aligned words, each atomic.
//! * Lines are independent of each other.
//! * Host files (the lower tiers) follow the same rules with 4 KiB pages for lines: a
//!   `pwrite` is pending until the file's next `fdatasync`, and a page keeps a prefix of
//!   its pending words (stricter than a disk's atomic sectors).
//!
//! [`Sim`] follows a trace event by event and keeps the durable image (`img`) and, per
//! line, its pending words. At any point, [`Sim::choices`] lists crash images as one
//! prefix length per pending line: every combination when there are few, a sample when
//! there are many. [`Sim::image_hash`] names an image without building it, so that an
//! image seen before is not checked again.

use crate::trace::Event;
use rand::Rng;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Cache-line size.
pub const LINE: u64 = 64;

/// One pending 8-byte word.
#[derive(Debug, Clone, Copy)]
struct Word {
    id: u64,
    /// Byte offset of the word in the file (8-aligned).
    off: u64,
    val: [u8; 8],
    /// Which bytes of the word the store wrote.
    mask: u8,
    /// The source location of the store.
    site: u32,
}

/// A crash image: how many pending words of each line persisted (lines not named: none).
pub type Choice = Vec<(u64, usize)>;

/// A traced file the simulator follows.
#[derive(Debug, Clone)]
pub struct Target {
    /// (dev, ino) of the file.
    pub file: (u64, u64),
    /// Its contents when the trace started.
    pub base: Vec<u8>,
    /// A host file written with `pwrite` and `fdatasync` (a lower tier), not an NVM
    /// mapping.
    pub disk: bool,
}

/// Line of `target` (in the top 16 bits of a line key) and line number.
const TARGET_SHIFT: u32 = 48;

/// The durable images of the traced files, and what is pending.
pub struct Sim {
    targets: Vec<Target>,
    hash: u64,
    /// Pending words by line key (target << 48 | line).
    pending: BTreeMap<u64, Vec<Word>>,
    /// Per thread: lines written back and not fenced yet, with the last word covered.
    flushing: HashMap<u32, Vec<(u64, u64)>>,
    /// Per thread: non-temporal words not fenced yet (line key, word).
    nt: HashMap<u32, Vec<(u64, u64)>>,
    next_id: u64,
    /// Fault injection: write-backs, fences and syncs at these sites are ignored.
    dropped: HashSet<u32>,
    /// How many traced write-backs, fences and syncs were ignored.
    pub dropped_hits: u64,
    /// Stores beyond the end of a file's image (a bug in the trace or the image size).
    pub outside: u64,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A word's share of an image's hash (zero words count nothing, so an image's hash is
/// the sum over its non-zero words).
fn word_hash(t: usize, off: u64, val: [u8; 8]) -> u64 {
    let v = u64::from_le_bytes(val);
    if v == 0 {
        0
    } else {
        mix((off ^ ((t as u64) << 56)).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ mix(v))
    }
}

fn merge(old: [u8; 8], w: &Word) -> [u8; 8] {
    let mut v = old;
    for (i, b) in v.iter_mut().enumerate() {
        if w.mask & (1 << i) != 0 {
            *b = w.val[i];
        }
    }
    v
}

impl Sim {
    /// Follow one NVM file (dev, ino), whose contents when the trace started were `base`.
    pub fn new(file: (u64, u64), base: Vec<u8>) -> Sim {
        Sim::with_targets(vec![Target {
            file,
            base,
            disk: false,
        }])
    }

    /// Follow several files. A host file may grow (appends): its image is padded with
    /// zeros to whole words.
    pub fn with_targets(mut targets: Vec<Target>) -> Sim {
        for t in targets.iter_mut().filter(|t| t.disk) {
            let n = t.base.len().next_multiple_of(8);
            t.base.resize(n, 0);
        }
        let mut hash = 0u64;
        for (t, tg) in targets.iter().enumerate() {
            for (i, c) in tg.base.chunks_exact(8).enumerate() {
                hash = hash.wrapping_add(word_hash(t, i as u64 * 8, c.try_into().expect("8")));
            }
        }
        Sim {
            targets,
            hash,
            pending: BTreeMap::new(),
            flushing: HashMap::new(),
            nt: HashMap::new(),
            next_id: 0,
            dropped: HashSet::new(),
            dropped_hits: 0,
            outside: 0,
        }
    }

    /// Ignore every write-back, fence and sync traced at these sites (fault injection).
    pub fn drop_sites(&mut self, sites: impl IntoIterator<Item = u32>) {
        self.dropped.extend(sites);
    }

    /// The durable image of the first file.
    pub fn durable(&self) -> &[u8] {
        &self.targets[0].base
    }

    /// Number of pending words.
    pub fn pending_words(&self) -> usize {
        self.pending.values().map(Vec::len).sum()
    }

    /// Number of lines with pending words.
    pub fn pending_lines(&self) -> usize {
        self.pending.len()
    }

    fn target(&self, file: (u64, u64), disk: bool) -> Option<usize> {
        self.targets
            .iter()
            .position(|t| t.file == file && t.disk == disk)
    }

    fn line_bytes(&self, t: usize) -> u64 {
        if self.targets[t].disk {
            4096
        } else {
            LINE
        }
    }

    fn dropped(&mut self, site: u32) -> bool {
        let d = self.dropped.contains(&site);
        if d {
            self.dropped_hits += 1;
        }
        d
    }

    /// Apply one event of the trace.
    pub fn step(&mut self, e: &Event) {
        match e {
            Event::Store {
                tid,
                site,
                file,
                off,
                data,
                nt,
            } => {
                if let Some(t) = self.target(*file, false) {
                    self.store(t, *tid, *site, *off, data, *nt);
                }
            }
            Event::FileWrite {
                tid,
                site,
                file,
                off,
                data,
            } => {
                if let Some(t) = self.target(*file, true) {
                    self.store(t, *tid, *site, *off, data, false);
                }
            }
            Event::Flush {
                tid,
                site,
                file,
                off,
                len,
            } => {
                let Some(t) = self.target(*file, false) else {
                    return;
                };
                if self.dropped(*site) {
                    return;
                }
                let base = (t as u64) << TARGET_SHIFT;
                let (first, end) = (base + off / LINE, base + (off + len).div_ceil(LINE));
                let f = self.flushing.entry(*tid).or_default();
                for (&line, words) in self.pending.range(first..end) {
                    f.push((line, words.last().expect("non-empty").id));
                }
            }
            Event::Fence { tid, site } => {
                if self.dropped(*site) {
                    return;
                }
                for (line, upto) in self.flushing.remove(tid).unwrap_or_default() {
                    self.persist(line, upto);
                }
                for (line, id) in self.nt.remove(tid).unwrap_or_default() {
                    self.persist(line, id);
                }
            }
            Event::FileSync { site, file, .. } => {
                let Some(t) = self.target(*file, true) else {
                    return;
                };
                if self.dropped(*site) {
                    return;
                }
                let base = (t as u64) << TARGET_SHIFT;
                let lines: Vec<u64> = self
                    .pending
                    .range(base..base + (1 << TARGET_SHIFT))
                    .map(|(&l, _)| l)
                    .collect();
                for l in lines {
                    self.persist(l, u64::MAX);
                }
            }
            Event::Mark { .. } => {}
        }
    }

    fn store(&mut self, t: usize, tid: u32, site: u32, off: u64, data: &[u8], nt: bool) {
        let end = off + data.len() as u64;
        if end > self.targets[t].base.len() as u64 {
            if !self.targets[t].disk {
                self.outside += 1;
                return;
            }
            // An append: the file grows (zeros count nothing in the hash).
            self.targets[t]
                .base
                .resize(end.next_multiple_of(8) as usize, 0);
        }
        let line_bytes = self.line_bytes(t);
        let mut at = 0usize;
        while at < data.len() {
            let pos = off + at as u64;
            let word = pos & !7;
            let first = (pos - word) as usize;
            let n = (8 - first).min(data.len() - at);
            let mut val = [0u8; 8];
            let mut mask = 0u8;
            for i in 0..n {
                val[first + i] = data[at + i];
                mask |= 1 << (first + i);
            }
            let id = self.next_id;
            self.next_id += 1;
            let line = ((t as u64) << TARGET_SHIFT) | (word / line_bytes);
            self.pending.entry(line).or_default().push(Word {
                id,
                off: word,
                val,
                mask,
                site,
            });
            if nt {
                self.nt.entry(tid).or_default().push((line, id));
            }
            at += n;
        }
    }

    /// Make the pending words of `line` up to word `upto` durable (with every earlier
    /// word of the line: a line reaches the media as a whole).
    fn persist(&mut self, line: u64, upto: u64) {
        let Some(words) = self.pending.get_mut(&line) else {
            return;
        };
        let n = words.iter().take_while(|w| w.id <= upto).count();
        let done: Vec<Word> = words.drain(..n).collect();
        if words.is_empty() {
            self.pending.remove(&line);
        }
        let t = (line >> TARGET_SHIFT) as usize;
        for w in done {
            let at = w.off as usize;
            let img = &mut self.targets[t].base;
            let old: [u8; 8] = img[at..at + 8].try_into().expect("8");
            let new = merge(old, &w);
            self.hash = self
                .hash
                .wrapping_sub(word_hash(t, w.off, old))
                .wrapping_add(word_hash(t, w.off, new));
            img[at..at + 8].copy_from_slice(&new);
        }
    }

    /// The words of `line` after its first `k` pending words persisted: (offset, old
    /// value, new value).
    fn line_after(&self, line: u64, k: usize) -> Vec<(u64, [u8; 8], [u8; 8])> {
        let img = &self.targets[(line >> TARGET_SHIFT) as usize].base;
        let mut words: BTreeMap<u64, ([u8; 8], [u8; 8])> = BTreeMap::new();
        for w in self.pending[&line].iter().take(k) {
            let at = w.off as usize;
            let e = words.entry(w.off).or_insert_with(|| {
                let old: [u8; 8] = img[at..at + 8].try_into().expect("8");
                (old, old)
            });
            e.1 = merge(e.1, w);
        }
        words.into_iter().map(|(o, (a, b))| (o, a, b)).collect()
    }

    /// The hash of the image `choice` describes (equal images, equal hashes).
    pub fn image_hash(&self, choice: &Choice) -> u64 {
        let mut h = self.hash;
        for &(line, k) in choice {
            let t = (line >> TARGET_SHIFT) as usize;
            for (off, old, new) in self.line_after(line, k) {
                h = h
                    .wrapping_sub(word_hash(t, off, old))
                    .wrapping_add(word_hash(t, off, new));
            }
        }
        h
    }

    /// The pending words `choice` leaves out, counted by the site that stored them.
    pub fn lost_sites(&self, choice: &Choice) -> Vec<(u32, usize)> {
        let kept: HashMap<u64, usize> = choice.iter().copied().collect();
        let mut by: BTreeMap<u32, usize> = BTreeMap::new();
        for (line, words) in &self.pending {
            for w in words.iter().skip(kept.get(line).copied().unwrap_or(0)) {
                *by.entry(w.site).or_default() += 1;
            }
        }
        by.into_iter().collect()
    }

    /// The durable image of every file, in the order of the targets.
    pub fn bases(&self) -> impl Iterator<Item = &[u8]> {
        self.targets.iter().map(|t| t.base.as_slice())
    }

    /// The words the image `choice` describes holds on top of the durable images:
    /// (target, offset, value).
    pub fn overlay(&self, choice: &Choice) -> Vec<(usize, u64, [u8; 8])> {
        let mut v = Vec::new();
        for &(line, k) in choice {
            let t = (line >> TARGET_SHIFT) as usize;
            v.extend(
                self.line_after(line, k)
                    .into_iter()
                    .map(|(off, _, new)| (t, off, new)),
            );
        }
        v
    }

    /// Build the image `choice` describes into `out`: one buffer per file, in the order
    /// of the targets.
    pub fn build(&self, choice: &Choice, out: &mut Vec<Vec<u8>>) {
        out.resize(self.targets.len(), Vec::new());
        for (o, base) in out.iter_mut().zip(self.bases()) {
            o.clear();
            o.extend_from_slice(base);
        }
        for (t, off, new) in self.overlay(choice) {
            out[t][off as usize..off as usize + 8].copy_from_slice(&new);
        }
    }

    /// Crash images at this point: every combination of prefixes when there are at most
    /// `exhaustive` of them; else `samples` of them: nothing pending persisted,
    /// everything, each line alone lost (up to half the samples), then random prefixes.
    pub fn choices(&self, exhaustive: u64, samples: usize, rng: &mut impl Rng) -> Vec<Choice> {
        let lines: Vec<(u64, usize)> = self.pending.iter().map(|(&l, w)| (l, w.len())).collect();
        let mut total: u64 = 1;
        for &(_, n) in &lines {
            total = total.saturating_mul(n as u64 + 1);
        }
        let mut out = Vec::new();
        if total <= exhaustive {
            let mut k = vec![0usize; lines.len()];
            loop {
                out.push(
                    lines
                        .iter()
                        .zip(&k)
                        .filter(|(_, &k)| k > 0)
                        .map(|(&(l, _), &k)| (l, k))
                        .collect(),
                );
                // Mixed-radix increment.
                let mut i = 0;
                loop {
                    if i == k.len() {
                        return out;
                    }
                    k[i] += 1;
                    if k[i] <= lines[i].1 {
                        break;
                    }
                    k[i] = 0;
                    i += 1;
                }
            }
        }
        let all: Choice = lines.clone();
        out.push(Vec::new());
        out.push(all.clone());
        for i in 0..lines.len().min(samples / 2) {
            let mut c = all.clone();
            c.remove(i);
            out.push(c);
        }
        while out.len() < samples.max(2) {
            out.push(
                lines
                    .iter()
                    .map(|&(l, n)| (l, rng.gen_range(0..=n)))
                    .filter(|&(_, k)| k > 0)
                    .collect(),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const F: (u64, u64) = (1, 2);

    fn store(tid: u32, off: u64, data: &[u8]) -> Event {
        Event::Store {
            tid,
            site: 0,
            file: F,
            off,
            data: data.to_vec(),
            nt: false,
        }
    }

    fn flush(tid: u32, off: u64, len: u64) -> Event {
        Event::Flush {
            tid,
            site: 0,
            file: F,
            off,
            len,
        }
    }

    fn fence(tid: u32, site: u32) -> Event {
        Event::Fence { tid, site }
    }

    fn images(s: &Sim) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut v: Vec<Vec<u8>> = s
            .choices(1 << 20, 0, &mut rng)
            .iter()
            .map(|c| {
                let mut o = Vec::new();
                s.build(c, &mut o);
                let o = o.remove(0);
                assert_eq!(
                    s.image_hash(c),
                    Sim::new(F, o.clone()).hash,
                    "hash of {c:?}"
                );
                o
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn write_back_and_fence_make_stores_durable() {
        let mut s = Sim::new(F, vec![0; 256]);
        s.step(&store(1, 0, &[1; 8]));
        s.step(&store(1, 64, &[2; 8]));
        // Not written back: each line may or may not have reached the media.
        assert_eq!(images(&s).len(), 4);
        s.step(&flush(1, 0, 8));
        // Written back but not fenced: nothing is durable yet.
        assert_eq!(images(&s).len(), 4);
        // Another thread's fence does not order this thread's write-back.
        s.step(&fence(2, 0));
        assert_eq!(images(&s).len(), 4);
        s.step(&fence(1, 0));
        assert_eq!(&s.durable()[..8], &[1; 8]);
        assert_eq!(images(&s).len(), 2);
    }

    #[test]
    fn a_line_keeps_a_prefix_of_its_stores() {
        let mut s = Sim::new(F, vec![0; 64]);
        s.step(&store(1, 0, &[1; 8]));
        s.step(&store(1, 8, &[2; 8]));
        s.step(&store(1, 0, &[3; 8]));
        let imgs = images(&s);
        // None, the first, the first two, all three: never the second without the first.
        assert_eq!(imgs.len(), 4);
        assert!(!imgs.iter().any(|i| i[0] == 0 && i[8] == 2));
        assert!(imgs.iter().any(|i| i[0] == 3 && i[8] == 2));
    }

    #[test]
    fn unaligned_stores_split_into_atomic_words() {
        let mut s = Sim::new(F, vec![0; 64]);
        s.step(&store(1, 4, &[9; 8]));
        // Two words: none, the first, both.
        let imgs = images(&s);
        assert_eq!(imgs.len(), 3);
        assert!(imgs.iter().any(|i| i[4..8] == [9; 4] && i[8..12] == [0; 4]));
    }

    #[test]
    fn non_temporal_stores_need_only_a_fence() {
        let mut s = Sim::new(F, vec![0; 128]);
        s.step(&Event::Store {
            tid: 1,
            site: 0,
            file: F,
            off: 64,
            data: vec![5; 64],
            nt: true,
        });
        s.step(&fence(1, 0));
        assert_eq!(&s.durable()[64..], &[5; 64]);
        assert_eq!(s.pending_words(), 0);
    }

    #[test]
    fn a_dropped_fence_leaves_stores_pending() {
        let mut s = Sim::new(F, vec![0; 64]);
        s.drop_sites([7]);
        s.step(&store(1, 0, &[1; 8]));
        s.step(&flush(1, 0, 8));
        s.step(&fence(1, 7));
        assert_eq!(s.dropped_hits, 1);
        assert_eq!(images(&s).len(), 2);
        s.step(&fence(1, 0));
        assert_eq!(images(&s).len(), 1);
    }

    #[test]
    fn other_files_are_ignored_and_many_pending_lines_are_sampled() {
        let mut s = Sim::new(F, vec![0; 64 * 64]);
        s.step(&Event::Store {
            tid: 1,
            site: 0,
            file: (9, 9),
            off: 0,
            data: vec![1; 8],
            nt: false,
        });
        assert_eq!(s.pending_words(), 0);
        for l in 0..64 {
            s.step(&store(1, l * 64, &[1; 16]));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let c = s.choices(1000, 100, &mut rng);
        assert_eq!(c.len(), 100);
        assert!(c[0].is_empty());
        assert_eq!(c[1].len(), 64);
    }

    #[test]
    fn host_file_writes_are_durable_at_fdatasync() {
        let nvm = Target {
            file: (1, 1),
            base: vec![0; 64],
            disk: false,
        };
        let disk = Target {
            file: (1, 2),
            base: vec![0; 8192],
            disk: true,
        };
        let mut s = Sim::with_targets(vec![nvm, disk]);
        s.step(&Event::FileWrite {
            tid: 1,
            site: 0,
            file: (1, 2),
            off: 4096,
            data: vec![7; 16],
        });
        // A fence does not make a host file write durable; a write-back of the NVM
        // file's line does not either.
        s.step(&Event::Fence { tid: 1, site: 0 });
        assert_eq!(s.pending_words(), 2);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert_eq!(s.choices(100, 0, &mut rng).len(), 3);
        s.step(&Event::FileSync {
            tid: 2,
            site: 0,
            file: (1, 2),
        });
        assert_eq!(s.pending_words(), 0);
        let mut out = Vec::new();
        s.build(&Vec::new(), &mut out);
        assert_eq!(&out[1][4096..4112], &[7; 16]);
        assert_eq!(out[0], vec![0; 64]);
    }
}
