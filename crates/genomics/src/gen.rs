//! A deterministic generator of synthetic paired-end sequencing data: the same seed and
//! read count give the same bytes. Pairs of 100-base reads on eight references, most
//! mapped as proper pairs, with mates on other references, singletons, unmapped pairs,
//! duplicates, QC failures, secondary and supplementary alignments, insertions,
//! deletions and soft clips, so that every flagstat line and both sort orders have work.

use cairn_area::fs_err;
use noodles_sam::alignment::io::Write as _;
use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;

/// Bases per read.
pub const READ_LEN: usize = 150;

/// The references of the generated header: name and length.
pub const REFS: [(&str, u64); 8] = [
    ("chr1", 24_000_000),
    ("chr2", 22_000_000),
    ("chr3", 19_000_000),
    ("chr4", 17_000_000),
    ("chr5", 15_000_000),
    ("chr10", 12_000_000),
    ("chrX", 14_000_000),
    ("chrM", 16_569),
];

/// splitmix64: small, fast, and the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `pct` percent.
    pub fn pct(&mut self, pct: u64) -> bool {
        self.below(1000) < pct * 10
    }
}

/// The SAM header text of a generated data set.
pub fn header() -> String {
    let mut s = String::from("@HD\tVN:1.6\tSO:unsorted\n");
    for (n, l) in REFS {
        writeln!(s, "@SQ\tSN:{n}\tLN:{l}").unwrap();
    }
    s.push_str("@RG\tID:sim\tSM:synthetic\tPL:ILLUMINA\n");
    s.push_str("@PG\tID:cairn-gen\tPN:cairn\tCL:cairn bench spacejmp sam\n");
    s
}

struct Placed {
    ref_id: usize,
    pos: u64, // 1-based
    cigar: String,
    ref_len: u64,
    reverse: bool,
    mapq: u8,
    nm: u32,
}

fn place(rng: &mut Rng, ref_id: usize, near: Option<u64>) -> Placed {
    let len = REFS[ref_id].1;
    let pos = match near {
        Some(p) => (p + 100 + rng.below(400)).min(len - 2 * READ_LEN as u64),
        None => 1 + rng.below(len - 2 * READ_LEN as u64),
    };
    let (cigar, ref_len, nm) = match rng.below(100) {
        0..=79 => (format!("{READ_LEN}M"), READ_LEN as u64, rng.below(3) as u32),
        80..=86 => {
            let a = 10 + rng.below(80);
            let k = 1 + rng.below(3);
            (
                format!("{a}M{k}I{}M", READ_LEN as u64 - a - k),
                READ_LEN as u64 - k,
                k as u32,
            )
        }
        87..=93 => {
            let a = 10 + rng.below(80);
            let k = 1 + rng.below(5);
            (
                format!("{a}M{k}D{}M", READ_LEN as u64 - a),
                READ_LEN as u64 + k,
                k as u32,
            )
        }
        _ => {
            let s = 3 + rng.below(20);
            (
                format!("{s}S{}M", READ_LEN as u64 - s),
                READ_LEN as u64 - s,
                0,
            )
        }
    };
    let mapq = if rng.pct(90) { 60 } else { rng.below(60) as u8 };
    Placed {
        ref_id,
        pos,
        cigar,
        ref_len,
        reverse: rng.pct(50),
        mapq,
        nm,
    }
}

fn bases(rng: &mut Rng, out: &mut String) {
    const B: &[u8; 4] = b"ACGT";
    for _ in 0..READ_LEN {
        let r = rng.below(1000);
        out.push(if r == 0 {
            'N'
        } else {
            B[(r % 4) as usize] as char
        });
    }
}

fn quals(rng: &mut Rng, out: &mut String) {
    // Binned qualities, as current instruments give, in runs.
    const Q: &[u8] = b"#,:FFFFF";
    let mut q = Q[rng.below(Q.len() as u64) as usize];
    for _ in 0..READ_LEN {
        if rng.pct(15) {
            q = Q[rng.below(Q.len() as u64) as usize];
        }
        out.push(q as char);
    }
}

/// One SAM line.
#[allow(clippy::too_many_arguments)]
fn line(
    out: &mut String,
    rng: &mut Rng,
    name: &str,
    flag: u16,
    me: Option<&Placed>,
    mate: Option<&Placed>,
    tlen: i64,
) {
    let (rname, pos, mapq, cigar) = match (me, mate) {
        (Some(p), _) => (REFS[p.ref_id].0, p.pos, p.mapq, p.cigar.as_str()),
        // Unmapped with a mapped mate: placed at the mate's position (SAM 1.4).
        (None, Some(m)) => (REFS[m.ref_id].0, m.pos, 0, "*"),
        (None, None) => ("*", 0, 0, "*"),
    };
    let (rnext, pnext) = match (mate, me) {
        (Some(m), Some(p)) if m.ref_id == p.ref_id => ("=", m.pos),
        (Some(m), Some(_)) => (REFS[m.ref_id].0, m.pos),
        (Some(m), None) => ("=", m.pos),
        (None, Some(p)) => ("=", p.pos),
        (None, None) => ("*", 0),
    };
    write!(
        out,
        "{name}\t{flag}\t{rname}\t{pos}\t{mapq}\t{cigar}\t{rnext}\t{pnext}\t{tlen}\t"
    )
    .unwrap();
    bases(rng, out);
    out.push('\t');
    quals(rng, out);
    let nm = me.map_or(0, |p| p.nm);
    writeln!(out, "\tNM:i:{nm}\tRG:Z:sim").unwrap();
}

/// Write `reads` records of synthetic data as SAM text to `w` (seed `seed`).
pub fn write_sam(w: &mut dyn Write, reads: u64, seed: u64) -> io::Result<()> {
    use crate::model::flag::*;
    let mut rng = Rng::new(seed);
    w.write_all(header().as_bytes())?;
    let mut out = String::with_capacity(1 << 20);
    let mut written = 0u64;
    let mut pair = 0u64;
    while written < reads {
        let name = format!(
            "SIM:{}:{}:{}:{}",
            1 + rng.below(8),
            1101 + rng.below(1200),
            pair,
            rng.below(30000)
        );
        pair += 1;
        if reads - written == 1 {
            // An odd count ends with one unpaired read.
            let c = rng.below(REFS.len() as u64) as usize;
            let p = place(&mut rng, c, None);
            let flag = if p.reverse { REVERSE } else { 0 };
            line(&mut out, &mut rng, &name, flag, Some(&p), None, 0);
            written += 1;
            continue;
        }
        let mut base = PAIRED;
        if rng.pct(3) {
            base |= DUPLICATE;
        }
        if rng.pct(1) {
            base |= QC_FAIL;
        }
        let r = rng.below(100);
        let chr = rng.below(REFS.len() as u64 - 1) as usize;
        let (a, b, proper) = match r {
            0..=86 => {
                let a = place(&mut rng, chr, None);
                let b = place(&mut rng, chr, Some(a.pos));
                (Some(a), Some(b), true)
            }
            87..=91 => {
                let a = place(&mut rng, chr, None);
                let other = (chr + 1 + rng.below(REFS.len() as u64 - 1) as usize) % REFS.len();
                (Some(a), Some(place(&mut rng, other, None)), false)
            }
            92..=96 => (Some(place(&mut rng, chr, None)), None, false),
            _ => (None, None, false),
        };
        let mut f1 = base | READ1;
        let mut f2 = base | READ2;
        if proper {
            f1 |= PROPER_PAIR;
            f2 |= PROPER_PAIR;
        }
        for (f, me, mate) in [(&mut f1, &a, &b), (&mut f2, &b, &a)] {
            if me.is_none() {
                *f |= UNMAPPED;
            }
            if mate.is_none() {
                *f |= MATE_UNMAPPED;
            }
            if me.as_ref().is_some_and(|p| p.reverse) {
                *f |= REVERSE;
            }
            if mate.as_ref().is_some_and(|p| p.reverse) {
                *f |= MATE_REVERSE;
            }
        }
        let tlen = match (&a, &b) {
            (Some(x), Some(y)) if proper => (y.pos + y.ref_len) as i64 - x.pos as i64,
            _ => 0,
        };
        line(&mut out, &mut rng, &name, f1, a.as_ref(), b.as_ref(), tlen);
        line(&mut out, &mut rng, &name, f2, b.as_ref(), a.as_ref(), -tlen);
        written += 2;
        // Now and then a secondary or supplementary alignment of read 1.
        if written < reads && a.is_some() && rng.pct(2) {
            let extra = if rng.pct(50) {
                SECONDARY
            } else {
                SUPPLEMENTARY
            };
            let c = rng.below(REFS.len() as u64) as usize;
            let p = place(&mut rng, c, None);
            let mut f = (f1 & !(PROPER_PAIR | REVERSE)) | extra;
            if p.reverse {
                f |= REVERSE;
            }
            line(&mut out, &mut rng, &name, f, Some(&p), b.as_ref(), 0);
            written += 1;
        }
        if out.len() > (1 << 20) - 4096 {
            w.write_all(out.as_bytes())?;
            out.clear();
        }
    }
    w.write_all(out.as_bytes())?;
    w.flush()
}

/// Convert SAM text to BAM, with noodles (2 compression threads).
pub fn sam_to_bam(sam: &Path, bam: &Path) -> io::Result<u64> {
    let f = std::fs::File::open(sam).map_err(|e| ctx(sam, e))?;
    let mut reader = noodles_sam::io::Reader::new(BufReader::with_capacity(1 << 20, f));
    let header = reader.read_header().map_err(|e| ctx(sam, e))?;
    let out = std::fs::File::create(bam).map_err(|e| ctx(bam, e))?;
    let workers = std::num::NonZero::new(2).unwrap();
    let mut writer = noodles_bam::io::Writer::from(
        noodles_bgzf::io::MultithreadedWriter::with_worker_count(workers, BufWriter::new(out)),
    );
    writer.write_header(&header)?;
    let mut rec = noodles_sam::Record::default();
    let mut n = 0u64;
    loop {
        match reader.read_record(&mut rec) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(malformed(sam, n + 1, e)),
        }
        n += 1;
        writer
            .write_alignment_record(&header, &rec)
            .map_err(|e| malformed(sam, n, e))?;
    }
    writer.get_mut().finish()?.flush()?;
    Ok(n)
}

pub(crate) fn ctx(p: &Path, e: io::Error) -> io::Error {
    fs_err(cairn_area::errno_of(&e), format!("{}: {e}", p.display()))
}

/// A malformed SAM record: `EINVAL` naming the file and the record.
pub(crate) fn malformed(p: &Path, record: u64, e: io::Error) -> io::Error {
    let errno = match e.kind() {
        _ if e.raw_os_error().is_some() => cairn_area::errno_of(&e),
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof => {
            libc::EINVAL
        }
        _ => cairn_area::errno_of(&e),
    };
    fs_err(errno, format!("{}: record {record}: {e}", p.display()))
}

/// Whether `p` starts with gzip's magic (BAM is BGZF, a gzip).
pub fn is_bgzf(p: &Path) -> io::Result<bool> {
    let f = std::fs::File::open(p).map_err(|e| ctx(p, e))?;
    let mut r = BufReader::new(f);
    let buf = r.fill_buf().map_err(|e| ctx(p, e))?;
    Ok(buf.starts_with(&[0x1f, 0x8b]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_deterministic() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write_sam(&mut a, 1001, 7).unwrap();
        write_sam(&mut b, 1001, 7).unwrap();
        assert_eq!(a, b);
        let text = String::from_utf8(a).unwrap();
        assert_eq!(text.lines().filter(|l| !l.starts_with('@')).count(), 1001);
        let mut c = Vec::new();
        write_sam(&mut c, 1001, 8).unwrap();
        assert_ne!(text.as_bytes(), &c[..]);
    }
}
