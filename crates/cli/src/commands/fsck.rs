//! `cairn fsck`: check (and repair) a stopped store, with `e2fsck`'s exit codes.

use crate::error::{CliError, CliResult};
use cairn_area::StoreDir;
use std::io::Write;
use std::path::Path;

/// Exit code when the check could not run (`e2fsck`: operational error).
const OPERATIONAL: i32 = 8;

pub fn fsck(store: Option<&Path>, json: bool, repair: bool) -> CliResult {
    let dir = StoreDir::resolve(store);
    let bar = crate::progress::count("fsck", 0, "inodes (at most)");
    let shown = bar.clone();
    let opts = cairn_daemon::FsckOptions {
        repair,
        progress: Some(Box::new(move |done: u64, max: u64| {
            shown.set_length(max);
            shown.set_position(done);
        })),
    };
    let rep = cairn_daemon::fsck(&dir.path, &opts);
    bar.finish_and_clear();
    let rep = rep.map_err(|e| CliError {
        message: format!("fsck {}: {}", dir.path.display(), crate::error::clean(&e)),
        code: OPERATIONAL,
    })?;
    let text = if json {
        crate::util::json_text(
            &serde_json::json!({
                "store": dir.path,
                "exit_code": rep.exit_code(),
                "problems": rep.problems,
                "repaired": rep.repaired,
                "notes": rep.notes,
                "inodes": rep.inodes,
                "directories": rep.directories,
                "nvm_blocks": rep.nvm_blocks,
                "tier_blocks": rep.tier_blocks,
            }),
            "the fsck report",
        )?
    } else {
        let mut s = String::new();
        for n in &rep.notes {
            s += &format!("note: {n}\n");
        }
        for r in &rep.repaired {
            s += &format!("repaired: {r}\n");
        }
        for p in &rep.problems {
            s += &format!("error: {p}\n");
        }
        s += &format!(
            "{}: {} inodes ({} directories), {} NVM blocks and {} lower-tier blocks in use: {}\n",
            dir.path.display(),
            rep.inodes,
            rep.directories,
            rep.nvm_blocks,
            rep.tier_blocks,
            match rep.exit_code() {
                0 => "clean".to_string(),
                1 => format!("{} errors corrected", rep.repaired.len()),
                _ => format!("{} errors left", rep.problems.len()),
            }
        );
        s
    };
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(crate::error::stdout_err)?;
    match rep.exit_code() {
        0 => Ok(()),
        code => Err(CliError {
            message: String::new(),
            code,
        }),
    }
}
