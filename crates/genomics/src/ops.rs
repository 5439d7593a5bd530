//! The operations, written once over any [`Source`] of records: flagstat, sort by name
//! and by coordinate, index, region query. Results follow samtools 1.16 exactly
//! (flagstat's counts, `sort`'s and `sort -n`'s order, `view -c REGION`'s count).

use crate::model::{flag, Rec, Reference};
use cairn_area::fs_err;
use std::cmp::Ordering;
use std::fmt::Write as _;
use std::io;
use std::time::{Duration, Instant};

/// Records in some order, wherever they live. A location (`u64`) names a record so
/// that [`Source::scan_from`] can start there: a BGZF virtual offset in a BAM file, an
/// ordinal in a data set's order in a segment. Locations grow along the order.
pub trait Source {
    fn references(&self) -> &[Reference];
    /// Every record, in order, with its location.
    fn scan(&mut self, f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<()>) -> io::Result<()>;
    /// The records from location `loc` on, in order, while `f` returns true.
    fn scan_from(
        &mut self,
        loc: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()>;
}

// ---- flagstat ----------------------------------------------------------------------

/// samtools flagstat's counts, QC-passed (`[0]`) and QC-failed (`[1]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlagStat {
    pub total: [u64; 2],
    pub primary: [u64; 2],
    pub secondary: [u64; 2],
    pub supplementary: [u64; 2],
    pub duplicates: [u64; 2],
    pub primary_duplicates: [u64; 2],
    pub mapped: [u64; 2],
    pub primary_mapped: [u64; 2],
    pub paired: [u64; 2],
    pub read1: [u64; 2],
    pub read2: [u64; 2],
    pub proper_pair: [u64; 2],
    pub both_mapped: [u64; 2],
    pub singletons: [u64; 2],
    pub diff_chr: [u64; 2],
    pub diff_chr_q5: [u64; 2],
}

impl FlagStat {
    /// Count one record (samtools' `bam_stat.c`).
    pub fn add(&mut self, r: &Rec<'_>) {
        let f = r.core.flag;
        let w = usize::from(f & flag::QC_FAIL != 0);
        self.total[w] += 1;
        if f & flag::SECONDARY != 0 {
            self.secondary[w] += 1;
        } else if f & flag::SUPPLEMENTARY != 0 {
            self.supplementary[w] += 1;
        } else {
            self.primary[w] += 1;
            if f & flag::PAIRED != 0 {
                self.paired[w] += 1;
                if f & flag::PROPER_PAIR != 0 && f & flag::UNMAPPED == 0 {
                    self.proper_pair[w] += 1;
                }
                if f & flag::READ1 != 0 {
                    self.read1[w] += 1;
                }
                if f & flag::READ2 != 0 {
                    self.read2[w] += 1;
                }
                if f & flag::MATE_UNMAPPED != 0 && f & flag::UNMAPPED == 0 {
                    self.singletons[w] += 1;
                }
                if f & flag::UNMAPPED == 0 && f & flag::MATE_UNMAPPED == 0 {
                    self.both_mapped[w] += 1;
                    if r.core.mate_ref_id != r.core.ref_id {
                        self.diff_chr[w] += 1;
                        if r.core.mapq >= 5 {
                            self.diff_chr_q5[w] += 1;
                        }
                    }
                }
            }
            if f & flag::UNMAPPED == 0 {
                self.primary_mapped[w] += 1;
            }
            if f & flag::DUPLICATE != 0 {
                self.primary_duplicates[w] += 1;
            }
        }
        if f & flag::UNMAPPED == 0 {
            self.mapped[w] += 1;
        }
        if f & flag::DUPLICATE != 0 {
            self.duplicates[w] += 1;
        }
    }

    /// The counts in samtools flagstat's order.
    pub fn lines(&self) -> [([u64; 2], &'static str); 16] {
        [
            (self.total, "in total (QC-passed reads + QC-failed reads)"),
            (self.primary, "primary"),
            (self.secondary, "secondary"),
            (self.supplementary, "supplementary"),
            (self.duplicates, "duplicates"),
            (self.primary_duplicates, "primary duplicates"),
            (self.mapped, "mapped"),
            (self.primary_mapped, "primary mapped"),
            (self.paired, "paired in sequencing"),
            (self.read1, "read1"),
            (self.read2, "read2"),
            (self.proper_pair, "properly paired"),
            (self.both_mapped, "with itself and mate mapped"),
            (self.singletons, "singletons"),
            (self.diff_chr, "with mate mapped to a different chr"),
            (
                self.diff_chr_q5,
                "with mate mapped to a different chr (mapQ>=5)",
            ),
        ]
    }

    /// samtools flagstat's text.
    pub fn text(&self) -> String {
        let pct = |n: u64, d: u64| {
            if d == 0 {
                "N/A".to_string()
            } else {
                format!("{:.2}%", n as f64 * 100.0 / d as f64)
            }
        };
        let mut s = String::new();
        for (v, what) in self.lines() {
            let denom = match what {
                "mapped" => Some(self.total),
                "primary mapped" => Some(self.primary),
                "properly paired" | "singletons" => Some(self.paired),
                _ => None,
            };
            match denom {
                Some(d) => writeln!(
                    s,
                    "{} + {} {what} ({} : {})",
                    v[0],
                    v[1],
                    pct(v[0], d[0]),
                    pct(v[1], d[1])
                ),
                None => writeln!(s, "{} + {} {what}", v[0], v[1]),
            }
            .expect("write to a string");
        }
        s
    }

    /// The counts of samtools flagstat's text output, in its order.
    pub fn parse_counts(text: &str) -> io::Result<Vec<[u64; 2]>> {
        let mut out = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let mut it = line.split_whitespace();
            let a = it.next().and_then(|x| x.parse().ok());
            let plus = it.next();
            let b = it.next().and_then(|x| x.parse().ok());
            match (a, plus, b) {
                (Some(a), Some("+"), Some(b)) => out.push([a, b]),
                _ => {
                    return Err(fs_err(
                        libc::EINVAL,
                        format!("not a flagstat line: {line:?}"),
                    ))
                }
            }
        }
        Ok(out)
    }

    pub fn counts(&self) -> Vec<[u64; 2]> {
        self.lines().iter().map(|(v, _)| *v).collect()
    }
}

/// flagstat over every record of `src`.
pub fn flagstat(src: &mut dyn Source) -> io::Result<FlagStat> {
    let mut s = FlagStat::default();
    src.scan(&mut |_, r| {
        s.add(r);
        Ok(())
    })?;
    Ok(s)
}

// ---- sort --------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// samtools sort -n: read names in natural order, then READ1 before READ2.
    Name,
    /// samtools sort: reference, position, forward before reverse; unmapped last.
    Coord,
}

impl Order {
    pub fn parse(s: &str) -> io::Result<Order> {
        match s {
            "name" => Ok(Order::Name),
            "coord" | "coordinate" => Ok(Order::Coord),
            _ => Err(fs_err(
                libc::EINVAL,
                format!("sort order {s:?}: name or coord"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Order::Name => "name",
            Order::Coord => "coord",
        }
    }
}

/// samtools' `strnum_cmp`: bytes compared one by one, runs of digits as numbers.
pub fn strnum_cmp(a: &[u8], b: &[u8]) -> Ordering {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let (mut i, mut j) = (0, 0);
    while at(a, i) != 0 && at(b, j) != 0 {
        let (ca, cb) = (at(a, i), at(b, j));
        if !ca.is_ascii_digit() || !cb.is_ascii_digit() {
            if ca != cb {
                return ca.cmp(&cb);
            }
            i += 1;
            j += 1;
        } else {
            while at(a, i) == b'0' {
                i += 1;
            }
            while at(b, j) == b'0' {
                j += 1;
            }
            while at(a, i).is_ascii_digit() && at(a, i) == at(b, j) {
                i += 1;
                j += 1;
            }
            let diff = at(a, i) as i32 - at(b, j) as i32;
            while at(a, i).is_ascii_digit() && at(b, j).is_ascii_digit() {
                i += 1;
                j += 1;
            }
            if at(a, i).is_ascii_digit() {
                return Ordering::Greater;
            } else if at(b, j).is_ascii_digit() {
                return Ordering::Less;
            } else if diff != 0 {
                return diff.cmp(&0);
            }
        }
    }
    if at(a, i) != 0 {
        Ordering::Greater
    } else if at(b, j) != 0 {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

/// The keys of a sort, gathered from a source, and its result.
pub struct Sorted {
    /// The locations of the records, in the new order.
    pub locs: Vec<u64>,
    /// Time to gather the keys (reading the records).
    pub gather: Duration,
    /// The compute-bound core: comparing and ordering the keys.
    pub core: Duration,
}

/// The order of `src`'s records by `order`, as samtools sort gives it (a stable sort:
/// records equal under the order keep their order).
pub fn sort(src: &mut dyn Source, order: Order) -> io::Result<Sorted> {
    let t0 = Instant::now();
    let mut locs = Vec::new();
    match order {
        Order::Coord => {
            let mut keys: Vec<(u64, u64)> = Vec::new();
            src.scan(&mut |loc, r| {
                let c = &r.core;
                let pa = ((c.ref_id as u32 as u64) << 32) | ((c.pos + 1) as u32 as u64);
                let rev = u64::from(c.flag & flag::REVERSE != 0);
                keys.push((pa, (rev << 32) | keys.len() as u64));
                locs.push(loc);
                Ok(())
            })?;
            let gather = t0.elapsed();
            let t1 = Instant::now();
            keys.sort_unstable();
            let locs = keys
                .iter()
                .map(|k| locs[(k.1 & 0xffff_ffff) as usize])
                .collect();
            Ok(Sorted {
                locs,
                gather,
                core: t1.elapsed(),
            })
        }
        Order::Name => {
            let mut names: Vec<u8> = Vec::new();
            // (offset of the name, its length, flag & 0xc0)
            let mut keys: Vec<(u64, u16, u16)> = Vec::new();
            src.scan(&mut |loc, r| {
                keys.push((names.len() as u64, r.name.len() as u16, r.core.flag & 0xc0));
                names.extend_from_slice(r.name);
                locs.push(loc);
                Ok(())
            })?;
            let gather = t0.elapsed();
            let t1 = Instant::now();
            let mut idx: Vec<u32> = (0..keys.len() as u32).collect();
            let name = |k: &(u64, u16, u16)| &names[k.0 as usize..k.0 as usize + k.1 as usize];
            idx.sort_by(|&a, &b| {
                let (ka, kb) = (&keys[a as usize], &keys[b as usize]);
                strnum_cmp(name(ka), name(kb)).then(ka.2.cmp(&kb.2))
            });
            let locs = idx.iter().map(|&i| locs[i as usize]).collect();
            Ok(Sorted {
                locs,
                gather,
                core: t1.elapsed(),
            })
        }
    }
}

// ---- index and region queries ------------------------------------------------------

/// Windows of the linear index: 16 KiB of reference, as BAI's.
pub const WINDOW_SHIFT: u32 = 14;
const INDEX_MAGIC: u64 = 0x5844_4e49_4d41_5343; // "CSAMINDX"
const NONE: u64 = u64::MAX;

/// A linear index of a data set sorted by coordinate: for each reference and each
/// 16 KiB window of it, the location of the first record that overlaps the window
/// (or of the first after it). Invariant: locations never decrease along a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    windows: Vec<Vec<u64>>,
}

impl Index {
    /// Index `src`, which must be sorted by coordinate (`EINVAL` if it is not).
    pub fn build(src: &mut dyn Source) -> io::Result<Index> {
        let n_refs = src.references().len();
        let mut windows: Vec<Vec<u64>> = vec![Vec::new(); n_refs];
        let mut last = (i64::MIN, i64::MIN);
        let mut seen = 0u64;
        src.scan(&mut |loc, r| {
            let c = &r.core;
            let key = if c.ref_id < 0 {
                (i64::MAX, 0)
            } else {
                (c.ref_id as i64, c.pos as i64)
            };
            if key < last {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("record {seen} is out of coordinate order: sort by coordinate first"),
                ));
            }
            last = key;
            seen += 1;
            if c.ref_id < 0 {
                return Ok(());
            }
            let w = windows.get_mut(c.ref_id as usize).ok_or_else(|| {
                fs_err(
                    libc::EINVAL,
                    format!("record {seen}: reference {} not in the header", c.ref_id),
                )
            })?;
            let (first, lastw) = (
                (c.pos.max(0) >> WINDOW_SHIFT) as usize,
                ((c.end.max(1) - 1) >> WINDOW_SHIFT) as usize,
            );
            if w.len() <= lastw {
                w.resize(lastw + 1, NONE);
            }
            for x in &mut w[first..=lastw] {
                if *x == NONE {
                    *x = loc;
                }
            }
            Ok(())
        })?;
        for w in &mut windows {
            let mut carry = NONE;
            for x in w.iter_mut().rev() {
                if *x == NONE {
                    *x = carry;
                } else {
                    carry = *x;
                }
            }
        }
        let ix = Index { windows };
        ix.check()?;
        Ok(ix)
    }

    fn check(&self) -> io::Result<()> {
        for (i, w) in self.windows.iter().enumerate() {
            if w.windows(2).any(|p| p[0] > p[1]) {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("index of reference {i}: locations decrease"),
                ));
            }
        }
        Ok(())
    }

    /// Where a query of `[beg, ..)` on reference `ref_id` starts (`None`: nothing there).
    pub fn start(&self, ref_id: usize, beg: i32) -> Option<u64> {
        let w = self.windows.get(ref_id)?;
        let x = *w.get((beg.max(0) >> WINDOW_SHIFT) as usize)?;
        (x != NONE).then_some(x)
    }

    /// The index as words: magic, number of references, then per reference the number
    /// of windows and the windows.
    pub fn to_words(&self) -> Vec<u64> {
        let mut v = vec![INDEX_MAGIC, self.windows.len() as u64];
        for w in &self.windows {
            v.push(w.len() as u64);
            v.extend_from_slice(w);
        }
        v
    }

    pub fn from_words(v: &[u64]) -> io::Result<Index> {
        let bad = || fs_err(libc::EINVAL, "damaged index: rebuild it with index");
        if v.len() < 2 || v[0] != INDEX_MAGIC {
            return Err(bad());
        }
        let n = v[1] as usize;
        let mut windows = Vec::with_capacity(n.min(v.len()));
        let mut at = 2usize;
        for _ in 0..n {
            let len = *v.get(at).ok_or_else(bad)? as usize;
            at += 1;
            let w = v
                .get(at..at.checked_add(len).ok_or_else(bad)?)
                .ok_or_else(bad)?;
            windows.push(w.to_vec());
            at += len;
        }
        if at != v.len() {
            return Err(bad());
        }
        let ix = Index { windows };
        ix.check()?;
        Ok(ix)
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.to_words()
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }

    pub fn from_bytes(b: &[u8]) -> io::Result<Index> {
        if !b.len().is_multiple_of(8) {
            return Err(fs_err(libc::EINVAL, "damaged index: not whole words"));
        }
        let v: Vec<u64> = b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Index::from_words(&v)
    }
}

/// A region of a reference: `[beg, end)`, 0-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub ref_id: usize,
    pub beg: i32,
    pub end: i32,
}

impl Region {
    /// samtools' region syntax: `NAME`, `NAME:BEG` or `NAME:BEG-END` (1-based, inclusive).
    pub fn parse(refs: &[Reference], s: &str) -> io::Result<Region> {
        let bad = |why: &str| fs_err(libc::EINVAL, format!("region {s:?}: {why}"));
        let (name, range) = match refs.iter().position(|r| r.name == s) {
            Some(_) => (s, None),
            None => match s.rsplit_once(':') {
                Some((n, r)) => (n, Some(r)),
                None => (s, None),
            },
        };
        let ref_id = refs
            .iter()
            .position(|r| r.name == name)
            .ok_or_else(|| bad("no such reference in the header"))?;
        let (beg, end) = match range {
            None => (0i64, i32::MAX as i64),
            Some(r) => {
                let r = r.replace(',', "");
                let num = |x: &str| {
                    x.parse::<i64>()
                        .ok()
                        .filter(|&v| v >= 1 && v <= i32::MAX as i64)
                        .ok_or_else(|| bad("positions are numbers from 1"))
                };
                match r.split_once('-') {
                    Some((a, b)) => (num(a)? - 1, num(b)?),
                    None => (num(&r)? - 1, i32::MAX as i64),
                }
            }
        };
        if beg >= end {
            return Err(bad("its start is past its end"));
        }
        Ok(Region {
            ref_id,
            beg: beg as i32,
            end: end as i32,
        })
    }
}

/// The records of `src` (sorted by coordinate, indexed by `ix`) that overlap `region`
/// (samtools view REGION: `pos < end` and `end_pos > beg`), given to `f`; their count.
pub fn query(
    src: &mut dyn Source,
    ix: &Index,
    region: Region,
    f: &mut dyn FnMut(&Rec<'_>),
) -> io::Result<u64> {
    let Some(start) = ix.start(region.ref_id, region.beg) else {
        return Ok(0);
    };
    let mut n = 0;
    src.scan_from(start, &mut |_, r| {
        let c = &r.core;
        if c.ref_id != region.ref_id as i32 || c.pos >= region.end {
            return Ok(false);
        }
        if c.end > region.beg {
            n += 1;
            f(r);
        }
        Ok(true)
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_is_samtools() {
        use Ordering::*;
        assert_eq!(strnum_cmp(b"r2", b"r10"), Less);
        assert_eq!(strnum_cmp(b"r010", b"r10"), Equal);
        assert_eq!(strnum_cmp(b"a", b"ab"), Less);
        assert_eq!(strnum_cmp(b"x:12:3", b"x:12:20"), Less);
        assert_eq!(strnum_cmp(b"B", b"a"), Less);
    }

    #[test]
    fn index_words_round_trip_and_reject_damage() {
        let ix = Index {
            windows: vec![vec![0, 5, 5, NONE], vec![]],
        };
        assert_eq!(Index::from_words(&ix.to_words()).unwrap(), ix);
        let mut w = ix.to_words();
        w.pop();
        assert!(Index::from_words(&w).is_err());
        assert!(Index::from_bytes(&[1, 2, 3]).is_err());
    }

    #[test]
    fn regions_parse_like_samtools() {
        let refs = vec![Reference {
            name: "chr1".into(),
            len: 1000,
        }];
        assert_eq!(
            Region::parse(&refs, "chr1:10-20").unwrap(),
            Region {
                ref_id: 0,
                beg: 9,
                end: 20
            }
        );
        assert!(Region::parse(&refs, "chr2:1-5").is_err());
        assert!(Region::parse(&refs, "chr1:0-5").is_err());
        assert!(Region::parse(&refs, "chr1:9-5").is_err());
    }
}
