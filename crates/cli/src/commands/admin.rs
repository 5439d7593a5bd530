//! Store administration: `mkfs`, `daemon`, `status`, `stop`.

use crate::error::{clean, CliError, CliResult};
use crate::util::human_bytes;
use crate::{DaemonArgs, MkfsArgs};
use cairn_area::StoreDir;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Whether a daemon answers on the store's socket.
fn daemon_running(dir: &StoreDir) -> bool {
    UnixStream::connect(dir.socket_path()).is_ok()
}

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
    if let Some(n) = args.max_clients {
        opts.max_clients = n;
    }
    if let Some(n) = args.inodes {
        opts.inodes = n;
    }
    if let Some(n) = args.digest_threshold {
        opts.digest_threshold_pct = n;
    }
    if let Some(g) = &args.trusted_group {
        opts.trusted_gid = Some(
            cairn_daemon::resolve_group(g)
                .map_err(|e| CliError::new(format!("--trusted-group {g}: {}", clean(&e))))?,
        );
    }
    let cfg = cairn_daemon::mkfs(&opts).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists && !args.force {
            CliError::new(format!(
                "{} (use --force to overwrite it; its contents are lost)",
                clean(&e)
            ))
        } else {
            CliError::new(format!("mkfs {}: {}", dir.path.display(), clean(&e)))
        }
    })?;
    let mut out = std::io::stdout().lock();
    let text = format!(
        "created Cairn store {store}\n  \
         config        {config}\n  \
         NVM tier      {nvm} ({nvm_size})\n  \
         client logs   {slots} slots of {log}\n  \
         inodes        {inodes}\n  \
         digest at     {pct}% log fill\n  \
         trusted       {trust}\n",
        store = dir.path.display(),
        config = dir.config_path().display(),
        nvm = cfg.nvm_path.display(),
        nvm_size = human_bytes(cfg.nvm_size),
        slots = cfg.max_clients,
        log = human_bytes(cfg.log_size),
        inodes = if cfg.inodes == 0 {
            "one per 8 KiB".to_string()
        } else {
            cfg.inodes.to_string()
        },
        pct = cfg.digest_threshold_pct,
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

/// The human form of `cairn status`.
pub fn format_status(r: &cairn_proto::StatusReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "store   {}", r.store);
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
    s
}

pub fn stop(store: Option<&Path>) -> CliResult {
    let dir = StoreDir::resolve(store);
    let running = daemon_running(&dir);
    if running {
        cairn::daemon_shutdown(store).map_err(|e| {
            CliError::new(format!(
                "stopping the daemon of {}: {}",
                dir.path.display(),
                clean(&e)
            ))
        })?;
    }
    let msg = if running {
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
            tiers: vec![TierStatus {
                name: "nvm".into(),
                capacity_bytes: 128 << 20,
                used_bytes: 32 << 20,
            }],
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
        };
        let s = format_status(&r);
        assert!(s.contains("nvm"), "{s}");
        assert!(s.contains("128 MiB"), "{s}");
        assert!(s.contains("25.0%"), "{s}");
        assert!(s.contains("records digested"), "{s}");
        assert!(s.contains("shared-write inodes"), "{s}");
    }
}
