//! Reading a persistence trace written by `cairn_media::trace`.

use cairn_media::trace::{
    DATA_START, FENCE, FILE_SYNC, FILE_WRITE, FLUSH, HDR_CAPACITY, HDR_OVERFLOW, HDR_TAIL, MARK,
    NT_STORE, SITE, STORE,
};
use std::collections::HashMap;
use std::io;
use std::path::Path;

/// One traced event, in the global order of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Stores of `data` at `off` of file (dev, ino); `nt`: non-temporal.
    Store {
        tid: u32,
        site: u32,
        file: (u64, u64),
        off: u64,
        data: Vec<u8>,
        nt: bool,
    },
    /// A write-back of the cache lines covering `off..off+len`.
    Flush {
        tid: u32,
        site: u32,
        file: (u64, u64),
        off: u64,
        len: u64,
    },
    /// A fence of thread `tid`.
    Fence { tid: u32, site: u32 },
    /// A workload's mark.
    Mark { tid: u32, label: u32, value: u64 },
    /// A `pwrite` of `data` at `off` of a host file (a lower tier).
    FileWrite {
        tid: u32,
        site: u32,
        file: (u64, u64),
        off: u64,
        data: Vec<u8>,
    },
    /// An `fdatasync` of a host file.
    FileSync {
        tid: u32,
        site: u32,
        file: (u64, u64),
    },
}

/// A whole trace: its events and the names of its sites.
#[derive(Debug, Default)]
pub struct Trace {
    pub events: Vec<Event>,
    /// Site id → `file:line`.
    pub sites: HashMap<u32, String>,
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Trace {
    /// Read the trace file at `path` once every traced process has stopped. Errors: the
    /// trace overflowed its capacity, or a record was reserved but never written (a
    /// process died in the middle of tracing it).
    pub fn read(path: &Path) -> io::Result<Trace> {
        use std::io::Read;
        // Only the header and the records up to the tail are read: the rest of the
        // file's capacity (sparse, gigabytes) is zeros.
        let f = std::fs::File::open(path)?;
        let size = f.metadata()?.len() as usize;
        let mut b = Vec::new();
        (&f).take(DATA_START).read_to_end(&mut b)?;
        if b.len() < DATA_START as usize {
            return Err(bad("not a trace file: too short"));
        }
        let tail = u64_at(&b, HDR_TAIL) as usize;
        let cap = u64_at(&b, HDR_CAPACITY) as usize;
        if cap != size {
            return Err(bad(format!(
                "not a trace file: capacity {cap}, size {size}"
            )));
        }
        if u64_at(&b, HDR_OVERFLOW) != 0 || tail > cap {
            return Err(bad(format!(
                "the trace overflowed its {cap} bytes: make it larger"
            )));
        }
        (&f).take(tail.saturating_sub(b.len()) as u64)
            .read_to_end(&mut b)?;
        if b.len() < tail {
            return Err(bad(format!(
                "the trace ends at {} before its tail {tail}",
                b.len()
            )));
        }
        let mut t = Trace::default();
        let mut at = DATA_START as usize;
        while at < tail {
            let h = u64_at(&b, at);
            let len = (h & 0xffff_ffff) as usize;
            let kind = (h >> 32) as u8;
            if len < 8 || at + len > tail {
                return Err(bad(format!(
                    "record at {at} was never completed (header {h:#x})"
                )));
            }
            let r = &b[at + 8..at + len];
            let tid = u32_at(r, 0);
            match kind {
                STORE | NT_STORE | FILE_WRITE => {
                    let n = u64_at(r, 32) as usize;
                    if 40 + n > r.len() {
                        return Err(bad(format!("store record at {at} is cut short")));
                    }
                    let (site, file, off) =
                        (u32_at(r, 4), (u64_at(r, 8), u64_at(r, 16)), u64_at(r, 24));
                    let data = r[40..40 + n].to_vec();
                    t.events.push(if kind == FILE_WRITE {
                        Event::FileWrite {
                            tid,
                            site,
                            file,
                            off,
                            data,
                        }
                    } else {
                        Event::Store {
                            tid,
                            site,
                            file,
                            off,
                            data,
                            nt: kind == NT_STORE,
                        }
                    });
                }
                FILE_SYNC => t.events.push(Event::FileSync {
                    tid,
                    site: u32_at(r, 4),
                    file: (u64_at(r, 8), u64_at(r, 16)),
                }),
                FLUSH => t.events.push(Event::Flush {
                    tid,
                    site: u32_at(r, 4),
                    file: (u64_at(r, 8), u64_at(r, 16)),
                    off: u64_at(r, 24),
                    len: u64_at(r, 32),
                }),
                FENCE => t.events.push(Event::Fence {
                    tid,
                    site: u32_at(r, 4),
                }),
                MARK => t.events.push(Event::Mark {
                    tid,
                    label: u32_at(r, 4),
                    value: u64_at(r, 8),
                }),
                SITE => {
                    // The first word is the site's id, not a thread.
                    let name = String::from_utf8_lossy(&r[8..]);
                    let site = u32_at(r, 0);
                    t.sites
                        .insert(site, name.trim_end_matches('\0').to_string());
                }
                k => return Err(bad(format!("record at {at} has unknown kind {k}"))),
            }
            at += len;
        }
        Ok(t)
    }

    /// The name of a site (`file:line`), or its number.
    pub fn site_name(&self, site: u32) -> String {
        self.sites
            .get(&site)
            .cloned()
            .unwrap_or_else(|| format!("site {site:#x}"))
    }
}
