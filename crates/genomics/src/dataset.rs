//! A data set in a segment: SAM/BAM read once into a pointer-rich in-memory form, which
//! tools attach and switch into instead of decoding files.
//!
//! Segment `/.sj/seg/sam-NAME` (lockable) in address spaces `sam-NAME` (read-write,
//! for the tools that change it) and `sam-NAME.ro` (read-only: readers share it).
//! Named roots:
//!
//! * `header` → [`HeaderObj`]: the SAM header text.
//! * `reads` → [`ReadsObj`]: the reads as an array of [`Core`]s (64 bytes each, in the
//!   order loaded), each pointing at its name (in an arena of names) and at the BAM
//!   encoding of its CIGAR, sequence, qualities and optional fields (in a data arena).
//! * `by_name`, `by_coord` → [`OrderObj`]: the results of the sorts, arrays of pointers
//!   to the reads' cores.
//! * `index` → [`IndexObj`]: the linear index of the `by_coord` order it was built on
//!   (locations are positions in that array).
//!
//! Every change (load, sort, index) is one commit: all or nothing.

use crate::gen::{ctx, malformed};
use crate::model::{parse_raw, Core, Rec, Reference};
use crate::ops::{self, FlagStat, Index, Order, Region, Source};
use bytemuck::{Pod, Zeroable};
use cairn_area::fs_err;
use cairn_sj::{flags, prot, CommitMode, SegId, SegPtr, SpaceJmp, Switched, Target, Vh};
use noodles_sam::alignment::io::Write as _;
use std::io::{self, BufReader};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HEADER_MAGIC: u64 = 0x5244_4548_4d41_5343; // "CSAMHEDR"
const READS_MAGIC: u64 = 0x5344_4552_4d41_5343; // "CSAMREDS"
const ORDER_MAGIC: u64 = 0x5244_524f_4d41_5343; // "CSAMORDR"
const INDEX_OBJ_MAGIC: u64 = 0x5844_4e49_4d41_5343; // "CSAMINDX"

/// Root `header`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct HeaderObj {
    pub magic: u64,
    pub text: u64,
    pub text_len: u64,
    pub _r: u64,
}

/// Root `reads`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct ReadsObj {
    pub magic: u64,
    pub n: u64,
    /// `n` [`Core`]s.
    pub cores: u64,
    pub names: u64,
    pub names_len: u64,
    pub data: u64,
    pub data_len: u64,
    pub _r: u64,
}

/// Roots `by_name` and `by_coord`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct OrderObj {
    pub magic: u64,
    pub n: u64,
    /// `n` addresses of cores.
    pub ptrs: u64,
    pub order: u64,
    /// For the coordinate order: `n` [`CoordKey`]s beside the pointers (0 otherwise).
    pub keys: u64,
}

/// The coordinates of the record a coordinate order points at, kept beside the pointer
/// so that indexing and counting a region read one array instead of following a
/// pointer per record.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct CoordKey {
    pub ref_id: i32,
    pub pos: i32,
    pub end: i32,
}

/// Root `index`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct IndexObj {
    pub magic: u64,
    pub words: u64,
    pub n_words: u64,
    /// The `OrderObj` (by coordinate) it indexes.
    pub of: u64,
}

const CORE: u64 = std::mem::size_of::<Core>() as u64;

fn damaged(what: impl std::fmt::Display) -> io::Error {
    fs_err(libc::EIO, format!("damaged data set: {what}"))
}

/// Segment and address-space names of data set `name`.
pub fn names(name: &str) -> io::Result<(String, String, String)> {
    if name.is_empty()
        || name.len() > 40
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(fs_err(
            libc::EINVAL,
            format!("data set name {name:?}: 1 to 40 letters, digits, '-', '_' or '.'"),
        ));
    }
    let s = format!("sam-{name}");
    Ok((s.clone(), s.clone(), format!("{s}.ro")))
}

/// `text` with its `@HD` line's `SO:` set for `order` (an `@HD` line added if none).
pub fn set_sort_order(text: &str, order: Order) -> String {
    let so = match order {
        Order::Name => "queryname",
        Order::Coord => "coordinate",
    };
    let mut out = String::new();
    let mut had = false;
    for line in text.lines() {
        if line.starts_with("@HD") {
            had = true;
            let fields: Vec<String> = line
                .split('\t')
                .filter(|f| !f.starts_with("SO:") && !f.starts_with("GO:") && !f.starts_with("SS:"))
                .map(str::to_string)
                .collect();
            out.push_str(&fields.join("\t"));
            out.push_str(&format!("\tSO:{so}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !had {
        out = format!("@HD\tVN:1.6\tSO:{so}\n{out}");
    }
    out
}

// ---- loading -----------------------------------------------------------------------

/// What [`load`] did.
#[derive(Debug, Clone)]
pub struct LoadStats {
    pub records: u64,
    pub segment_len: u64,
    /// Reading and decoding the input.
    pub read: Duration,
    /// Storing into the segment and the commit.
    pub store: Duration,
}

/// Records parsed from a file, in memory, before they go to the segment.
struct Parsed {
    header: String,
    cores: Vec<Core>,
    names: Vec<u8>,
    data: Vec<u8>,
}

fn parse_input(input: &Path) -> io::Result<Parsed> {
    let mut p = Parsed {
        header: String::new(),
        cores: Vec::new(),
        names: Vec::new(),
        data: Vec::new(),
    };
    // Each record is encoded to BAM bytes in memory, then split into core and parts.
    let mut enc = noodles_bam::io::Writer::from(Vec::<u8>::new());
    let push = |buf: &[u8], p: &mut Parsed, n: u64| -> io::Result<()> {
        let raw =
            parse_raw(buf.get(4..).unwrap_or_default()).map_err(|e| malformed(input, n, e))?;
        let mut core = raw.core;
        core.name = p.names.len() as u64;
        core.data = p.data.len() as u64;
        p.names.extend_from_slice(raw.name);
        p.data.extend_from_slice(raw.data);
        p.cores.push(core);
        Ok(())
    };
    let header_text = |h: &noodles_sam::Header| -> io::Result<String> {
        let mut t = Vec::new();
        noodles_sam::io::Writer::new(&mut t).write_header(h)?;
        Ok(String::from_utf8_lossy(&t).into_owned())
    };
    let f = std::fs::File::open(input).map_err(|e| ctx(input, e))?;
    if crate::gen::is_bgzf(input)? {
        let inner = noodles_bgzf::io::MultithreadedReader::with_worker_count(
            std::num::NonZero::new(crate::bamfile::THREADS).unwrap(),
            f,
        );
        let mut r = noodles_bam::io::Reader::from(inner);
        let header = r.read_header().map_err(|e| ctx(input, e))?;
        p.header = header_text(&header)?;
        let mut rec = noodles_bam::Record::default();
        let mut n = 0;
        loop {
            match r.read_record(&mut rec) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Err(malformed(input, n + 1, e)),
            }
            n += 1;
            enc.get_mut().clear();
            enc.write_record(&header, &rec)
                .map_err(|e| malformed(input, n, e))?;
            push(enc.get_ref(), &mut p, n)?;
        }
    } else {
        let mut r = noodles_sam::io::Reader::new(BufReader::with_capacity(1 << 20, f));
        let header = r.read_header().map_err(|e| ctx(input, e))?;
        p.header = header_text(&header)?;
        let mut rec = noodles_sam::Record::default();
        let mut n = 0;
        loop {
            match r.read_record(&mut rec) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Err(malformed(input, n + 1, e)),
            }
            n += 1;
            enc.get_mut().clear();
            enc.write_alignment_record(&header, &rec)
                .map_err(|e| malformed(input, n, e))?;
            push(enc.get_ref(), &mut p, n)?;
        }
    }
    let refs = crate::model::references(&p.header)?;
    for (i, c) in p.cores.iter().enumerate() {
        for id in [c.ref_id, c.mate_ref_id] {
            if id < -1 || id >= refs.len() as i32 {
                return Err(fs_err(
                    libc::EINVAL,
                    format!(
                        "{}: record {}: reference {id} not in the header",
                        input.display(),
                        i + 1
                    ),
                ));
            }
        }
    }
    Ok(p)
}

/// Copy `data` into the segment at `p`, in pieces.
fn put_bytes(g: &Switched<'_>, p: SegPtr, data: &[u8]) -> io::Result<()> {
    for (i, c) in data.chunks(64 << 20).enumerate() {
        g.write(p.offset((i as u64) << 26), c)?;
    }
    Ok(())
}

/// `n` values of `T` at `p`.
fn get_vec<T: Pod>(g: &Switched<'_>, p: SegPtr, n: usize) -> io::Result<Vec<T>> {
    let mut v = vec![T::zeroed(); n];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
    for (i, c) in bytes.chunks_mut(64 << 20).enumerate() {
        g.read(p.offset((i as u64) << 26), c)?;
    }
    Ok(v)
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Load SAM or BAM file `input` as data set `name` (a new segment and its address
/// spaces, mode `mode`), in one commit. `EEXIST` if the data set exists.
pub fn load(sj: &Arc<SpaceJmp>, name: &str, input: &Path, mode: u32) -> io::Result<LoadStats> {
    let (seg_name, vas_rw, vas_ro) = names(name)?;
    let t0 = Instant::now();
    let p = parse_input(input)?;
    let read = t0.elapsed();
    let t1 = Instant::now();
    let n = p.cores.len() as u64;
    let refs = crate::model::references(&p.header)?;
    let windows: u64 = refs.iter().map(|r| r.len / 16384 + 2).sum();
    let payload = n * CORE
        + p.names.len() as u64
        + p.data.len() as u64
        + p.header.len() as u64
        + 3 * 8 * n
        + 2 * 8 * windows;
    let mut len = round_up(payload + payload / 8 + (16 << 20), cairn_sj_align(payload));
    if len >= 1 << 30 {
        len = round_up(len, 1 << 30);
    }
    // A data set whose load was killed before its commit left a segment without roots:
    // it is replaced; one with its roots is not.
    // So is one whose load was killed while its segment was being created (`EINVAL`
    // from `seg_find`: a segment file without its header).
    match sj.seg_find(&seg_name) {
        Ok(_) => {
            if attach_existing(sj, name).is_ok() {
                return Err(fs_err(
                    libc::EEXIST,
                    format!("data set {name} exists: remove it first"),
                ));
            }
            remove(sj, name)?;
        }
        Err(e) if cairn_area::errno_of(&e) == libc::EINVAL => remove(sj, name)?,
        Err(e) if cairn_area::errno_of(&e) == libc::ENOENT => {}
        Err(e) => return Err(e),
    }
    let seg = sj.seg_alloc(&seg_name, None, len, prot::RW, flags::LOCKABLE, mode)?;
    let mk_vas = |vas: &str, pr: u32| -> io::Result<()> {
        let vid = match sj.vas_create(vas, mode) {
            Ok(v) => v,
            Err(e) if cairn_area::errno_of(&e) == libc::EEXIST => {
                sj.vas_remove(vas)?;
                sj.vas_create(vas, mode)?
            }
            Err(e) => return Err(e),
        };
        sj.seg_attach(Target::Vas(vid), seg, pr)
    };
    mk_vas(&vas_rw, prot::RW)?;
    mk_vas(&vas_ro, prot::READ)?;
    let vh = sj.vas_attach(sj.vas_find(&vas_rw)?, CommitMode::Snapshot)?;
    let r = (|| -> io::Result<()> {
        let g = sj.enter(vh)?;
        let alloc = |len: u64| g.alloc_bytes(seg, len.max(16));
        let text = alloc(p.header.len() as u64)?;
        put_bytes(&g, text, p.header.as_bytes())?;
        let names_at = alloc(p.names.len() as u64)?;
        put_bytes(&g, names_at, &p.names)?;
        let data_at = alloc(p.data.len() as u64)?;
        put_bytes(&g, data_at, &p.data)?;
        let cores_at = alloc(n * CORE)?;
        let mut cores = p.cores;
        for c in &mut cores {
            c.name += names_at.0;
            c.data += data_at.0;
        }
        put_bytes(&g, cores_at, bytemuck::cast_slice(&cores))?;
        let h = g.alloc(
            seg,
            HeaderObj {
                magic: HEADER_MAGIC,
                text: text.0,
                text_len: p.header.len() as u64,
                _r: 0,
            },
        )?;
        let r = g.alloc(
            seg,
            ReadsObj {
                magic: READS_MAGIC,
                n,
                cores: cores_at.0,
                names: names_at.0,
                names_len: p.names.len() as u64,
                data: data_at.0,
                data_len: p.data.len() as u64,
                _r: 0,
            },
        )?;
        g.set_root(seg, "header", h)?;
        g.set_root(seg, "reads", r)?;
        g.commit()?;
        Ok(())
    })();
    let _ = sj.vas_detach(vh);
    r?;
    Ok(LoadStats {
        records: n,
        segment_len: len,
        read,
        store: t1.elapsed(),
    })
}

fn cairn_sj_align(len: u64) -> u64 {
    if len >= 1 << 30 {
        1 << 30
    } else {
        2 << 20
    }
}

fn attach_existing(sj: &Arc<SpaceJmp>, name: &str) -> io::Result<()> {
    let d = DataSet::attach(sj, name, false)?;
    let o = d.enter()?;
    drop(o);
    Ok(())
}

/// Remove data set `name`: its address spaces and its segment.
pub fn remove(sj: &Arc<SpaceJmp>, name: &str) -> io::Result<()> {
    let (seg, vas_rw, vas_ro) = names(name)?;
    for v in [&vas_rw, &vas_ro] {
        match sj.vas_remove(v) {
            Ok(()) => {}
            Err(e) if cairn_area::errno_of(&e) == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
    }
    match sj.seg_free(&seg) {
        // A segment whose creation was killed before its header was written: only
        // its file is there.
        Err(e) if cairn_area::errno_of(&e) == libc::EINVAL => {
            sj.fs().remove_file(cairn_sj::seg_path(&seg)?.as_str())
        }
        r => r,
    }
}

// ---- attaching ---------------------------------------------------------------------

/// Data set `name` attached by this process (detached when dropped).
pub struct DataSet {
    sj: Arc<SpaceJmp>,
    name: String,
    seg: SegId,
    vh: Vh,
}

impl DataSet {
    /// Attach data set `name`: read-only (readers share it) or `writable` (for the
    /// tools that change it; one at a time).
    pub fn attach(sj: &Arc<SpaceJmp>, name: &str, writable: bool) -> io::Result<DataSet> {
        let (seg_name, vas_rw, vas_ro) = names(name)?;
        let not_loaded = |e: io::Error| {
            if cairn_area::errno_of(&e) == libc::ENOENT {
                fs_err(libc::ENOENT, format!("no data set {name}: load it first"))
            } else {
                e
            }
        };
        let seg = sj.seg_find(&seg_name).map_err(not_loaded)?;
        let vid = sj
            .vas_find(if writable { &vas_rw } else { &vas_ro })
            .map_err(not_loaded)?;
        let vh = sj.vas_attach(vid, CommitMode::Snapshot)?;
        Ok(DataSet {
            sj: sj.clone(),
            name: name.to_string(),
            seg,
            vh,
        })
    }

    /// Switch the calling thread into the data set.
    pub fn enter(&self) -> io::Result<Open<'_>> {
        let g = self.sj.enter(self.vh)?;
        let get_root = |root: &str| -> io::Result<SegPtr> {
            g.root(self.seg, root)?.ok_or_else(|| {
                fs_err(
                    libc::ENOENT,
                    format!(
                        "data set {} is not loaded (no {root}): load it again",
                        self.name
                    ),
                )
            })
        };
        let h: HeaderObj = g.get(get_root("header")?)?;
        if h.magic != HEADER_MAGIC || h.text_len > 1 << 30 {
            return Err(damaged("header"));
        }
        let mut text = vec![0u8; h.text_len as usize];
        g.read(SegPtr(h.text), &mut text)?;
        let header = String::from_utf8(text).map_err(|_| damaged("header is not UTF-8"))?;
        let refs = crate::model::references(&header)?;
        let reads: ReadsObj = g.get(get_root("reads")?)?;
        if reads.magic != READS_MAGIC {
            return Err(damaged("reads"));
        }
        Ok(Open {
            g,
            seg: self.seg,
            name: self.name.clone(),
            header,
            refs,
            reads,
        })
    }
}

impl Drop for DataSet {
    fn drop(&mut self) {
        let _ = self.sj.vas_detach(self.vh);
    }
}

/// A data set the thread is switched into.
pub struct Open<'a> {
    g: Switched<'a>,
    seg: SegId,
    name: String,
    header: String,
    refs: Vec<Reference>,
    reads: ReadsObj,
}

/// What a sort of a data set took.
#[derive(Debug, Clone, Copy)]
pub struct SortStats {
    pub core: Duration,
    pub commit: Duration,
}

impl<'a> Open<'a> {
    pub fn header(&self) -> &str {
        &self.header
    }

    pub fn references(&self) -> &[Reference] {
        &self.refs
    }

    pub fn reads(&self) -> u64 {
        self.reads.n
    }

    /// The data set's records in the order loaded (with their names if `names`; else
    /// with empty names).
    pub fn loaded(&self, names: bool) -> LoadOrder<'_, 'a> {
        LoadOrder { o: self, names }
    }

    fn order_obj(&self, order: Order) -> io::Result<Option<(SegPtr, OrderObj)>> {
        let root = match order {
            Order::Name => "by_name",
            Order::Coord => "by_coord",
        };
        let Some(p) = self.g.root(self.seg, root)? else {
            return Ok(None);
        };
        let o: OrderObj = self.g.get(p)?;
        if o.magic != ORDER_MAGIC || o.n != self.reads.n {
            return Err(damaged(root));
        }
        Ok(Some((p, o)))
    }

    /// The records in the order of the last sort by `order` (`ENOENT` if never sorted).
    pub fn sorted(&self, order: Order) -> io::Result<Sorted<'_, 'a>> {
        let (_, obj) = self.order_obj(order)?.ok_or_else(|| {
            fs_err(
                libc::ENOENT,
                format!(
                    "data set {} is not sorted by {}: sort it first",
                    self.name,
                    order.as_str()
                ),
            )
        })?;
        Ok(Sorted {
            o: self,
            obj,
            cores: None,
            names: true,
            full: true,
        })
    }

    pub fn flagstat(&self) -> io::Result<FlagStat> {
        ops::flagstat(&mut self.loaded(false))
    }

    /// Sort the data set by `order`: the order is kept as root `by_name` or `by_coord`
    /// (replacing the last one; a new coordinate order drops the index), one commit.
    pub fn sort(&self, order: Order) -> io::Result<SortStats> {
        let sorted = ops::sort(&mut self.loaded(order == Order::Name), order)?;
        let t = Instant::now();
        let g = &self.g;
        let ptrs: Vec<u64> = sorted
            .locs
            .iter()
            .map(|&i| self.reads.cores + i * CORE)
            .collect();
        let keys: Vec<CoordKey> = if order == Order::Coord {
            let cores: Vec<Core> = get_vec(g, SegPtr(self.reads.cores), self.reads.n as usize)?;
            sorted
                .locs
                .iter()
                .map(|&i| {
                    let c = &cores[i as usize];
                    CoordKey {
                        ref_id: c.ref_id,
                        pos: c.pos,
                        end: c.end,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        if let Some((p, old)) = self.order_obj(order)? {
            g.free(SegPtr(old.ptrs))?;
            if old.keys != 0 {
                g.free(SegPtr(old.keys))?;
            }
            g.free(p)?;
        }
        if order == Order::Coord {
            self.drop_index()?;
        }
        let at = g.alloc_bytes(self.seg, (ptrs.len() as u64 * 8).max(16))?;
        put_bytes(g, at, bytemuck::cast_slice(&ptrs))?;
        let keys_at = if keys.is_empty() {
            SegPtr::NULL
        } else {
            let k = g.alloc_bytes(
                self.seg,
                (keys.len() * std::mem::size_of::<CoordKey>()) as u64,
            )?;
            put_bytes(g, k, bytemuck::cast_slice(&keys))?;
            k
        };
        let obj = g.alloc(
            self.seg,
            OrderObj {
                magic: ORDER_MAGIC,
                n: ptrs.len() as u64,
                ptrs: at.0,
                order: order as u64,
                keys: keys_at.0,
            },
        )?;
        let root = match order {
            Order::Name => "by_name",
            Order::Coord => "by_coord",
        };
        g.set_root(self.seg, root, obj)?;
        g.commit()?;
        Ok(SortStats {
            core: sorted.core,
            commit: t.elapsed(),
        })
    }

    fn drop_index(&self) -> io::Result<()> {
        if let Some(p) = self.g.root(self.seg, "index")? {
            let ix: IndexObj = self.g.get(p)?;
            if ix.magic == INDEX_OBJ_MAGIC {
                self.g.free(SegPtr(ix.words))?;
            }
            self.g.free(p)?;
            self.g.set_root(self.seg, "index", SegPtr::NULL)?;
        }
        Ok(())
    }

    /// Index the coordinate order (root `index`), one commit.
    pub fn index(&self) -> io::Result<Index> {
        let (order_at, _) = self.order_obj(Order::Coord)?.ok_or_else(|| {
            fs_err(
                libc::ENOENT,
                format!(
                    "data set {} is not sorted by coord: sort it first",
                    self.name
                ),
            )
        })?;
        let mut src = self.sorted(Order::Coord)?;
        src.full = false;
        let ix = Index::build(&mut src)?;
        self.drop_index()?;
        let words = ix.to_words();
        let g = &self.g;
        let at = g.alloc_bytes(self.seg, words.len() as u64 * 8)?;
        put_bytes(g, at, bytemuck::cast_slice(&words))?;
        let obj = g.alloc(
            self.seg,
            IndexObj {
                magic: INDEX_OBJ_MAGIC,
                words: at.0,
                n_words: words.len() as u64,
                of: order_at.0,
            },
        )?;
        g.set_root(self.seg, "index", obj)?;
        g.commit()?;
        Ok(ix)
    }

    /// The index, if it is the index of the current coordinate order.
    pub fn load_index(&self) -> io::Result<Index> {
        let stale = || {
            fs_err(
                libc::ENOENT,
                format!(
                    "data set {} has no index of its coordinate order: index it",
                    self.name
                ),
            )
        };
        let p = self.g.root(self.seg, "index")?.ok_or_else(stale)?;
        let obj: IndexObj = self.g.get(p)?;
        let (order_at, _) = self.order_obj(Order::Coord)?.ok_or_else(stale)?;
        if obj.magic != INDEX_OBJ_MAGIC || obj.n_words > 1 << 32 {
            return Err(damaged("index"));
        }
        if obj.of != order_at.0 {
            return Err(stale());
        }
        Index::from_words(&get_vec::<u64>(
            &self.g,
            SegPtr(obj.words),
            obj.n_words as usize,
        )?)
    }

    /// The records overlapping `region` (samtools' syntax), through the index; `f` sees
    /// whole records if `names`, else only their coordinates (reference, position and
    /// end, from the order's keys, with empty names): what counting needs.
    pub fn query(&self, region: &str, names: bool, f: &mut dyn FnMut(&Rec<'_>)) -> io::Result<u64> {
        let ix = self.load_index()?;
        let region = Region::parse(&self.refs, region)?;
        let mut src = self.sorted(Order::Coord)?;
        src.names = names;
        src.full = names;
        ops::query(&mut src, &ix, region, f)
    }

    /// Which of the roots a data set may have are set.
    pub fn roots(&self) -> io::Result<Vec<&'static str>> {
        let mut v = Vec::new();
        for r in ["header", "reads", "by_name", "by_coord", "index"] {
            if self.g.root(self.seg, r)?.is_some() {
                v.push(r);
            }
        }
        Ok(v)
    }

    /// The whole record at `core` (its BAM bytes without `block_size`).
    pub fn record_bytes(&self, core: &Core) -> io::Result<Vec<u8>> {
        let mut name = vec![0u8; core.name_len as usize];
        self.g.read(SegPtr(core.name), &mut name)?;
        let mut data = vec![0u8; core.data_len as usize];
        self.g.read(SegPtr(core.data), &mut data)?;
        let mut out = Vec::new();
        crate::model::encode_raw(core, &name, &data, &mut out);
        Ok(out)
    }
}

/// Cores per piece read from the segment during a scan (1 MiB).
const PIECE: usize = 16384;

/// The records in the order loaded; locations are their ordinals.
pub struct LoadOrder<'o, 'a> {
    o: &'o Open<'a>,
    names: bool,
}

impl LoadOrder<'_, '_> {
    fn run(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let (g, r) = (&self.o.g, &self.o.reads);
        let mut names = Vec::new();
        let mut i = from;
        while i < r.n {
            let k = (r.n - i).min(PIECE as u64) as usize;
            let cores: Vec<Core> = get_vec(g, SegPtr(r.cores + i * CORE), k)?;
            // The names of these cores, contiguous in the names arena.
            let (first, last) = (&cores[0], &cores[k - 1]);
            if self.names {
                let end = last.name + last.name_len as u64;
                if first.name < r.names || end > r.names + r.names_len || end < first.name {
                    return Err(damaged(format!("names of reads {i}..{}", i + k as u64)));
                }
                names.resize((end - first.name) as usize, 0);
                g.read(SegPtr(first.name), &mut names)?;
            }
            for (j, c) in cores.iter().enumerate() {
                let name: &[u8] = if self.names {
                    let off = c.name.wrapping_sub(first.name) as usize;
                    names
                        .get(off..off + c.name_len as usize)
                        .ok_or_else(|| damaged(format!("name of read {}", i + j as u64)))?
                } else {
                    b""
                };
                if !f(i + j as u64, &Rec { core: *c, name })? {
                    return Ok(());
                }
            }
            i += k as u64;
        }
        Ok(())
    }
}

impl Source for LoadOrder<'_, '_> {
    fn references(&self) -> &[Reference] {
        &self.o.refs
    }

    fn scan(&mut self, f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<()>) -> io::Result<()> {
        self.run(0, &mut |l, r| f(l, r).map(|()| true))
    }

    fn scan_from(
        &mut self,
        loc: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        self.run(loc, f)
    }
}

/// The records in a sort's order; locations are positions in that order.
pub struct Sorted<'o, 'a> {
    o: &'o Open<'a>,
    obj: OrderObj,
    /// Every core, read at the first whole scan.
    cores: Option<Vec<Core>>,
    /// Whether [`Source::scan_from`] reads the names.
    pub names: bool,
    /// Whether scans give whole cores; else (and if the order has coordinate keys) only
    /// their reference, position and end, read from the keys beside the pointers:
    /// what indexing and counting need.
    pub full: bool,
}

impl Sorted<'_, '_> {
    /// The records from `loc` on as their coordinate keys (cores with only the
    /// reference, position and end set), in pieces.
    fn keys_from(
        &mut self,
        loc: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let g = &self.o.g;
        let ksz = std::mem::size_of::<CoordKey>() as u64;
        let mut i = loc;
        let mut piece = 256u64;
        while i < self.obj.n {
            let k = (self.obj.n - i).min(piece) as usize;
            let keys: Vec<CoordKey> = get_vec(g, SegPtr(self.obj.keys + i * ksz), k)?;
            for (j, key) in keys.iter().enumerate() {
                let core = Core {
                    ref_id: key.ref_id,
                    pos: key.pos,
                    end: key.end,
                    ..Core::default()
                };
                if !f(i + j as u64, &Rec { core, name: b"" })? {
                    return Ok(());
                }
            }
            i += k as u64;
            // Small pieces first (a query may need few), larger ones after.
            piece = (piece * 4).min(PIECE as u64 * 4);
        }
        Ok(())
    }

    fn ordinal(&self, p: u64) -> io::Result<usize> {
        let r = &self.o.reads;
        if p < r.cores || !(p - r.cores).is_multiple_of(CORE) || (p - r.cores) / CORE >= r.n {
            return Err(damaged(format!("order holds {p:#x}, not a read")));
        }
        Ok(((p - r.cores) / CORE) as usize)
    }
}

impl Source for Sorted<'_, '_> {
    fn references(&self) -> &[Reference] {
        &self.o.refs
    }

    /// A whole scan reads every core once and follows the order's pointers to them
    /// (names are not read: the scans of a sorted order, index and query, need none).
    fn scan(&mut self, f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<()>) -> io::Result<()> {
        if !self.full && self.obj.keys != 0 {
            return self.keys_from(0, &mut |l, r| f(l, r).map(|()| true));
        }
        let g = &self.o.g;
        if self.cores.is_none() {
            self.cores = Some(get_vec(
                g,
                SegPtr(self.o.reads.cores),
                self.o.reads.n as usize,
            )?);
        }
        let mut i = 0u64;
        while i < self.obj.n {
            let k = (self.obj.n - i).min(PIECE as u64) as usize;
            let ptrs: Vec<u64> = get_vec(g, SegPtr(self.obj.ptrs + i * 8), k)?;
            for (j, &p) in ptrs.iter().enumerate() {
                let c = self.cores.as_ref().expect("read above")[self.ordinal(p)?];
                f(i + j as u64, &Rec { core: c, name: b"" })?;
            }
            i += k as u64;
        }
        Ok(())
    }

    /// Follows the order's pointers from `loc`, reading each record's core and name.
    fn scan_from(
        &mut self,
        loc: u64,
        f: &mut dyn FnMut(u64, &Rec<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        if !self.full && self.obj.keys != 0 {
            return self.keys_from(loc, f);
        }
        let g = &self.o.g;
        let mut i = loc;
        let mut name = Vec::new();
        while i < self.obj.n {
            let k = (self.obj.n - i).min(256) as usize;
            let ptrs: Vec<u64> = get_vec(g, SegPtr(self.obj.ptrs + i * 8), k)?;
            for (j, &p) in ptrs.iter().enumerate() {
                self.ordinal(p)?;
                let c: Core = g.get(SegPtr(p))?;
                if self.names {
                    name.resize(c.name_len as usize, 0);
                    g.read(SegPtr(c.name), &mut name)?;
                }
                if !f(
                    i + j as u64,
                    &Rec {
                        core: c,
                        name: &name,
                    },
                )? {
                    return Ok(());
                }
            }
            i += k as u64;
        }
        Ok(())
    }
}
