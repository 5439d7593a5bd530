//! The network side: an acceptor and `threads` workers, each with its own `epoll` set
//! of connections (non-blocking sockets, level-triggered). A connection's requests are
//! parsed as they arrive, as many as its buffer holds (pipelining), executed in order,
//! and their replies written back in order; a connection whose client does not read
//! its replies stops being served (4 MiB of replies pending: no more of its requests
//! executed, none read) until it does.

use crate::commands::{execute, After, Session, Shared};
use crate::resp::{parse_into, wanted, Args, Out};
use rustix::buffer::spare_capacity;
use rustix::event::epoll;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Replies pending on a connection beyond which it is not read from.
const MAX_PENDING: usize = 4 << 20;
/// Bytes read from one connection per wake-up (then the others get their turn).
const READ_BUDGET: usize = 1 << 20;

struct Conn {
    stream: TcpStream,
    inb: Vec<u8>,
    out: Vec<u8>,
    sent: usize,
    session: Session,
    /// The arguments of the request being executed (reused).
    args: Args,
    /// Close once the replies are out (`QUIT`, a protocol error, the peer's EOF).
    closing: bool,
    /// The interest registered now (readable, writable).
    interest: (bool, bool),
}

/// `SET`s committed together at most: a batch holds the locks of its keys' buckets
/// (readers of those wait) until its commit.
const MAX_BATCH: usize = 64;

/// The most room made ahead of the bytes of an announced bulk.
const MAX_PREALLOC: usize = 1 << 20;

impl Conn {
    /// Read what is there, execute every whole request, write what can be written.
    /// Whether the connection is finished.
    fn serve(&mut self, sh: &Shared, scratch: &mut [u8]) -> bool {
        // Replies out first, then the requests the last wake-up left waiting for room.
        if self.flush().is_err() {
            return true;
        }
        self.run(sh);
        let mut got = 0;
        while !self.closing && self.out.len() - self.sent < MAX_PENDING && got < READ_BUDGET {
            match self.stream.read(scratch) {
                Ok(0) => {
                    self.closing = true;
                    break;
                }
                Ok(n) => {
                    self.inb.extend_from_slice(&scratch[..n]);
                    got += n;
                    // A large bulk announced: make room for it at once, up to a bound
                    // (a client announcing 512 MiB and sending nothing costs 1 MiB).
                    let w = wanted(&self.inb);
                    if w > 0 {
                        self.inb.reserve(w.min(MAX_PREALLOC));
                    }
                    self.run(sh);
                    if n < scratch.len() {
                        // Drained, most likely: no second read to hear `EAGAIN` (the
                        // set is level-triggered; anything more wakes it again).
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        self.flush().is_err() || (self.closing && self.sent == self.out.len())
    }

    /// Execute the whole requests in the input buffer, until the replies pending reach
    /// `MAX_PENDING` (the rest waits for the client to read). Plain `SET`s in a row are
    /// one batch (group commit): their records written, fenced once, and only then
    /// visible and acknowledged; any other request commits the batch before it runs.
    fn run(&mut self, sh: &Shared) {
        let mut at = 0;
        let mut done = 0;
        let mut batch = sh.store.batch();
        while !self.closing && self.out.len() - self.sent < MAX_PENDING {
            let buf = &self.inb[at..];
            match parse_into(buf, &mut self.args) {
                Ok(Some(n)) => {
                    at += n;
                    done += 1;
                    if self.args.len() == 3 && self.args.get(buf, 0).eq_ignore_ascii_case(b"set") {
                        batch.put(self.args.get(buf, 1), self.args.get(buf, 2));
                        if batch.len() >= MAX_BATCH {
                            let mut o = Out {
                                buf: &mut self.out,
                                resp3: self.session.resp3,
                            };
                            commit(&mut batch, &mut o);
                        }
                        continue;
                    }
                    let mut o = Out {
                        buf: &mut self.out,
                        resp3: self.session.resp3,
                    };
                    commit(&mut batch, &mut o);
                    // The arguments as slices (on the stack for the usual few).
                    let mut small: [&[u8]; 8] = [&[]; 8];
                    let big: Vec<&[u8]>;
                    let argv: &[&[u8]] = match self.args.len() {
                        k if k <= small.len() => {
                            for (i, a) in small[..k].iter_mut().enumerate() {
                                *a = self.args.get(buf, i);
                            }
                            &small[..k]
                        }
                        k => {
                            big = (0..k).map(|i| self.args.get(buf, i)).collect();
                            &big
                        }
                    };
                    if execute(sh, &mut self.session, argv, &mut o) == After::Close {
                        self.closing = true;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // As Redis: the error, then the connection is closed.
                    let mut o = Out {
                        buf: &mut self.out,
                        resp3: self.session.resp3,
                    };
                    commit(&mut batch, &mut o);
                    o.error(&format!("ERR {}", e.0));
                    self.closing = true;
                }
            }
        }
        let mut o = Out {
            buf: &mut self.out,
            resp3: self.session.resp3,
        };
        commit(&mut batch, &mut o);
        // Counted once per batch (a counter shared by every worker: once per command
        // it bounced between the CPUs).
        sh.commands.fetch_add(done, Ordering::Relaxed);
        self.inb.drain(..at);
    }

    fn flush(&mut self) -> io::Result<()> {
        while self.sent < self.out.len() {
            match self.stream.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        } else if self.sent > 1 << 20 {
            self.out.drain(..self.sent);
            self.sent = 0;
        }
        Ok(())
    }

    fn wants(&self) -> (bool, bool) {
        let pending = self.out.len() - self.sent;
        (!self.closing && pending < MAX_PENDING, pending > 0)
    }
}

/// Commit the batched `SET`s and write their replies.
fn commit(batch: &mut cairn_kv::Batch<'_>, o: &mut Out<'_>) {
    if !batch.is_empty() {
        batch.commit(|r| match r {
            Ok(()) => o.ok(),
            Err(e) => crate::commands::store_error(o, &e),
        });
    }
}

fn flags((read, write): (bool, bool)) -> epoll::EventFlags {
    let mut f = epoll::EventFlags::RDHUP;
    if read {
        f |= epoll::EventFlags::IN;
    }
    if write {
        f |= epoll::EventFlags::OUT;
    }
    f
}

/// A worker: its `epoll` set and the connections the acceptor handed it.
struct Worker {
    ep: OwnedFd,
    inbox: Mutex<Vec<(u64, TcpStream)>>,
}

fn work(w: Arc<Worker>, sh: Arc<Shared>, stop: Arc<dyn Fn() -> bool + Send + Sync>) {
    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut events = Vec::with_capacity(256);
    let mut scratch = vec![0u8; 64 << 10];
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while !stop() {
        events.clear();
        if let Err(e) = epoll::wait(&w.ep, spare_capacity(&mut events), Some(&tick)) {
            if e != rustix::io::Errno::INTR {
                eprintln!("cairn kv serve: epoll_wait: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        for ev in events.drain(..) {
            let token = ev.data.u64();
            if !conns.contains_key(&token) {
                for (t, stream) in crate::lock(&w.inbox).drain(..) {
                    conns.insert(
                        t,
                        Conn {
                            stream,
                            inb: Vec::new(),
                            out: Vec::new(),
                            sent: 0,
                            session: Session {
                                id: t,
                                resp3: false,
                                name: Vec::new(),
                            },
                            args: Args::default(),
                            closing: false,
                            interest: (true, false),
                        },
                    );
                }
            }
            let Some(c) = conns.get_mut(&token) else {
                continue;
            };
            let done = c.serve(&sh, &mut scratch);
            if done {
                let _ = epoll::delete(&w.ep, &c.stream);
                conns.remove(&token);
                sh.clients.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let want = c.wants();
            if want != c.interest {
                c.interest = want;
                if epoll::modify(
                    &w.ep,
                    &c.stream,
                    epoll::EventData::new_u64(token),
                    flags(want),
                )
                .is_err()
                {
                    conns.remove(&token);
                    sh.clients.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Serve on `listener` with `threads` workers until `stop` says so.
pub fn serve(
    sh: Arc<Shared>,
    listener: TcpListener,
    threads: usize,
    stop: Arc<dyn Fn() -> bool + Send + Sync>,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    // A connection costs a descriptor (and a few KiB while idle): as many as the
    // system lets this process have.
    if let Err(e) = cairn_media::sys::raise_open_files_limit() {
        eprintln!("cairn kv serve: cannot raise the limit of open files: {e}");
    }
    let workers: Vec<Arc<Worker>> = (0..threads.max(1))
        .map(|_| {
            Ok(Arc::new(Worker {
                ep: epoll::create(epoll::CreateFlags::CLOEXEC)?,
                inbox: Mutex::new(Vec::new()),
            }))
        })
        .collect::<io::Result<_>>()?;
    let handles: Vec<_> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let (w, sh, stop) = (w.clone(), sh.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("kv-serve-{i}"))
                .spawn(move || work(w, sh, stop))
        })
        .collect::<io::Result<_>>()?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    epoll::add(
        &ep,
        &listener,
        epoll::EventData::new_u64(0),
        epoll::EventFlags::IN,
    )?;
    let mut events = Vec::with_capacity(4);
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let mut next = 0usize;
    // When accept last said why it failed (once a second at most).
    let mut said = None;
    while !stop() {
        events.clear();
        match epoll::wait(&ep, spare_capacity(&mut events), Some(&tick)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors and the like: the listener stays, try again soon.
                Err(e) => {
                    if said
                        .is_none_or(|t: std::time::Instant| t.elapsed() >= Duration::from_secs(1))
                    {
                        eprintln!("cairn kv serve: accept: {e}");
                        said = Some(std::time::Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let token = sh.next_id.fetch_add(1, Ordering::Relaxed);
            let w = &workers[next % workers.len()];
            next += 1;
            sh.clients.fetch_add(1, Ordering::Relaxed);
            sh.connections.fetch_add(1, Ordering::Relaxed);
            // Registered first (an event that comes before the worker has the stream
            // is seen again: level-triggered).
            if epoll::add(
                &w.ep,
                &stream,
                epoll::EventData::new_u64(token),
                flags((true, false)),
            )
            .is_err()
            {
                sh.clients.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            crate::lock(&w.inbox).push((token, stream));
        }
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}
