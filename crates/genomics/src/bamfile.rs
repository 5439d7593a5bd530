//! The operations on records decoded from BAM files each time, as a tool chain passing
//! files between its stages does: every tool reads (and decompresses, and decodes) the
//! whole file it is given; sorting writes a new BAM file, indexing writes an index file
//! beside it (`FILE.cidx`, the same linear index a data set keeps in its segment).

use crate::gen::{ctx, malformed};
use crate::model::{end_pos, Core, Rec, Reference};
use crate::ops::{self, FlagStat, Index, Order, Region, Source};
use noodles_bam as bam;
use noodles_bgzf as bgzf;
use noodles_sam as sam;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::num::NonZero;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Decompression and compression threads (the machine's two CPUs, as `samtools -@ 2`).
pub const THREADS: usize = 2;

/// A BAM file, its header read.
pub struct BamFile {
    path: PathBuf,
    header: sam::Header,
    refs: Vec<Reference>,
}

fn header_refs(header: &sam::Header) -> Vec<Reference> {
    header
        .reference_sequences()
        .iter()
        .map(|(name, rs)| Reference {
            name: String::from_utf8_lossy(name).into_owned(),
            len: usize::from(rs.length()) as u64,
        })
        .collect()
}

/// The core and name of a decoded BAM record.
pub fn decode(r: &bam::Record) -> io::Result<(Core, &[u8])> {
    let opt = |v: Option<io::Result<usize>>| -> io::Result<i32> {
        match v {
            None => Ok(-1),
            Some(x) => Ok(x? as i32),
        }
    };
    let pos = |v: Option<io::Result<noodles_core::Position>>| -> io::Result<i32> {
        match v {
            None => Ok(-1),
            Some(p) => Ok(usize::from(p?) as i32 - 1),
        }
    };
    let flag = r.flags().bits();
    let p = pos(r.alignment_start())?;
    let name: &[u8] = r.name().map(|n| n.as_ref()).unwrap_or(b"*");
    let cigar = r.cigar();
    let core = Core {
        ref_id: opt(r.reference_sequence_id())?,
        pos: p,
        end: end_pos(p, flag, cigar.as_bytes()),
        mate_ref_id: opt(r.mate_reference_sequence_id())?,
        mate_pos: pos(r.mate_alignment_start())?,
        tlen: r.template_length(),
        flag,
        mapq: r.mapping_quality().map_or(255, u8::from),
        name_len: name.len() as u8,
        l_seq: r.sequence().len() as u32,
        n_cigar: cigar.len() as u16,
        ..Core::default()
    };
    Ok((core, name))
}

impl BamFile {
    pub fn open(path: &Path) -> io::Result<BamFile> {
        let f = File::open(path).map_err(|e| ctx(path, e))?;
        let mut r = bam::io::Reader::new(f);
        let header = r.read_header().map_err(|e| ctx(path, e))?;
        let refs = header_refs(&header);
        Ok(BamFile {
            path: path.to_path_buf(),
            header,
            refs,
        })
    }

    pub fn header(&self) -> &sam::Header {
        &self.header
    }

    /// Every record, decoded (what `samtools sort` reads into memory).
    pub fn read_all(&self) -> io::Result<Vec<bam::Record>> {
        let mut recs = Vec::new();
        self.each(&mut |_, r| {
            recs.push(r.clone());
            Ok(())
        })?;
        Ok(recs)
    }

    fn each(&self, f: &mut dyn FnMut(u64, &bam::Record) -> io::Result<()>) -> io::Result<()> {
        let file = File::open(&self.path).map_err(|e| ctx(&self.path, e))?;
        let inner =
            bgzf::io::MultithreadedReader::with_worker_count(NonZero::new(THREADS).unwrap(), file);
        let mut r = bam::io::Reader::from(inner);
        r.read_header().map_err(|e| ctx(&self.path, e))?;
        let mut rec = bam::Record::default();
        let mut n = 0u64;
        loop {
            let vp = u64::from(r.get_ref().virtual_position());
            match r.read_record(&mut rec) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(malformed(&self.path, n + 1, e)),
            }
            n += 1;
            f(vp, &rec)?;
        }
    }
}

impl Source for BamFile {
    fn references(&self) -> &[Reference] {
        &self.refs
    }

    fn scan(&mut self, f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<()>) -> io::Result<()> {
        self.each(&mut |vp, r| {
            let (core, name) = decode(r)?;
            f(vp, &Rec { core, name })
        })
    }

    fn scan_from(
        &mut self,
        loc: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let file = File::open(&self.path).map_err(|e| ctx(&self.path, e))?;
        let mut r = bam::io::Reader::new(BufReader::new(file));
        r.read_header().map_err(|e| ctx(&self.path, e))?;
        r.get_mut()
            .seek(bgzf::VirtualPosition::from(loc))
            .map_err(|e| ctx(&self.path, e))?;
        let mut rec = bam::Record::default();
        loop {
            let vp = u64::from(r.get_ref().virtual_position());
            if r.read_record(&mut rec).map_err(|e| ctx(&self.path, e))? == 0 {
                return Ok(());
            }
            let (core, name) = decode(&rec)?;
            if !f(vp, &Rec { core, name })? {
                return Ok(());
            }
        }
    }
}

/// Decoded records held in memory, in the order read: what a sort orders.
pub struct InMemory<'a> {
    pub refs: &'a [Reference],
    pub recs: &'a [bam::Record],
}

impl Source for InMemory<'_> {
    fn references(&self) -> &[Reference] {
        self.refs
    }

    fn scan(&mut self, f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<()>) -> io::Result<()> {
        for (i, r) in self.recs.iter().enumerate() {
            let (core, name) = decode(r)?;
            f(i as u64, &Rec { core, name })?;
        }
        Ok(())
    }

    fn scan_from(
        &mut self,
        loc: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        for (i, r) in self.recs.iter().enumerate().skip(loc as usize) {
            let (core, name) = decode(r)?;
            if !f(i as u64, &Rec { core, name })? {
                break;
            }
        }
        Ok(())
    }
}

/// `flagstat FILE.bam`.
pub fn flagstat(path: &Path) -> io::Result<FlagStat> {
    ops::flagstat(&mut BamFile::open(path)?)
}

/// What a sort of a file took.
#[derive(Debug, Clone, Copy)]
pub struct SortTimes {
    pub core: Duration,
    pub total: Duration,
}

/// `sort [-n] IN.bam -o OUT.bam`: read and decode every record, order them, write them.
pub fn sort(input: &Path, output: &Path, order: Order) -> io::Result<SortTimes> {
    let t = Instant::now();
    let file = BamFile::open(input)?;
    let recs = file.read_all()?;
    let sorted = ops::sort(
        &mut InMemory {
            refs: &file.refs,
            recs: &recs,
        },
        order,
    )?;
    let header = sorted_header(file.header(), order)?;
    let out = File::create(output).map_err(|e| ctx(output, e))?;
    let mut w = bam::io::Writer::from(bgzf::io::MultithreadedWriter::with_worker_count(
        NonZero::new(THREADS).unwrap(),
        BufWriter::new(out),
    ));
    w.write_header(&header).map_err(|e| ctx(output, e))?;
    for &i in &sorted.locs {
        w.write_record(&header, &recs[i as usize])
            .map_err(|e| ctx(output, e))?;
    }
    w.get_mut()
        .finish()
        .and_then(|mut b| b.flush())
        .map_err(|e| ctx(output, e))?;
    Ok(SortTimes {
        core: sorted.core,
        total: t.elapsed(),
    })
}

/// The header with `@HD SO:` set for `order`.
fn sorted_header(h: &sam::Header, order: Order) -> io::Result<sam::Header> {
    let mut text = Vec::new();
    sam::io::Writer::new(&mut text).write_header(h)?;
    let text = String::from_utf8_lossy(&text).into_owned();
    let text = crate::dataset::set_sort_order(&text, order);
    text.parse::<sam::Header>()
        .map_err(|e| crate::fs_err(libc::EINVAL, format!("header: {e}")))
}

/// Where `index` keeps the index of `bam`.
pub fn index_path(bam: &Path) -> PathBuf {
    let mut p = bam.as_os_str().to_owned();
    p.push(".cidx");
    PathBuf::from(p)
}

/// `index FILE.bam`: read the file (sorted by coordinate), write `FILE.bam.cidx`.
pub fn index(path: &Path) -> io::Result<Index> {
    let ix = Index::build(&mut BamFile::open(path)?)?;
    let out = index_path(path);
    std::fs::write(&out, ix.bytes()).map_err(|e| ctx(&out, e))?;
    Ok(ix)
}

/// `view -c FILE.bam REGION`: the records overlapping the region, through the index.
pub fn query(path: &Path, region: &str, f: &mut dyn FnMut(&Rec<'_>)) -> io::Result<u64> {
    let mut file = BamFile::open(path)?;
    let ip = index_path(path);
    let ix = Index::from_bytes(&std::fs::read(&ip).map_err(|e| ctx(&ip, e))?)?;
    let region = Region::parse(&file.refs, region)?;
    ops::query(&mut file, &ix, region, f)
}
