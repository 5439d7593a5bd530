//! `cairn bench tiers`: Cairn across NVM, SSD and HDD against the host file system that
//! holds the SSD and HDD tier files, in one run, on a three-tier store made for the run
//! (and removed after it):
//!
//! * multi-layer (Strata's experiment): 1 MiB appends round-robin over many files, so the
//!   working set grows from NVM into SSD and then HDD; throughput over time. The host
//!   runs the same appends with `fdatasync` after each.
//! * Zipfian (s = 1) 80:20 read:write mix of 4 KiB operations over a file twice the NVM
//!   tier; the host syncs each write.
//! * write amplification of both: bytes the application wrote against bytes written to
//!   each tier (Cairn's counters), and the sectors the block device under the host
//!   directory wrote meanwhile (everything on that device, both systems).

use super::hostfs;
use super::latency::host_system_name;
use super::BenchStore;
use super::Rng;
use crate::error::{ctx, ctx_msg, CliError, CliResult};
use crate::progress::note as progress;
use crate::util::{human_bytes, human_ns};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `cairn bench tiers` options.
#[derive(Debug, Args)]
pub struct TiersArgs {
    /// Print the results as JSON on stdout (progress still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Directory for the SSD and HDD tier files and the host runs
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// NVM tier of the benchmark store
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = crate::util::parse_size)]
    pub nvm_size: u64,
    /// SSD tier of the benchmark store
    #[arg(long, value_name = "SIZE", default_value = "512M", value_parser = crate::util::parse_size)]
    pub ssd_size: u64,
    /// HDD tier of the benchmark store
    #[arg(long, value_name = "SIZE", default_value = "4G", value_parser = crate::util::parse_size)]
    pub hdd_size: u64,
    /// Segment size of the lower tiers
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = crate::util::parse_size)]
    pub segment_size: u64,
    /// Files of the multi-layer experiment
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub files: u64,
    /// Bytes the multi-layer experiment appends [default: 1.5 × (NVM + SSD)]
    #[arg(long, value_name = "SIZE", value_parser = crate::util::parse_size)]
    pub total: Option<u64>,
    /// Operations of the Zipfian experiment
    #[arg(long, value_name = "N", default_value_t = 200_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub zipf_ops: u64,
    /// Emulate slower media on the Cairn store (`strata`; see `cairn mkfs --emulate`).
    /// The host runs are not slowed.
    #[arg(long, value_name = "PROFILE")]
    pub emulate: Option<String>,
}

/// One point of a throughput-over-time series.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the start of the run.
    pub t: f64,
    /// Bytes written so far.
    pub written: u64,
    /// Throughput since the previous sample (MB/s, 10^6 bytes).
    pub mbps: f64,
    /// Cairn only: bytes used in NVM, SSD and HDD.
    pub tier_used: Vec<u64>,
}

/// The multi-layer run of one system.
#[derive(Debug, Clone, Serialize)]
pub struct Multilayer {
    pub system: String,
    pub bytes: u64,
    pub seconds: f64,
    /// Mean throughput (MB/s).
    pub mbps: f64,
    pub samples: Vec<Sample>,
}

/// The Zipfian run of one system.
#[derive(Debug, Clone, Serialize)]
pub struct Zipf {
    pub system: String,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    /// Bytes read and written per second (MB/s).
    pub mbps: f64,
    pub read_p50_ns: u64,
    pub read_p99_ns: u64,
    pub write_p50_ns: u64,
    pub write_p99_ns: u64,
    /// Cairn only: hits and misses of the lower-tier cache.
    pub cache_hits: u64,
    pub cache_misses: u64,
}

/// Bytes written per tier during one experiment.
#[derive(Debug, Clone, Serialize)]
pub struct Amplification {
    pub experiment: String,
    pub system: String,
    /// Bytes the application wrote.
    pub app_bytes: u64,
    /// Cairn: bytes appended to the operation logs, written to the NVM shared area
    /// (digests and migration metadata), and written to the SSD and HDD tiers.
    pub nvm_log_bytes: u64,
    pub nvm_shared_bytes: u64,
    pub ssd_bytes: u64,
    pub hdd_bytes: u64,
    /// Sectors × 512 the block device under the host directory wrote during the run
    /// (`/sys/dev/block/M:m/stat`; everything on that device).
    pub device_bytes: Option<u64>,
    /// Cairn: per tier, bytes migrated down out of it, up into it and cleaned in it
    /// during the run (where the lower tiers' writes come from).
    pub traffic: Vec<TierTraffic>,
}

/// One tier's migration traffic during a run (`bytes_migrated_down`,
/// `bytes_migrated_up`, `bytes_cleaned`, as in `cairn status`).
#[derive(Debug, Clone, Serialize)]
pub struct TierTraffic {
    pub tier: String,
    #[serde(flatten)]
    pub bytes: cairn_proto::TierTraffic,
}

fn traffic(
    before: &cairn_proto::StatusReport,
    after: &cairn_proto::StatusReport,
) -> Vec<TierTraffic> {
    after
        .tiers
        .iter()
        .map(|a| {
            let b = before.tiers.iter().find(|t| t.name == a.name);
            let d = |f: fn(&cairn_proto::TierStatus) -> u64| f(a) - b.map_or(0, f);
            TierTraffic {
                tier: a.name.clone(),
                bytes: cairn_proto::TierTraffic {
                    bytes_migrated_down: d(|t| t.bytes_migrated_down),
                    bytes_migrated_up: d(|t| t.bytes_migrated_up),
                    bytes_cleaned: d(|t| t.bytes_cleaned),
                },
            }
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct Report {
    host_fs: String,
    dir: String,
    nvm_size: u64,
    ssd_size: u64,
    hdd_size: u64,
    segment_size: u64,
    files: u64,
    /// The emulation profile of the Cairn store, if any.
    emulate: Option<String>,
    multilayer: Vec<Multilayer>,
    zipf: Vec<Zipf>,
    write_amplification: Vec<Amplification>,
}

/// Sectors written by the block device holding `dir`, in bytes.
fn device_written(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

/// Cairn's per-tier write counters: (log, shared, ssd, hdd).
fn cairn_writes(r: &cairn_proto::StatusReport) -> [u64; 4] {
    let t = |name: &str| r.tiers.iter().find(|t| t.name == name);
    let (nvm, ssd, hdd) = (t("nvm"), t("ssd"), t("hdd"));
    let down = |x: Option<&cairn_proto::TierStatus>| x.map_or(0, |x| x.bytes_migrated_down);
    let cleaned = |x: Option<&cairn_proto::TierStatus>| x.map_or(0, |x| x.bytes_cleaned);
    let up = |x: Option<&cairn_proto::TierStatus>| x.map_or(0, |x| x.bytes_migrated_up);
    [
        r.digest.log_bytes_written,
        r.digest.shared_bytes_written,
        down(nvm) + cleaned(ssd) + up(ssd),
        down(ssd) + cleaned(hdd) + up(hdd),
    ]
}

fn amplification(
    experiment: &str,
    system: &str,
    app_bytes: u64,
    cairn: Option<(&cairn_proto::StatusReport, &cairn_proto::StatusReport)>,
    device: (Option<u64>, Option<u64>),
) -> Amplification {
    let counters = cairn.map(|(a, b)| (cairn_writes(a), cairn_writes(b)));
    let d = |i: usize| counters.map_or(0, |(a, b)| b[i].saturating_sub(a[i]));
    Amplification {
        experiment: experiment.into(),
        system: system.into(),
        app_bytes,
        nvm_log_bytes: d(0),
        nvm_shared_bytes: d(1),
        ssd_bytes: d(2),
        hdd_bytes: d(3),
        device_bytes: match device {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        },
        traffic: cairn.map_or(Vec::new(), |(a, b)| traffic(a, b)),
    }
}

/// Zipf(s = 1) over `0..n` by inverse CDF (rank 0 the most popular), ranks scattered
/// over the file by a fixed permutation so that hot blocks are not all adjacent.
struct ZipfGen {
    cdf: Vec<f64>,
    n: u64,
}

impl ZipfGen {
    fn new(n: u64) -> ZipfGen {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / k as f64;
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        ZipfGen { cdf, n }
    }
    fn sample(&self, r: &mut Rng) -> u64 {
        let u = r.unit();
        let rank = self.cdf.partition_point(|&c| c < u) as u64;
        // Multiplying by a prime that does not divide n permutes 0..n.
        ((rank.min(self.n - 1) as u128 * 2_654_435_761) % self.n as u128) as u64
    }
}

/// Files of the multi-layer run, on Cairn or on the host.
enum Appender {
    Cairn(Vec<cairn::File>),
    Host(Vec<std::fs::File>),
}

impl Appender {
    fn append(&self, i: usize, off: u64, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Appender::Cairn(f) => {
                let mut done = 0;
                while done < buf.len() {
                    done += f[i].write_at(&buf[done..], off + done as u64)?;
                }
                Ok(())
            }
            Appender::Host(f) => {
                f[i].write_all_at(buf, off)?;
                f[i].sync_data()
            }
        }
    }
}

fn multilayer(
    system: &str,
    files: &Appender,
    nfiles: u64,
    total: u64,
    fs: Option<&cairn::Fs>,
) -> CliResult<Multilayer> {
    const CHUNK: usize = 1 << 20;
    let buf: Vec<u8> = (0..CHUNK).map(|i| (i * 31 % 251) as u8).collect();
    let appends = total / CHUNK as u64;
    let start = Instant::now();
    let mut samples = Vec::new();
    let (mut last_t, mut last_b) = (0.0, 0u64);
    let mut next_sample = Duration::from_millis(250);
    let bar = crate::progress::bytes(&format!("  {system}: appending"), appends * CHUNK as u64);
    for k in 0..appends {
        let i = (k % nfiles) as usize;
        let off = (k / nfiles) * CHUNK as u64;
        files
            .append(i, off, &buf)
            .map_err(ctx_msg(format!("{system}: append {k}")))?;
        let el = start.elapsed();
        if el >= next_sample || k + 1 == appends {
            let t = el.as_secs_f64();
            let written = (k + 1) * CHUNK as u64;
            let tier_used = fs
                .and_then(|f| f.status().ok())
                .map(|r| r.tiers.iter().map(|t| t.used_bytes).collect())
                .unwrap_or_default();
            samples.push(Sample {
                t,
                written,
                mbps: (written - last_b) as f64 / (t - last_t).max(1e-9) / 1e6,
                tier_used,
            });
            (last_t, last_b) = (t, written);
            next_sample = el + Duration::from_millis(250);
            bar.set_position(written);
        }
    }
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    let bytes = appends * CHUNK as u64;
    Ok(Multilayer {
        system: system.into(),
        bytes,
        seconds,
        mbps: bytes as f64 / seconds / 1e6,
        samples,
    })
}

/// The Zipfian mix on one file: `read(off, buf)` / `write(off, buf)` (durable).
#[allow(clippy::type_complexity)]
fn zipf_run(
    system: &str,
    blocks: u64,
    ops: u64,
    read: &dyn Fn(u64, &mut [u8]) -> std::io::Result<()>,
    write: &dyn Fn(u64, &[u8]) -> std::io::Result<()>,
) -> CliResult<Zipf> {
    let z = ZipfGen::new(blocks);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut buf = vec![0u8; 4096];
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
    let (mut rh, mut wh) = (new_hist(), new_hist());
    let start = Instant::now();
    for k in 0..ops {
        let b = z.sample(&mut rng);
        let t = Instant::now();
        if rng.unit() < 0.8 {
            read(b * 4096, &mut buf).map_err(ctx_msg(format!("{system}: read op {k}")))?;
            let _ = rh.record(t.elapsed().as_nanos() as u64);
        } else {
            buf[..8].copy_from_slice(&k.to_le_bytes());
            write(b * 4096, &buf).map_err(ctx_msg(format!("{system}: write op {k}")))?;
            let _ = wh.record(t.elapsed().as_nanos() as u64);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(Zipf {
        system: system.into(),
        ops,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        mbps: ops as f64 * 4096.0 / seconds / 1e6,
        read_p50_ns: rh.value_at_quantile(0.5),
        read_p99_ns: rh.value_at_quantile(0.99),
        write_p50_ns: wh.value_at_quantile(0.5),
        write_p99_ns: wh.value_at_quantile(0.99),
        cache_hits: 0,
        cache_misses: 0,
    })
}

/// Fill `len` bytes with 1 MiB writes.
fn fill(len: u64, write: &dyn Fn(u64, &[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
    let buf: Vec<u8> = (0..1usize << 20).map(|i| (i % 253) as u8).collect();
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        write(off, &buf[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// `cairn bench tiers`. Long (about 180 lines) on purpose: it is the benchmark's script,
/// its phases in the order they run and print, which a reader checks against
/// docs/BENCHMARKS.md in one place.
pub fn run(args: &TiersArgs) -> CliResult {
    let dir = &args.dir;
    if !dir.is_dir() {
        return Err(CliError::new(format!(
            "--dir {}: not a directory",
            dir.display()
        )));
    }
    let host_fs = hostfs::fs_type(dir).map_err(ctx("file system type of", dir))?;
    let host = host_system_name(&host_fs);
    let pid = std::process::id();
    let root = dir.join(format!("cairn-bench-tiers-{pid}"));
    std::fs::create_dir_all(&root).map_err(ctx("create", &root))?;
    let bs = BenchStore {
        root: root.clone(),
        nvm: PathBuf::from(format!("/dev/shm/cairn-bench-tiers-{pid}.nvm")),
    };
    let store = root.join("store");
    let tier = |name: &str, size| cairn_daemon::TierOptions {
        path: root.join(name),
        size: Some(size),
    };
    cairn_daemon::mkfs(&cairn_daemon::MkfsOptions {
        store: store.clone(),
        nvm_path: Some(bs.nvm.clone()),
        nvm_size: args.nvm_size,
        log_size: 16 << 20,
        max_clients: 2,
        ssd: Some(tier("ssd.tier", args.ssd_size)),
        hdd: Some(tier("hdd.tier", args.hdd_size)),
        segment_size: Some(args.segment_size),
        ..Default::default()
    })
    .map_err(ctx_msg("creating the benchmark store"))?;
    if let Some(p) = &args.emulate {
        let sd = cairn_area::StoreDir::new(&store);
        let mut cfg = sd.load_config()?;
        cfg.set_emulation_profile(p, cairn_media::emulate::dram_copy_mbps())
            .map_err(ctx_msg("--emulate"))?;
        sd.save_config(&cfg)?;
    }
    let fs = cairn::Fs::open(&store).map_err(ctx_msg("opening the benchmark store"))?;
    let host_dir = root.join("host");
    std::fs::create_dir_all(&host_dir).map_err(ctx("create", &host_dir))?;
    let total = args
        .total
        .unwrap_or((args.nvm_size + args.ssd_size) / 2 * 3);
    let mut amp = Vec::new();

    // Multi-layer.
    progress(format_args!(
        "bench tiers: multi-layer: {} in 1 MiB appends over {} files (NVM {}, SSD {}, HDD {})\n",
        human_bytes(total),
        args.files,
        human_bytes(args.nvm_size),
        human_bytes(args.ssd_size),
        human_bytes(args.hdd_size)
    ));
    fs.create_dir("/ml").map_err(ctx_msg("mkdir /ml"))?;
    let mut cf = Vec::new();
    for i in 0..args.files {
        cf.push(
            cairn::File::create(&fs, format!("/ml/f{i}").as_str())
                .map_err(ctx_msg("creating the files"))?,
        );
    }
    let before = (fs.status()?, device_written(dir));
    let ml_cairn = multilayer("cairn", &Appender::Cairn(cf), args.files, total, Some(&fs))?;
    let after = (fs.status()?, device_written(dir));
    amp.push(amplification(
        "multilayer",
        "cairn",
        ml_cairn.bytes,
        Some((&before.0, &after.0)),
        (before.1, after.1),
    ));
    let mut hf = Vec::new();
    for i in 0..args.files {
        let p = host_dir.join(format!("f{i}"));
        hf.push(std::fs::File::create(&p).map_err(ctx("create", &p))?);
    }
    let d0 = device_written(dir);
    let ml_host = multilayer(&host, &Appender::Host(hf), args.files, total, None)?;
    amp.push(amplification(
        "multilayer",
        &host,
        ml_host.bytes,
        None,
        (d0, device_written(dir)),
    ));
    fs.remove_dir_all("/ml").map_err(ctx_msg("removing /ml"))?;
    let _ = std::fs::remove_dir_all(&host_dir);
    std::fs::create_dir_all(&host_dir).map_err(ctx("create", &host_dir))?;

    // Zipfian.
    let zlen = 2 * args.nvm_size;
    let blocks = zlen / 4096;
    progress(format_args!(
        "bench tiers: Zipfian 80:20 read:write of 4 KiB over a {} file, {} operations\n",
        human_bytes(zlen),
        args.zipf_ops
    ));
    let zf = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&fs, "/zipf")
        .map_err(ctx_msg("creating /zipf"))?;
    let cw = |off: u64, b: &[u8]| {
        let mut done = 0;
        while done < b.len() {
            done += zf.write_at(&b[done..], off + done as u64)?;
        }
        Ok(())
    };
    let cr = |off: u64, b: &mut [u8]| zf.read_at(b, off).map(|_| ());
    fill(zlen, &cw).map_err(ctx_msg("filling /zipf"))?;
    let before = (fs.status()?, device_written(dir));
    let c0 = fs.read_cache_stats().unwrap_or_default();
    let mut z_cairn = zipf_run("cairn", blocks, args.zipf_ops, &cr, &cw)?;
    let c1 = fs.read_cache_stats().unwrap_or_default();
    (z_cairn.cache_hits, z_cairn.cache_misses) = (c1.0 - c0.0, c1.1 - c0.1);
    let after = (fs.status()?, device_written(dir));
    let zipf_writes = |z: &Zipf| (z.ops as f64 * 0.2 * 4096.0) as u64;
    amp.push(amplification(
        "zipf",
        "cairn",
        zipf_writes(&z_cairn),
        Some((&before.0, &after.0)),
        (before.1, after.1),
    ));
    let hp = host_dir.join("zipf");
    let hfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&hp)
        .map_err(ctx("create", &hp))?;
    let hw = |off: u64, b: &[u8]| {
        hfile.write_all_at(b, off)?;
        hfile.sync_data()
    };
    let hr = |off: u64, b: &mut [u8]| hfile.read_exact_at(b, off);
    fill(zlen, &|o, b| hfile.write_all_at(b, o)).map_err(ctx("fill", &hp))?;
    hfile.sync_all().map_err(ctx("fsync", &hp))?;
    let d0 = device_written(dir);
    let z_host = zipf_run(&host, blocks, args.zipf_ops, &hr, &hw)?;
    amp.push(amplification(
        "zipf",
        &host,
        zipf_writes(&z_host),
        None,
        (d0, device_written(dir)),
    ));
    drop(fs);
    let report = Report {
        host_fs,
        dir: dir.display().to_string(),
        nvm_size: args.nvm_size,
        ssd_size: args.ssd_size,
        hdd_size: args.hdd_size,
        segment_size: args.segment_size,
        files: args.files,
        emulate: args.emulate.clone(),
        multilayer: vec![ml_cairn, ml_host],
        zipf: vec![z_cairn, z_host],
        write_amplification: amp,
    };
    drop(bs);
    let text = if args.json {
        crate::util::json_text(&report, "the tiers report")?
    } else {
        human(&report)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

/// The report as text: one table after the other, as docs/BENCHMARKS.md shows them.
fn human(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Cairn tiers benchmark: NVM {} (/dev/shm), SSD {} and HDD {} ({} segments) as files in {} ({})",
        human_bytes(r.nvm_size),
        human_bytes(r.ssd_size),
        human_bytes(r.hdd_size),
        human_bytes(r.segment_size),
        r.dir,
        r.host_fs
    );
    if let Some(p) = &r.emulate {
        let _ = writeln!(s, "Cairn's media emulated with the {p:?} profile");
    }
    let _ = writeln!(
        s,
        "\nmulti-layer: 1 MiB appends over {} files (host: write + fdatasync each)",
        r.files
    );
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>9} {:>10} {:>10} {:>10}",
        "system", "bytes", "seconds", "MB/s", "min MB/s", "p50 MB/s"
    );
    for m in &r.multilayer {
        let mut v: Vec<f64> = m.samples.iter().map(|x| x.mbps).collect();
        v.sort_by(f64::total_cmp);
        let _ = writeln!(
            s,
            "{:<10} {:>10} {:>9.2} {:>10.0} {:>10.0} {:>10.0}",
            m.system,
            human_bytes(m.bytes),
            m.seconds,
            m.mbps,
            v.first().copied().unwrap_or(0.0),
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        s,
        "\nZipfian (s = 1) 80:20 read:write, 4 KiB (host: fdatasync per write)"
    );
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9}",
        "system",
        "ops",
        "ops/s",
        "MB/s",
        "read p50",
        "read p99",
        "write p50",
        "write p99",
        "cache hit"
    );
    for z in &r.zipf {
        let hit = if z.cache_hits + z.cache_misses == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.1}%",
                z.cache_hits as f64 * 100.0 / (z.cache_hits + z.cache_misses) as f64
            )
        };
        let _ = writeln!(
            s,
            "{:<10} {:>10} {:>10.0} {:>8.1} {:>10} {:>10} {:>10} {:>10} {:>9}",
            z.system,
            z.ops,
            z.ops_per_sec,
            z.mbps,
            human_ns(z.read_p50_ns as f64),
            human_ns(z.read_p99_ns as f64),
            human_ns(z.write_p50_ns as f64),
            human_ns(z.write_p99_ns as f64),
            hit
        );
    }
    let _ = writeln!(
        s,
        "\nwrite amplification (bytes written / bytes the application wrote)"
    );
    let _ = writeln!(
        s,
        "{:<11} {:<10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "experiment", "system", "app", "NVM log", "NVM area", "SSD", "HDD", "device"
    );
    for a in &r.write_amplification {
        let f = |b: u64| format!("{:.2}", b as f64 / a.app_bytes.max(1) as f64);
        let _ = writeln!(
            s,
            "{:<11} {:<10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
            a.experiment,
            a.system,
            human_bytes(a.app_bytes),
            f(a.nvm_log_bytes),
            f(a.nvm_shared_bytes),
            f(a.ssd_bytes),
            f(a.hdd_bytes),
            a.device_bytes.map_or("-".into(), f)
        );
    }
    s
}
