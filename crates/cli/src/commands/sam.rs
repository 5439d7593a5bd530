//! `cairn sam`: genomics data sets in address spaces (docs/SPACEJMP.md, "Genomics data
//! in an address space").

use crate::error::{CliError, CliResult};
use crate::util::human_bytes;
use crate::SamCommand;
use cairn_genomics::dataset::{self, DataSet};
use cairn_genomics::ops::{Order, Source};
use cairn_sj::SpaceJmp;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

fn out(text: &str) -> CliResult {
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

pub fn run(store: Option<&Path>, which: SamCommand) -> CliResult {
    if let SamCommand::Gen {
        out: path,
        reads,
        seed,
        bam,
    } = &which
    {
        let f = std::fs::File::create(path)
            .map_err(|e| CliError::new(format!("{}: {e}", path.display())))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        cairn_genomics::gen::write_sam(&mut w, *reads, *seed)
            .map_err(|e| CliError::new(format!("{}: {e}", path.display())))?;
        drop(w);
        if let Some(b) = bam {
            cairn_genomics::gen::sam_to_bam(path, b)?;
        }
        return Ok(());
    }
    let sj = SpaceJmp::open(store)?;
    sj.fs().set_umask(0);
    match which {
        SamCommand::Gen { .. } => unreachable!("handled above"),
        SamCommand::Load { file, name, mode } => {
            let mode = super::sj::parse_mode(&mode)?;
            let st = dataset::load(&sj, &name, &file, mode)?;
            out(&format!(
                "loaded {} reads as data set {name} (segment of {}) in {:.2} s (reading {:.2} s)\n",
                st.records,
                human_bytes(st.segment_len),
                (st.read + st.store).as_secs_f64(),
                st.read.as_secs_f64()
            ))
        }
        SamCommand::Flagstat { name } => {
            let d = DataSet::attach(&sj, &name, false)?;
            let o = d.enter()?;
            out(&o.flagstat()?.text())
        }
        SamCommand::Sort { name, by, print } => {
            let order = Order::parse(&by)?;
            let d = DataSet::attach(&sj, &name, true)?;
            let o = d.enter()?;
            o.sort(order)?;
            if print {
                let refs = o.references().to_vec();
                let mut text = String::new();
                let mut w = |name: &[u8], c: &cairn_genomics::model::Core| {
                    let rname = refs
                        .get(c.ref_id.max(0) as usize)
                        .filter(|_| c.ref_id >= 0)
                        .map_or("*", |r| r.name.as_str());
                    let _ = writeln!(
                        text,
                        "{}\t{}\t{rname}\t{}",
                        String::from_utf8_lossy(name),
                        c.flag,
                        c.pos + 1
                    );
                };
                o.sorted(order)?.scan_from(0, &mut |_, r| {
                    w(r.name, &r.core);
                    Ok(true)
                })?;
                out(&text)?;
            }
            Ok(())
        }
        SamCommand::Index { name } => {
            let d = DataSet::attach(&sj, &name, true)?;
            d.enter()?.index()?;
            Ok(())
        }
        SamCommand::View {
            name,
            region,
            count,
        } => {
            let d = DataSet::attach(&sj, &name, false)?;
            let o = d.enter()?;
            let refs = o.references().to_vec();
            let mut text = String::new();
            let n = o.query(&region, !count, &mut |r| {
                if !count {
                    let c = &r.core;
                    let _ = writeln!(
                        text,
                        "{}\t{}\t{}\t{}\t{}",
                        String::from_utf8_lossy(r.name),
                        c.flag,
                        refs[c.ref_id as usize].name,
                        c.pos + 1,
                        c.mapq
                    );
                }
            })?;
            if count {
                let _ = writeln!(text, "{n}");
            }
            out(&text)
        }
        SamCommand::Info { name } => {
            let d = DataSet::attach(&sj, &name, false)?;
            let o = d.enter()?;
            let mut text = format!("data set {name}\n  reads      {}\n", o.reads());
            let _ = writeln!(
                text,
                "  references {}",
                o.references()
                    .iter()
                    .map(|r| format!("{} ({})", r.name, r.len))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let _ = writeln!(text, "  roots      {}", o.roots()?.join(" "));
            let (seg, _, _) = dataset::names(&name)?;
            let info = sj.seg_info(&seg)?;
            let _ = writeln!(
                text,
                "  segment    /.sj/seg/{seg} at {:#x}, {}",
                info.base,
                human_bytes(info.len)
            );
            out(&text)
        }
        SamCommand::Ls => {
            let mut text = String::new();
            for s in sj.seg_list()? {
                if let Some(n) = s.path.strip_prefix("/.sj/seg/sam-") {
                    let _ = writeln!(text, "{n}\t{}", human_bytes(s.len));
                }
            }
            out(&text)
        }
        SamCommand::Rm { name } => {
            dataset::names(&name)?;
            dataset::remove(&sj, &name).map_err(|e| {
                if cairn_area::errno_of(&e) == libc::ENOENT {
                    CliError::new(format!("no data set {name}"))
                } else {
                    e.into()
                }
            })
        }
    }
}
