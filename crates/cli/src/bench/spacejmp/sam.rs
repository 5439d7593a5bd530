//! `cairn bench spacejmp sam`: genomics tools on a data set kept in a segment, against
//! the same code on records decoded from BAM each time and against samtools
//! (docs/BENCHMARKS.md, "Genomics data in an address space").
//!
//! A synthetic data set is generated (SAM, then BAM), loaded once into a segment, and
//! each operation (flagstat, sort by name, sort by coordinate, index, region query)
//! runs `--runs` times in three ways: `samtools` (Debian's, `-@ 2`) on BAM files, the
//! `cairn-genomics` code on records decoded from BAM (`bam`: each tool reads the file
//! its stage is given, sorts write BAM, as a tool chain passing files does), and the
//! same code on the data set (`segment`: each tool attaches the data set, switches into
//! it, and its changes are one commit). Figures are medians. Results are checked
//! against samtools (flagstat counts, region counts) before any number is printed.

use super::super::{median, BenchStore};
use crate::error::{CliError, CliResult};
use cairn_genomics::bamfile;
use cairn_genomics::dataset::{self, DataSet};
use cairn_genomics::ops::{FlagStat, Order};
use cairn_sj::SpaceJmp;
use clap::Args;
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `cairn bench spacejmp sam` options.
#[derive(Debug, Args)]
pub struct SamBenchArgs {
    /// Print the results as JSON on stdout (progress goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Runs of each measurement: each figure is the median
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
    /// Reads in the synthetic data set (8 million: about 3 GB of SAM, 0.76 GB of BAM)
    #[arg(long, value_name = "N", default_value_t = 8_000_000,
          value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    pub reads: u64,
    /// The generator's seed
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// The region of the query (samtools' syntax)
    #[arg(long, default_value = "chr1:1000000-2000000")]
    pub region: String,
}

fn progress(msg: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().write_fmt(msg);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn samtools(args: &[&str]) -> CliResult<String> {
    let out = Command::new("samtools")
        .args(args)
        .output()
        .map_err(|e| CliError::new(format!("samtools: {e} (scripts/setup.sh installs it)")))?;
    if !out.status.success() {
        return Err(CliError::new(format!(
            "samtools {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn timed<T>(f: impl FnOnce() -> CliResult<T>) -> CliResult<(Duration, T)> {
    let t = Instant::now();
    let v = f()?;
    Ok((t.elapsed(), v))
}

/// Medians over runs of named figures (ms).
#[derive(Default)]
struct Figures(Vec<(String, Vec<f64>)>);

impl Figures {
    fn add(&mut self, k: &str, v: f64) {
        match self.0.iter_mut().find(|(n, _)| n == k) {
            Some((_, vs)) => vs.push(v),
            None => self.0.push((k.to_string(), vec![v])),
        }
    }

    fn get(&self, k: &str) -> f64 {
        self.0
            .iter()
            .find(|(n, _)| n == k)
            .map_or(f64::NAN, |(_, v)| median(v))
    }
}

pub fn run(args: &SamBenchArgs) -> CliResult {
    samtools(&["--version"])?;
    let root = std::env::temp_dir().join(format!("cairn-bench-sam-{}", std::process::id()));
    std::fs::create_dir_all(&root).map_err(crate::error::ctx_msg(root.display()))?;
    let nvm = PathBuf::from(format!(
        "/dev/shm/cairn-bench-sam-{}.nvm",
        std::process::id()
    ));
    let bs = BenchStore {
        root: root.clone(),
        nvm: nvm.clone(),
    };
    let store_dir = root.join("store");
    // The segment (about 410 bytes a read), its staged commit and the orders.
    let need = (args.reads * 450 * 5 / 2).max(1 << 30);
    let mut opts = cairn_daemon::MkfsOptions::new(&store_dir);
    opts.nvm_path = Some(nvm.clone());
    opts.nvm_size = need.div_ceil(1 << 30) << 30;
    cairn_daemon::mkfs(&opts)
        .map_err(|e| CliError::new(format!("creating the benchmark store: {e}")))?;
    let sj = SpaceJmp::with_fs(cairn::Fs::open(&store_dir)?)?;
    let rows = measure(&sj, args, &root)?;
    let text = if args.json {
        crate::util::json_text(
            &json!({ "runs": args.runs, "reads": args.reads, "results": rows }),
            "the results",
        )?
    } else {
        super::table(&rows)
    };
    drop(sj);
    drop(bs);
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

fn measure(sj: &Arc<SpaceJmp>, args: &SamBenchArgs, root: &Path) -> CliResult<Vec<Value>> {
    let mut rows = Vec::new();
    let sam = root.join("reads.sam");
    let bam = root.join("reads.bam");
    progress(format_args!("generating {} reads\n", args.reads));
    let (t_gen, ()) = timed(|| {
        let f = std::fs::File::create(&sam).map_err(crate::error::ctx_msg(sam.display()))?;
        let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
        cairn_genomics::gen::write_sam(&mut w, args.reads, args.seed)?;
        Ok(())
    })?;
    let (t_bam, _) = timed(|| Ok(cairn_genomics::gen::sam_to_bam(&sam, &bam)?))?;
    let size = |f: &Path| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
    rows.push(json!({"experiment": "sam-data", "reads": args.reads,
        "sam_bytes": size(&sam), "bam_bytes": size(&bam),
        "generate_ms": ms(t_gen), "to_bam_ms": ms(t_bam)}));
    progress(format_args!("loading {} into a segment\n", bam.display()));
    let st = dataset::load(sj, "bench", &bam, 0o600)?;
    rows.push(json!({"experiment": "sam-load", "reads": st.records,
        "segment_bytes": st.segment_len, "read_ms": ms(st.read), "store_commit_ms": ms(st.store)}));
    std::fs::remove_file(&sam).map_err(crate::error::ctx_msg(sam.display()))?;

    // The reference results.
    let st_flagstat = FlagStat::parse_counts(&samtools(&["flagstat", "-@", "2", p(&bam)])?)?;
    let sorted_st = root.join("st.coord.bam");
    let sorted_ours = root.join("bam.coord.bam");
    let by_name = root.join("out.name.bam");
    let check_flagstat = |what: &str, f: &FlagStat| -> CliResult {
        if f.counts() != st_flagstat {
            return Err(CliError::new(format!(
                "{what}: flagstat differs from samtools'"
            )));
        }
        Ok(())
    };
    let mut fig = Figures::default();
    for run in 0..args.runs {
        progress(format_args!("run {} of {}\n", run + 1, args.runs));
        // samtools, passing BAM files.
        let (t, _) = timed(|| samtools(&["flagstat", "-@", "2", p(&bam)]))?;
        fig.add("samtools flagstat", ms(t));
        let (t, _) = timed(|| samtools(&["sort", "-n", "-@", "2", "-o", p(&by_name), p(&bam)]))?;
        fig.add("samtools sort-name", ms(t));
        let (t, _) = timed(|| samtools(&["sort", "-@", "2", "-o", p(&sorted_st), p(&bam)]))?;
        fig.add("samtools sort-coord", ms(t));
        let (t, _) = timed(|| samtools(&["index", "-@", "2", p(&sorted_st)]))?;
        fig.add("samtools index", ms(t));
        let (t2, _) = timed(|| samtools(&["flagstat", "-@", "2", p(&sorted_st)]))?;
        fig.add(
            "samtools pipeline",
            fig.0
                .iter()
                .rev()
                .find(|(k, _)| k == "samtools sort-coord")
                .map_or(0.0, |(_, v)| v[v.len() - 1])
                + fig
                    .0
                    .iter()
                    .rev()
                    .find(|(k, _)| k == "samtools index")
                    .map_or(0.0, |(_, v)| v[v.len() - 1])
                + ms(t2),
        );
        let (t, st_count) = timed(|| samtools(&["view", "-c", p(&sorted_st), &args.region]))?;
        fig.add("samtools query", ms(t));
        let st_count: u64 = st_count.trim().parse().unwrap_or(u64::MAX);

        // The same code on decoded BAM.
        let (t, f) = timed(|| Ok(bamfile::flagstat(&bam)?))?;
        check_flagstat("bam", &f)?;
        fig.add("bam flagstat", ms(t));
        let s = bamfile::sort(&bam, &by_name, Order::Name)?;
        fig.add("bam sort-name", ms(s.total));
        fig.add("bam sort-name core", ms(s.core));
        let s = bamfile::sort(&bam, &sorted_ours, Order::Coord)?;
        fig.add("bam sort-coord", ms(s.total));
        fig.add("bam sort-coord core", ms(s.core));
        let (ti, _) = timed(|| Ok(bamfile::index(&sorted_ours)?))?;
        fig.add("bam index", ms(ti));
        let (tf, f) = timed(|| Ok(bamfile::flagstat(&sorted_ours)?))?;
        check_flagstat("bam (sorted)", &f)?;
        fig.add("bam pipeline", ms(s.total + ti + tf));
        let (t, n) = timed(|| Ok(bamfile::query(&sorted_ours, &args.region, &mut |_| {})?))?;
        if n != st_count {
            return Err(CliError::new(format!(
                "bam: {n} records in {}, samtools counts {st_count}",
                args.region
            )));
        }
        fig.add("bam query", ms(t));

        // The same code on the data set, each tool attaching it.
        let tool = |write: bool,
                    fig: &mut Figures,
                    op: &dyn Fn(&dataset::Open<'_>) -> CliResult<Option<Duration>>|
         -> CliResult<Duration> {
            let t = Instant::now();
            let d = DataSet::attach(sj, "bench", write)?;
            let o = d.enter()?;
            fig.add("segment attach", ms(t.elapsed()));
            let core = op(&o)?;
            drop(o);
            drop(d);
            let total = t.elapsed();
            let _ = core;
            Ok(total)
        };
        let mut cores = Vec::new();
        let t = tool(false, &mut fig, &|o| {
            check_flagstat("segment", &o.flagstat()?)?;
            Ok(None)
        })?;
        fig.add("segment flagstat", ms(t));
        let core_cell = std::cell::Cell::new(Duration::ZERO);
        let t = tool(true, &mut fig, &|o| {
            core_cell.set(o.sort(Order::Name)?.core);
            Ok(None)
        })?;
        fig.add("segment sort-name", ms(t));
        fig.add("segment sort-name core", ms(core_cell.get()));
        let ts = tool(true, &mut fig, &|o| {
            core_cell.set(o.sort(Order::Coord)?.core);
            Ok(None)
        })?;
        fig.add("segment sort-coord", ms(ts));
        fig.add("segment sort-coord core", ms(core_cell.get()));
        cores.push(core_cell.get());
        let ti = tool(true, &mut fig, &|o| {
            o.index()?;
            Ok(None)
        })?;
        fig.add("segment index", ms(ti));
        let tf = tool(false, &mut fig, &|o| {
            check_flagstat("segment (sorted)", &o.flagstat()?)?;
            Ok(None)
        })?;
        fig.add("segment pipeline", ms(ts + ti + tf));
        let count = std::cell::Cell::new(0);
        let t = tool(false, &mut fig, &|o| {
            count.set(o.query(&args.region, false, &mut |_| {})?);
            Ok(None)
        })?;
        if count.get() != st_count {
            return Err(CliError::new(format!(
                "segment: {} records in {}, samtools counts {st_count}",
                count.get(),
                args.region
            )));
        }
        fig.add("segment query", ms(t));
    }
    for (name, v) in &fig.0 {
        let mut it = name.splitn(2, ' ');
        let system = it.next().unwrap_or_default();
        let op = it.next().unwrap_or_default();
        rows.push(json!({"experiment": "sam", "system": system, "op": op, "ms": median(v)}));
    }
    for (op, target) in [
        ("flagstat", 10.0),
        ("sort-name", 3.0),
        ("sort-coord", 3.0),
        ("index", 3.0),
        ("query", 3.0),
        ("pipeline", 3.0),
    ] {
        let (b, s, t) = (
            fig.get(&format!("bam {op}")),
            fig.get(&format!("segment {op}")),
            fig.get(&format!("samtools {op}")),
        );
        let mut row = json!({"experiment": "sam-ratio", "op": op,
            "bam_over_segment": b / s, "samtools_over_segment": t / s, "target": target});
        if op.starts_with("sort") {
            // The compute-bound core (ordering the keys) aside.
            let (bc, sc) = (
                fig.get(&format!("bam {op} core")),
                fig.get(&format!("segment {op} core")),
            );
            row["bam_over_segment_without_core"] = json!((b - bc) / (s - sc));
        }
        let key = if op == "pipeline" {
            "samtools_over_segment"
        } else if op.starts_with("sort") {
            "bam_over_segment_without_core"
        } else {
            "bam_over_segment"
        };
        row["met"] = json!(row[key].as_f64().unwrap_or(0.0) >= target);
        rows.push(row);
    }
    let attach = fig.get("segment attach");
    rows.push(
        json!({"experiment": "sam-attach", "ms": attach, "target_ms": 5.0, "met": attach <= 5.0}),
    );
    dataset::remove(sj, "bench")?;
    Ok(rows)
}
