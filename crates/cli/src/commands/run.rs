//! `cairn run`: a command with `libcairn_preload.so` loaded, so that its file calls under
//! the prefix go to the store.

use crate::error::{CliError, CliResult};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file name of the interposition library.
pub const LIBRARY: &str = "libcairn_preload.so";

/// The library: `$CAIRN_PRELOAD`, else next to this executable or in its parent
/// directory (where cargo puts it next to test binaries), else the error says where it
/// was looked for.
pub fn library() -> CliResult<PathBuf> {
    find_library(LIBRARY, "CAIRN_PRELOAD", "cargo build --release")
}

/// A library of Cairn's named `file`: the path in `$env_var` if set, else next to this
/// executable or in its parent directory; the error says how to build it (`build`).
pub fn find_library(file: &str, env_var: &str, build: &str) -> CliResult<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(CliError::new(format!(
            "{env_var}={}: no such file",
            p.display()
        )));
    }
    let exe = std::env::current_exe()
        .map_err(crate::error::ctx_msg("cannot find the cairn executable"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [Some(dir.to_path_buf()), dir.parent().map(Path::to_path_buf)];
    for d in candidates.iter().flatten() {
        let p = d.join(file);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(CliError::new(format!(
        "{file} not found next to {} (build it with `{build}`, or set {env_var})",
        exe.display()
    )))
}

/// The environment `cairn run` gives a command: the library first in `LD_PRELOAD`, the
/// store, the prefix, and the `cairn` binary for restarting the daemon.
pub fn environment(store: &Path, prefix: &Path) -> CliResult<Vec<(&'static str, OsString)>> {
    let lib = library()?;
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let mut env = vec![
        ("LD_PRELOAD", preload),
        ("CAIRN_STORE", store.as_os_str().to_owned()),
        ("CAIRN_PREFIX", prefix.as_os_str().to_owned()),
    ];
    if std::env::var_os("CAIRN_BIN").is_none() {
        if let Ok(exe) = std::env::current_exe() {
            env.push(("CAIRN_BIN", exe.into_os_string()));
        }
    }
    Ok(env)
}

/// Check the prefix: absolute, not `/`, no `..`.
pub fn check_prefix(prefix: &Path) -> CliResult {
    let ok = prefix.is_absolute()
        && prefix.components().count() > 1
        && !prefix
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        && prefix.as_os_str().len() < 256;
    if !ok {
        return Err(CliError::new(format!(
            "--prefix {}: must be an absolute path other than `/`, without `..`",
            prefix.display()
        )));
    }
    Ok(())
}

/// `cairn run`: start the daemon if needed, then become `cmd` with the library loaded
/// (and, with `vas`, its main thread in that address space; `true`: abort at exit).
pub fn run(
    store: Option<&Path>,
    prefix: &Path,
    vas: Option<&(String, bool)>,
    cmd: &[OsString],
) -> CliResult {
    check_prefix(prefix)?;
    let Some((prog, args)) = cmd.split_first() else {
        return Err(CliError::new(
            "run: no command given (cairn run -- CMD [ARGS...])",
        ));
    };
    // Opening a client starts the daemon (and creates the default store) if needed.
    let fs = super::open_fs(store)?;
    let dir = fs.store_dir().to_path_buf();
    if let Some((name, _)) = vas {
        // Checked here, so that a wrong name is one clear error, not one per process.
        let path = cairn_sj::space::vas_path(name)?;
        fs.metadata(path.as_str())
            .map_err(crate::error::ctx_msg(format!("--vas {name} ({path})")))?;
    }
    drop(fs);
    let mut env = environment(&dir, prefix)?;
    if let Some((name, abort)) = vas {
        env.push(("CAIRN_SJ_VAS", name.into()));
        env.push((
            "CAIRN_SJ_EXIT",
            if *abort { "abort" } else { "commit" }.into(),
        ));
    }
    let err = Command::new(prog).args(args).envs(env).exec();
    let mut e = crate::error::ctx_msg(format!("run {}", Path::new(prog).display()))(err);
    e.code = 127;
    Err(e)
}
