//! What this library hands out as pointers: directory streams (`DIR *`), stdio streams
//! on Cairn descriptors (`FILE *` made with `fopencookie`), and the memory mappings of
//! Cairn files whose changes go back to the file.

use crate::table::{Dent, Ofd};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::Arc;

/// A directory stream: a snapshot of the entries, taken at `opendir` and `rewinddir`.
pub struct Stream {
    pub fd: c_int,
    pub entries: Vec<Dent>,
    pub next: usize,
    pub ent: libc::dirent64,
}

/// Streams by the address handed out (that of the boxed `Stream`).
pub static DIRS: Mutex<Option<HashMap<usize, Box<Stream>>>> = Mutex::new(None);

/// Stdio streams on Cairn descriptors: `FILE *` → descriptor (for `fileno`).
pub static FILES: Mutex<Option<HashMap<usize, c_int>>> = Mutex::new(None);

/// A mapping of a Cairn file this library keeps track of.
pub struct Mapping {
    pub addr: usize,
    pub len: usize,
    pub off: u64,
    pub ofd: Arc<Ofd>,
    pub kind: MapKind,
}

pub enum MapKind {
    /// Shared and writable: its pages go back to the file at `msync`, `munmap` and exit.
    WriteBack,
    /// Some of its pages map the NVM tier file in place; the blocks stay pinned until
    /// every piece of it is unmapped. `prot`: the protection asked for.
    InPlace { pin: Arc<MapPin>, prot: c_int },
}

/// The epoch a mapping in place pins; released when the last piece goes.
pub struct MapPin {
    pub ofd: Arc<Ofd>,
    pub epoch: u64,
}

impl Drop for MapPin {
    fn drop(&mut self) {
        if let Ok(f) = self.ofd.file() {
            let _ = f.map_unpin(self.epoch);
        }
    }
}

pub static MAPS: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());

pub fn lock_for_fork() {
    std::mem::forget(DIRS.lock());
    std::mem::forget(FILES.lock());
    std::mem::forget(MAPS.lock());
}

pub fn unlock_after_fork() {
    // SAFETY: `lock_for_fork` locked them and forgot the guards, in this thread.
    unsafe {
        MAPS.force_unlock();
        FILES.force_unlock();
        DIRS.force_unlock();
    }
}

/// In the child after `fork`: mappings write back through the child's descriptions.
/// (Mappings in place are turned into copies first: `abi_mmap::copy_in_place_mappings`.)
pub fn reborn_after_fork(renew: &mut dyn FnMut(&Arc<Ofd>) -> Arc<Ofd>) {
    let mut maps = MAPS.lock();
    for m in maps.iter_mut() {
        let new = renew(&m.ofd);
        std::mem::forget(std::mem::replace(&mut m.ofd, new));
    }
}

/// Which pages of a mapping differ from the file: `(offset in mapping, len)` runs of
/// whole pages (the last one cut at `limit`, the mapping's bytes that are inside the
/// file). `mem` is the mapping's memory, `file` the file's bytes at the same offsets.
pub fn dirty_runs(mem: &[u8], file: &[u8], page: usize) -> Vec<(usize, usize)> {
    let limit = mem.len().min(file.len());
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut p = 0;
    while p < limit {
        let end = (p + page).min(limit);
        if mem[p..end] != file[p..end] {
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == p => r.1 += end - p,
                _ => runs.push((p, end - p)),
            }
        }
        p = end;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs() {
        let file = vec![0u8; 10];
        let mut mem = file.clone();
        assert!(dirty_runs(&mem, &file, 4).is_empty());
        mem[1] = 1;
        mem[5] = 1;
        mem[9] = 1;
        assert_eq!(dirty_runs(&mem, &file, 4), vec![(0, 10)]);
        mem[5] = 0;
        assert_eq!(dirty_runs(&mem, &file, 4), vec![(0, 4), (8, 2)]);
        // Bytes beyond the file's end are not written back.
        assert!(dirty_runs(&mem, &file[..1], 4).is_empty());
        assert_eq!(dirty_runs(&mem, &file[..2], 4), vec![(0, 2)]);
    }
}
