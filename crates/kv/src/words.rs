//! Tables of atomic words ([`Words`]) in a mapping: of the process's own memory, or of a
//! file that several processes map, where every access is atomic on every side. The
//! structures a store's processes share (the index first) are laid out in words, so one
//! piece of code serves a store open in one process and one shared by several.

use cairn_media::Mapping;
use std::io;
use std::sync::atomic::AtomicU64;

/// `len` atomic words, at byte `off` (8-aligned) of a writable mapping; the mapping is
/// page aligned, so a table at a multiple of 64 bytes starts a cache line.
pub(crate) struct Words {
    map: Mapping,
    off: usize,
    len: usize,
}

impl Words {
    /// `len` zeroed words of the process's own (`what` names the memory, as
    /// `/proc/PID/maps` shows it).
    pub fn owned(what: &str, len: usize) -> io::Result<Words> {
        Words::shared(Mapping::anonymous(what, (len * 8).max(1))?, 0, len)
    }

    /// The `len` words at byte `off` of `map`.
    pub fn shared(map: Mapping, off: usize, len: usize) -> io::Result<Words> {
        map.atomic_u64s(off, len)?;
        Ok(Words { map, off, len })
    }

    /// The words.
    #[inline]
    pub fn get(&self) -> &[AtomicU64] {
        self.map
            .atomic_u64s(self.off, self.len)
            .expect("bounds and access checked at creation")
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn shared_words_are_the_files_and_bounds_are_checked() {
        let path = std::env::temp_dir().join(format!("cairn-kv-words-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(4096).unwrap();
        let map = |writable| Mapping::new(&f, 0, 4096, writable, false).unwrap();
        let a = Words::shared(map(true), 64, 8).unwrap();
        let b = Words::shared(map(true), 64, 8).unwrap();
        a.get()[3].store(42, Ordering::SeqCst);
        assert_eq!(b.get()[3].load(Ordering::SeqCst), 42);
        let own = Words::owned("cairn-kv-test", 5).unwrap();
        assert_eq!((a.len(), own.len()), (8, 5));
        assert!(own.get().iter().all(|w| w.load(Ordering::Relaxed) == 0));
        assert!(Words::shared(map(true), 4096 - 8, 2).is_err());
        assert!(Words::shared(map(true), 4, 1).is_err());
        assert!(Words::shared(map(false), 0, 1).is_err());
    }
}
