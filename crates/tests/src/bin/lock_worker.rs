//! Lock-test worker: a Cairn client that runs lock commands read from stdin, one per
//! line, and prints one answer line per command (so a test can drive several processes
//! contending for locks, and see which ones block).
//!
//! Usage: cairn-lock-worker STORE
//!
//! Commands (`H` is a handle number chosen by the test; `KIND` is `posix` or `ofd`;
//! `TYP` is `r` or `w`; `MODE` is `r`, `w` or `rw`):
//! * `open H PATH MODE` (creates the file if needed when writable) → `OK` | `ERR errno`
//! * `close H` → `OK`
//! * `lock H KIND TYP START LEN WAIT(0|1)` → `OK` | `ERR errno`
//! * `locktimeout H KIND TYP START LEN MS` → `OK` | `ERR errno`
//! * `unlock H KIND START LEN` → `OK` | `ERR errno`
//! * `getlk H KIND TYP START LEN` → `NONE` | `LOCK r|w START LEN PID` | `ERR errno`
//! * `flock H sh|ex|un NB(0|1)` → `OK` | `ERR errno`
//! * `pid` → the process id
//! * `exit` → exits (dropping every handle and the client)

use cairn::{File, FlockOp, LockKind, LockType, OpenOptions};
use std::collections::HashMap;
use std::io::{BufRead, Write};

fn errno(e: &std::io::Error) -> String {
    format!("ERR {}", cairn_area::errno_of(e))
}

fn result(r: std::io::Result<()>) -> String {
    match r {
        Ok(()) => "OK".into(),
        Err(e) => errno(&e),
    }
}

fn kind(s: &str) -> Option<LockKind> {
    match s {
        "posix" => Some(LockKind::Posix),
        "ofd" => Some(LockKind::Ofd),
        _ => None,
    }
}

fn typ(s: &str) -> Option<LockType> {
    match s {
        "r" => Some(LockType::Read),
        "w" => Some(LockType::Write),
        _ => None,
    }
}

fn run(fs: &cairn::Fs, files: &mut HashMap<u64, File>, a: &[&str]) -> Option<String> {
    let num = |i: usize| a.get(i).and_then(|s| s.parse::<u64>().ok());
    let file = |files: &HashMap<u64, File>| num(1).and_then(|h| files.get(&h).map(|_| h));
    Some(match a.first().copied()? {
        "pid" => std::process::id().to_string(),
        "open" => {
            let (h, path, mode) = (num(1)?, *a.get(2)?, *a.get(3)?);
            let w = mode.contains('w');
            let r = OpenOptions::new()
                .read(mode.contains('r'))
                .write(w)
                .create(w)
                .open(fs, path);
            match r {
                Ok(f) => {
                    files.insert(h, f);
                    "OK".into()
                }
                Err(e) => errno(&e),
            }
        }
        "close" => {
            files.remove(&num(1)?);
            "OK".into()
        }
        "lock" => {
            let f = &files[&file(files)?];
            let wait = num(6)? == 1;
            result(f.lock(kind(a[2])?, typ(a[3])?, num(4)?, num(5)?, wait))
        }
        "locktimeout" => {
            let f = &files[&file(files)?];
            let t = std::time::Duration::from_millis(num(6)?);
            result(f.lock_timeout(kind(a[2])?, typ(a[3])?, num(4)?, num(5)?, t))
        }
        "unlock" => {
            let f = &files[&file(files)?];
            result(f.unlock(kind(a[2])?, num(3)?, num(4)?))
        }
        "getlk" => {
            let f = &files[&file(files)?];
            match f.get_lock(kind(a[2])?, typ(a[3])?, num(4)?, num(5)?) {
                Ok(None) => "NONE".into(),
                Ok(Some(l)) => format!(
                    "LOCK {} {} {} {}",
                    if l.typ == LockType::Read { "r" } else { "w" },
                    l.start,
                    l.len,
                    l.pid
                ),
                Err(e) => errno(&e),
            }
        }
        "flock" => {
            let f = &files[&file(files)?];
            let op = match *a.get(2)? {
                "sh" => FlockOp::Shared,
                "ex" => FlockOp::Exclusive,
                "un" => FlockOp::Unlock,
                _ => return None,
            };
            result(f.flock(op, num(3)? == 1))
        }
        "exit" => std::process::exit(0),
        _ => return None,
    })
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 2 {
        eprintln!("usage: cairn-lock-worker STORE");
        std::process::exit(2);
    }
    let fs = match cairn::Fs::open(&a[1]) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("cairn-lock-worker: open {}: {e}", a[1]);
            std::process::exit(1);
        }
    };
    let mut files = HashMap::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = run(&fs, &mut files, &words).unwrap_or_else(|| format!("BAD {line}"));
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
}
