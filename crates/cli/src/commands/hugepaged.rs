//! `cairn hugepaged`: the Ingens-style huge-page daemon (`cairn_hugepage::daemon`), and
//! `cairn hugepaged status`, which reads the status file the daemon writes every
//! interval.

use crate::error::{CliError, CliResult};
use crate::{HugepagedArgs, HugepagedCommand};
use cairn_hugepage::daemon::{Config, Daemon, Status, Targets};
use cairn_hugepage::sim::{self, Params, Policy, Report, Sim};
use cairn_hugepage::trace::{self, Recorder};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

pub fn run(a: &HugepagedArgs) -> CliResult {
    match &a.status {
        Some(HugepagedCommand::Status { json, status_file }) => status(status_file, *json),
        Some(HugepagedCommand::Simulate {
            scenario,
            objects,
            purged,
            trace,
            json,
        }) => match trace {
            Some(t) => replay(t, *json),
            None => simulate(scenario, *objects, *purged, *json),
        },
        Some(HugepagedCommand::Record {
            pids,
            out,
            interval,
            duration,
            no_access,
        }) => record(pids, out, *interval, *duration, !*no_access),
        None => serve(a),
    }
}

fn config(a: &HugepagedArgs) -> CliResult<Config> {
    if !(0.0..=1.0).contains(&a.threshold) {
        return Err(CliError::new("--threshold: a fraction from 0 to 1"));
    }
    if a.tau.is_nan() || a.tau <= 0.0 || a.tau > 1.0 {
        return Err(CliError::new("--tau: a number in (0, 1]"));
    }
    if a.rate.is_nan() || a.rate <= 0.0 {
        return Err(CliError::new("--rate: MiB per second, more than 0"));
    }
    if !(0.05..=3600.0).contains(&a.interval) {
        return Err(CliError::new("--interval: 0.05 to 3600 seconds"));
    }
    if a.cpu.is_nan() || a.cpu <= 0.0 || a.cpu > 1.0 {
        return Err(CliError::new("--cpu: a fraction of one core, in (0, 1]"));
    }
    let mut shares = std::collections::HashMap::new();
    for s in &a.shares {
        let (p, v) = s
            .split_once('=')
            .and_then(|(p, v)| Some((p.parse::<u32>().ok()?, v.parse::<f64>().ok()?)))
            .filter(|&(_, v)| v > 0.0)
            .ok_or_else(|| CliError::new(format!("--share {s}: PID=SHARE, a share above 0")))?;
        shares.insert(p, v);
    }
    Ok(Config {
        threshold: a.threshold,
        rate_mib: a.rate,
        cpu: a.cpu,
        tau: a.tau,
        shares,
        access: !a.no_access,
        dry_run: a.dry_run,
        compact: a.compact,
        ..Config::default()
    })
}

fn serve(a: &HugepagedArgs) -> CliResult {
    let targets = if a.all {
        Targets::All
    } else if let Some(c) = &a.cgroup {
        Targets::Cgroup(c.clone())
    } else if !a.pids.is_empty() {
        // A process named on the command line must exist at the start (later it may
        // exit: it is then dropped).
        if let Some(p) = a.pids.iter().find(|&&p| !cairn_media::sys::pid_alive(p)) {
            return Err(CliError::new(format!("--pid {p}: no such process")));
        }
        Targets::Pids(a.pids.clone())
    } else {
        return Err(CliError::new(
            "what to watch: --pid PID (repeatable), --cgroup PATH or --all",
        ));
    };
    let mut d = Daemon::new(config(a)?, targets);
    cairn_media::sys::install_termination_flag()?;
    let t = Instant::now();
    eprintln!(
        "cairn hugepaged: promoting regions at least {:.0}% populated, at most {} MiB/s{}; status in {}",
        a.threshold * 100.0,
        a.rate,
        if a.dry_run { " (dry run)" } else { "" },
        a.status_file.display()
    );
    loop {
        d.step().map_err(|e| CliError::new(e.to_string()))?;
        let st = d.status();
        write_status(&a.status_file, &st)?;
        if a.duration.is_some_and(|s| t.elapsed().as_secs_f64() >= s)
            || cairn_media::sys::termination_requested()
        {
            break;
        }
        pause(a.interval);
    }
    Ok(())
}

/// Write the status atomically (a temporary file renamed over the old one).
fn write_status(path: &Path, st: &Status) -> CliResult {
    let tmp = path.with_extension("tmp");
    let text = serde_json::to_string_pretty(st).map_err(|e| CliError::new(e.to_string()))?;
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(crate::error::ctx_msg(path.display()))
}

fn status(path: &Path, json: bool) -> CliResult {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::new(format!(
            "{}: {} (is cairn hugepaged running with this --status-file?)",
            path.display(),
            crate::error::clean(&e)
        ))
    })?;
    let st: Status = serde_json::from_str(&text)
        .map_err(|e| CliError::new(format!("{}: not a status file: {e}", path.display())))?;
    let mut o = std::io::stdout().lock();
    if json {
        writeln!(o, "{text}")?;
        return Ok(());
    }
    writeln!(
        o,
        "cairn hugepaged (pid {}): {} intervals in {:.0} s, CPU {:.2} s ({:.2}% of a core{}), {} MiB watched, fragmentation index {:.2}{}",
        st.pid,
        st.intervals,
        st.uptime_secs,
        st.cpu_secs,
        st.cpu_fraction * 100.0,
        if st.cpu_limited > 0 {
            format!("; over its CPU budget in {} passes", st.cpu_limited)
        } else {
            String::new()
        },
        st.watched_bytes >> 20,
        st.fmfi,
        if st.dry_run { ", dry run" } else { "" }
    )?;
    writeln!(
        o,
        "{:>8} {:>8} {:>9} {:>8} {:>10} {:>9} {:>6} {:>9}  regions by utilization (0-10% … 90-100%, huge)",
        "pid", "share", "huge MiB", "waiting", "promotions", "failures", "idle", "fairness"
    )?;
    for p in &st.processes {
        let r: Vec<String> = p.regions.iter().map(u64::to_string).collect();
        writeln!(
            o,
            "{:>8} {:>8.0} {:>9} {:>8} {:>10} {:>9} {:>6.2} {:>9}  {}",
            p.pid,
            p.share,
            p.huge_bytes >> 20,
            p.waiting,
            p.promotions,
            p.failures,
            p.idle,
            p.fairness.map_or("-".into(), |f| format!("{f:.2}")),
            r.join(" ")
        )?;
        if let Some(e) = &p.last_error {
            writeln!(o, "         last error: {e}")?;
        }
    }
    for d in &st.dropped {
        writeln!(o, "dropped: {d}")?;
    }
    Ok(())
}

/// Sleep `secs`, in short steps so that a signal ends the wait.
fn pause(secs: f64) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < until && !cairn_media::sys::termination_requested() {
        std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
    }
}

/// `cairn hugepaged record`: a snapshot of the processes every interval, one JSON line
/// each, until they have exited, `duration` passed or a signal came.
fn record(
    pids: &[u32],
    out: &Path,
    interval: f64,
    duration: Option<f64>,
    access: bool,
) -> CliResult {
    if !(0.05..=3600.0).contains(&interval) {
        return Err(CliError::new("--interval: 0.05 to 3600 seconds"));
    }
    let mut r = Recorder::new(pids, access).map_err(|e| CliError::new(e.to_string()))?;
    let file = std::fs::File::create(out).map_err(crate::error::ctx_msg(out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    cairn_media::sys::install_termination_flag()?;
    let t = Instant::now();
    let mut n = 0u64;
    eprintln!(
        "cairn hugepaged record: {} process(es) every {interval} s into {}",
        pids.len(),
        out.display()
    );
    loop {
        let iv = r.snapshot();
        for why in r.gone.drain(..) {
            eprintln!("cairn hugepaged record: {why}");
        }
        let line = serde_json::to_string(&iv).map_err(|e| CliError::new(e.to_string()))?;
        writeln!(w, "{line}").map_err(crate::error::ctx_msg(out.display()))?;
        n += 1;
        if r.is_empty()
            || duration.is_some_and(|s| t.elapsed().as_secs_f64() >= s)
            || cairn_media::sys::termination_requested()
        {
            break;
        }
        pause(interval);
    }
    w.flush().map_err(crate::error::ctx_msg(out.display()))?;
    eprintln!("cairn hugepaged record: {n} intervals written");
    Ok(())
}

/// `cairn hugepaged simulate --trace`: each policy on a recorded trace, with physical
/// memory twice the most the processes held (at least 64 MiB).
fn replay(path: &Path, json: bool) -> CliResult {
    let text = std::fs::read_to_string(path).map_err(crate::error::ctx_msg(path.display()))?;
    let tr = trace::parse(&text)
        .map_err(|e| CliError::new(format!("{}: not a trace: {e}", path.display())))?;
    if tr.is_empty() {
        return Err(CliError::new(format!("{}: an empty trace", path.display())));
    }
    let frames = (2 * trace::peak_pages(&tr)).max(1 << 14).div_ceil(512) * 512;
    let events = trace::events(&tr);
    let reports: Vec<Report> = [Policy::Linux, Policy::FreeBsd, Policy::Ingens]
        .iter()
        .map(|&p| Sim::new(p, Params::default(), frames).run(events.iter().copied()))
        .collect();
    print_reports(&reports, json)
}

/// `cairn hugepaged simulate`: each policy on the scenario's trace.
fn simulate(scenario: &str, objects: u64, purged: f64, json: bool) -> CliResult {
    if !(0.0..=1.0).contains(&purged) {
        return Err(CliError::new("--purged: a fraction from 0 to 1"));
    }
    if objects == 0 || objects > 1 << 24 {
        return Err(CliError::new("--objects: 1 to 16777216"));
    }
    let policies = [Policy::Linux, Policy::FreeBsd, Policy::Ingens];
    let reports: Vec<Report> = policies
        .iter()
        .map(|&p| match scenario {
            "fairness" => sim::fairness(p, 8, 7, 16, 5),
            _ => {
                // Memory for the objects and as much again; 100 intervals after the
                // deletions (khugepaged scans 8 regions per interval).
                let pages = 2 * objects;
                let frames = (2 * pages).max(1 << 14);
                let ticks = (pages / 512 / 8 + 20).min(10_000);
                Sim::new(p, Params::default(), frames)
                    .run(sim::redis_trace(objects, 256, purged, ticks, 7))
            }
        })
        .collect();
    print_reports(&reports, json)
}

fn print_reports(reports: &[Report], json: bool) -> CliResult {
    let mut o = std::io::stdout().lock();
    if json {
        writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&reports).map_err(|e| CliError::new(e.to_string()))?
        )?;
        return Ok(());
    }
    writeln!(
        o,
        "{:<8} {:>8} {:>10} {:>10} {:>10} {:>11} {:>6}  huge pages per process",
        "policy", "bloat", "huge flt", "promoted", "demoted", "compacted", "FMFI"
    )?;
    for r in reports {
        let last = r.samples.last().cloned().unwrap_or(sim::Sample {
            tick: 0,
            bloat: 0.0,
            huge: Vec::new(),
            objective: 0.0,
            fmfi: 0.0,
        });
        let huge: Vec<String> = last.huge.iter().map(|(p, h)| format!("{p}:{h}")).collect();
        writeln!(
            o,
            "{:<8} {:>7.1}% {:>10} {:>10} {:>10} {:>11} {:>6.2}  {}",
            format!("{:?}", r.policy),
            last.bloat * 100.0,
            r.huge_faults,
            r.promotions,
            r.demotions,
            r.compacted_pages,
            last.fmfi,
            huge.join(" ")
        )?;
    }
    Ok(())
}
