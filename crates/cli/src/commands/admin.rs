//! Store administration: `mkfs`, `daemon`, `status`, `stop`.

use crate::error::{clean, CliError, CliResult};
use crate::util::human_bytes;
use crate::{DaemonArgs, MkfsArgs};
use cairn_area::StoreDir;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Whether a daemon answers on the store's socket.
pub(crate) fn daemon_running(dir: &StoreDir) -> bool {
    UnixStream::connect(dir.socket_path()).is_ok()
}

/// Stop the daemon of `dir` cleanly if one runs; whether one ran.
pub(crate) fn shutdown_daemon(store: Option<&Path>, dir: &StoreDir) -> CliResult<bool> {
    if !daemon_running(dir) {
        return Ok(false);
    }
    cairn::daemon_shutdown(store).map_err(|e| {
        CliError::new(format!(
            "stopping the daemon of {}: {}",
            dir.path.display(),
            clean(&e)
        ))
    })?;
    Ok(true)
}

/// `cairn mkfs`. Long (about 120 lines): each option checked and turned into the daemon's
/// `MkfsOptions` in the order `--help` lists them, then the summary printed.
pub fn mkfs(store: Option<&Path>, args: &MkfsArgs) -> CliResult {
    let dir = StoreDir::resolve(store);
    if args.force && dir.exists() && daemon_running(&dir) {
        return Err(CliError::new(format!(
            "the daemon of {} is running; stop it first with `cairn stop --store {}`",
            dir.path.display(),
            dir.path.display()
        )));
    }
    let mut opts = cairn_daemon::MkfsOptions {
        store: dir.path.clone(),
        force: args.force,
        ..Default::default()
    };
    if let Some(p) = &args.nvm_path {
        opts.nvm_path = Some(p.clone());
    }
    if let Some(n) = args.nvm_size {
        opts.nvm_size = n;
    }
    if let Some(n) = args.log_size {
        opts.log_size = n;
    }
    if let Some(v) = args.format_version {
        opts.format_version = v;
    }
    if let Some(n) = args.max_clients {
        opts.max_clients = n;
    }
    if let Some(n) = args.inodes {
        opts.inodes = n;
    }
    if let Some(n) = args.digest_threshold {
        opts.digest_threshold_pct = n;
    }
    let tier = |path: &Option<std::path::PathBuf>, size| {
        path.as_ref().map(|p| cairn_daemon::TierOptions {
            path: p.clone(),
            size,
        })
    };
    opts.ssd = tier(&args.ssd, args.ssd_size);
    opts.hdd = tier(&args.hdd, args.hdd_size);
    opts.segment_size = args.segment_size;
    opts.remote = args.remote.as_ref().map(|url| cairn_daemon::RemoteOptions {
        url: url.clone(),
        conf: args.ceph_conf.clone(),
        user: args.ceph_user.clone(),
        size: args.remote_size,
    });
    if let Some(g) = &args.trusted_group {
        opts.trusted_gid = Some(
            cairn_daemon::resolve_group(g)
                .map_err(|e| CliError::new(format!("--trusted-group {g}: {}", clean(&e))))?,
        );
    }
    let cfg = cairn_daemon::mkfs(&opts).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists && !args.force {
            CliError::new(clean(&e))
        } else {
            CliError::new(format!("mkfs {}: {}", dir.path.display(), clean(&e)))
        }
    })?;
    let cfg = match &args.emulate {
        Some(p) => {
            let mut cfg = cfg;
            cfg.set_emulation_profile(p, cairn_media::emulate::dram_copy_mbps())
                .map_err(|e| CliError::new(format!("--emulate: {}", clean(&e))))?;
            dir.save_config(&cfg)?;
            cfg
        }
        None => cfg,
    };
    let mut out = std::io::stdout().lock();
    let text = format!(
        "created Cairn store {store}\n  \
         config        {config}\n  \
         NVM tier      {nvm} ({nvm_size})\n  \
         client logs   {slots} slots of {log}{scaled}\n  \
         inodes        {inodes}\n  \
         digest at     {pct}% log fill\n  \
         trusted       {trust}\n{lower}{emulation}",
        store = dir.path.display(),
        config = dir.config_path().display(),
        nvm = cfg.nvm_path.display(),
        nvm_size = human_bytes(cfg.nvm_size),
        slots = cfg.max_clients,
        log = human_bytes(cfg.log_size),
        scaled = if args.log_size.is_none() || args.max_clients.is_none() {
            " (scaled to the tier; --max-clients and --log-size choose them)"
        } else {
            ""
        },
        inodes = if cfg.inodes == 0 {
            "one per 8 KiB".to_string()
        } else {
            cfg.inodes.to_string()
        },
        pct = cfg.digest_threshold_pct,
        emulation = match (cfg.nvm_read_latency_ns, cfg.nvm_bandwidth_mbps) {
            (Some(l), Some(b)) => format!(
                "  emulation     NVM {l} ns + {b} MB/s, SSD {} µs + {} MB/s, HDD {} ms + {} MB/s \
                 (cairn.toml)\n",
                cfg.ssd_read_latency_ns.unwrap_or(0) / 1000,
                cfg.ssd_bandwidth_mbps.unwrap_or(0),
                cfg.hdd_read_latency_ns.unwrap_or(0) / 1_000_000,
                cfg.hdd_bandwidth_mbps.unwrap_or(0)
            ),
            _ => String::new(),
        },
        lower = [
            ("SSD", &cfg.ssd_path, &opts.ssd),
            ("HDD", &cfg.hdd_path, &opts.hdd)
        ]
        .into_iter()
        .filter_map(|(n, p, o)| {
            let p = p.as_ref()?;
            let size = o.as_ref().and_then(|o| o.size).map(human_bytes);
            Some(format!(
                "  {n} tier      {}{}\n",
                p.display(),
                size.map(|s| format!(" ({s})")).unwrap_or_default()
            ))
        })
        .chain(opts.remote.as_ref().map(|r| {
            format!(
                "  remote tier   {} ({}; objects cairn.<store id>.3.*)\n",
                r.url,
                human_bytes(r.size.unwrap_or(cairn_daemon::DEFAULT_REMOTE_SIZE))
            )
        }))
        .collect::<String>(),
        trust = match (cfg.owner_uid, cfg.trusted_gid) {
            (Some(u), Some(g)) => format!("root, uid {u} (owner), group {g}"),
            (Some(u), None) => format!("root, uid {u} (owner)"),
            (None, Some(g)) => format!("root, the owner, group {g}"),
            (None, None) => "root, the owner".to_string(),
        },
    );
    out.write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

/// The number of a tier by name.
fn tier_num(name: &str) -> Result<u8, CliError> {
    match name {
        "nvm" => Ok(0),
        "ssd" => Ok(1),
        "hdd" => Ok(2),
        "remote" => Ok(3),
        _ => Err(CliError::new(format!(
            "unknown tier {name:?}: use nvm, ssd, hdd or remote"
        ))),
    }
}

/// `cairn migrate --tier FROM [--to TO] [--free BYTES]`: drain a tier into the one below
/// it now, one segment per request, with a progress bar on stderr.
pub fn migrate(store: Option<&Path>, from: &str, to: Option<&str>, free: Option<u64>) -> CliResult {
    let f = tier_num(from)?;
    let status = cairn::daemon_status(store)?;
    // The status lists the tiers the store has, from the top.
    let Some(i) = status.tiers.iter().position(|x| x.name == from) else {
        return Err(CliError::new(format!(
            "the store {} has no {from} tier (see cairn mkfs --ssd/--hdd/--remote)",
            status.store
        )));
    };
    let src = &status.tiers[i];
    let Some(dst) = status.tiers.get(i + 1) else {
        return Err(CliError::new(format!(
            "the store {} has no tier below {from}",
            status.store
        )));
    };
    if let Some(to) = to {
        tier_num(to)?;
        if to != dst.name {
            return Err(CliError::new(format!(
                "data moves one tier down: --tier {from} --to {}",
                dst.name
            )));
        }
    }
    let (to, t) = (dst.name.as_str(), tier_num(&dst.name)?);
    let want = match free {
        Some(b) => b,
        None => {
            let cfg = StoreDir::resolve(store).load_config()?;
            let goal = src.capacity_bytes / 100 * cfg.migrate_low_pct as u64;
            src.used_bytes.saturating_sub(goal)
        }
    };
    // Four segments a request: the daemon keeps two rounds in flight within one.
    let step = dst.segment_bytes.max(1 << 20) * 4;
    let mut done = 0u64;
    let bar = crate::progress::bytes(&format!("migrating {from} -> {to}"), want);
    let mut used = src.used_bytes;
    while done < want {
        let (n, u) = cairn::daemon_migrate(store, f, t, step.min(want - done))?;
        used = u;
        if n == 0 {
            break;
        }
        done += n;
        bar.set_position(done.min(want));
    }
    bar.finish_and_clear();
    let msg = format!(
        "moved {} from {from} to {to}; {from} now uses {} of {}{}\n",
        human_bytes(done),
        human_bytes(used),
        human_bytes(src.capacity_bytes),
        if done < want {
            " (nothing more could move: the rest is metadata, or the tiers below are full)"
        } else {
            ""
        }
    );
    std::io::stdout()
        .lock()
        .write_all(msg.as_bytes())
        .map_err(crate::error::stdout_err)
}

/// `cairn clean --tier ssd|hdd`: cleaning rounds until one gains nothing.
pub fn clean_tier(store: Option<&Path>, tier: &str) -> CliResult {
    let t = tier_num(tier)?;
    if t == 0 {
        return Err(CliError::new(
            "the NVM tier is not cleaned: its space is given out in blocks, not segments",
        ));
    }
    let free_segments = |store| -> Result<u64, CliError> {
        let status = cairn::daemon_status(store)?;
        match status.tiers.iter().find(|x| x.name == tier) {
            Some(s) => Ok(s.segments_free),
            None => Err(CliError::new(format!(
                "the store {} has no {tier} tier (see cairn mkfs --ssd/--hdd)",
                status.store
            ))),
        }
    };
    let before = free_segments(store)?;
    let (mut moved, mut rounds) = (0u64, 0u64);
    let spin = crate::progress::spinner(&format!("cleaning {tier}"));
    loop {
        let (n, _) = cairn::daemon_clean(store, t)?;
        if n == 0 {
            break;
        }
        moved += n;
        rounds += 1;
        spin.set_message(format!("{rounds} rounds, {} moved", human_bytes(moved)));
    }
    spin.finish_and_clear();
    // Freed segments return after the epoch: the count may lag a moment.
    let after = free_segments(store)?;
    let msg = format!(
        "cleaned {tier}: {} moved in {rounds} round{}; {after} segments free (were {before})\n",
        human_bytes(moved),
        if rounds == 1 { "" } else { "s" }
    );
    std::io::stdout()
        .lock()
        .write_all(msg.as_bytes())
        .map_err(crate::error::stdout_err)
}

pub fn daemon(store: Option<&Path>, args: &DaemonArgs) -> CliResult {
    let dir = StoreDir::resolve(store);
    let opts = cairn_daemon::DaemonOptions {
        store: dir.path.clone(),
        background: args.background,
        create: args.create,
    };
    cairn_daemon::run_daemon(&opts)
        .map_err(|e| CliError::new(format!("daemon {}: {}", dir.path.display(), clean(&e))))
}

pub fn status(store: Option<&Path>, json: bool) -> CliResult {
    let report = cairn::daemon_status(store)?;
    let mut out = std::io::stdout().lock();
    let text = if json {
        crate::util::json_text(&report, "the status report")?
    } else {
        format_status(&report)
    };
    out.write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

fn pct(used: u64, cap: u64) -> String {
    if cap == 0 {
        "-".into()
    } else {
        format!("{:.1}%", used as f64 * 100.0 / cap as f64)
    }
}

/// Where the NVM file lives, and the memory it and the host objects hold.
fn format_host(s: &mut String, h: &cairn_proto::HostStatus) {
    use std::fmt::Write as _;
    let held = if h.nvm_in_ram {
        format!(
            "on tmpfs: {} of RAM held, lost at reboot or power loss",
            human_bytes(h.nvm_allocated_bytes)
        )
    } else {
        format!("{} allocated", human_bytes(h.nvm_allocated_bytes))
    };
    let _ = writeln!(
        s,
        "nvm     {}: {}, {held}",
        h.nvm_path,
        human_bytes(h.nvm_size_bytes)
    );
    if h.log_files > 0 {
        let _ = writeln!(
            s,
            "logs    {} client log file(s) beside it: {}{}",
            h.log_files,
            human_bytes(h.log_allocated_bytes),
            if h.nvm_in_ram {
                " of RAM"
            } else {
                " allocated"
            }
        );
    }
    if h.host_objects > 0 {
        let _ = writeln!(
            s,
            "shm     {} host object(s) in /dev/shm (shared mappings, FIFOs, sockets, segments), {} of RAM",
            h.host_objects,
            human_bytes(h.host_object_bytes)
        );
    }
    if h.resident_segments > 0 {
        let _ = writeln!(
            s,
            "        of which {} resident segment(s) pinned in memory: {} (cairn sj seg evict frees one)",
            h.resident_segments,
            human_bytes(h.resident_segment_bytes)
        );
    }
}

/// The human form of `cairn status`: its sections in the order they print (long, about
/// 120 lines, as the output is).
/// The NVM tier's superpage lines of `cairn status`.
fn format_superpages(s: &mut String, sp: &cairn_proto::SuperpageStatus) {
    use std::fmt::Write as _;
    let _ = writeln!(s);
    if let Some(why) = &sp.off_reason {
        let _ = writeln!(s, "superpages: off: {why}");
        return;
    }
    let _ = writeln!(
        s,
        "superpages: {} in 2 MiB extents; {} of {} extents free; fragmentation index {:.2}",
        human_bytes(sp.extent_bytes),
        sp.extents_free,
        sp.extents_total,
        sp.fragmentation_index
    );
    let _ = writeln!(
        s,
        "  {} promoted ({}), {} demoted, {} compacted; internal fragmentation {} ({:.2}%)",
        sp.promotions,
        human_bytes(sp.bytes_promoted),
        sp.demotions,
        human_bytes(sp.bytes_compacted),
        human_bytes(sp.internal_fragmentation_bytes),
        sp.internal_fragmentation * 100.0
    );
    match &sp.huge_pages_refusal {
        Some(why) => {
            let _ = writeln!(s, "  huge pages: none, 4 KiB pages only: {why}");
        }
        None if sp.collapse_failures > 0 => {
            let _ = writeln!(
                s,
                "  huge pages: the kernel refused {} collapses (those extents use 4 KiB pages)",
                sp.collapse_failures
            );
        }
        None => {}
    }
}

/// The remote tier's lines of `cairn status`.
fn format_remote(s: &mut String, r: &cairn_proto::RemoteStatus) {
    use std::fmt::Write as _;
    let _ = writeln!(s);
    let state = match (r.connected, r.paused) {
        (_, true) => "migration to it paused after a failure (it resumes by itself)",
        (true, false) => "connected",
        (false, false) => "not connected",
    };
    let _ = writeln!(s, "remote  {}: {state}", r.url);
    let _ = writeln!(
        s,
        "  objects in use {}; since start: {} written ({}), {} removed, {} orphans removed",
        r.objects,
        r.objects_written,
        human_bytes(r.bytes_written),
        r.objects_removed,
        r.orphans_removed
    );
    let _ = writeln!(
        s,
        "  reads {} ({}); daemon cache {} hits, {} misses",
        r.reads,
        human_bytes(r.bytes_read),
        r.cache_hits,
        r.cache_misses
    );
    if let Some(e) = &r.last_error {
        let ago = (cairn_area::time::now_ns() - r.last_error_ns).max(0) / 1_000_000_000;
        let _ = writeln!(s, "  last error ({ago} s ago): {e}");
    }
}

pub fn format_status(r: &cairn_proto::StatusReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "store   {}", r.store);
    if let Some(h) = &r.host {
        format_host(&mut s, h);
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<8} {:>12} {:>12} {:>12} {:>7}",
        "tier", "capacity", "used", "free", "use%"
    );
    for t in &r.tiers {
        let _ = writeln!(
            s,
            "{:<8} {:>12} {:>12} {:>12} {:>7}",
            t.name,
            human_bytes(t.capacity_bytes),
            human_bytes(t.used_bytes),
            human_bytes(t.capacity_bytes.saturating_sub(t.used_bytes)),
            pct(t.used_bytes, t.capacity_bytes)
        );
    }
    let _ = writeln!(
        s,
        "{:<8} {:>12} {:>12} {:>12} {:>7}",
        "inodes",
        r.inodes.capacity,
        r.inodes.used,
        r.inodes.capacity.saturating_sub(r.inodes.used),
        pct(r.inodes.used, r.inodes.capacity)
    );
    if r.tiers.len() > 1 {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<8} {:>6} {:>14} {:>12} {:>12} {:>12} {:>12}",
            "tier", "live", "segments", "segment", "moved down", "moved up", "cleaned"
        );
        for t in &r.tiers {
            let segs = if t.segment_bytes == 0 {
                "-".to_string()
            } else {
                format!("{} free/{} used", t.segments_free, t.segments_used)
            };
            let _ = writeln!(
                s,
                "{:<8} {:>5.1}% {:>14} {:>12} {:>12} {:>12} {:>12}",
                t.name,
                t.live_fraction * 100.0,
                segs,
                if t.segment_bytes == 0 {
                    "-".to_string()
                } else {
                    human_bytes(t.segment_bytes)
                },
                human_bytes(t.bytes_migrated_down),
                human_bytes(t.bytes_migrated_up),
                human_bytes(t.bytes_cleaned)
            );
        }
    }
    if let Some(m) = &r.migration {
        let _ = writeln!(
            s,
            "in flight: {} {} -> {}: {} of {}",
            m.kind,
            m.from,
            m.to,
            human_bytes(m.bytes_done),
            human_bytes(m.bytes_planned)
        );
    }
    if let Some(rm) = &r.remote {
        format_remote(&mut s, rm);
    }
    if let Some(b) = &r.backup {
        let ago = (cairn_area::time::now_ns() - b.taken_ns).max(0) / 1_000_000_000;
        let _ = writeln!(
            s,
            "backup  {} into {}: {ago} s old; {} objects ({}); the snapshot held the store {} ms",
            b.seq,
            b.url,
            b.objects,
            human_bytes(b.bytes),
            b.snapshot_ms
        );
    }
    if let Some(sp) = &r.superpages {
        format_superpages(&mut s, sp);
    }
    let _ = writeln!(s);
    if r.clients.is_empty() {
        let _ = writeln!(s, "clients: none");
    } else {
        let _ = writeln!(s, "clients: {}", r.clients.len());
        let _ = writeln!(
            s,
            "  {:>4} {:>8} {:>6} {:>12} {:>12} {:>7}",
            "slot", "pid", "uid", "log used", "log size", "fill"
        );
        for c in &r.clients {
            let _ = writeln!(
                s,
                "  {:>4} {:>8} {:>6} {:>12} {:>12} {:>6.1}%",
                c.slot,
                c.pid,
                c.uid,
                human_bytes(c.log_used_bytes),
                human_bytes(c.log_capacity_bytes),
                c.log_fill * 100.0
            );
        }
    }
    let d = &r.digest;
    let _ = writeln!(s);
    let _ = writeln!(s, "digest");
    let _ = writeln!(s, "  digests               {}", d.digests);
    let _ = writeln!(s, "  records digested      {}", d.records_digested);
    let _ = writeln!(s, "  records skipped       {}", d.records_skipped);
    let _ = writeln!(
        s,
        "  log bytes written     {} ({})",
        d.log_bytes_written,
        human_bytes(d.log_bytes_written)
    );
    let _ = writeln!(
        s,
        "  shared bytes written  {} ({})",
        d.shared_bytes_written,
        human_bytes(d.shared_bytes_written)
    );
    let sh = &r.sharing;
    let _ = writeln!(s);
    let _ = writeln!(s, "sharing (since the daemon started)");
    let _ = writeln!(s, "  shared-write inodes   {}", sh.mediated_inodes);
    let _ = writeln!(s, "  mode entries          {}", sh.mode_entries);
    let _ = writeln!(s, "  commits               {}", sh.commits);
    let _ = writeln!(s, "  stale commits         {}", sh.stale_commits);
    let _ = writeln!(s, "  lease revocations     {}", sh.revocations);
    s
}

pub fn stop(store: Option<&Path>) -> CliResult {
    let dir = StoreDir::resolve(store);
    // Shared mappings that no process maps any more (a mapper killed before it wrote
    // back) keep their bytes in map objects: write them back into the store first.
    // The host rendezvous of FIFOs and sockets removed while a client was killed are
    // removed too.
    let mut folded = 0;
    let objects = !cairn::map_object_files(&dir.path)
        .unwrap_or_default()
        .is_empty();
    let rendezvous = !cairn::rendezvous_files(&dir.path)
        .unwrap_or_default()
        .is_empty();
    if objects || rendezvous {
        let fs = cairn::Fs::open(&dir.path)
            .map_err(|e| CliError::new(format!("opening {}: {}", dir.path.display(), clean(&e))))?;
        folded = fs.fold_map_objects().map_err(|e| {
            CliError::new(format!(
                "writing back the map objects of {}: {}",
                dir.path.display(),
                clean(&e)
            ))
        })?;
        fs.remove_stale_rendezvous().map_err(|e| {
            CliError::new(format!(
                "removing stale FIFO and socket rendezvous of {}: {}",
                dir.path.display(),
                clean(&e)
            ))
        })?;
    }
    let running = shutdown_daemon(store, &dir)?;
    let msg = if folded > 0 {
        format!(
            "wrote back {folded} shared mapping(s); stopped the daemon of {}\n",
            dir.path.display()
        )
    } else if running {
        format!("stopped the daemon of {}\n", dir.path.display())
    } else {
        format!("no daemon running for {}\n", dir.path.display())
    };
    std::io::stdout()
        .lock()
        .write_all(msg.as_bytes())
        .map_err(crate::error::stdout_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::*;

    #[test]
    fn status_table() {
        let r = StatusReport {
            store: "/s".into(),
            tiers: vec![
                TierStatus {
                    name: "nvm".into(),
                    capacity_bytes: 128 << 20,
                    used_bytes: 32 << 20,
                    live_bytes: 32 << 20,
                    live_fraction: 1.0,
                    segments_free: 0,
                    segments_used: 0,
                    segment_bytes: 0,
                    bytes_migrated_down: 5 << 20,
                    bytes_migrated_up: 0,
                    bytes_cleaned: 0,
                },
                TierStatus {
                    name: "ssd".into(),
                    capacity_bytes: 1 << 30,
                    used_bytes: 64 << 20,
                    live_bytes: 48 << 20,
                    live_fraction: 0.75,
                    segments_free: 14,
                    segments_used: 2,
                    segment_bytes: 64 << 20,
                    bytes_migrated_down: 0,
                    bytes_migrated_up: 0,
                    bytes_cleaned: 3 << 20,
                },
            ],
            inodes: InodeStatus {
                capacity: 100,
                used: 3,
            },
            clients: vec![ClientStatus {
                slot: 0,
                pid: 42,
                uid: 0,
                log_capacity_bytes: 1 << 20,
                log_used_bytes: 1 << 18,
                log_fill: 0.25,
            }],
            digest: DigestCounters::default(),
            sharing: SharingStatus::default(),
            migration: Some(MigrationStatus {
                kind: "migrate".into(),
                from: "nvm".into(),
                to: "ssd".into(),
                bytes_done: 0,
                bytes_planned: 4 << 20,
            }),
            superpages: Some(Box::new(SuperpageStatus {
                enabled: true,
                huge_pages: true,
                extent_bytes: 6 << 20,
                extents_free: 9,
                extents_total: 12,
                promotions: 2,
                bytes_promoted: 4 << 20,
                fragmentation_index: 0.25,
                ..Default::default()
            })),
            host: Some(Box::new(HostStatus {
                nvm_path: "/dev/shm/cairn-1.nvm".into(),
                nvm_size_bytes: 128 << 20,
                nvm_allocated_bytes: 128 << 20,
                nvm_in_ram: true,
                host_objects: 2,
                host_object_bytes: 8192,
                resident_segments: 1,
                resident_segment_bytes: 4096,
                log_files: 8,
                log_allocated_bytes: 32 << 20,
            })),
            remote: Some(Box::new(RemoteStatus {
                url: "ceph:cairn".into(),
                objects: 8,
                objects_written: 12,
                bytes_written: 96 << 20,
                paused: true,
                last_error: Some("writing object x: Connection timed out".into()),
                last_error_ns: cairn_area::time::now_ns() - 3_000_000_000,
                ..Default::default()
            })),
            backup: Some(Box::new(BackupReport {
                url: "ceph:cairn".into(),
                seq: 4,
                taken_ns: cairn_area::time::now_ns() - 7_000_000_000,
                objects: 12,
                bytes: 48 << 20,
                snapshot_ms: 30,
                ..Default::default()
            })),
        };
        let s = format_status(&r);
        assert!(
            s.contains("logs    8 client log file(s) beside it: 32 MiB of RAM"),
            "{s}"
        );
        assert!(
            s.contains("remote  ceph:cairn: migration to it paused after a failure"),
            "{s}"
        );
        assert!(
            s.contains("objects in use 8; since start: 12 written (96 MiB)"),
            "{s}"
        );
        assert!(
            s.contains("last error (3 s ago): writing object x: Connection timed out"),
            "{s}"
        );
        assert!(
            s.contains("backup  4 into ceph:cairn: 7 s old; 12 objects (48 MiB)"),
            "{s}"
        );
        assert!(s.contains("nvm"), "{s}");
        assert!(s.contains("128 MiB"), "{s}");
        assert!(s.contains("25.0%"), "{s}");
        assert!(s.contains("records digested"), "{s}");
        assert!(s.contains("shared-write inodes"), "{s}");
        assert!(s.contains("14 free/2 used"), "{s}");
        assert!(s.contains("75.0%"), "{s}");
        assert!(s.contains("in flight: migrate nvm -> ssd"), "{s}");
        assert!(
            s.contains("nvm     /dev/shm/cairn-1.nvm: 128 MiB, on tmpfs: 128 MiB of RAM held"),
            "{s}"
        );
        assert!(s.contains("2 host object(s) in /dev/shm"), "{s}");
        assert!(
            s.contains("superpages: 6 MiB in 2 MiB extents; 9 of 12 extents free"),
            "{s}"
        );
        assert!(s.contains("fragmentation index 0.25"), "{s}");
    }
}
