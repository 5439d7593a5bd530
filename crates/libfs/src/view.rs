//! Read-only views of files: [`File::map`].

use crate::file::File;
use crate::fs::Inner;
use cairn_area::fs_err;
use std::io;
use std::sync::Arc;

const PAGE: usize = 4096;

/// A read-only view of part of a file ([`File::map`]): its digested data in the NVM tier
/// mapped in place — a superpage extent at a 2 MiB-aligned address, which the kernel
/// maps with one PMD when the extent is backed by a huge folio — and the rest (data not
/// yet digested, lower tiers, holes, the last partial page, past the end) copied when
/// the view is made. The blocks it maps stay allocated while it lives (an epoch pin).
///
/// What it shows is the file when `map` was called; a later write of the file may show
/// through where it lands in a superpage extent (written in place), and does not
/// elsewhere (like a `MAP_PRIVATE` mapping, POSIX leaves this unspecified). Access goes
/// through copies and loads, never Rust references (the bytes may change).
pub struct Map {
    view: Option<cairn_media::View>,
    pin: Option<u64>,
    fs: Arc<Inner>,
    in_place: usize,
}

impl Map {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.view().len()
    }
    /// Whether the view is empty (never).
    pub fn is_empty(&self) -> bool {
        self.view().is_empty()
    }
    fn view(&self) -> &cairn_media::View {
        self.view.as_ref().expect("mapped until dropped")
    }
    /// Copy `buf.len()` bytes at `off` (from the view's start) into `buf`.
    pub fn read(&self, off: usize, buf: &mut [u8]) -> io::Result<()> {
        self.view().read(off, buf)
    }
    /// The 8 bytes at `off` (8-aligned).
    pub fn load_u64(&self, off: usize) -> io::Result<u64> {
        self.view().load_u64(off)
    }
    /// The view's first byte, for callers that manage access themselves.
    pub fn as_ptr(&self) -> *const u8 {
        self.view().as_ptr()
    }
    /// Bytes of the view mapped in place from the NVM tier (the rest was copied).
    pub fn mapped_in_place(&self) -> usize {
        self.in_place
    }
}

impl std::fmt::Debug for Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("len", &self.len())
            .field("in_place", &self.in_place)
            .finish()
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        self.view = None;
        if let Some(e) = self.pin.take() {
            let _ = self.fs.run(|st| self.fs.map_unpin(st, e));
        }
    }
}

impl File {
    /// A read-only view of `len` bytes from `off` (a multiple of 4096): see [`Map`].
    /// Bytes past the end of the file read as zeros. Needs a handle open for reading.
    pub fn map(&self, off: u64, len: usize) -> io::Result<Map> {
        if len == 0 || !off.is_multiple_of(PAGE as u64) {
            return Err(fs_err(
                libc::EINVAL,
                "map: the length must be positive and the offset a multiple of 4096",
            ));
        }
        let size = self.metadata()?.len();
        let filled = size.saturating_sub(off).min(len as u64) as usize;
        let (plan, pin) = if filled >= PAGE {
            self.map_plan(off, filled / PAGE)?
        } else {
            if !self.readable() {
                return Err(fs_err(libc::EACCES, "map: file not open for reading"));
            }
            (Vec::new(), None)
        };
        let mut m = Map {
            view: None,
            pin,
            fs: self.inner().clone(),
            in_place: 0,
        };
        let mut view = cairn_media::View::new(len, off)?;
        let mut copy = vec![true; filled.div_ceil(PAGE)];
        if pin.is_some() {
            let nvm = &self.inner().nvm;
            for (i, j, start) in File::in_place_runs(&plan) {
                view.map_file(i * PAGE, nvm, start, (j - i) * PAGE)?;
                copy[i..j].iter_mut().for_each(|c| *c = false);
                m.in_place += (j - i) * PAGE;
            }
        }
        let mut buf = Vec::new();
        let mut i = 0;
        while i < copy.len() {
            if !copy[i] {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < copy.len() && copy[j] {
                j += 1;
            }
            let end = (j * PAGE).min(filled);
            buf.resize(end - i * PAGE, 0);
            let mut done = 0;
            while done < buf.len() {
                let n = self.read_at(&mut buf[done..], off + (i * PAGE + done) as u64)?;
                if n == 0 {
                    break;
                }
                done += n;
            }
            view.fill(i * PAGE, &buf[..done])?;
            i = j;
        }
        view.seal()?;
        m.view = Some(view);
        Ok(m)
    }
}
