//! A connection to one RADOS pool whose every operation is bounded in time.
//!
//! librados waits for ever on a cluster it cannot reach (its own timeouts,
//! `rados_osd_op_timeout` and `rados_mon_op_timeout`, are 0 unless the cluster's
//! configuration sets them). Cairn must never hang a migration round or a client's read
//! on that, so every operation runs on one of a few I/O threads and the caller waits at
//! most the pool's timeout: then it gets `ETIMEDOUT`. An operation given up on that way
//! is skipped if no thread has started it yet; one already started may still land (a
//! write, as an object nothing names: the remote tier sweeps those).
//!
//! librados' own timeouts are set to the pool's too (in whole seconds, rounded up), so
//! that an I/O thread is never lost to an operation librados never finishes: reads of a
//! placement group that a one-OSD Ceph 16.2 cluster left "laggy" after it was stopped
//! and continued (SIGSTOP, SIGCONT) were seen to wait for ever, and with them every I/O
//! thread. A librados timeout reads as any other (`rados_err`). Reads,
//! whose latency a client waits for, run on the caller's thread under that bound alone
//! ([`Pool::read`]).

use crate::{rados_err, Spec};
use cairn_area::{fs_err, SharedBuf};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest wait for the cluster's health.
const HEALTH_LIMIT: Duration = Duration::from_secs(5);

/// I/O threads per pool: the most operations in flight at once.
pub const IO_THREADS: usize = 4;

/// The I/O context, shared by the I/O threads.
struct Io {
    /// Dropped before `_owner` (declaration order): the context needs the cluster.
    ioctx: ceph::ceph::IoCtx,
    /// The cluster handle (`ceph::ceph::Rados`, which may not move between threads)
    /// lives on the thread that connected, which shuts it down once this is dropped,
    /// after the last I/O thread let go of the context.
    _owner: Sender<Ask>,
}

/// A question for the thread that holds the cluster handle.
enum Ask {
    /// The cluster's health (`ceph health --format json`).
    Health(mpsc::SyncSender<io::Result<Health>>),
}

/// The cluster's health: its status (`HEALTH_OK`, `HEALTH_WARN`, `HEALTH_ERR`) and the
/// checks that fail, by code (`OSD_FULL`, `POOL_FULL`, …) with their summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    pub checks: Vec<(String, String)>,
}

impl Health {
    /// From `ceph health --format json`'s output.
    pub fn parse(json: &[u8]) -> io::Result<Health> {
        let bad = |why: &str| fs_err(libc::EIO, format!("the cluster's health: {why}"));
        let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| bad(&e.to_string()))?;
        let status = v["status"].as_str().ok_or_else(|| bad("no status"))?;
        let checks = v["checks"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(code, c)| {
                        let msg = c["summary"]["message"].as_str().unwrap_or_default();
                        (code.clone(), msg.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Health {
            status: status.to_string(),
            checks,
        })
    }

    /// Whether an OSD or a pool is full (RADOS holds writes back).
    pub fn full(&self) -> bool {
        self.checks
            .iter()
            .any(|(c, _)| c == "OSD_FULL" || c == "POOL_FULL")
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        for (i, (_, m)) in self.checks.iter().enumerate() {
            write!(f, "{}{m}", if i == 0 { ": " } else { "; " })?;
        }
        Ok(())
    }
}

type Job = Box<dyn FnOnce(&Io) + Send>;

/// Bytes `range` of a shared buffer: an object's data, as the I/O threads hold it
/// (without a copy, and for as long as a write given up on still runs).
pub struct Slice {
    pub buf: SharedBuf,
    pub range: std::ops::Range<usize>,
}

impl Slice {
    /// A copy of `data`.
    pub fn copy_of(data: &[u8]) -> Slice {
        let mut b = cairn_media::AlignedBuf::zeroed(data.len());
        b.copy_from_slice(data);
        Slice {
            buf: Arc::new(b),
            range: 0..data.len(),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }
}

/// A connection to one pool.
pub struct Pool {
    /// `None` once dropped.
    jobs: Mutex<Option<Sender<Job>>>,
    /// The I/O context, for reads made on the caller's thread; `None` once dropped.
    io: Option<Arc<Io>>,
    pool: String,
    timeout: Duration,
    /// Questions for the cluster handle's thread; `None` once dropped.
    ask: Mutex<Option<Sender<Ask>>>,
    /// Told when the cluster handle was shut down.
    down: Mutex<Receiver<()>>,
}

impl Drop for Pool {
    /// Let the I/O threads end, then wait (at most the timeout) until the cluster
    /// handle is shut down: a process that exits meanwhile would run librados' own
    /// destructors under its threads (and abort).
    fn drop(&mut self) {
        self.io.take();
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.ask.lock().unwrap_or_else(|e| e.into_inner()).take();
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let _ = down.recv_timeout(self.timeout);
    }
}

impl Pool {
    /// Connect to the cluster and open the pool; every later operation (and this one)
    /// gives up after `timeout` with `ETIMEDOUT`.
    pub fn connect(spec: &Spec, timeout: Duration) -> io::Result<Pool> {
        let conf = spec
            .conf
            .to_str()
            .ok_or_else(|| fs_err(libc::EINVAL, format!("{}: not UTF-8", spec.conf.display())))?;
        if !spec.conf.is_file() {
            return Err(fs_err(
                libc::ENOENT,
                format!("no Ceph configuration file at {conf} (--ceph-conf)"),
            ));
        }
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<Ask>();
        let (down_tx, down) = mpsc::channel::<()>();
        let (user, conf_s, pool) = (spec.user.clone(), conf.to_string(), spec.pool.clone());
        std::thread::Builder::new()
            .name("cairn-rados".into())
            .spawn(move || {
                let rados = match ceph::ceph::connect_to_ceph(&user, &conf_s) {
                    Ok(r) => r,
                    Err(e) => {
                        let what =
                            format!("connecting to the Ceph cluster of {conf_s} as client.{user}");
                        let _ = tx.send(Err(rados_err(&what, e)));
                        return;
                    }
                };
                let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
                let limits = ["rados_osd_op_timeout", "rados_mon_op_timeout"]
                    .iter()
                    .try_for_each(|k| crate::ffi::conf_set(&rados, k, &secs.to_string()));
                let io = limits.and_then(|()| {
                    rados
                        .get_rados_ioctx(&pool)
                        .map_err(|e| rados_err(&format!("opening the RADOS pool {pool:?}"), e))
                });
                let opened = io.is_ok();
                // Nobody waiting any more (timed out): the context goes with the error.
                if tx.send(io).is_err() || !opened {
                    return;
                }
                // Until the context is dropped.
                while let Ok(Ask::Health(reply)) = stop_rx.recv() {
                    let cmd = serde_json::json!({"prefix": "health", "format": "json"});
                    let h = rados
                        .ceph_mon_command_without_data(&cmd)
                        .map_err(|e| rados_err("asking the cluster's health", e))
                        .and_then(|(out, _)| Health::parse(&out));
                    let _ = reply.send(h);
                }
                drop(rados);
                let _ = down_tx.send(());
            })?;
        let ioctx = rx.recv_timeout(timeout).map_err(|_| {
            fs_err(
                libc::ETIMEDOUT,
                format!(
                    "the Ceph cluster of {conf} did not answer in {} (are its monitors up?)",
                    seconds(timeout)
                ),
            )
        })??;
        let io = Arc::new(Io {
            ioctx,
            _owner: stop_tx.clone(),
        });
        let (jobs, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..IO_THREADS {
            let (io, rx) = (io.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("cairn-rados-io{i}"))
                .spawn(move || io_thread(&io, &rx))?;
        }
        Ok(Pool {
            jobs: Mutex::new(Some(jobs)),
            io: Some(io),
            pool: spec.pool.clone(),
            timeout,
            ask: Mutex::new(Some(stop_tx)),
            down: Mutex::new(down),
        })
    }

    /// Run `f` on an I/O thread; wait at most the timeout for its result. `what` says
    /// what it does, for the error.
    fn call<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce(&Io) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        let cancelled = Arc::new(AtomicBool::new(false));
        let c = cancelled.clone();
        self.submit(Box::new(move |io: &Io| {
            if !c.load(Ordering::Acquire) {
                let _ = tx.send(f(io));
            }
        }))?;
        rx.recv_timeout(self.timeout).unwrap_or_else(|_| {
            cancelled.store(true, Ordering::Release);
            Err(self.no_answer(what))
        })
    }

    fn submit(&self, job: Job) -> io::Result<()> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| fs_err(libc::EIO, "the RADOS I/O threads are gone"))
    }

    /// Write `data` as the whole of object `name` (replacing it), acknowledged by every
    /// replica when it returns.
    pub fn put(&self, name: &str, data: &[u8]) -> io::Result<()> {
        self.put_many(vec![(name.to_string(), Slice::copy_of(data))])
    }

    /// The cluster's health, asked within `limit`.
    pub fn health(&self, limit: Duration) -> io::Result<Health> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.ask
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|a| a.send(Ask::Health(tx)).ok())
            .ok_or_else(|| fs_err(libc::EIO, "the RADOS cluster handle is gone"))?;
        rx.recv_timeout(limit).unwrap_or_else(|_| {
            Err(fs_err(
                libc::ETIMEDOUT,
                "the Ceph cluster's monitors did not answer",
            ))
        })
    }

    /// `ENOSPC` and why if the cluster says it is full (RADOS then holds writes back
    /// until it is not: they time out).
    pub fn full(&self) -> Option<io::Error> {
        let h = self.health(self.timeout.min(HEALTH_LIMIT)).ok()?;
        h.full().then(|| {
            fs_err(
                libc::ENOSPC,
                format!("the Ceph cluster of pool {} is full: {h}", self.pool),
            )
        })
    }

    /// Write every `(name, data)` as a whole object, up to [`IO_THREADS`] at once;
    /// returns when all are acknowledged, or with the first failure (then some may have
    /// been written: the caller names none of them). A write that times out on a full
    /// cluster is `ENOSPC`, with the cluster's health.
    pub fn put_many(&self, objects: Vec<(String, Slice)>) -> io::Result<()> {
        let deadline = std::time::Instant::now() + self.timeout;
        // Set once this call returns: writes no thread has started yet are skipped.
        let over = Arc::new(AtomicBool::new(false));
        let _over = SetOnDrop(over.clone());
        let mut waiting = Vec::new();
        for (name, data) in objects {
            let (tx, rx) = mpsc::sync_channel(1);
            let what = format!("writing object {name} to pool {}", self.pool);
            let (w, over) = (what.clone(), over.clone());
            self.submit(Box::new(move |io: &Io| {
                if over.load(Ordering::Acquire) {
                    return;
                }
                let r = io
                    .ioctx
                    .rados_object_write_full(&name, data.bytes())
                    .map_err(|e| rados_err(&w, e));
                // Before the answer: the caller may take the buffer back.
                drop(data);
                let _ = tx.send(r);
            }))?;
            waiting.push((what, rx));
        }
        for (what, rx) in waiting {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            // Given up on here, or by librados (whose own timeout may come first).
            let r = rx
                .recv_timeout(left)
                .unwrap_or_else(|_| Err(self.no_answer(&what)));
            if let Err(e) = r {
                let timed_out = cairn_area::errno_of(&e) == libc::ETIMEDOUT;
                return Err(timed_out.then(|| self.full()).flatten().unwrap_or(e));
            }
        }
        Ok(())
    }

    /// Read from byte `off` of object `name` into `buf`: the bytes read, fewer than
    /// `buf.len()` only where the object ends. `ENOENT` if there is no such object.
    /// Runs on the caller's thread (a cold read is latency: no hand-off to an I/O
    /// thread), so it is bounded by librados' own timeout, the pool's rounded up to
    /// whole seconds.
    pub fn read(&self, name: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let what = format!("reading object {name} of pool {}", self.pool);
        let io = self
            .io
            .as_ref()
            .ok_or_else(|| fs_err(libc::EIO, "the RADOS I/O context is gone"))?;
        let data = read_object(io, name, off, buf.len(), &what)?;
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    /// `ETIMEDOUT`: the cluster did not answer `what` in the pool's time.
    fn no_answer(&self, what: &str) -> io::Error {
        fs_err(
            libc::ETIMEDOUT,
            format!(
                "{what}: the Ceph cluster did not answer in {}",
                seconds(self.timeout)
            ),
        )
    }

    /// Remove object `name`; `Ok(false)` if there was none.
    pub fn remove(&self, name: &str) -> io::Result<bool> {
        let what = format!("removing object {name} from pool {}", self.pool);
        let (n, w) = (name.to_string(), what.clone());
        self.call(&what, move |io| remove_object(io, &n, &w))
    }

    /// Remove the objects `names` in the background, without waiting; `done` gets the
    /// first failure, if any.
    pub fn remove_later(
        &self,
        names: Vec<String>,
        done: impl FnOnce(io::Result<()>) + Send + 'static,
    ) -> io::Result<()> {
        let pool = self.pool.clone();
        self.submit(Box::new(move |io: &Io| {
            let r = names.iter().try_for_each(|n| {
                remove_object(io, n, &format!("removing object {n} from pool {pool}")).map(|_| ())
            });
            done(r)
        }))
    }

    /// The size of object `name`, if it exists.
    pub fn size(&self, name: &str) -> io::Result<Option<u64>> {
        let what = format!("stat of object {name} in pool {}", self.pool);
        let (n, w) = (name.to_string(), what.clone());
        self.call(&what, move |io| match io.ioctx.rados_object_stat(&n) {
            Ok((len, _)) => Ok(Some(len)),
            Err(ceph::error::RadosError::ApiError(e)) if e as i32 == libc::ENOENT => Ok(None),
            Err(e) => Err(rados_err(&w, e)),
        })
    }

    /// The names of the pool's objects that start with `prefix`.
    pub fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let what = format!("listing the objects of pool {}", self.pool);
        let (p, w) = (prefix.to_string(), what.clone());
        self.call(&what, move |io| {
            let ctx = io
                .ioctx
                .rados_list_pool_objects()
                .map_err(|e| rados_err(&w, e))?;
            Ok(ceph::ceph::Pool { ctx }
                .map(|o| o.name)
                .filter(|n| n.starts_with(&p))
                .collect())
        })
    }
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn io_thread(io: &Io, jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = match jobs.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(j) => j,
            Err(_) => return,
        };
        job(io);
    }
}

fn read_object(io: &Io, name: &str, off: u64, len: usize, what: &str) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let mut v = Vec::with_capacity(len - out.len());
        let n = io
            .ioctx
            .rados_object_read(name, &mut v, off + out.len() as u64)
            .map_err(|e| rados_err(what, e))?;
        if n <= 0 {
            break;
        }
        let n = (n as usize).min(len - out.len());
        out.extend_from_slice(&v[..n]);
    }
    Ok(out)
}

fn remove_object(io: &Io, name: &str, what: &str) -> io::Result<bool> {
    match io.ioctx.rados_object_remove(name) {
        Ok(()) => Ok(true),
        Err(ceph::error::RadosError::ApiError(e)) if e as i32 == libc::ENOENT => Ok(false),
        Err(e) => Err(rados_err(what, e)),
    }
}

/// `d` as a user reads it: whole seconds ("5 s") or tenths ("2.5 s"), never rounded
/// down to a bound it was not ("2 s" for 2.5 s).
fn seconds(d: Duration) -> String {
    let tenths = d.as_millis().div_ceil(100);
    if tenths.is_multiple_of(10) {
        format!("{} s", tenths / 10)
    } else {
        format!("{}.{} s", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::{seconds, Health};
    use std::time::Duration;

    #[test]
    fn timeouts_are_said_as_they_are() {
        assert_eq!(seconds(Duration::from_secs(5)), "5 s");
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(seconds(Duration::from_millis(2501)), "2.6 s");
        assert_eq!(seconds(Duration::from_millis(100)), "0.1 s");
    }

    #[test]
    fn health_says_full_only_when_an_osd_or_a_pool_is() {
        let full = br#"{"status":"HEALTH_ERR","checks":{"OSD_FULL":{"severity":"HEALTH_ERR","summary":{"message":"1 full osd(s)","count":1},"muted":false},"POOL_FULL":{"severity":"HEALTH_WARN","summary":{"message":"1 pool(s) full","count":1},"muted":false}},"mutes":[]}"#;
        let h = Health::parse(full).unwrap();
        assert!(h.full());
        assert_eq!(h.to_string(), "HEALTH_ERR: 1 full osd(s); 1 pool(s) full");
        let near = br#"{"status":"HEALTH_WARN","checks":{"OSD_NEARFULL":{"summary":{"message":"1 nearfull osd(s)"}}}}"#;
        assert!(!Health::parse(near).unwrap().full());
        let ok = br#"{"status":"HEALTH_OK","checks":{},"mutes":[]}"#;
        let h = Health::parse(ok).unwrap();
        assert!(!h.full() && h.to_string() == "HEALTH_OK");
        assert!(Health::parse(b"not json").is_err());
        assert!(Health::parse(br#"{"checks":{}}"#).is_err());
    }
}
