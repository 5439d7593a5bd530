//! What the `cairn` binary's test files share.

use std::io::{Read, Write};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How a command ended: its status (`None`: killed after the timeout) and its output.
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Run `cmd` with `input` on its standard input (else none), collecting its output,
/// killed after `timeout`. `after_exit` runs once it ended and before its output is
/// collected (to stop processes it left that hold its pipes).
pub fn run_with_timeout(
    mut cmd: Command,
    input: Option<Vec<u8>>,
    timeout: Duration,
    after_exit: impl FnOnce(),
) -> Ran {
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let writer = input.map(|data| {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        })
    });
    let collect = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out_t = collect(Box::new(child.stdout.take().unwrap()));
    let err_t = collect(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    after_exit();
    if let Some(w) = writer {
        let _ = w.join();
    }
    Ran {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}
