//! A Cairn client driven line by line over stdin/stdout, for the multi-process sharing
//! tests (`tests/sharing.rs`): `cairn-share-worker STORE`, then one command per line,
//! one answer line per command: `ok [RESULT]` or `err ERRNO MESSAGE`.
//!
//! Commands (paths have no spaces; TEXT is the rest of the line):
//! `pid`, `write PATH TEXT` (create/truncate + write), `append PATH TEXT` (creates),
//! `pwrite PATH OFF TEXT`, `read PATH`, `len PATH`, `mode PATH`, `chmod PATH OCTAL`,
//! `mkdir PATH`, `create PATH`, `rename FROM TO`, `unlink PATH`, `rmdir PATH`,
//! `ls DIR` (sorted names joined by `,`), `exists PATH`, `quit`; handles kept open:
//! `hold PATH` (open read-write), `hread PATH` (its whole content through the handle),
//! `happend PATH TEXT` (write at its end through the handle), `release PATH` (close).

use cairn::{File, Fs, OpenOptions, Permissions};
use std::collections::HashMap;
use std::io::{BufRead, Write};

fn held<'a>(h: &'a HashMap<String, File>, p: &str) -> std::io::Result<&'a File> {
    h.get(p)
        .ok_or_else(|| std::io::Error::other(format!("{p} is not held")))
}

fn run(fs: &Fs, h: &mut HashMap<String, File>, line: &str) -> std::io::Result<String> {
    let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
    let (a, b) = rest.split_once(' ').unwrap_or((rest, ""));
    Ok(match cmd {
        "pid" => std::process::id().to_string(),
        "write" => {
            fs.write(a, b.as_bytes())?;
            String::new()
        }
        "append" => {
            let f = OpenOptions::new().append(true).create(true).open(fs, a)?;
            f.write_at(b.as_bytes(), 0)?;
            String::new()
        }
        "pwrite" => {
            let (off, text) = b.split_once(' ').unwrap_or((b, ""));
            let off: u64 = off
                .parse()
                .map_err(|_| std::io::Error::other("bad offset"))?;
            let f = OpenOptions::new().write(true).open(fs, a)?;
            f.write_at(text.as_bytes(), off)?;
            String::new()
        }
        "read" => String::from_utf8_lossy(&fs.read(a)?).into_owned(),
        "len" => fs.metadata(a)?.len().to_string(),
        "mode" => format!("{:o}", fs.metadata(a)?.permissions().mode() & 0o7777),
        "chmod" => {
            let m = u32::from_str_radix(b, 8).map_err(|_| std::io::Error::other("bad mode"))?;
            fs.set_permissions(a, Permissions::from_mode(m))?;
            String::new()
        }
        "mkdir" => {
            fs.create_dir(a)?;
            String::new()
        }
        "create" => {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(fs, a)?;
            String::new()
        }
        "rename" => {
            fs.rename(a, b)?;
            String::new()
        }
        "unlink" => {
            fs.remove_file(a)?;
            String::new()
        }
        "rmdir" => {
            fs.remove_dir(a)?;
            String::new()
        }
        "ls" => {
            let mut v: Vec<String> = fs
                .read_dir(a)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<_>>()?;
            v.sort();
            v.join(",")
        }
        "exists" => fs.exists(a).to_string(),
        "hold" => {
            let f = OpenOptions::new().read(true).write(true).open(fs, a)?;
            h.insert(a.to_string(), f);
            String::new()
        }
        "hread" => {
            let f = held(h, a)?;
            let mut buf = vec![0u8; f.metadata()?.len() as usize];
            let mut n = 0;
            while n < buf.len() {
                match f.read_at(&mut buf[n..], n as u64)? {
                    0 => break,
                    k => n += k,
                }
            }
            buf.truncate(n);
            String::from_utf8_lossy(&buf).into_owned()
        }
        "happend" => {
            let f = held(h, a)?;
            f.write_at(b.as_bytes(), f.metadata()?.len())?;
            String::new()
        }
        "release" => {
            h.remove(a)
                .ok_or_else(|| std::io::Error::other(format!("{a} is not held")))?;
            String::new()
        }
        _ => return Err(std::io::Error::other(format!("unknown command {cmd}"))),
    })
}

fn main() {
    let store = std::env::args()
        .nth(1)
        .expect("usage: cairn-share-worker STORE");
    let fs = match Fs::open(&store) {
        Ok(f) => f,
        Err(e) => {
            println!("err {} {e}", cairn_area::errno_of(&e));
            std::process::exit(1);
        }
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let mut handles = HashMap::new();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line == "quit" {
            break;
        }
        let answer = match run(&fs, &mut handles, &line) {
            Ok(r) if r.is_empty() => "ok".to_string(),
            Ok(r) => format!("ok {r}"),
            Err(e) => format!("err {} {e}", cairn_area::errno_of(&e)),
        };
        let _ = writeln!(out, "{}", answer.replace('\n', "\\n"));
        let _ = out.flush();
    }
}
