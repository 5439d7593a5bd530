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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The largest request a connection that is not a client's may send: a registration, a
/// status or an administration request is a few hundred bytes. A larger announced
/// length closes the connection (a client's own connection, once registered, is read
/// by its thread, up to the protocol's `MAX_FRAME`).
const FRONT_FRAME: usize = 64 << 10;

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
                Ok(Some(n)) if self.buf.len() >= n => return Ok(true),
                Ok(Some(n)) => n,
                Ok(None) => 4,
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

/// The worker threads: `alive` of them (at most the cap), `idle` of which wait for a
/// connection in `jobs`.
#[derive(Default)]
struct Workers {
    jobs: VecDeque<Waiting>,
    idle: usize,
    alive: usize,
}

/// How long a worker with nothing to do waits for a connection before it exits.
const WORKER_IDLE: Duration = Duration::from_secs(30);

/// The connections waiting in the front, and the threads serving the others.
pub(super) struct Front {
    ep: OwnedFd,
    /// Written when a worker becomes idle (requests may queue for it).
    wake: OwnedFd,
    waiting: Mutex<HashMap<u64, Waiting>>,
    workers: Mutex<Workers>,
    /// Signalled when `workers.jobs` has a connection.
    work: Condvar,
    /// The most worker threads.
    cap: usize,
}

impl Front {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Workers> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
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

    /// A worker stopped serving a connection that is no client's, between requests: it
    /// waits in the front again.
    pub(super) fn give_back(&self, w: Waiting) {
        let (pid, id) = (w.peer.0, w.id);
        if let Err(e) = self.hold(w) {
            tracing::warn!("pid {pid}: connection {id} dropped: {e}");
        }
    }

    /// Worker threads alive now.
    fn threads(&self) -> usize {
        self.workers().alive
    }

    /// Whether a connection can go to a worker now: an idle one not yet given one, or
    /// room for another.
    fn has_room(&self) -> bool {
        let g = self.workers();
        g.idle > g.jobs.len() || g.alive < self.cap
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
        workers: Mutex::new(Workers::default()),
        work: Condvar::new(),
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
        // Requests to workers: idle ones first, then new ones up to the cap. (Only this
        // thread hands work out, so room seen here is still there.)
        while front.has_room() {
            let Some(w) = queue.pop() else { break };
            dispatch(d, &front, w);
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

/// Give `w` to an idle worker, or to a new one ([`Front::has_room`] said there is room).
fn dispatch(d: &Arc<Daemon>, front: &Arc<Front>, w: Waiting) {
    let mut g = front.workers();
    debug_assert!(g.idle <= g.alive && g.alive <= front.cap);
    if g.idle > g.jobs.len() {
        g.jobs.push_back(w);
        front.work.notify_one();
        return;
    }
    assert!(g.alive < front.cap, "dispatch without room");
    g.alive += 1;
    drop(g);
    let (d2, f2, pid) = (d.clone(), front.clone(), w.peer.0);
    let spawned = std::thread::Builder::new()
        .name("cairnd-conn".into())
        .spawn(move || {
            let _log = d2.mark_thread();
            let _ = cairn_media::sys::request_slice(std::time::Duration::from_micros(100));
            work(&d2, &f2, w)
        });
    if let Err(e) = spawned {
        // The connection is dropped with the closure.
        front.workers().alive -= 1;
        tracing::warn!("pid {pid}: cannot serve a connection: {e}");
    }
}

/// A worker: serve `first` (its request, and the connection while it is a client's),
/// then the connections the front hands it, until none came for [`WORKER_IDLE`].
fn work(d: &Daemon, front: &Front, first: Waiting) {
    let mut job = Some(first);
    while let Some(w) = job.take() {
        serve(d, front, w);
        let mut g = front.workers();
        g.idle += 1;
        // A full counter (the front has not read it yet) is as good as a write.
        let _ = rustix::io::write(&front.wake, &1u64.to_ne_bytes());
        let deadline = Instant::now() + WORKER_IDLE;
        loop {
            if let Some(w) = g.jobs.pop_front() {
                job = Some(w);
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || d.stop.load(Ordering::SeqCst) {
                g.alive -= 1;
                break;
            }
            g = front
                .work
                .wait_timeout(g, left.min(Duration::from_millis(500)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        g.idle -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn waiting() -> (Waiting, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let w = Waiting {
            stream: a,
            id: 1,
            peer: (1, 0, 0),
            buf: Vec::new(),
        };
        (w, b)
    }

    #[test]
    fn requests_are_read_whole_and_no_further() {
        let (mut w, mut peer) = waiting();
        assert!(!w.read_request().unwrap(), "nothing yet");
        // The prefix in two pieces, then the body, then the next request's first byte.
        peer.write_all(&[5, 0]).unwrap();
        assert!(!w.read_request().unwrap());
        peer.write_all(&[0, 0, 1, 2, 3]).unwrap();
        assert!(!w.read_request().unwrap());
        peer.write_all(&[4, 5, 9]).unwrap();
        assert!(w.read_request().unwrap());
        assert_eq!(w.buf, [5, 0, 0, 0, 1, 2, 3, 4, 5], "not a byte of the next");
        // An empty request is whole at once (its decoding fails later, on its thread):
        // it once made this loop spin for ever.
        let (mut w, mut peer) = waiting();
        peer.write_all(&[0, 0, 0, 0]).unwrap();
        assert!(w.read_request().unwrap());
        assert_eq!(w.buf.len(), 4);
    }

    #[test]
    fn too_large_or_closed_is_an_error() {
        let (mut w, mut peer) = waiting();
        peer.write_all(&(FRONT_FRAME as u32 + 1).to_le_bytes())
            .unwrap();
        let e = w.read_request().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        let (mut w, mut peer) = waiting();
        peer.write_all(&(FRONT_FRAME as u32).to_le_bytes()).unwrap();
        peer.write_all(&[1; 100]).unwrap();
        assert!(!w.read_request().unwrap(), "the largest allowed, in part");
        drop(peer);
        let e = w.read_request().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn the_queue_takes_turns_by_process() {
        let mut q = Queue::default();
        let w = |pid: u32, id: u64| Waiting {
            stream: UnixStream::pair().unwrap().0,
            id,
            peer: (pid, 0, 0),
            buf: Vec::new(),
        };
        for id in 1..=4 {
            q.push(w(7, id));
        }
        q.push(w(8, 10));
        q.push(w(9, 20));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|w| w.id)).collect();
        assert_eq!(order, [1, 10, 20, 2, 3, 4]);
    }
}
