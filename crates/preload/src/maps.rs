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
    /// Shared (`MAP_SHARED`): a mapping of the file's map object, coherent with every
    /// other process's. With `write` (a description open for writing) its changes are
    /// written back at `msync`, `munmap` and exit.
    Shared {
        obj: Arc<cairn::MapObject>,
        write: bool,
    },
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
