//! `cairn backup` and `cairn restore`: whole stores kept in a Ceph RADOS pool
//! (docs/REMOTE.md, "Backup and restore").

use crate::error::{CliError, CliResult};
use cairn_area::units::human_bytes;
use std::io::Write;
use std::path::Path;

fn print(text: &str) -> CliResult {
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)
}

/// Seconds since `ns` (ns since the Unix epoch).
fn age_s(ns: i64) -> f64 {
    (cairn_area::time::now_ns() - ns).max(0) as f64 / 1e9
}

/// `cairn backup [--remote ceph:POOL] [--json]`.
pub fn backup(store: Option<&Path>, remote: Option<&str>, json: bool) -> CliResult {
    let spin = crate::progress::spinner("backing up");
    let r = cairn::daemon_backup(store, remote);
    spin.finish_and_clear();
    let r = r?;
    if json {
        return print(&crate::util::json_text(&r, "the backup report")?);
    }
    print(&format!(
        "backup {} of the store into {}: {} objects, {}; {} written now ({}), {} kept from \
         the previous backup, {} removed; {} remote segments kept in place\n\
         the store was held {} ms for the snapshot; {} ms in all\n",
        r.seq,
        r.url,
        r.objects,
        human_bytes(r.bytes),
        r.objects_written,
        human_bytes(r.bytes_written),
        r.objects_kept,
        r.objects_removed,
        r.remote_segments,
        r.snapshot_ms,
        r.total_ms
    ))
}

/// `cairn restore --list`.
pub fn list(opts: &cairn_daemon::RestoreOptions, json: bool) -> CliResult {
    let all = cairn_daemon::list_backups(&opts.url, opts.conf.as_deref(), opts.user.as_deref())?;
    if json {
        let v: Vec<serde_json::Value> = all
            .iter()
            .map(|m| {
                serde_json::json!({
                    "id": m.uuid, "seq": m.seq, "taken_ns": m.taken_ns,
                    "nvm_size": m.nvm_size, "bytes": m.bytes(),
                    "segments": m.segments.len(), "remote_segments": m.remote.len(),
                })
            })
            .collect();
        return print(&crate::util::json_text(&v, "the list of backups")?);
    }
    if all.is_empty() {
        return print(&format!("no backup in {}\n", opts.url));
    }
    let mut s = String::new();
    for m in &all {
        s.push_str(&format!(
            "{}  backup {}, taken {:.0} s ago, {} (NVM {})\n",
            m.uuid,
            m.seq,
            age_s(m.taken_ns),
            human_bytes(m.bytes()),
            human_bytes(m.nvm_size)
        ));
    }
    print(&s)
}

/// `cairn restore --remote ceph:POOL --store DIR`.
pub fn restore(store: Option<&Path>, opts: &cairn_daemon::RestoreOptions, json: bool) -> CliResult {
    if store.is_none() {
        return Err(CliError::new(
            "restore makes a new store: name its directory with --store DIR",
        ));
    }
    let bar = crate::progress::bytes("restoring", 0);
    let m = cairn_daemon::restore(opts, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let m = m?;
    if json {
        let v = serde_json::json!({
            "id": m.uuid, "seq": m.seq, "taken_ns": m.taken_ns, "bytes": m.bytes(),
            "store": opts.store,
        });
        return print(&crate::util::json_text(&v, "the restore report")?);
    }
    print(&format!(
        "restored store {} at {} from backup {} (taken {:.0} s ago, {}); it starts as \
         after a crash: its daemon replays the logs. `cairn fsck` checks it.\n",
        m.uuid,
        opts.store.display(),
        m.seq,
        age_s(m.taken_ns),
        human_bytes(m.bytes())
    ))
}
