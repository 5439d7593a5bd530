//! Huge pages: 2 MiB-aligned placement of mappings, what the kernel allows, and what
//! `/proc` says a mapping is backed by. Shared by every Cairn component that maps NVM
//! (the shared area, superpage extents, and later the key-value store's segments).
//!
//! On tmpfs (`/dev/shm`, the default NVM stand-in) a file's pages become 2 MiB folios
//! only through `madvise(MADV_COLLAPSE)` (`crate::Mapping::collapse`) unless the mount
//! says `huge=`; a mapping then uses PMDs where both its address and the file offset are
//! 2 MiB aligned (`crate::Mapping::new` places every mapping of 2 MiB or more so).
//! `/sys/kernel/mm/transparent_hugepage/shmem_enabled = deny` refuses all of it; Cairn
//! then runs on 4 KiB pages and says why ([`refusal`]).

use std::io;

/// Bytes of a huge page (PMD) on x86-64.
pub const HUGE_PAGE: usize = 2 << 20;

/// Reserve `len` bytes of address space (no access, no memory) at an address congruent
/// to `offset` modulo [`HUGE_PAGE`], for a `MAP_FIXED` mapping of a file at `offset`
/// (the caller maps over it or unmaps it).
pub fn reserve_aligned(len: usize, offset: u64) -> io::Result<*mut u8> {
    let span = len
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "mapping too long"))?;
    // SAFETY: a fresh anonymous reservation chosen by the kernel (addr NULL), checked
    // below; nothing can be read or written through it (PROT_NONE).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = p as usize;
    let want = (offset % HUGE_PAGE as u64) as usize;
    let at = base + (want + HUGE_PAGE - base % HUGE_PAGE) % HUGE_PAGE;
    let (head, tail) = (at - base, base + span - (at + len));
    // SAFETY: both ranges are parts of the reservation just made, outside
    // `at..at + len`; unmapping them releases address space only.
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((at + len) as *mut libc::c_void, tail);
        }
    }
    Ok(at as *mut u8)
}

/// The kernel's policy for huge pages of shared memory (tmpfs), as
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` selects it (`never`,
/// `always`, `within_size`, `advise`, `deny`, `force`), if readable.
pub fn shmem_policy() -> Option<String> {
    let s = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").ok()?;
    selected(&s).map(str::to_owned)
}

/// The bracketed word of a sysfs choice list (`always [never] deny`).
fn selected(s: &str) -> Option<&str> {
    let a = s.find('[')?;
    let b = a + s[a..].find(']')?;
    Some(&s[a + 1..b])
}

/// Why the kernel will not back the NVM tier with huge pages, or `None` when it may.
pub fn refusal() -> Option<String> {
    match shmem_policy().as_deref() {
        Some("deny") => Some(
            "the kernel refuses huge pages for shared memory \
             (/sys/kernel/mm/transparent_hugepage/shmem_enabled is deny)"
                .into(),
        ),
        None if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() => {
            Some("the kernel has no transparent huge pages".into())
        }
        _ => None,
    }
}

/// Kibibytes of the address range `start..end` of process `pid` (0: this one) that its
/// page tables map with PMDs (huge pages of shared memory or of files), from
/// `/proc/PID/smaps` (`ShmemPmdMapped` + `FilePmdMapped` of the areas overlapping the
/// range, pro rata when an area sticks out of it).
pub fn pmd_mapped_kib(pid: u32, start: usize, end: usize) -> io::Result<u64> {
    Ok(pmd_mapped_in(&smaps(pid)?, start, end))
}

/// [`pmd_mapped_kib`] over the text of an smaps file.
pub fn pmd_mapped_in(smaps: &str, start: usize, end: usize) -> u64 {
    let mut total = 0u64;
    let mut area: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some((a, b)) = area_of(line) {
            area = Some((a, b));
            continue;
        }
        let Some((lo, hi)) = area else { continue };
        let kib = ["ShmemPmdMapped:", "FilePmdMapped:"]
            .iter()
            .find_map(|k| line.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
        if let Some(kib) = kib {
            let (s, e) = (lo.max(start), hi.min(end));
            if s < e && hi > lo {
                total += kib * (e - s) as u64 / (hi - lo) as u64;
            }
        }
    }
    total
}

/// Whether the area of process `pid` (0: this one) holding address `addr` is marked
/// `MADV_HUGEPAGE` (`hg` among its `VmFlags` in `/proc/PID/smaps`); `None` when no
/// area holds it.
pub fn huge_advised(pid: u32, addr: usize) -> io::Result<Option<bool>> {
    Ok(huge_advised_in(&smaps(pid)?, addr))
}

/// The text of `/proc/PID/smaps` (0: this process).
fn smaps(pid: u32) -> io::Result<String> {
    if pid == 0 {
        std::fs::read_to_string("/proc/self/smaps")
    } else {
        std::fs::read_to_string(format!("/proc/{pid}/smaps"))
    }
}

/// [`huge_advised`] over the text of an smaps file.
pub fn huge_advised_in(smaps: &str, addr: usize) -> Option<bool> {
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((a, b)) = area_of(line) {
            inside = (a..b).contains(&addr);
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if inside {
                return Some(flags.split_whitespace().any(|f| f == "hg"));
            }
        }
    }
    None
}

/// The range of an smaps (or maps) area header line
/// (`7f..-7f.. r--s 00000000 00:1a 12 /path`).
pub(crate) fn area_of(line: &str) -> Option<(usize, usize)> {
    let range = line.split_whitespace().next()?;
    let (a, b) = range.split_once('-')?;
    let a = usize::from_str_radix(a, 16).ok()?;
    let b = usize::from_str_radix(b, 16).ok()?;
    // A header has permissions next; key lines ("Size:") do not parse as ranges.
    Some((a, b))
}

/// Run a collapse (`MADV_COLLAPSE`, here or in another process) and, while the kernel
/// answers `EAGAIN` (a page locked, off the LRU or in use for a moment), try it again up
/// to four times, after 2, 4, 8 and 16 ms.
pub(crate) fn retry_busy<T>(mut collapse: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 0;
    loop {
        match collapse() {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 4 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(1 << tries));
            }
            r => return r,
        }
    }
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10).
pub fn minor_faults() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) is in parentheses and may hold spaces.
    s.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7)?.parse().ok())
        .unwrap_or(0)
}

/// A counter of `/proc/vmstat` (for example `thp_collapse_alloc`), if present.
pub fn vmstat(name: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/vmstat").ok()?;
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_faults_count_touched_pages() {
        let before = minor_faults();
        // Through black_box: an optimized build may otherwise never write the memory
        // (only v[12345] is read, and its value is known).
        let v = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = minor_faults();
        assert!(
            v[12345] == 1 && after >= before + 1000,
            "{before} -> {after}"
        );
    }

    #[test]
    fn advice_of_the_area_holding_an_address() {
        let smaps = "1000-3000 rw-p 00000000 00:00 0\nSize: 8 kB\nVmFlags: rd wr mr mw me ac\n\
                     3000-5000 rw-p 00000000 00:00 0\nSize: 8 kB\nVmFlags: rd wr hg ac\n";
        assert_eq!(huge_advised_in(smaps, 0x1fff), Some(false));
        assert_eq!(huge_advised_in(smaps, 0x3000), Some(true));
        assert_eq!(huge_advised_in(smaps, 0x5000), None);
        // A real mapping, before and after the advice.
        let len = 4 * HUGE_PAGE;
        let mut v = vec![0u8; len];
        let p = v.as_mut_ptr() as usize;
        let inner = (p + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
        assert_eq!(huge_advised(0, inner).unwrap(), Some(false));
        // SAFETY: a range inside `v`, page aligned; the advice changes only how it is
        // backed.
        let r =
            unsafe { libc::madvise(inner as *mut libc::c_void, HUGE_PAGE, libc::MADV_HUGEPAGE) };
        if r == 0 {
            assert_eq!(huge_advised(0, inner).unwrap(), Some(true));
            assert_eq!(huge_advised(0, inner + HUGE_PAGE).unwrap(), Some(false));
        }
        v[0] = 1;
    }

    #[test]
    fn sysfs_choice() {
        assert_eq!(
            selected("always within_size advise [never] deny force\n"),
            Some("never")
        );
        assert_eq!(selected("[deny] never"), Some("deny"));
        assert_eq!(selected("never"), None);
    }

    #[test]
    fn smaps_pmd_sums() {
        let t = "\
7f0000000000-7f0000400000 r--s 00000000 00:1a 12 /dev/shm/x
Size:               4096 kB
ShmemPmdMapped:     2048 kB
FilePmdMapped:         0 kB
7f0000400000-7f0000600000 r--p 00000000 00:00 0
ShmemPmdMapped:        0 kB
FilePmdMapped:      2048 kB
";
        assert_eq!(pmd_mapped_in(t, 0x7f00_0000_0000, 0x7f00_0040_0000), 2048);
        assert_eq!(pmd_mapped_in(t, 0, usize::MAX), 4096);
        assert_eq!(pmd_mapped_in(t, 0x7f00_0000_0000, 0x7f00_0020_0000), 1024);
        assert_eq!(pmd_mapped_in(t, 0x1000, 0x2000), 0);
    }

    #[test]
    fn aligned_mappings_and_collapse() {
        use std::io::Write;
        let dir = std::env::temp_dir();
        let path = dir.join(format!("cairn-media-huge-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(&vec![7u8; 6 * HUGE_PAGE]).unwrap();
        let _ = std::fs::remove_file(&path);
        // The address follows the file offset modulo 2 MiB.
        for off in [0u64, 4096, HUGE_PAGE as u64 + 8192] {
            let m = crate::Mapping::new(&f, off, 3 * HUGE_PAGE, false, false).unwrap();
            assert_eq!(m.as_ptr() as u64 % HUGE_PAGE as u64, off % HUGE_PAGE as u64);
            let mut b = [0u8; 1];
            m.read(3 * HUGE_PAGE - 1, &mut b).unwrap();
            assert_eq!(b[0], 7);
        }
        let m = crate::Mapping::new(&f, 0, 6 * HUGE_PAGE, true, false).unwrap();
        assert!(m.collapse(4096, HUGE_PAGE).is_err(), "unaligned");
        // Whether the kernel collapses depends on the host; the bytes never change.
        let _ = m.collapse(HUGE_PAGE, HUGE_PAGE);
        let mut b = vec![0u8; HUGE_PAGE];
        m.read(HUGE_PAGE, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
    }
}
