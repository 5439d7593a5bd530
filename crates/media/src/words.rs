//! Tables of atomic words ([`Words`]) in a mapping: of the process's own memory, or of a
//! file that several processes map, where every access is atomic on every side. The
//! structures processes share (a key-value store's index, its epochs, its segments'
//! state) are laid out in words, so one piece of code serves memory of one process and
//! memory several share.

use crate::Mapping;
use std::io;
use std::sync::atomic::AtomicU64;

/// `len` atomic words at a byte offset (8-aligned) of a writable mapping, which it
/// owns; the mapping is page aligned, so a table at a multiple of 64 bytes starts a
/// cache line. Bounds and access are checked once, when the table is made: lending the
/// words costs nothing after that (they are on every lookup's path).
#[derive(Clone)]
pub struct Words {
    /// Keeps the words mapped (only held; shared by the tables cut from one mapping:
    /// [`Words::slice`]).
    _map: std::sync::Arc<Mapping>,
    ptr: *const AtomicU64,
    len: usize,
}

// SAFETY: `ptr` points into `map`, which is `Send` and `Sync`; the words are only
// reached as `&AtomicU64`, whose every access is atomic.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

impl Words {
    /// `len` zeroed words of the process's own (`what` names the memory, as
    /// `/proc/PID/maps` shows it).
    pub fn owned(what: &str, len: usize) -> io::Result<Words> {
        Words::shared(Mapping::anonymous(what, (len * 8).max(1))?, 0, len)
    }

    /// The first `len` words of the file at `path`, created (zeroed) or grown to hold
    /// them if needed: a table the processes that open the same path share.
    pub fn file(path: &std::path::Path, len: usize) -> io::Result<Words> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let bytes = (len * 8).max(1);
        if f.metadata()?.len() < bytes as u64 {
            f.set_len(bytes as u64)?;
        }
        Words::shared(Mapping::new(&f, 0, bytes, true, false)?, 0, len)
    }

    /// The `len` words at byte `off` of `map`.
    pub fn shared(map: Mapping, off: usize, len: usize) -> io::Result<Words> {
        let ptr = map.atomic_u64s(off, len)?.as_ptr();
        Ok(Words {
            _map: std::sync::Arc::new(map),
            ptr,
            len,
        })
    }

    /// Words `at..at + len` of this table, as a table of their own (the mapping stays
    /// while either is held): one mapping cut into the tables of a structure.
    pub fn slice(&self, at: usize, len: usize) -> io::Result<Words> {
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("words {at}..+{len} of a table of {}", self.len),
            ));
        }
        Ok(Words {
            _map: self._map.clone(),
            ptr: self.get()[at..].as_ptr(),
            len,
        })
    }

    /// The words.
    #[inline]
    pub fn get(&self) -> &[AtomicU64] {
        // SAFETY: `ptr..ptr + len` was checked in bounds, aligned and writable when the
        // table was made (`Mapping::atomic_u64s`), and `self._map` keeps it mapped for as
        // long as the borrow of `self` lasts.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn shared_words_are_the_files_and_bounds_are_checked() {
        let path = std::env::temp_dir().join(format!("cairn-media-words-{}", std::process::id()));
        let a = Words::file(&path, 520).unwrap();
        let b = Words::file(&path, 520).unwrap();
        a.get()[515].store(42, Ordering::SeqCst);
        assert_eq!(b.get()[515].load(Ordering::SeqCst), 42);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 520 * 8);
        let f = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let map = |writable| Mapping::new(&f, 0, 4096, writable, false);
        let own = Words::owned("cairn-media-test", 5).unwrap();
        assert_eq!((a.len(), own.len()), (520, 5));
        assert!(own.get().iter().all(|w| w.load(Ordering::Relaxed) == 0));
        // Read-only file: no writable mapping; a read-only one gives no words.
        assert!(map(true).is_err());
        let ro = map(false).unwrap();
        assert!(Words::shared(ro, 0, 1).is_err());
        let rw = Mapping::anonymous("cairn-media-test", 4096).unwrap();
        assert!(Words::shared(rw, 4096 - 8, 2).is_err());
        let rw = Mapping::anonymous("cairn-media-test", 4096).unwrap();
        assert!(Words::shared(rw, 4, 1).is_err());
        // A slice is the same words, and outlives the table it was cut from.
        let s = a.slice(500, 20).unwrap();
        drop(a);
        assert_eq!(s.get()[15].load(Ordering::SeqCst), 42);
        assert!(s.slice(10, 11).is_err() && s.slice(usize::MAX, 2).is_err());
        assert_eq!(s.slice(20, 0).unwrap().len(), 0);
    }
}
