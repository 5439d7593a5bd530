//! The server's front: one thread accepts connections and holds, in one `epoll` set,
//! every connection that belongs to no client and has no request running (command-line
//! tools between requests, and every connection until its first request has arrived
//! whole). A connection costs a thread only while a request of it runs, or while it is a
//! registered client's connection or upcall channel (at most two per log slot). A
//! process holding 10,000 idle connections costs the daemon 10,000 descriptors, a few
//! hundred bytes each, and no thread; one that sends part of a request and stops holds
//! nothing but its bytes.

use super::{serve, Daemon};
use cairn_media::sys;
use rustix::buffer::spare_capacity;
use rustix::event::epoll;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest request a connection that is not a client's may send: a registration, a
/// status or an administration request is a few hundred bytes. A larger announced
/// length closes the connection (a client's own connection, once registered, is read
/// by its thread, up to the protocol's `MAX_FRAME`).
pub(super) const FRONT_FRAME: usize = 64 << 10;

/// Threads beyond two per log slot: for the requests of connections that are no
/// client's (command-line tools), and registrations in progress. Requests that find them
/// all taken wait in the front for one.
const SPARE_THREADS: usize = 16;

/// The listener's and the wake-up's tokens in the `epoll` set (connections use their
/// ids, from 1).
const LISTENER: u64 = 0;
const WAKE: u64 = u64::MAX;

/// A connection waiting in the front: its socket (non-blocking, the only descriptor of
/// it the daemon holds), its id and peer, and the bytes of its next request read so far
/// (never beyond that request's end).
pub(super) struct Waiting {
    pub stream: UnixStream,
    pub id: u64,
    /// The peer's pid, uid and gid (`SO_PEERCRED` at accept).
    pub peer: (u32, u32, u32),
    pub buf: Vec<u8>,
}

impl Waiting {
    /// The length of the first request in `buf` with its 4-byte prefix, once the prefix
    /// is there; `Err` if it announces more than [`FRONT_FRAME`].
    fn frame_len(&self) -> Result<Option<usize>, u32> {
        let Some(prefix) = self.buf.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*prefix);
        if len as usize > FRONT_FRAME {
            return Err(len);
        }
        Ok(Some(4 + len as usize))
    }

    /// Read what the socket has, up to the end of the first request. `Ok(true)`: a whole
    /// request is buffered; `Ok(false)`: not yet; `Err`: the peer closed the connection,
    /// failed, or announced a request too large.
    fn read_request(&mut self) -> io::Result<bool> {
        loop {
            let want = match self.frame_len() {
                Ok(None) => 4,
                Ok(Some(n)) => n,
                Err(len) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "a request of {len} bytes from a connection that is no client's \
                             (at most {FRONT_FRAME})"
                        ),
                    ))
                }
            };
            if self.buf.len() >= want {
                if want == 4 {
                    continue;
                }
                return Ok(true);
            }
            let have = self.buf.len();
            self.buf.resize(want, 0);
            let r = self.stream.read(&mut self.buf[have..]);
            let got = *r.as_ref().unwrap_or(&0);
            self.buf.truncate(have + got);
            match r {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whole requests waiting for a thread, taken round-robin by the peer's pid: a process
/// that floods the daemon with requests delays another's by one request of its own.
#[derive(Default)]
struct Queue {
    order: VecDeque<u32>,
    by_pid: HashMap<u32, VecDeque<Waiting>>,
}

impl Queue {
    fn push(&mut self, w: Waiting) {
        let q = self.by_pid.entry(w.peer.0).or_default();
        if q.is_empty() {
            self.order.push_back(w.peer.0);
        }
        q.push_back(w);
    }

    fn pop(&mut self) -> Option<Waiting> {
        let pid = self.order.pop_front()?;
        let q = self
            .by_pid
            .get_mut(&pid)
            .expect("a pid in order has requests");
        let w = q.pop_front().expect("never empty");
        if q.is_empty() {
            self.by_pid.remove(&pid);
        } else {
            self.order.push_back(pid);
        }
        Some(w)
    }
}

/// The connections waiting in the front, and the threads serving the others.
pub(super) struct Front {
    ep: OwnedFd,
    /// Written when a thread is done with a connection (requests may queue for it).
    wake: OwnedFd,
    waiting: Mutex<HashMap<u64, Waiting>>,
    /// Connections a thread serves now, and the most there may be.
    threads: AtomicUsize,
    cap: usize,
}

impl Front {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold `w` until its next request has arrived whole.
    fn hold(&self, w: Waiting) -> io::Result<()> {
        debug_assert!(w.buf.is_empty());
        w.stream.set_nonblocking(true)?;
        // An event that comes before the connection is in the table is seen again
        // (level-triggered).
        epoll::add(
            &self.ep,
            &w.stream,
            epoll::EventData::new_u64(w.id),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
        self.waiting().insert(w.id, w);
        Ok(())
    }

    /// A thread stopped serving a connection that is no client's, between requests: it
    /// waits in the front again.
    pub(super) fn give_back(&self, w: Waiting) {
        let (pid, id) = (w.peer.0, w.id);
        if let Err(e) = self.hold(w) {
            tracing::warn!("pid {pid}: connection {id} dropped: {e}");
        }
        self.done();
    }

    /// A thread stopped serving a connection (given back, or closed).
    pub(super) fn done(&self) {
        let was = self.threads.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(was > 0 && was <= self.cap);
        // A full counter (the front has not read it yet) is as good as a write.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// Connections served by a thread now.
    fn threads(&self) -> usize {
        self.threads.load(Ordering::SeqCst)
    }

    /// Connections waiting in the front now.
    fn waiting_count(&self) -> usize {
        self.waiting().len()
    }
}

/// Accept connections and hand each whole request to a thread until a stop is asked
/// for. `slots`: the store's log slots (clients at once).
pub(super) fn run(d: &Arc<Daemon>, listener: &UnixListener, slots: usize) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    match sys::raise_open_files_limit() {
        Ok(n) => tracing::info!("up to {n} open descriptors (connections waiting cost one each)"),
        Err(e) => tracing::warn!("cannot raise the limit of open descriptors: {e}"),
    }
    let front = Arc::new(Front {
        ep: epoll::create(epoll::CreateFlags::CLOEXEC)?,
        wake: rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?,
        waiting: Mutex::new(HashMap::new()),
        threads: AtomicUsize::new(0),
        cap: 2 * slots + SPARE_THREADS,
    });
    epoll::add(
        &front.ep,
        listener,
        epoll::EventData::new_u64(LISTENER),
        epoll::EventFlags::IN,
    )?;
    epoll::add(
        &front.ep,
        &front.wake,
        epoll::EventData::new_u64(WAKE),
        epoll::EventFlags::IN,
    )?;
    let mut queue = Queue::default();
    let mut events = Vec::with_capacity(256);
    let tick = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    let mut accept_failed: Option<Instant> = None;
    while !d.stop.load(Ordering::SeqCst) && !sys::termination_requested() {
        events.clear();
        match epoll::wait(&front.ep, spare_capacity(&mut events), Some(&tick)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!("waiting for connections failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        for ev in events.drain(..) {
            match ev.data.u64() {
                LISTENER => accept_all(d, &front, listener, &mut accept_failed),
                WAKE => {
                    let _ = rustix::io::read(&front.wake, &mut [0u8; 8]);
                }
                id => {
                    if let Some(w) = readable(&front, id) {
                        queue.push(w);
                    }
                }
            }
        }
        // Requests to threads, as many as there may be.
        while front.threads() < front.cap {
            let Some(w) = queue.pop() else { break };
            spawn(d, &front, w);
        }
    }
    Ok(())
}

/// Accept every connection pending on the listener into the front.
fn accept_all(
    d: &Arc<Daemon>,
    front: &Front,
    listener: &UnixListener,
    failed: &mut Option<Instant>,
) {
    loop {
        let s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, most often: the connection waits in the backlog.
                // Said once a second at most; the loop comes back in 10 ms.
                if failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(
                        "accept failed ({} connections waiting, {} served by threads): {e}",
                        front.waiting_count(),
                        front.threads()
                    );
                    *failed = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        let peer = match sys::peer_cred(&s) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("connection without credentials refused: {e}");
                continue;
            }
        };
        let w = Waiting {
            stream: s,
            id: d.next_conn.fetch_add(1, Ordering::SeqCst),
            peer,
            buf: Vec::new(),
        };
        if let Err(e) = front.hold(w) {
            tracing::warn!("pid {}: connection refused: {e}", peer.0);
        }
    }
}

/// Connection `id` has bytes (or closed): read them; a whole request leaves the front
/// (returned, to go to a thread).
fn readable(front: &Front, id: u64) -> Option<Waiting> {
    let mut t = front.waiting();
    let w = t.get_mut(&id)?;
    let whole = w.read_request();
    if let Ok(false) = whole {
        return None;
    }
    let w = t.remove(&id).expect("present");
    drop(t);
    let _ = epoll::delete(&front.ep, &w.stream);
    match whole {
        Ok(_) => Some(w),
        Err(e) => {
            if e.kind() == io::ErrorKind::InvalidData {
                tracing::info!("pid {}: bad request, closing: {e}", w.peer.0);
            }
            None
        }
    }
}

/// Serve `w`'s request, and what follows of the connection, on a thread of its own.
fn spawn(d: &Arc<Daemon>, front: &Arc<Front>, w: Waiting) {
    let was = front.threads.fetch_add(1, Ordering::SeqCst);
    debug_assert!(was < front.cap);
    let (d2, f2, pid) = (d.clone(), front.clone(), w.peer.0);
    let spawned = std::thread::Builder::new()
        .name("cairnd-conn".into())
        .spawn(move || {
            let _log = d2.mark_thread();
            serve(&d2, &f2, w)
        });
    if let Err(e) = spawned {
        // The connection is dropped with the closure.
        front.threads.fetch_sub(1, Ordering::SeqCst);
        tracing::warn!("pid {pid}: cannot serve a connection: {e}");
    }
}
