//! The reading state: attributes, directory entries and file data as this client sees
//! them, the overlay of its undigested calls over the shared area (read under the reader
//! epoch); holes and data for `SEEK_DATA`; read-only mappings of shared-area blocks.

use super::{mapobj, Inner, Pin, State};
use crate::extents::{Extents, Src};
use crate::meta::Metadata;
use crate::path::{self};
use crate::ring::Ring;
use cairn_area::{fs_err, Area};
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::BLOCK_SIZE_U64;
use std::io;

/// Lazily pinned reads of one file from the shared area (for the gaps of the overlay).
pub(super) struct SharedFile<'a> {
    area: &'a Area,
    ring: &'a Ring,
    floor: u64,
    ino: u64,
    gen: u64,
    /// The pin and the shared inode, once the first gap is read.
    state: Option<(Pin<'a>, Option<Inode>)>,
}

impl SharedFile<'_> {
    /// Fill `dst` with the shared bytes at `off`: zeros beyond the shared size, or when
    /// the shared inode is not (yet) this file.
    fn read(&mut self, off: u64, dst: &mut [u8]) -> io::Result<()> {
        if self.state.is_none() {
            let pin = Pin::new(self.area, self.ring, self.floor)?;
            let i = self.area.read_inode(self.ino)?;
            let ok = i.generation == self.gen && i.attrs.kind != Kind::Free;
            self.state = Some((pin, ok.then_some(i)));
        }
        let (ring, ino) = (self.ring, self.ino);
        let got = match &self.state {
            // Reads of lower-tier data are hinted to the daemon (promotion).
            Some((_, Some(i))) => self.area.read_file_with(i, off, dst, &mut |fb| {
                let _ = ring.hint(ino, fb);
            })?,
            _ => 0,
        };
        dst[got..].fill(0);
        Ok(())
    }
}

impl Inner {
    /// Generation and attributes of `ino`: the overlay, else the shared area (a lease
    /// on it is needed).
    pub(super) fn attrs(&self, st: &State, ino: u64) -> io::Result<(u64, Attrs)> {
        self.need(st, ino, false)?;
        self.attrs_held(st, ino)
    }

    /// [`Inner::attrs`] when the caller checked the lease.
    pub(super) fn attrs_held(&self, st: &State, ino: u64) -> io::Result<(u64, Attrs)> {
        if let Some(o) = st.ov.get(ino) {
            // Unlinked here, unless the daemon pins it for us (it is open here).
            if o.attrs.nlink == 0 && !st.handles.is_pinned(ino) {
                return Err(fs_err(libc::ENOENT, format!("inode {ino} was removed")));
            }
            return Ok((o.gen, o.attrs));
        }
        let i = self.area.read_inode(ino)?;
        if i.attrs.kind == Kind::Free {
            return Err(fs_err(libc::ENOENT, format!("inode {ino} was removed")));
        }
        Ok((i.generation, i.attrs))
    }

    /// [`Inner::metadata_of`] as a call.
    pub(crate) fn metadata_ino(&self, ino: u64) -> io::Result<Metadata> {
        if !self.area.layout().ino_valid(ino) {
            return Err(fs_err(
                libc::EINVAL,
                format!("inode number {ino} out of range"),
            ));
        }
        self.run(|st| self.metadata_of(st, ino))
    }

    pub(crate) fn metadata_of(&self, st: &State, ino: u64) -> io::Result<Metadata> {
        let (gen, attrs) = self.attrs(st, ino)?;
        let shared = self.area.read_inode(ino)?;
        let mut blocks = if shared.generation == gen && shared.attrs.kind != Kind::Free {
            shared.blocks * 8
        } else {
            0
        };
        if st.ov.get(ino).is_some_and(|o| o.has_data()) {
            blocks = blocks.max(attrs.size.div_ceil(BLOCK_SIZE_U64) * 8);
        }
        Ok(Metadata {
            ino,
            generation: gen,
            attrs,
            blocks,
        })
    }

    /// Look `name` up in directory `dir`.
    pub(super) fn lookup(
        &self,
        st: &State,
        dir: u64,
        name: &[u8],
    ) -> io::Result<Option<(u64, Kind)>> {
        self.need(st, dir, false)?;
        let mut gen = None;
        if let Some(o) = st.ov.get(dir) {
            if let Some((e, _)) = o.dir.get(name) {
                return Ok(*e);
            }
            if o.attrs.kind != Kind::Dir {
                return Err(fs_err(libc::ENOTDIR, "lookup in a non-directory"));
            }
            gen = Some(o.gen);
        }
        let _pin = Pin::new(&self.area, st.log.ring(), st.pin_floor())?;
        let inode = self.area.read_inode(dir)?;
        match gen {
            Some(g) if g != inode.generation || inode.attrs.kind != Kind::Dir => Ok(None),
            _ => self.area.dir_lookup(&inode, name),
        }
    }

    /// Every entry of directory `dir`: the shared listing merged with the overlay.
    pub(super) fn list(&self, st: &State, dir: u64) -> io::Result<Vec<(Vec<u8>, u64, Kind)>> {
        self.need(st, dir, false)?;
        let o = st.ov.get(dir);
        let mut out = Vec::new();
        {
            let _pin = Pin::new(&self.area, st.log.ring(), st.pin_floor())?;
            let inode = self.area.read_inode(dir)?;
            let fresh = o.is_some_and(|o| o.gen != inode.generation);
            if inode.attrs.kind == Kind::Dir && !fresh {
                for e in self.area.dir_list(&inode)? {
                    if o.is_some_and(|o| o.dir.contains_key(&e.name)) {
                        continue;
                    }
                    out.push((e.name, e.ino, e.kind));
                }
            }
        }
        if let Some(o) = o {
            for (name, (e, _)) in &o.dir {
                if let Some((ino, kind)) = e {
                    out.push((name.clone(), *ino, *kind));
                }
            }
        }
        Ok(out)
    }

    pub(super) fn dir_is_empty(&self, st: &State, dir: u64) -> io::Result<bool> {
        Ok(self.list(st, dir)?.is_empty())
    }

    /// Read file data of `ino` at `off` into `buf`: overlay ranges from the ring, the
    /// rest from the shared area (zeros beyond its size). Returns the bytes read.
    pub(crate) fn read_data(
        &self,
        st: &State,
        ino: u64,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        self.need(st, ino, false)?;
        if let Some(o) = st.objs.get(&ino) {
            // The file has a map object (`mapobj`): it holds the current bytes.
            let (_, attrs) = self.attrs_held(st, ino)?;
            if off >= attrs.size || buf.is_empty() {
                return Ok(0);
            }
            let n = (buf.len() as u64).min(attrs.size - off) as usize;
            mapobj::read_full(o, &mut buf[..n], off)?;
            return Ok(n);
        }
        self.read_logged(st, ino, off, buf)
    }

    /// [`Inner::read_data`] from the log and the shared area, never the map object.
    pub(super) fn read_logged(
        &self,
        st: &State,
        ino: u64,
        off: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let (gen, attrs) = self.attrs(st, ino)?;
        if attrs.kind == Kind::Dir {
            return Err(fs_err(libc::EISDIR, "read: is a directory"));
        }
        if off >= attrs.size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(attrs.size - off) as usize;
        let buf = &mut buf[..n];
        let mut shared = SharedFile {
            area: &self.area,
            ring: st.log.ring(),
            floor: st.pin_floor(),
            ino,
            gen,
            state: None,
        };
        match st.ov.get(ino).filter(|o| o.has_data()) {
            None => shared.read(off, buf)?,
            Some(o) => {
                for seg in o.extents().segments(off, off + n as u64) {
                    let dst = &mut buf[(seg.start - off) as usize..(seg.end - off) as usize];
                    match seg.src {
                        Some(Src::Log(l)) => st.log.ring().read(l, dst)?,
                        Some(Src::Zero) => dst.fill(0),
                        None => shared.read(seg.start, dst)?,
                    }
                }
            }
        }
        Ok(n)
    }

    /// `lseek`'s `SEEK_DATA` (`data`) or `SEEK_HOLE` from `off` in file `ino`, at block
    /// granularity as ext4 reports: a 4 KiB block is data if any byte of it was written
    /// (logged here, or digested and mapped), a hole otherwise; the end of the file counts
    /// as a hole. `ENXIO` at or beyond the end, or when no data follows.
    pub(crate) fn seek_data(&self, st: &State, ino: u64, off: u64, data: bool) -> io::Result<u64> {
        const B: u64 = BLOCK_SIZE_U64;
        let (gen, attrs) = self.attrs(st, ino)?;
        if attrs.kind == Kind::Dir {
            return Err(fs_err(
                libc::EISDIR,
                "lseek: SEEK_DATA/SEEK_HOLE on a directory",
            ));
        }
        let size = attrs.size;
        if off >= size {
            return Err(fs_err(
                libc::ENXIO,
                "lseek: offset at or beyond the end of the file",
            ));
        }
        let nblocks = size.div_ceil(B);
        // The map is read under a pin: its blocks are not reused meanwhile.
        let _pin = Pin::new(&self.area, st.log.ring(), st.pin_floor())?;
        let shared = self.area.read_inode(ino)?;
        let shared =
            (shared.generation == gen && shared.attrs.kind != Kind::Free).then_some(shared);
        let shared_next = |from: u64, to: u64, want: bool| match &shared {
            Some(i) => self.area.next_block(i, from, to, want),
            None => Ok((!want && from < to).then_some(from)),
        };
        let ext = st.ov.get(ino).map(|o| o.extents());
        let empty = Extents::new();
        let ov = ext.as_deref().unwrap_or(&empty);
        let found = |b: u64| (b * B).max(off);
        let mut b = off / B;
        while b < nblocks {
            // Blocks before the next one the overlay touches are the shared file's alone.
            let seg = ov.segments(b * B, size).find(|s| s.src.is_some());
            let touched = seg.as_ref().map_or(nblocks, |s| s.start / B);
            if b < touched {
                if let Some(x) = shared_next(b, touched, data)? {
                    return Ok(found(x));
                }
                b = touched;
                continue;
            }
            let seg = seg.expect("a block the overlay touches has a segment");
            // Whole blocks inside one overlay piece: logged bytes are data, zeros a hole.
            let logged = matches!(seg.src, Some(Src::Log(_)));
            let whole_end = if logged {
                seg.end.div_ceil(B)
            } else {
                seg.end / B
            };
            if seg.start <= b * B && whole_end > b {
                if logged == data {
                    return Ok(found(b));
                }
                b = whole_end;
                continue;
            }
            // A block shared between pieces: data if any of it is logged or mapped.
            let (bs, be) = (b * B, ((b + 1) * B).min(size));
            let mut is_data = false;
            for s in ov.segments(bs, be) {
                is_data |= match s.src {
                    Some(Src::Log(_)) => true,
                    Some(Src::Zero) => false,
                    None => shared_next(b, b + 1, true)?.is_some(),
                };
            }
            if is_data == data {
                return Ok(found(b));
            }
            b += 1;
        }
        if data {
            Err(fs_err(libc::ENXIO, "lseek: no data after the offset"))
        } else {
            Ok(size)
        }
    }

    /// Where each 4 KiB page of `pages` pages from `off` (a multiple of 4096) of file
    /// `ino` lies, for mapping it in place: `Some(offset in the NVM tier file)` for a
    /// whole page of digested data inside the file, `None` for a page to read (logged
    /// and not digested, a hole, the file's last partial page, beyond its end). When a
    /// page is `Some`, the epoch returned is pinned — the blocks stay until
    /// [`Inner::map_unpin`] — so the pin is taken before the map is read.
    pub(crate) fn map_plan(
        &self,
        st: &mut State,
        ino: u64,
        off: u64,
        pages: usize,
    ) -> io::Result<(Vec<Option<u64>>, Option<u64>)> {
        let (gen, attrs) = self.attrs(st, ino)?;
        if attrs.kind != Kind::File {
            return Err(fs_err(libc::ENODEV, "mmap: not a regular file"));
        }
        if st.objs.contains_key(&ino) {
            // The current bytes are the map object's: nothing maps NVM in place.
            return Ok((vec![None; pages], None));
        }
        let e = self.area.global_epoch()?;
        st.long_pins.push(e);
        st.log.ring().set_reader_epoch(st.pin_floor())?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let plan = (|| -> io::Result<Vec<Option<u64>>> {
            let mut plan = vec![None; pages];
            let inode = self.area.read_inode(ino)?;
            if inode.generation != gen || inode.attrs.kind != Kind::File {
                return Ok(plan);
            }
            let ext = st.ov.get(ino).filter(|o| o.has_data()).map(|o| o.extents());
            for (i, p) in plan.iter_mut().enumerate() {
                let start = off + (i as u64) * BLOCK_SIZE_U64;
                let end = start + BLOCK_SIZE_U64;
                if end > attrs.size || end > inode.attrs.size {
                    break;
                }
                if (ext.as_ref()).is_some_and(|x| x.segments(start, end).any(|s| s.src.is_some())) {
                    continue;
                }
                // Only NVM blocks can be mapped in place; lower-tier data is read.
                match self.area.block_of(&inode, start / BLOCK_SIZE_U64)? {
                    Some(blk) if cairn_format::map::entry_tier(blk) == 0 => {
                        *p = Some(blk * BLOCK_SIZE_U64)
                    }
                    _ => {}
                }
            }
            Ok(plan)
        })();
        let keep = plan.as_ref().is_ok_and(|p| p.iter().any(Option::is_some));
        if !keep {
            self.unpin_epoch(st, e)?;
        }
        Ok((plan?, keep.then_some(e)))
    }

    /// A mapping pinned by [`Inner::map_plan`] at epoch `e` is gone.
    pub(crate) fn map_unpin(&self, st: &mut State, e: u64) -> io::Result<()> {
        self.unpin_epoch(st, e)
    }

    pub(super) fn unpin_epoch(&self, st: &mut State, e: u64) -> io::Result<()> {
        if let Some(i) = st.long_pins.iter().position(|&x| x == e) {
            st.long_pins.swap_remove(i);
        }
        st.log.ring().set_reader_epoch(st.pin_floor())
    }

    /// The target of symlink `ino`.
    pub(super) fn read_symlink(&self, st: &State, ino: u64) -> io::Result<Vec<u8>> {
        let (_, a) = self.attrs(st, ino)?;
        if a.kind != Kind::Symlink {
            return Err(fs_err(libc::EINVAL, "not a symbolic link"));
        }
        let mut v = vec![0u8; a.size.min(path::PATH_MAX as u64) as usize];
        let n = self.read_data(st, ino, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }
}
