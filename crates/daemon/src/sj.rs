//! The segment registry (SpaceJMP on Cairn, docs/SPACEJMP.md): which range of the
//! segment window each segment of the store holds, so that no two segments share
//! addresses unless both allow it, and a segment keeps its range for as long as it
//! exists.
//!
//! Kept in the store directory, `DIR/sj-registry` (FORMAT.md, "The store directory"),
//! rewritten whole (temporary file, `fsync`, rename) at every change. At the daemon's
//! start, ranges of segments whose file no longer exists are dropped.

use cairn_area::fs_err;
use cairn_format::sj::{self, alignment, reserved_len};
use cairn_proto::{SjRange, SjReservation};
use std::io::{self, Write};
use std::path::PathBuf;

const HEADER: &str = "cairn-sj-registry 1";

/// The registry: ranges sorted by base.
#[derive(Debug)]
pub(crate) struct Registry {
    path: PathBuf,
    ranges: Vec<SjRange>,
}

impl Registry {
    /// Load `path` (an empty registry when it does not exist).
    pub(crate) fn open(path: PathBuf) -> io::Result<Registry> {
        let ranges = match std::fs::read_to_string(&path) {
            Ok(text) => parse(&text)
                .map_err(|e| fs_err(libc::EINVAL, format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let r = Registry { path, ranges };
        r.check();
        Ok(r)
    }

    /// Drop the ranges of segments whose file is gone (`live(ino, gen)` false).
    pub(crate) fn reconcile(&mut self, live: impl Fn(u64, u64) -> bool) -> io::Result<usize> {
        let before = self.ranges.len();
        self.ranges.retain(|r| live(r.ino, r.gen));
        let dropped = before - self.ranges.len();
        if dropped > 0 {
            self.save()?;
        }
        Ok(dropped)
    }

    pub(crate) fn ranges(&self) -> &[SjRange] {
        &self.ranges
    }

    /// Give segment `r.ino`/`r.gen` a range (see `Request::SjReserve`).
    pub(crate) fn reserve(&mut self, r: &SjReservation) -> io::Result<u64> {
        let SjReservation {
            ino,
            gen,
            ref path,
            base,
            len,
            overlap,
        } = *r;
        if let Some(r) = self.ranges.iter().find(|r| r.ino == ino && r.gen == gen) {
            if r.len == len && base.is_none_or(|b| b == r.base) {
                return Ok(r.base);
            }
            return Err(fs_err(
                libc::EEXIST,
                format!(
                    "segment {path} already has the range {:#x}+{:#x}",
                    r.base, r.len
                ),
            ));
        }
        let base = match base {
            Some(b) => {
                sj::check_range(b, len).map_err(|e| fs_err(libc::EINVAL, e.0))?;
                if let Some(c) = self.conflict(b, reserved_len(len), overlap) {
                    return Err(fs_err(
                        libc::EEXIST,
                        format!(
                            "the range {b:#x}+{:#x} overlaps segment {} at {:#x}+{:#x} \
                             (segments share addresses only when both allow it)",
                            reserved_len(len),
                            c.path,
                            c.base,
                            c.reserved
                        ),
                    ));
                }
                b
            }
            None => {
                sj::check_range(sj::WINDOW_BASE, len).map_err(|e| fs_err(libc::EINVAL, e.0))?;
                self.first_fit(len).ok_or_else(|| {
                    fs_err(
                        libc::ENOSPC,
                        format!(
                            "no free range of {:#x} bytes left in the segment window",
                            reserved_len(len)
                        ),
                    )
                })?
            }
        };
        let at = self.ranges.partition_point(|r| r.base <= base);
        self.ranges.insert(
            at,
            SjRange {
                ino,
                gen,
                path: path.to_string(),
                base,
                len,
                reserved: reserved_len(len),
                overlap,
            },
        );
        self.check();
        if let Err(e) = self.save() {
            self.ranges.remove(at);
            return Err(e);
        }
        Ok(base)
    }

    /// Give back the range of `ino`/`gen`; whether it had one.
    pub(crate) fn release(&mut self, ino: u64, gen: u64) -> io::Result<bool> {
        let Some(i) = self
            .ranges
            .iter()
            .position(|r| r.ino == ino && r.gen == gen)
        else {
            return Ok(false);
        };
        let r = self.ranges.remove(i);
        if let Err(e) = self.save() {
            self.ranges.insert(i, r);
            return Err(e);
        }
        Ok(true)
    }

    /// A range `[base, base + len)` intersects that is not allowed to.
    fn conflict(&self, base: u64, len: u64, overlap: bool) -> Option<&SjRange> {
        self.ranges
            .iter()
            .find(|r| r.base < base + len && base < r.base + r.reserved && !(overlap && r.overlap))
    }

    /// The lowest aligned base where `len` bytes intersect no range.
    fn first_fit(&self, len: u64) -> Option<u64> {
        let need = reserved_len(len);
        let align = alignment(len);
        let mut at = sj::WINDOW_BASE;
        loop {
            at = at.div_ceil(align) * align;
            let end = at.checked_add(need)?;
            if end > sj::WINDOW_END {
                return None;
            }
            match self
                .ranges
                .iter()
                .find(|r| r.base < end && at < r.base + r.reserved)
            {
                Some(r) => at = r.base + r.reserved,
                None => return Some(at),
            }
        }
    }

    /// Invariants: sorted by base, each range valid for its length, no two ranges
    /// intersect unless both allow it, one range per segment.
    fn check(&self) {
        debug_assert!(self.ranges.windows(2).all(|w| w[0].base <= w[1].base));
        for (i, r) in self.ranges.iter().enumerate() {
            debug_assert!(sj::check_range(r.base, r.len).is_ok(), "{r:?}");
            debug_assert_eq!(r.reserved, reserved_len(r.len));
            for q in &self.ranges[i + 1..] {
                debug_assert!(
                    !(q.base < r.base + r.reserved && r.base < q.base + q.reserved)
                        || (q.overlap && r.overlap),
                    "{r:?} and {q:?} intersect"
                );
                debug_assert!((q.ino, q.gen) != (r.ino, r.gen));
            }
        }
    }

    /// Rewrite the file: a temporary file, `fsync`, rename, `fsync` of the directory.
    fn save(&self) -> io::Result<()> {
        let mut text = format!("{HEADER}\n");
        for r in &self.ranges {
            text.push_str(&format!(
                "{} {} {:#x} {:#x} {} {}\n",
                r.ino,
                r.gen,
                r.base,
                r.len,
                u8::from(r.overlap),
                r.path.replace(['\n', '\\'], "?")
            ));
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Parse the registry file.
fn parse(text: &str) -> Result<Vec<SjRange>, String> {
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(format!(
            "not a segment registry (first line is not `{HEADER}`)"
        ));
    }
    let mut out = Vec::new();
    for (n, l) in lines.enumerate() {
        let bad = || format!("line {}: malformed: {l:?}", n + 2);
        let mut f = l.splitn(6, ' ');
        let mut num = |hex: bool| -> Result<u64, String> {
            let t = f.next().ok_or_else(bad)?;
            let v = if hex {
                u64::from_str_radix(t.trim_start_matches("0x"), 16)
            } else {
                t.parse()
            };
            v.map_err(|_| bad())
        };
        let (ino, gen, base, len, overlap) = (
            num(false)?,
            num(false)?,
            num(true)?,
            num(true)?,
            num(false)?,
        );
        let path = f.next().ok_or_else(bad)?.to_string();
        sj::check_range(base, len).map_err(|e| format!("line {}: {}", n + 2, e.0))?;
        out.push(SjRange {
            ino,
            gen,
            path,
            base,
            len,
            reserved: reserved_len(len),
            overlap: overlap != 0,
        });
    }
    out.sort_by_key(|r| r.base);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::sj::{BIG, WINDOW_BASE, WINDOW_END};

    fn res(
        ino: u64,
        gen: u64,
        path: &str,
        base: Option<u64>,
        len: u64,
        overlap: bool,
    ) -> SjReservation {
        SjReservation {
            ino,
            gen,
            path: path.into(),
            base,
            len,
            overlap,
        }
    }

    fn errno(e: io::Error) -> Option<i32> {
        Some(cairn_area::errno_of(&e))
    }

    fn reg() -> (tempfile::TempDir, Registry) {
        let d = tempfile::tempdir().unwrap();
        let r = Registry::open(d.path().join("sj-registry")).unwrap();
        (d, r)
    }

    #[test]
    fn ranges_are_disjoint_aligned_and_kept() {
        let (d, mut r) = reg();
        let a = r.reserve(&res(1, 1, "/a", None, 4 << 20, false)).unwrap();
        assert_eq!(a, WINDOW_BASE);
        let b = r
            .reserve(&res(2, 1, "/b", None, 3 * 4096 * 32, false))
            .unwrap();
        assert_eq!(b, WINDOW_BASE + (4 << 20));
        // 1 GiB and more: 1 GiB aligned, after the others.
        let c = r.reserve(&res(3, 1, "/c", None, BIG, false)).unwrap();
        assert_eq!(c, WINDOW_BASE + BIG);
        // The same segment again: its range; another length: refused.
        assert_eq!(
            r.reserve(&res(1, 1, "/a", None, 4 << 20, false)).unwrap(),
            a
        );
        assert!(r.reserve(&res(1, 1, "/a", None, 8 << 20, false)).is_err());
        // An explicit base that overlaps, misaligned, or outside: refused.
        let e = r.reserve(&res(
            4,
            1,
            "/d",
            Some(WINDOW_BASE + (2 << 20)),
            4 << 20,
            false,
        ));
        assert_eq!(errno(e.unwrap_err()), Some(libc::EEXIST));
        let e = r.reserve(&res(4, 1, "/d", Some(WINDOW_BASE + 4096), 4 << 20, false));
        assert_eq!(errno(e.unwrap_err()), Some(libc::EINVAL));
        let e = r.reserve(&res(4, 1, "/d", Some(WINDOW_END), 4 << 20, false));
        assert_eq!(errno(e.unwrap_err()), Some(libc::EINVAL));
        // Overlap only when both allow it.
        r.release(3, 1).unwrap();
        r.reserve(&res(5, 1, "/e", Some(WINDOW_BASE + BIG), BIG, true))
            .unwrap();
        r.reserve(&res(6, 1, "/f", Some(WINDOW_BASE + BIG), BIG, true))
            .unwrap();
        assert!(r
            .reserve(&res(7, 1, "/g", Some(WINDOW_BASE + BIG), BIG, false))
            .is_err());
        // Reloaded from the file: the same ranges; a dead segment's range goes.
        let mut again = Registry::open(d.path().join("sj-registry")).unwrap();
        assert_eq!(again.ranges(), r.ranges());
        assert_eq!(again.reconcile(|ino, _| ino != 2).unwrap(), 1);
        let again = Registry::open(d.path().join("sj-registry")).unwrap();
        assert_eq!(again.ranges().len(), 3);
        assert!(again.ranges().iter().all(|x| x.ino != 2));
    }

    #[test]
    fn the_window_fills_up() {
        let (_d, mut r) = reg();
        let n = (WINDOW_END - WINDOW_BASE) / (1024 * BIG);
        for i in 0..n {
            r.reserve(&res(i + 1, 1, "/s", None, 1024 * BIG, false))
                .unwrap();
        }
        let e = r
            .reserve(&res(n + 1, 1, "/s", None, 1024 * BIG, false))
            .unwrap_err();
        assert_eq!(errno(e), Some(libc::ENOSPC));
    }

    #[test]
    fn a_damaged_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sj-registry");
        std::fs::write(&p, "something else\n").unwrap();
        assert!(Registry::open(p.clone()).is_err());
        std::fs::write(&p, format!("{HEADER}\n1 1 0x10 0x1000 0 /x\n")).unwrap();
        assert!(Registry::open(p).is_err());
    }
}
