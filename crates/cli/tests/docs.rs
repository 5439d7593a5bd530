//! The documentation's commands work: every worked example of README.md and docs/*.md
//! runs, in order, on fresh stores, so that the tour and the examples cannot rot.
//!
//! What counts (docs/CLI.md, "Examples in these documents"):
//!
//! * a fenced block tagged `sh`: every command line runs (`\` continues a line);
//! * a fenced block tagged `console`: every `$ ` line runs; when the output shown under it
//!   starts with `cairn: ` (an error), the command must fail, else it must succeed;
//! * a fenced block tagged `sh bench` (a benchmark recipe, minutes to hours): every
//!   `cairn` command in it must parse (it runs with `--help` appended), nothing runs;
//! * other blocks (`text`, untagged synopses, `json`) are not commands.
//!
//! The blocks of one file run as one bash script (so `export` carries on) in a fresh
//! directory holding a copy of README.md, with `/tmp/` in commands pointing into the
//! test's own temporary directory, `$HOME` and `$XDG_DATA_HOME` there too, and the tested
//! `cairn` first on `PATH`. The README's set-up commands (its first block) are skipped.
//! An example must clean up after itself (end with `cairn rmfs`): a store left behind
//! fails the test (and is removed).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_cairn");

/// The whole script of one file may take this long.
const TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sh,
    Console,
    Bench,
}

/// A command of a worked example: where it is, its text, and whether it must fail.
#[derive(Debug)]
struct Cmd {
    line: usize,
    text: String,
    fails: bool,
    kind: Kind,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The commands of `text`'s runnable blocks (the first `sh` block skipped when
/// `skip_setup`).
fn commands(text: &str, skip_setup: bool) -> Vec<Cmd> {
    let mut out = Vec::new();
    // Inside a block: `Some(kind)`, where `kind` is `None` for a block of no commands.
    let mut block: Option<Option<Kind>> = None;
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut setup_pending = skip_setup;
    for (i, line) in text.lines().enumerate() {
        if let Some(info) = line.strip_prefix("```") {
            match block.take() {
                Some(kind) => {
                    if let Some(k) = kind {
                        out.extend(block_commands(k, &lines));
                    }
                    lines.clear();
                }
                None => {
                    let mut kind = match info.trim() {
                        "sh" => Some(Kind::Sh),
                        "console" => Some(Kind::Console),
                        "sh bench" => Some(Kind::Bench),
                        _ => None,
                    };
                    if kind == Some(Kind::Sh) && std::mem::take(&mut setup_pending) {
                        kind = None;
                    }
                    block = Some(kind);
                }
            }
            continue;
        }
        if block.is_some() {
            lines.push((i + 1, line.to_string()));
        }
    }
    out
}

/// The commands of one block.
fn block_commands(kind: Kind, lines: &[(usize, String)]) -> Vec<Cmd> {
    let mut out: Vec<Cmd> = Vec::new();
    let mut pending: Option<Cmd> = None;
    let mut output_seen = true;
    for (n, line) in lines {
        if let Some(c) = &mut pending {
            // A continuation of the command before.
            c.text.push('\n');
            c.text.push_str(line);
            if !line.ends_with('\\') {
                out.push(pending.take().unwrap());
            }
            continue;
        }
        let cmd = match kind {
            Kind::Sh | Kind::Bench => {
                let t = line.trim();
                (!t.is_empty() && !t.starts_with('#')).then(|| line.clone())
            }
            Kind::Console => match line.strip_prefix("$ ") {
                Some(c) => Some(c.to_string()),
                None => {
                    // Output: the first line after a command tells whether it fails.
                    if !output_seen {
                        output_seen = true;
                        if line.starts_with("cairn: ") {
                            if let Some(last) = out.last_mut() {
                                last.fails = true;
                            }
                        }
                    }
                    None
                }
            },
        };
        if let Some(text) = cmd {
            output_seen = false;
            let c = Cmd {
                line: *n,
                text,
                fails: false,
                kind,
            };
            if c.text.ends_with('\\') {
                pending = Some(c);
            } else {
                out.push(c);
            }
        }
    }
    out.extend(pending);
    out
}

/// `cmd` with `/tmp/` pointing into `work`.
fn localize(cmd: &str, work: &Path) -> String {
    cmd.replace("/tmp/", &format!("{}/tmp/", work.display()))
}

/// The `cairn` argument lists of a benchmark recipe's command (`cairn …`,
/// `target/release/cairn …`, `cargo run … -- …`), without redirections and comments.
fn cairn_invocations(cmd: &str) -> Vec<String> {
    let joined = cmd.replace("\\\n", " ");
    let mut out = Vec::new();
    for part in joined.split("&&").flat_map(|p| p.split(';')) {
        let part = part.split(" #").next().unwrap_or("");
        let part = part.split(['>', '|']).next().unwrap_or("").trim();
        let args = if let Some(a) = part.strip_prefix("target/release/cairn ") {
            a
        } else if let Some(a) = part.strip_prefix("cairn ") {
            a
        } else if part.starts_with("cargo run") {
            match part.split_once(" -- ") {
                Some((_, a)) => a,
                None => continue,
            }
        } else {
            continue;
        };
        out.push(args.trim().to_string());
    }
    out
}

/// The bash script that runs `cmds` (from `file`) in `work`.
fn script(file: &str, cmds: &[Cmd], work: &Path) -> String {
    let mut s = String::from("set -uo pipefail\n");
    for c in cmds {
        let text = localize(&c.text, work);
        s.push_str(&format!("__where='{file}:{}'\n", c.line));
        match c.kind {
            Kind::Bench => {
                for args in cairn_invocations(&text) {
                    s.push_str(&format!(
                        "cairn {args} --help >/dev/null || {{ echo \"docs: $__where: \
                         the command does not parse\" >&2; exit 1; }}\n"
                    ));
                }
            }
            Kind::Sh | Kind::Console => {
                s.push_str(&text);
                s.push_str("\n__rc=$?\n");
                if c.fails {
                    s.push_str(
                        "if [ $__rc -eq 0 ]; then echo \"docs: $__where: succeeded, but the \
                         example shows an error\" >&2; exit 1; fi\n",
                    );
                } else {
                    s.push_str(
                        "if [ $__rc -ne 0 ]; then echo \"docs: $__where: failed (exit \
                         $__rc)\" >&2; exit 1; fi\n",
                    );
                }
            }
        }
    }
    s
}

/// Stores (directories with a `cairn.toml`) under `dir`.
fn stores_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if p.join("cairn.toml").is_file() {
                out.push(p.clone());
            }
            stores_under(&p, out);
        }
    }
}

/// FUSE mounts under `dir` (from /proc/self/mounts).
fn mounts_under(dir: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = dir.display().to_string();
    mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| m.starts_with(&prefix))
        .map(String::from)
        .collect()
}

/// Unmount and remove everything the examples left under `work`; the stores left.
fn clean_up(work: &Path) -> Vec<PathBuf> {
    for m in mounts_under(work) {
        let _ = Command::new("fusermount3").args(["-u", "-z", &m]).status();
    }
    let mut left = Vec::new();
    stores_under(work, &mut left);
    for s in &left {
        let _ = Command::new(BIN)
            .args(["rmfs", "--force", "--store"])
            .arg(s)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    left
}

/// Run the examples of the file at `rel` (relative to the repository).
fn run_examples(rel: &str) {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join(rel)).unwrap();
    let cmds = commands(&text, rel == "README.md");
    if cmds.is_empty() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let work = work.path();
    for d in ["tmp", "home", "xdg"] {
        std::fs::create_dir(work.join(d)).unwrap();
    }
    std::fs::copy(root.join("README.md"), work.join("README.md")).unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(script(rel, &cmds, work))
        .current_dir(work)
        .env("PATH", path)
        .env("CAIRN_BIN", BIN)
        .env("HOME", work.join("home"))
        .env("XDG_DATA_HOME", work.join("xdg"))
        .env_remove("CAIRN_STORE");
    // Mounts and stores an example left are cleaned up before its output is read (a
    // mount's process would hold the pipes).
    let mut left = Vec::new();
    let ran = common::run_with_timeout(bash, None, TIMEOUT, || left = clean_up(work));
    let status = ran.status;
    let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&ran.stderr).into_owned();
    let tail = |s: &str| {
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    match status {
        Some(s) if s.success() => {}
        Some(_) => panic!(
            "{rel}: an example failed\n--- stderr (end)\n{}\n--- stdout (end)\n{}",
            tail(&stderr),
            tail(&stdout)
        ),
        None => panic!("{rel}: the examples took more than {TIMEOUT:?}"),
    }
    assert!(
        left.is_empty(),
        "{rel}: the examples left stores behind (end them with `cairn rmfs`): {left:?}"
    );
}

#[test]
fn readme_tour() {
    run_examples("README.md");
}

#[test]
fn docs_examples() {
    let mut files: Vec<String> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    files.sort();
    for f in files {
        run_examples(&format!("docs/{f}"));
    }
}

#[test]
fn examples_are_found_and_classified() {
    let doc = "```sh\nsetup\n```\n\
               ```sh\ncairn a \\\n  --b\n# comment\n\ncairn c\n```\n\
               ```console\n$ cairn d\ncairn: an error\n$ cairn e\nfine\n```\n\
               ```text\ncairn not-a-command\n```\n\
               ```sh bench\ncargo run --release -p cairn-cli -- bench kv --json > kv.json\n```\n";
    let cmds = commands(doc, true);
    let texts: Vec<(&str, bool, Kind)> = cmds
        .iter()
        .map(|c| (c.text.as_str(), c.fails, c.kind))
        .collect();
    assert_eq!(
        texts,
        vec![
            ("cairn a \\\n  --b", false, Kind::Sh),
            ("cairn c", false, Kind::Sh),
            ("cairn d", true, Kind::Console),
            ("cairn e", false, Kind::Console),
            (
                "cargo run --release -p cairn-cli -- bench kv --json > kv.json",
                false,
                Kind::Bench
            ),
        ]
    );
    assert_eq!(cmds[0].line, 5);
    assert_eq!(
        cairn_invocations(&cmds[4].text),
        vec!["bench kv --json".to_string()]
    );
    assert_eq!(
        cairn_invocations("scripts/setup.sh && target/release/cairn bench latency # x"),
        vec!["bench latency".to_string()]
    );
    // A failing command fails the script, and an expected error that does not come too.
    let work = Path::new("/w");
    let s = script("f.md", &cmds[2..4], work);
    assert!(
        s.contains("succeeded, but the example shows an error"),
        "{s}"
    );
    assert_eq!(localize("ls /tmp/demo", work), "ls /w/tmp/demo");
}
