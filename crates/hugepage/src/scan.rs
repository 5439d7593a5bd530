//! What the daemon reads of a watched process, through `/proc` only: its anonymous
//! mappings (`maps`), per 2 MiB region the base pages present and whether a huge page
//! maps it with a PMD (`PAGEMAP_SCAN` on its `pagemap`, Linux 6.7; on older kernels
//! `pagemap` read page by page and `/proc/kpageflags`, root), the memory its huge pages back
//! (`smaps_rollup`), and per mapping whether it was touched since the last scan
//! (`clear_refs` then `smaps`' `Referenced`: this kernel has neither `page_idle` nor
//! DAMON's virtual-address mode, so access is known per mapping, not per page). And the
//! one thing it does to it: `process_madvise(MADV_COLLAPSE)` on a region.

use crate::policy::{HUGE, PAGES};
use cairn_media::sys::{pagemap_scan, PageRange, PAGE_IS_HUGE, PAGE_IS_PRESENT};
use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

/// An anonymous private writable mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
}

impl Vma {
    /// The 2 MiB-aligned regions wholly inside it.
    pub fn regions(&self) -> impl Iterator<Item = u64> {
        let first = self.start.next_multiple_of(HUGE);
        let end = self.end;
        (first..end)
            .step_by(HUGE as usize)
            .filter(move |r| r + HUGE <= end)
    }
}

/// The anonymous private writable mappings of a `maps` text (the heap and unnamed
/// mappings; not the stack, not files, not shared memory).
pub fn parse_maps(text: &str) -> Vec<Vma> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let range = w.next()?;
            let perms = w.next()?;
            let _offset = w.next()?;
            let _dev = w.next()?;
            let inode = w.next()?;
            let path = w.next().unwrap_or("");
            let anon =
                inode == "0" && (path.is_empty() || path == "[heap]" || path.starts_with("[anon:"));
            if !anon || !perms.starts_with("rw") || !perms.ends_with('p') {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some(Vma {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
            })
        })
        .collect()
}

/// Per mapping of an `smaps` text: start, end and the value of field `key` (kB).
pub fn smaps_field(text: &str, key: &str) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    for l in text.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                cur = Some((a, b));
                continue;
            }
        }
        if let (Some((a, b)), Some(rest)) = (cur, l.strip_prefix(key)) {
            if let Some(v) = rest
                .strip_prefix(':')
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
            {
                out.push((a, b, v));
            }
        }
    }
    out
}

/// A region as a scan saw it: base pages present, mapped by a huge page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub start: u64,
    pub present: u32,
    pub huge: bool,
    /// Which base pages are present (bit `i % 64` of word `i / 64`).
    pub bits: [u64; 8],
}

/// Whether the region at `start` counts as accessed, given `referenced` (per mapping:
/// start, end, kB referenced): known per mapping only, a region is accessed when its
/// mapping had referenced pages.
pub fn accessed(referenced: &[(u64, u64, u64)], start: u64) -> bool {
    referenced
        .iter()
        .any(|&(a, b, kb)| a <= start && start < b && kb > 0)
}

/// `kpageflags` bit of a page that is part of a transparent huge page.
const KPF_THP: u64 = 1 << 22;
const PM_PRESENT: u64 = 1 << 63;
const PM_PFN: u64 = (1 << 55) - 1;

/// An open watched process.
pub struct Proc {
    pub pid: u32,
    pidfd: OwnedFd,
    pagemap: File,
    /// `/proc/kpageflags` (root only; without it no region is known to be huge and
    /// only `smaps_rollup` tells the total), for kernels without `PAGEMAP_SCAN`.
    kpageflags: Option<File>,
    /// `PAGEMAP_SCAN` works (until the kernel says it does not).
    ioctl: Cell<bool>,
}

/// An error about process `pid`, said plainly.
fn about(pid: u32, what: &str, e: io::Error) -> io::Error {
    let why = match e.raw_os_error() {
        // ESRCH
        Some(3) => "no such process (it exited)".to_string(),
        // EPERM, EACCES
        Some(1) | Some(13) => {
            "permission denied (watching another user's process needs root or ptrace access)"
                .to_string()
        }
        _ => e.to_string(),
    };
    io::Error::new(e.kind(), format!("process {pid}: {what}: {why}"))
}

impl Proc {
    pub fn open(pid: u32) -> io::Result<Proc> {
        let pidfd = cairn_media::sys::pidfd_open(pid).map_err(|e| about(pid, "pidfd_open", e))?;
        let pagemap =
            File::open(format!("/proc/{pid}/pagemap")).map_err(|e| about(pid, "pagemap", e))?;
        Ok(Proc {
            pid,
            pidfd,
            pagemap,
            kpageflags: File::open("/proc/kpageflags").ok(),
            ioctl: Cell::new(true),
        })
    }

    fn read(&self, name: &str) -> io::Result<String> {
        std::fs::read_to_string(format!("/proc/{}/{name}", self.pid))
            .map_err(|e| about(self.pid, name, e))
    }

    /// Its anonymous mappings now.
    pub fn vmas(&self) -> io::Result<Vec<Vma>> {
        Ok(parse_maps(&self.read("maps")?))
    }

    /// Each 2 MiB region of `vmas`: base pages present, and whether a huge page maps it
    /// (with a PMD: a huge page the kernel split, mapped by base-page entries until it
    /// frees it, is not huge).
    pub fn scan(&self, vmas: &[Vma]) -> io::Result<Vec<Seen>> {
        if self.ioctl.get() {
            match self.scan_ranges(vmas) {
                // ENOTTY, EINVAL: a kernel before 6.7.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                    self.ioctl.set(false)
                }
                r => return r.map_err(|e| about(self.pid, "pagemap", e)),
            }
        }
        self.scan_pages(vmas)
    }

    /// [`Proc::scan`] with `PAGEMAP_SCAN`: one call per mapping, answered in ranges of
    /// pages present, huge or not.
    fn scan_ranges(&self, vmas: &[Vma]) -> io::Result<Vec<Seen>> {
        let mut out = Vec::new();
        let mut ranges: Vec<PageRange> = Vec::new();
        for v in vmas {
            let Some(lo) = v.regions().next() else {
                continue;
            };
            // A pagemap opened before an exec reads nothing (and scans an address space
            // that is gone, answering no pages): this read tells.
            let mut probe = [0u8; 8];
            self.pagemap.read_exact_at(&mut probe, lo / 4096 * 8)?;
            let n = v.regions().count();
            let hi = lo + n as u64 * HUGE;
            ranges.clear();
            pagemap_scan(
                &self.pagemap,
                lo,
                hi,
                PAGE_IS_PRESENT,
                PAGE_IS_PRESENT | PAGE_IS_HUGE,
                &mut ranges,
            )?;
            let mut seen: Vec<Seen> = v
                .regions()
                .map(|start| Seen {
                    start,
                    present: 0,
                    huge: false,
                    bits: [0; 8],
                })
                .collect();
            let mut huge_pages = vec![0u32; n];
            for r in &ranges {
                let mut a = r.start.max(lo);
                let end = r.end.min(hi);
                while a < end {
                    let k = ((a - lo) / HUGE) as usize;
                    let b = end.min(lo + (k as u64 + 1) * HUGE);
                    let first = ((a - seen[k].start) / 4096) as usize;
                    let pages = ((b - a) / 4096) as usize;
                    for i in first..first + pages {
                        seen[k].bits[i / 64] |= 1 << (i % 64);
                    }
                    if r.categories & PAGE_IS_HUGE != 0 {
                        huge_pages[k] += pages as u32;
                    }
                    a = b;
                }
            }
            for (s, h) in seen.iter_mut().zip(huge_pages) {
                s.present = s.bits.iter().map(|w| w.count_ones()).sum();
                s.huge = h == PAGES;
            }
            out.extend(seen);
        }
        Ok(out)
    }

    /// [`Proc::scan`] page by page: a 4 KiB read of `pagemap` per region, and the THP
    /// flag of its first page in `kpageflags` (which cannot tell a huge page the kernel
    /// split but has not freed from one a PMD maps).
    fn scan_pages(&self, vmas: &[Vma]) -> io::Result<Vec<Seen>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; PAGES as usize * 8];
        for v in vmas {
            for start in v.regions() {
                self.pagemap
                    .read_exact_at(&mut buf, start / 4096 * 8)
                    .map_err(|e| about(self.pid, "pagemap", e))?;
                let entries: Vec<u64> = buf
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                    .collect();
                let mut bits = [0u64; 8];
                for (i, e) in entries.iter().enumerate() {
                    if e & PM_PRESENT != 0 {
                        bits[i / 64] |= 1 << (i % 64);
                    }
                }
                let present = bits.iter().map(|w| w.count_ones()).sum::<u32>();
                let huge = present == PAGES && self.is_thp(entries[0]);
                out.push(Seen {
                    start,
                    present,
                    huge,
                    bits,
                });
            }
        }
        Ok(out)
    }

    fn is_thp(&self, entry: u64) -> bool {
        let pfn = entry & PM_PFN;
        let Some(k) = &self.kpageflags else {
            return false;
        };
        let mut b = [0u8; 8];
        pfn != 0 && k.read_exact_at(&mut b, pfn * 8).is_ok() && u64::from_le_bytes(b) & KPF_THP != 0
    }

    /// Bytes of its anonymous memory huge pages back (`AnonHugePages`).
    pub fn huge_bytes(&self) -> io::Result<u64> {
        let t = self.read("smaps_rollup")?;
        Ok(t.lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024)
    }

    /// Clear the accessed bits of all its pages (`clear_refs` 1), so that `referenced`
    /// tells what it touched after.
    pub fn clear_refs(&self) -> io::Result<()> {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "1")
            .map_err(|e| about(self.pid, "clear_refs", e))
    }

    /// Per mapping: start, end, kB referenced since the last `clear_refs`.
    pub fn referenced(&self) -> io::Result<Vec<(u64, u64, u64)>> {
        Ok(smaps_field(&self.read("smaps")?, "Referenced"))
    }

    /// Ask the kernel to back the region at `start` with a huge page now.
    pub fn collapse(&self, start: u64) -> io::Result<()> {
        cairn_media::sys::collapse_remote(&self.pidfd, start, HUGE)
            .map(|_| ())
            .map_err(|e| about(self.pid, "MADV_COLLAPSE", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_private_writable_mappings_only() {
        let t = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000600000 rw-p 00000000 00:00 0 
7f0000600000-7f0000800000 r--p 00000000 00:00 0 
7f0000800000-7f0000a00000 rw-s 00000000 00:05 1234                       /dev/shm/x
7f0000a00000-7f0000c00000 rw-p 00000000 08:01 99                         /usr/lib/libc.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        let v = parse_maps(t);
        assert_eq!(
            v,
            vec![
                Vma {
                    start: 0x55d0c0a00000,
                    end: 0x55d0c0a21000
                },
                Vma {
                    start: 0x7f0000000000,
                    end: 0x7f0000600000
                }
            ]
        );
        // The heap holds no whole aligned region; the second mapping three.
        assert_eq!(v[0].regions().count(), 0);
        assert_eq!(
            v[1].regions().collect::<Vec<_>>(),
            vec![0x7f0000000000, 0x7f0000200000, 0x7f0000400000]
        );
        let odd = Vma {
            start: 0x1000,
            end: 0x600000,
        };
        assert_eq!(odd.regions().collect::<Vec<_>>(), vec![0x200000, 0x400000]);
    }

    #[test]
    fn smaps_fields_by_mapping() {
        let t = "\
7f0000000000-7f0000600000 rw-p 00000000 00:00 0 
Size:               6144 kB
Referenced:         2048 kB
AnonHugePages:      4096 kB
7f0000600000-7f0000800000 r--p 00000000 00:00 0 
Referenced:            0 kB
";
        assert_eq!(
            smaps_field(t, "Referenced"),
            vec![
                (0x7f0000000000, 0x7f0000600000, 2048),
                (0x7f0000600000, 0x7f0000800000, 0)
            ]
        );
        assert_eq!(
            smaps_field(t, "AnonHugePages"),
            vec![(0x7f0000000000, 0x7f0000600000, 4096)]
        );
    }

    #[test]
    fn a_process_that_does_not_exist_is_a_clear_error() {
        let e = Proc::open(u32::MAX / 2).err().expect("no such process");
        assert!(e.to_string().contains("no such process"), "{e}");
    }
}
