//! `cairn sj`: segments, address spaces and their locks (docs/SPACEJMP.md).

use crate::error::{CliError, CliResult};
use crate::util::{human_bytes, json_text};
use crate::{SjCommand, SjSegCommand, SjVasCommand};
use cairn_sj::{control, flags, prot, SegInfo, SpaceJmp, VasCtl};
use serde::Serialize;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

pub fn run(store: Option<&Path>, which: SjCommand) -> CliResult {
    let sj = SpaceJmp::open(store)?;
    // `--mode` is exact, as `mkdir -m`'s: the umask does not apply.
    sj.fs().set_umask(0);
    match which {
        SjCommand::Seg { which } => seg(&sj, which),
        SjCommand::Vas { which } => vas(&sj, which),
        SjCommand::Locks { json } => locks(&sj, json),
    }
}

fn out(text: &str) -> CliResult {
    // Tables end their lines without the padding of their last column.
    let text: String = text
        .lines()
        .map(|l| format!("{}\n", l.trim_end()))
        .collect();
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

/// `--mode`: a segment's or address space's permission bits, in octal.
pub(super) fn parse_mode(s: &str) -> Result<u32, CliError> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| CliError::new(format!("--mode {s}: permission bits in octal (0640)")))
}

fn prot_text(p: u32) -> &'static str {
    if p & prot::WRITE != 0 {
        "rw"
    } else {
        "r"
    }
}

fn flags_text(f: u32) -> String {
    let mut v = Vec::new();
    if f & flags::LOCKABLE != 0 {
        v.push("lockable");
    }
    if f & flags::OVERLAP != 0 {
        v.push("overlap");
    }
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

#[derive(Serialize)]
struct SegRow {
    name: String,
    id: u64,
    base: String,
    len: u64,
    prot: &'static str,
    flags: String,
    commits: u64,
    resident_bytes: u64,
}

impl From<&SegInfo> for SegRow {
    fn from(i: &SegInfo) -> SegRow {
        SegRow {
            name: i.path.clone(),
            id: i.id.0,
            base: format!("{:#x}", i.base),
            len: i.len,
            prot: prot_text(i.prot),
            flags: flags_text(i.flags),
            commits: i.commit_seq,
            resident_bytes: i.resident_bytes,
        }
    }
}

fn seg(sj: &Arc<SpaceJmp>, which: SjSegCommand) -> CliResult {
    match which {
        SjSegCommand::Create {
            name,
            size,
            base,
            lockable,
            overlap,
            read_only,
            mode,
        } => {
            let base = match base.as_str() {
                "auto" => None,
                b => Some(
                    u64::from_str_radix(b.trim_start_matches("0x"), 16)
                        .map_err(|_| CliError::new(format!("--base {b}: a hex address or auto")))?,
                ),
            };
            let f = if lockable { flags::LOCKABLE } else { 0 }
                | if overlap { flags::OVERLAP } else { 0 };
            let p = if read_only { prot::READ } else { prot::RW };
            sj.seg_alloc(&name, base, size, p, f, parse_mode(&mode)?)?;
            let i = sj.seg_info(&name)?;
            out(&format!(
                "created segment {} at {:#x}, {} ({})\n",
                i.path,
                i.base,
                human_bytes(i.len),
                flags_text(i.flags)
            ))
        }
        SjSegCommand::Ls { json } => {
            let rows: Vec<SegRow> = sj.seg_list()?.iter().map(SegRow::from).collect();
            if json {
                return out(&json_text(&rows, "the segments")?);
            }
            let mut s = format!(
                "{:<24} {:>18} {:>10} {:>4} {:<16} {:>8} {:>10}\n",
                "segment", "base", "length", "prot", "flags", "commits", "resident"
            );
            for r in &rows {
                s.push_str(&format!(
                    "{:<24} {:>18} {:>10} {:>4} {:<16} {:>8} {:>10}\n",
                    r.name,
                    r.base,
                    human_bytes(r.len),
                    r.prot,
                    r.flags,
                    r.commits,
                    human_bytes(r.resident_bytes)
                ));
            }
            out(&s)
        }
        SjSegCommand::Stat { name, json } => {
            let i = sj.seg_info(&name)?;
            let slot = sj.control().slot(i.id.0, i.gen)?;
            #[derive(Serialize)]
            struct Stat {
                #[serde(flatten)]
                row: SegRow,
                generation: u64,
                recoveries: u64,
                attached_processes: Vec<u32>,
            }
            let attached: Vec<u32> = slot
                .attached()
                .into_iter()
                .filter(|&w| !control::owner_dead(w))
                .map(|w| (w >> 32) as u32)
                .collect();
            let st = Stat {
                row: SegRow::from(&i),
                generation: i.gen,
                recoveries: slot.recoveries(),
                attached_processes: attached,
            };
            if json {
                return out(&json_text(&st, "the segment")?);
            }
            out(&format!(
                "segment   {}\n  id        {} (generation {})\n  range     {:#x}..{:#x} ({})\n  \
                 allows    {}\n  flags     {}\n  commits   {}\n  resident  {} in /dev/shm\n  \
                 attached  {}\n  recovered {} time(s) from a dead writer\n",
                i.path,
                i.id.0,
                i.gen,
                i.base,
                i.base + i.len,
                human_bytes(i.len),
                prot_text(i.prot),
                flags_text(i.flags),
                i.commit_seq,
                human_bytes(i.resident_bytes),
                if st.attached_processes.is_empty() {
                    "by no process".to_string()
                } else {
                    format!("by pid {:?}", st.attached_processes)
                },
                st.recoveries
            ))
        }
        SjSegCommand::Rm { name } => {
            // A file without a valid header (a creation cut short) is removed too.
            let info = sj.seg_info(&name);
            sj.seg_free(&name)?;
            match info {
                Ok(i) => out(&format!(
                    "removed segment {} ({} freed at {:#x})\n",
                    i.path,
                    human_bytes(i.len),
                    i.base
                )),
                Err(e) => out(&format!(
                    "removed {name}, which was not a whole segment ({e})\n"
                )),
            }
        }
        SjSegCommand::Evict { name } => {
            let freed = sj.seg_evict(&name)?;
            out(&format!(
                "dropped the resident copy of {name}: {} of memory\n",
                human_bytes(freed)
            ))
        }
    }
}

#[derive(Serialize)]
struct VasRow {
    segment: String,
    id: u64,
    base: String,
    len: u64,
    prot: &'static str,
    flags: String,
}

fn vas_rows(entries: &[cairn_format::sj::VasEntry]) -> Vec<VasRow> {
    entries
        .iter()
        .map(|e| VasRow {
            segment: e.path.clone(),
            id: e.ino,
            base: format!("{:#x}", e.base),
            len: e.len,
            prot: prot_text(e.prot),
            flags: flags_text(e.flags),
        })
        .collect()
}

fn vas_table(rows: &[VasRow]) -> String {
    let mut s = format!(
        "  {:<24} {:>18} {:>10} {:>4} {:<16}\n",
        "segment", "base", "length", "prot", "flags"
    );
    for r in rows {
        s.push_str(&format!(
            "  {:<24} {:>18} {:>10} {:>4} {:<16}\n",
            r.segment,
            r.base,
            human_bytes(r.len),
            r.prot,
            r.flags
        ));
    }
    s
}

fn vas(sj: &Arc<SpaceJmp>, which: SjVasCommand) -> CliResult {
    match which {
        SjVasCommand::Create { name, mode } => {
            sj.vas_create(&name, parse_mode(&mode)?)?;
            out(&format!(
                "created address space {}\n",
                cairn_sj::vas_path(&name)?
            ))
        }
        SjVasCommand::Add { name, seg, prot: p } => {
            let vid = sj.vas_find(&name)?;
            let sid = sj.seg_find(&seg)?;
            let p = if p == "r" { prot::READ } else { prot::RW };
            sj.vas_ctl(vid, VasCtl::Add { seg: sid, prot: p })?;
            out(&format!("{name}: added {seg} ({})\n", prot_text(p)))
        }
        SjVasCommand::RmSeg { name, seg } => {
            let vid = sj.vas_find(&name)?;
            let sid = sj.seg_find(&seg)?;
            sj.vas_ctl(vid, VasCtl::Remove { seg: sid })?;
            out(&format!("{name}: removed {seg}\n"))
        }
        SjVasCommand::Show { name, json } => {
            let vid = sj.vas_find(&name)?;
            let rows = vas_rows(&sj.vas_ctl(vid, VasCtl::List)?);
            if json {
                #[derive(Serialize)]
                struct Show {
                    name: String,
                    id: u64,
                    segments: Vec<VasRow>,
                }
                return out(&json_text(
                    &Show {
                        name: cairn_sj::vas_path(&name)?,
                        id: vid.0,
                        segments: rows,
                    },
                    "the address space",
                )?);
            }
            out(&format!(
                "address space {} (id {})\n{}",
                cairn_sj::vas_path(&name)?,
                vid.0,
                vas_table(&rows)
            ))
        }
        SjVasCommand::Ls { json } => {
            let all = sj.vas_list()?;
            if json {
                #[derive(Serialize)]
                struct Row {
                    name: String,
                    id: u64,
                    segments: Vec<VasRow>,
                }
                let rows: Vec<Row> = all
                    .iter()
                    .map(|(n, id, e)| Row {
                        name: n.clone(),
                        id: id.0,
                        segments: vas_rows(e),
                    })
                    .collect();
                return out(&json_text(&rows, "the address spaces")?);
            }
            let mut s = String::new();
            for (n, id, e) in &all {
                s.push_str(&format!("{n} (id {}): {} segment(s)\n", id.0, e.len()));
                s.push_str(&vas_table(&vas_rows(e)));
            }
            if all.is_empty() {
                s.push_str("no address spaces\n");
            }
            out(&s)
        }
        SjVasCommand::Clone { src, dst } => {
            let vid = sj.vas_find(&src)?;
            sj.vas_clone(vid, &dst)?;
            out(&format!("cloned {src} to {dst}\n"))
        }
        SjVasCommand::Rm { name } => {
            sj.vas_remove(&name)?;
            out(&format!("removed address space {name}\n"))
        }
    }
}

/// `cairn sj locks`: every claimed slot of the control file.
fn locks(sj: &Arc<SpaceJmp>, json: bool) -> CliResult {
    #[derive(Serialize)]
    struct Holder {
        pid: u32,
        alive: bool,
        count: u32,
    }
    #[derive(Serialize)]
    struct Lock {
        segment: String,
        id: u64,
        generation: u64,
        /// The writer's thread id (0: none) and whether it lives.
        writer_tid: u32,
        writer_alive: bool,
        readers: Vec<Holder>,
        waiters: u32,
        dead_owners_recovered: u64,
        commits: u64,
        journal: String,
    }
    let names: std::collections::HashMap<u64, String> = sj
        .fs()
        .sj_ranges()?
        .into_iter()
        .map(|r| (r.ino, r.path))
        .collect();
    let rows: Vec<Lock> = sj
        .control()
        .slots()
        .iter()
        .map(|s| {
            let w = s.writer();
            Lock {
                segment: names
                    .get(&s.key())
                    .cloned()
                    .unwrap_or_else(|| "(removed)".into()),
                id: s.key(),
                generation: s.generation(),
                writer_tid: (w >> 32) as u32,
                writer_alive: w != 0 && !control::owner_dead(w),
                readers: s
                    .readers()
                    .into_iter()
                    .map(|(o, c)| Holder {
                        pid: (o >> 32) as u32,
                        alive: !control::owner_dead(o),
                        count: c,
                    })
                    .collect(),
                waiters: s.waiting(),
                dead_owners_recovered: s.recoveries(),
                commits: s.commits(),
                journal: format!("{:?}", s.journal().0).to_lowercase(),
            }
        })
        .collect();
    if json {
        return out(&json_text(&rows, "the locks")?);
    }
    let mut s = format!(
        "{:<24} {:>12} {:<20} {:>7} {:>9} {:>8} {:<8}\n",
        "segment", "writer", "readers (pid:count)", "waiting", "recovered", "commits", "journal"
    );
    for r in &rows {
        let writer = match (r.writer_tid, r.writer_alive) {
            (0, _) => "-".to_string(),
            (t, true) => format!("tid {t}"),
            (t, false) => format!("tid {t} dead"),
        };
        let readers = if r.readers.is_empty() {
            "-".to_string()
        } else {
            r.readers
                .iter()
                .map(|h| {
                    format!(
                        "{}:{}{}",
                        h.pid,
                        h.count,
                        if h.alive { "" } else { " dead" }
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        s.push_str(&format!(
            "{:<24} {:>12} {:<20} {:>7} {:>9} {:>8} {:<8}\n",
            r.segment, writer, readers, r.waiters, r.dead_owners_recovered, r.commits, r.journal
        ));
    }
    if rows.is_empty() {
        s.push_str("no segment has been attached\n");
    }
    out(&s)
}
