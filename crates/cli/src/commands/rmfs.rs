//! `cairn rmfs`: remove a store and everything it holds on the host.
//!
//! A store is more than its directory: its NVM file (as large as the tier, on `/dev/shm`
//! by default, which is RAM) and its host objects in `/dev/shm` (map objects of shared
//! mappings, FIFO and socket rendezvous) stay until they are removed or the machine
//! reboots. `rmfs` stops the daemon cleanly, refuses while clients are attached (unless
//! `--force`), removes all of it, and says what it freed.

use crate::error::{clean, CliError, CliResult};
use crate::util::human_bytes;
use cairn_area::{host, StoreDir};
use serde::Serialize;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One thing `rmfs` removed (or left).
#[derive(Debug, Serialize)]
struct Item {
    /// `nvm`, `host-object`, `ssd`, `hdd`, `directory`.
    kind: &'static str,
    path: PathBuf,
    /// Bytes it held on its file system (allocated).
    bytes: u64,
    /// Whether those bytes were RAM (tmpfs).
    in_ram: bool,
}

/// What `rmfs` did, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    store: PathBuf,
    /// Whether a daemon was running and was stopped.
    daemon_stopped: bool,
    /// Clients that were attached (`--force`); they lose the store.
    clients_detached: Vec<u32>,
    removed: Vec<Item>,
    /// Paths left in place: block devices of lower tiers, and files in the store
    /// directory that Cairn did not make.
    left: Vec<PathBuf>,
    ram_freed_bytes: u64,
    disk_freed_bytes: u64,
}

/// The files Cairn makes in a store directory (`StoreDir`), removed by name; anything
/// else there is the user's and is left.
fn store_dir_entries(dir: &StoreDir) -> Vec<PathBuf> {
    let mut v = vec![
        dir.config_path(),
        dir.path.join(".cairn.toml.tmp"),
        dir.socket_path(),
        dir.daemon_log_path(),
        // `cairn mount`'s log (a background mount).
        dir.path.join("mount.log"),
        dir.sj_registry_path(),
        dir.sj_registry_path().with_extension("tmp"),
    ];
    for ext in ["", "tmp", "old"] {
        v.push(dir.xattr_path().with_extension(ext));
    }
    v
}

/// Pids of processes holding a slot lock of the store (attached clients), when no
/// daemon answers to list them.
fn slot_holders(dir: &StoreDir, slots: u32) -> Vec<u32> {
    (0..slots)
        .filter(|&s| {
            File::open(dir.slot_lock_path(s)).is_ok_and(|f| {
                let held = cairn_media::sys::flock_exclusive(&f, true).is_err();
                let _ = cairn_media::sys::flock_unlock(&f);
                held
            })
        })
        .collect()
}

fn in_ram(path: &Path) -> bool {
    path.parent()
        .is_some_and(|d| cairn_media::sys::in_ram(d).unwrap_or(false))
}

/// Remove `path` (a file) and record it; a missing file is skipped.
fn remove_file(kind: &'static str, path: &Path, out: &mut Vec<Item>) -> CliResult {
    let bytes = host::allocated_bytes(path);
    match std::fs::remove_file(path) {
        Ok(()) => {
            out.push(Item {
                kind,
                path: path.to_path_buf(),
                bytes,
                in_ram: in_ram(path),
            });
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CliError::new(format!(
            "removing {}: {}",
            path.display(),
            clean(&e)
        ))),
    }
}

/// `cairn rmfs [--force] [--json]`.
pub fn rmfs(store: Option<&Path>, force: bool, json: bool) -> CliResult {
    let dir = StoreDir::resolve(store);
    let cfg = dir.load_config()?;
    // The UUID names the host objects; it is in the NVM file, read before that goes.
    let uuid = host::store_uuid(&dir.path).ok();
    let mut report = Report {
        store: dir.path.clone(),
        daemon_stopped: false,
        clients_detached: Vec::new(),
        removed: Vec::new(),
        left: Vec::new(),
        ram_freed_bytes: 0,
        disk_freed_bytes: 0,
    };
    let running = super::admin::daemon_running(&dir);
    let attached: Vec<u32> = if running {
        cairn::daemon_status(store)?
            .clients
            .iter()
            .map(|c| c.pid)
            .collect()
    } else {
        slot_holders(&dir, cfg.max_clients)
    };
    if !attached.is_empty() && !force {
        let who = if running {
            let pids: Vec<String> = attached.iter().map(u32::to_string).collect();
            format!("pid {}", pids.join(", "))
        } else {
            format!("slot {:?}", attached)
        };
        return Err(CliError::new(format!(
            "{} client(s) are attached to {} ({who}); stop them first, or use --force \
             (they lose the store)",
            attached.len(),
            dir.path.display()
        )));
    }
    report.daemon_stopped = running && super::admin::shutdown_daemon(store, &dir)?;
    if report.daemon_stopped {
        report.clients_detached = attached;
    }
    // Hold the daemon lock while removing, so that no daemon starts in between.
    let lock = File::open(dir.daemon_lock_path()).ok();
    if let Some(f) = &lock {
        cairn_media::sys::flock_exclusive(f, true).map_err(|_| {
            CliError::new(format!(
                "a daemon of {} started again while stopping it; run rmfs again",
                dir.path.display()
            ))
        })?;
    }
    if let Some(uuid) = &uuid {
        for p in host::list(uuid) {
            remove_file("host-object", &p, &mut report.removed)?;
        }
    }
    remove_file("nvm", &cfg.nvm_path, &mut report.removed)?;
    // Its client logs (files of their own beside it, format version 7).
    for p in cairn_area::store::nvm_files(&cfg.nvm_path) {
        remove_file("log", &p, &mut report.removed)?;
    }
    for (kind, p) in [("ssd", &cfg.ssd_path), ("hdd", &cfg.hdd_path)] {
        let Some(p) = p else { continue };
        match std::fs::metadata(p) {
            Ok(m) if m.is_file() => remove_file(kind, p, &mut report.removed)?,
            Ok(_) => report.left.push(p.clone()), // A block device is the user's.
            Err(_) => {}
        }
    }
    for p in store_dir_entries(&dir) {
        remove_file("store-file", &p, &mut report.removed)?;
    }
    let _ = std::fs::remove_dir_all(dir.slots_dir());
    drop(lock);
    let _ = std::fs::remove_file(dir.daemon_lock_path());
    match std::fs::remove_dir(&dir.path) {
        Ok(()) => report.removed.push(Item {
            kind: "directory",
            path: dir.path.clone(),
            bytes: 0,
            in_ram: false,
        }),
        Err(_) => {
            if let Ok(rest) = std::fs::read_dir(&dir.path) {
                report.left.extend(rest.flatten().map(|e| e.path()));
            }
        }
    }
    for i in &report.removed {
        if i.in_ram {
            report.ram_freed_bytes += i.bytes;
        } else {
            report.disk_freed_bytes += i.bytes;
        }
    }
    let text = if json {
        crate::util::json_text(&report, "the report")?
    } else {
        human(&report, uuid.is_none())
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

fn human(r: &Report, no_uuid: bool) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "removed the store {}", r.store.display());
    if r.daemon_stopped {
        let _ = writeln!(s, "  stopped its daemon");
    }
    if !r.clients_detached.is_empty() {
        let _ = writeln!(
            s,
            "  detached clients (pid): {:?}; they get errors from now on",
            r.clients_detached
        );
    }
    let objects: Vec<&Item> = r
        .removed
        .iter()
        .filter(|i| i.kind == "host-object")
        .collect();
    for i in &r.removed {
        let what = match i.kind {
            "nvm" => "NVM file",
            "ssd" => "SSD tier",
            "hdd" => "HDD tier",
            _ => continue,
        };
        let _ = writeln!(
            s,
            "  {what:<13} {} ({}{})",
            i.path.display(),
            human_bytes(i.bytes),
            if i.in_ram { " of RAM" } else { "" }
        );
    }
    if !objects.is_empty() {
        let _ = writeln!(
            s,
            "  {:<13} {} in {} ({} of RAM)",
            "host objects",
            objects.len(),
            host::HOST_OBJECT_DIR,
            human_bytes(objects.iter().map(|i| i.bytes).sum())
        );
    }
    let logs: Vec<&Item> = r.removed.iter().filter(|i| i.kind == "log").collect();
    if let Some(first) = logs.first() {
        let _ = writeln!(
            s,
            "  {:<13} {} beside it ({}{})",
            "client logs",
            logs.len(),
            human_bytes(logs.iter().map(|i| i.bytes).sum()),
            if first.in_ram { " of RAM" } else { "" }
        );
    }
    if no_uuid {
        let _ = writeln!(
            s,
            "  (the NVM file was unreadable: host objects in {} could not be named; look \
             for cairn-*.map-* and cairn-*.fifo-* there)",
            host::HOST_OBJECT_DIR
        );
    }
    for p in &r.left {
        let _ = writeln!(s, "  left in place: {}", p.display());
    }
    let _ = writeln!(
        s,
        "freed {} of RAM and {} of disk",
        human_bytes(r.ram_freed_bytes),
        human_bytes(r.disk_freed_bytes)
    );
    s
}
