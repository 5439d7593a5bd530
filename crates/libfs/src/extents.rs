//! The per-file interval map of the DRAM overlay: which byte ranges of a file were written
//! (or zeroed by a truncation) by transactions the daemon has not digested yet, and where
//! their bytes are in the log ring.
//!
//! Ranges never overlap: inserting a range overwrites what was there (splitting the
//! neighbours). Every range carries the *tag* of its transaction (the LSN just past it);
//! once the daemon's published head reaches a tag, the shared area holds that state and
//! [`Extents::prune`] drops the range.

use crate::ordmap::OrdMap;

/// Where the bytes of a range come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    /// Log bytes: the LSN of the byte at the start of the range (contiguous in the ring).
    Log(u64),
    /// Zeros (the range lies beyond a truncation point).
    Zero,
}

impl Src {
    /// The source of the byte `delta` bytes further on.
    fn advance(self, delta: u64) -> Src {
        match self {
            Src::Log(l) => Src::Log(l + delta),
            Src::Zero => Src::Zero,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ext {
    end: u64,
    src: Src,
    tag: u64,
}

/// Non-overlapping file ranges `[start, end)` mapped to their source. Its index
/// allocates only when it grows past its largest size so far ([`OrdMap`]), so a
/// recycled one ([`Extents::clear`]) lets writes update the overlay without allocating.
#[derive(Debug, Default, Clone)]
pub struct Extents {
    map: OrdMap<Ext>,
}

/// One piece of a range walk: `[start, end)` and its source, `None` for a gap (not in the
/// overlay: read it from the shared area).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub end: u64,
    pub src: Option<Src>,
}

impl Extents {
    /// An empty map.
    pub fn new() -> Extents {
        Extents::default()
    }

    /// Whether no range is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Drop every range, keeping the room they took.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// How many ranges it can index without allocating.
    pub fn capacity(&self) -> usize {
        self.map.capacity()
    }

    /// Map `[start, end)` to `src` (tagged `tag`), overwriting whatever overlapped it.
    /// One search of the index: the ranges around `start` are cut and removed through a
    /// cursor there.
    pub fn insert(&mut self, start: u64, end: u64, src: Src, tag: u64) {
        if start >= end {
            return;
        }
        let mut c = self.map.cursor_mut(start);
        // Rewriting exactly an existing range (no other range can overlap it).
        if let Some((k, e)) = c.next_mut() {
            if k == start && e.end == end {
                e.src = src;
                e.tag = tag;
                return;
            }
        }
        // What an overlapped range kept beyond `end` (at most one range reaches past it).
        let mut tail = None;
        let mut keep_tail = |s: u64, old: Ext| {
            if old.end > end {
                tail = Some(Ext {
                    end: old.end,
                    src: old.src.advance(end - s),
                    tag: old.tag,
                });
            }
        };
        // A range starting before `start` that reaches into it: cut.
        if let Some((s, e)) = c.prev_mut() {
            if e.end > start {
                let old = *e;
                e.end = start;
                keep_tail(s, old);
            }
        }
        // Ranges starting inside the new one: removed.
        while let Some((s, _)) = c.next_mut() {
            if s >= end {
                break;
            }
            let (s, old) = c.remove_next().expect("present");
            keep_tail(s, old);
        }
        c.insert(Ext { end, src, tag });
        if let Some(t) = tail {
            self.map.insert(end, t);
        }
    }

    /// Drop every range whose tag is at most `upto` (digested by the daemon).
    pub fn prune(&mut self, upto: u64) {
        self.map.retain(|_, e| e.tag > upto);
    }

    /// The largest tag of any range (0 when empty).
    pub fn max_tag(&self) -> u64 {
        self.map.iter().map(|(_, e)| e.tag).max().unwrap_or(0)
    }

    /// Walk `[start, end)`: mapped pieces and gaps, in order, covering it exactly.
    pub fn segments(&self, start: u64, end: u64) -> Segments<'_> {
        Segments {
            ext: self,
            pos: start,
            end,
        }
    }
}

/// Iterator returned by [`Extents::segments`].
pub struct Segments<'a> {
    ext: &'a Extents,
    pos: u64,
    end: u64,
}

impl Iterator for Segments<'_> {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.pos >= self.end {
            return None;
        }
        let pos = self.pos;
        // A range containing `pos`?
        if let Some((s, e)) = self.ext.map.last_before(pos + 1) {
            if e.end > pos {
                let seg_end = e.end.min(self.end);
                self.pos = seg_end;
                return Some(Segment {
                    start: pos,
                    end: seg_end,
                    src: Some(e.src.advance(pos - s)),
                });
            }
        }
        // A gap up to the next range (or the end).
        let next = self
            .ext
            .map
            .first_in(pos + 1, self.end)
            .map_or(self.end, |(s, _)| s);
        self.pos = next;
        Some(Segment {
            start: pos,
            end: next,
            src: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_splits_and_segments_cover() {
        let mut x = Extents::new();
        x.insert(0, 100, Src::Log(1000), 1);
        x.insert(40, 60, Src::Zero, 2);
        let segs: Vec<_> = x.segments(0, 120).collect();
        assert_eq!(
            segs,
            vec![
                Segment {
                    start: 0,
                    end: 40,
                    src: Some(Src::Log(1000))
                },
                Segment {
                    start: 40,
                    end: 60,
                    src: Some(Src::Zero)
                },
                Segment {
                    start: 60,
                    end: 100,
                    src: Some(Src::Log(1060))
                },
                Segment {
                    start: 100,
                    end: 120,
                    src: None
                },
            ]
        );
        x.prune(1);
        assert_eq!(x.len(), 1);
        assert_eq!(x.max_tag(), 2);
        let segs: Vec<_> = x.segments(10, 50).collect();
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0].src, None);
        assert_eq!(segs[1].start, 40);
    }

    /// One operation of the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Write { off: u64, len: u64, byte: u8 },
        Truncate { size: u64 },
        Digest { upto: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..300, 1u64..80, any::<u8>()).prop_map(|(off, len, byte)| Op::Write { off, len, byte }),
            1 => (0u64..300).prop_map(|size| Op::Truncate { size }),
            1 => (0usize..40).prop_map(|upto| Op::Digest { upto }),
        ]
    }

    /// Materialise the file as a reader would: overlay first, then the "shared area"
    /// (`base`, zeros beyond its size), bounded by the current size.
    fn read_all(x: &Extents, log: &[u8], base: &[u8], size: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for seg in x.segments(0, size) {
            for p in seg.start..seg.end {
                out.push(match seg.src {
                    Some(Src::Log(l)) => log[(l + p - seg.start) as usize],
                    Some(Src::Zero) => 0,
                    None => base.get(p as usize).copied().unwrap_or(0),
                });
            }
        }
        out
    }

    proptest! {
        /// Random writes, truncations and digests against a `Vec<u8>` model: after every
        /// step, overlay + shared area reads exactly the model's bytes.
        #[test]
        fn overlay_matches_model(
            base0 in proptest::collection::vec(any::<u8>(), 0..200),
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let mut x = Extents::new();
            let mut log: Vec<u8> = Vec::new();
            let mut model = base0.clone();
            // history[k] = file state after the first k transactions (tags are k + 1).
            let mut history = vec![model.clone()];
            let mut base = base0.clone();
            let mut digested = 0usize;
            for o in ops {
                match o {
                    Op::Write { off, len, byte } => {
                        let tag = history.len() as u64;
                        let lsn = log.len() as u64;
                        log.extend(std::iter::repeat_n(byte, len as usize));
                        x.insert(off, off + len, Src::Log(lsn), tag);
                        let end = (off + len) as usize;
                        if model.len() < end { model.resize(end, 0); }
                        model[off as usize..end].fill(byte);
                        history.push(model.clone());
                    }
                    Op::Truncate { size } => {
                        let tag = history.len() as u64;
                        x.insert(size, cairn_format::MAX_FILE_SIZE, Src::Zero, tag);
                        model.resize(size as usize, 0);
                        history.push(model.clone());
                    }
                    Op::Digest { upto } => {
                        let k = upto.min(history.len() - 1).max(digested);
                        digested = k;
                        base = history[k].clone();
                        x.prune(k as u64);
                    }
                }
                prop_assert_eq!(read_all(&x, &log, &base, model.len() as u64), model.clone());
                // Ranges never overlap and are ordered.
                let mut last = 0;
                for (s, e) in x.map.iter() {
                    prop_assert!(s >= last && e.end > s);
                    last = e.end;
                }
            }
        }
    }
}
