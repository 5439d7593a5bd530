//! The remote tier: a lower tier whose segments are objects of a Ceph RADOS pool, through
//! librados (the `ceph` crate, which holds the only `unsafe` of this path).
//!
//! A segment written under generation `gen` is the objects
//! `cairn.<store uuid>.<tier>.<segment>.<gen>.<chunk>` (numbers in hex), each at most
//! [`CHUNK`] bytes: RADOS refuses a write above `osd_max_write_size` (90 MiB by default)
//! and an object above `osd_max_object_size` (128 MiB). The generation in the name means a
//! reused segment never aliases its old objects, and a write is acknowledged
//! (`rados_write_full` returns once every replica has it) before anything names it.
//! Every chunk of a written segment is an object (empty past the round's data), so a
//! missing object is a loss and reads as an error, while bytes past an object's end read
//! as zeros, as a file's unwritten space does.

use cairn_area::{fs_err, TierDevice};
use cairn_format::map::TIER_NAMES;
use cairn_format::superblock::TierGeom;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most bytes of a segment one object holds.
pub const CHUNK: u64 = 16 << 20;

/// Where a remote tier lives: `ceph:POOL`, the cluster's configuration file (it names
/// the monitors and the keyring) and the user to connect as (`admin` is
/// `client.admin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub pool: String,
    pub conf: PathBuf,
    pub user: String,
}

impl Spec {
    /// `ceph:POOL`, with the configuration file and user (defaults:
    /// `/etc/ceph/ceph.conf`, `admin`).
    pub fn parse(url: &str, conf: Option<&Path>, user: Option<&str>) -> io::Result<Spec> {
        let pool = url.strip_prefix("ceph:").ok_or_else(|| {
            fs_err(
                libc::EINVAL,
                format!(
                    "remote tier {url:?}: expected ceph:POOL (Ceph RADOS is the only remote store)"
                ),
            )
        })?;
        if pool.is_empty() || pool.contains(['/', '\0']) {
            return Err(fs_err(
                libc::EINVAL,
                format!("remote tier {url:?}: a pool name, without '/'"),
            ));
        }
        Ok(Spec {
            pool: pool.to_string(),
            conf: conf.map_or_else(|| PathBuf::from("/etc/ceph/ceph.conf"), Path::to_path_buf),
            user: user.unwrap_or("admin").to_string(),
        })
    }
}

/// An error of librados as an `io::Error` with its errno, saying what was done.
fn rados_err(what: &str, e: ceph::error::RadosError) -> io::Error {
    // The errno's own text is added by `fs_err`.
    match &e {
        ceph::error::RadosError::ApiError(n) => fs_err(*n as i32, what),
        ceph::error::RadosError::IoError(io) => fs_err(
            io.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {io}"),
        ),
        _ => fs_err(libc::EIO, format!("{what}: {e}")),
    }
}

/// A connection to one pool.
pub struct Pool {
    spec: Spec,
    /// Dropped before `_owner` (declaration order): the I/O context needs the cluster.
    ioctx: ceph::ceph::IoCtx,
    /// The cluster handle (`ceph::ceph::Rados`, which may not move between threads)
    /// lives on the thread that connected, which shuts it down once this is dropped.
    _owner: std::sync::mpsc::Sender<()>,
}

impl Pool {
    /// Connect to the cluster and open the pool, giving up after `timeout` with
    /// `ETIMEDOUT` (librados itself would wait minutes for unreachable monitors; the
    /// attempt then goes on in the background until librados gives up).
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
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
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
                let io = rados
                    .get_rados_ioctx(&pool)
                    .map_err(|e| rados_err(&format!("opening the RADOS pool {pool:?}"), e));
                let opened = io.is_ok();
                // Nobody waiting any more (timed out): the context goes with the error.
                if tx.send(io).is_err() || !opened {
                    return;
                }
                // Until the pool is dropped (its context first).
                let _ = stop_rx.recv();
                drop(rados);
            })?;
        let ioctx = rx.recv_timeout(timeout).map_err(|_| {
            fs_err(
                libc::ETIMEDOUT,
                format!(
                    "the Ceph cluster of {conf} did not answer in {} s (are its monitors up?)",
                    timeout.as_secs()
                ),
            )
        })??;
        Ok(Pool {
            spec: spec.clone(),
            ioctx,
            _owner: stop_tx,
        })
    }

    /// Write `data` as the whole of object `name` (replacing it), acknowledged by every
    /// replica when it returns.
    pub fn put(&self, name: &str, data: &[u8]) -> io::Result<()> {
        self.ioctx.rados_object_write_full(name, data).map_err(|e| {
            rados_err(
                &format!("writing object {name} to pool {}", self.spec.pool),
                e,
            )
        })
    }

    /// Read from byte `off` of object `name` into `buf`: the bytes read, fewer than
    /// `buf.len()` only where the object ends. `ENOENT` if there is no such object.
    pub fn read(&self, name: &str, off: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let mut v = Vec::with_capacity(buf.len() - done);
            let n = self
                .ioctx
                .rados_object_read(name, &mut v, off + done as u64)
                .map_err(|e| {
                    rados_err(
                        &format!("reading object {name} of pool {}", self.spec.pool),
                        e,
                    )
                })?;
            if n <= 0 {
                break;
            }
            let n = (n as usize).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&v[..n]);
            done += n;
        }
        Ok(done)
    }

    /// Remove object `name`; `Ok(false)` if there was none.
    pub fn remove(&self, name: &str) -> io::Result<bool> {
        match self.ioctx.rados_object_remove(name) {
            Ok(()) => Ok(true),
            Err(ceph::error::RadosError::ApiError(e)) if e as i32 == libc::ENOENT => Ok(false),
            Err(e) => Err(rados_err(
                &format!("removing object {name} from pool {}", self.spec.pool),
                e,
            )),
        }
    }

    /// The size of object `name`, if it exists.
    pub fn size(&self, name: &str) -> io::Result<Option<u64>> {
        match self.ioctx.rados_object_stat(name) {
            Ok((len, _)) => Ok(Some(len)),
            Err(ceph::error::RadosError::ApiError(e)) if e as i32 == libc::ENOENT => Ok(None),
            Err(e) => Err(rados_err(
                &format!("stat of object {name} in pool {}", self.spec.pool),
                e,
            )),
        }
    }
}

/// A lower tier whose segments are objects of a pool ([`TierDevice`]).
pub struct RadosTier {
    tier: u8,
    /// `cairn.<uuid>.<tier>`.
    prefix: String,
    segment_bytes: u64,
    pool: Pool,
}

impl RadosTier {
    /// Tier `tier` (1 or 2) of the store `uuid`, with segments of `geom`, in `pool`.
    pub fn new(pool: Pool, uuid: &[u8; 16], tier: u8, geom: TierGeom) -> RadosTier {
        let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
        RadosTier {
            tier,
            prefix: format!("cairn.{hex}.{tier}"),
            segment_bytes: geom.segment_bytes(),
            pool,
        }
    }

    /// The name of chunk `chunk` of segment `seg` written under `gen`.
    pub fn object(&self, seg: u64, gen: u64, chunk: u64) -> String {
        format!("{}.{seg:x}.{gen:x}.{chunk:x}", self.prefix)
    }

    /// The objects a segment is cut into.
    fn chunks(&self) -> u64 {
        self.segment_bytes.div_ceil(CHUNK)
    }

    /// Byte `off` of the tier, inside segment `seg`: its chunk and offset there.
    fn locate(&self, seg: u64, off: u64) -> io::Result<(u64, u64)> {
        let start = seg * self.segment_bytes;
        if off < start || off >= start + self.segment_bytes {
            return Err(fs_err(
                libc::EINVAL,
                format!(
                    "byte {off} of the {} tier is not in segment {seg}",
                    TIER_NAMES[self.tier.min(2) as usize]
                ),
            ));
        }
        let rel = off - start;
        Ok((rel / CHUNK, rel % CHUNK))
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl TierDevice for RadosTier {
    fn read(&self, seg: u64, gen: u64, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let (chunk, at) = self.locate(seg, off + done as u64)?;
            let n = ((CHUNK - at) as usize).min(buf.len() - done);
            let got =
                self.pool
                    .read(&self.object(seg, gen, chunk), at, &mut buf[done..done + n])?;
            // Past what the round wrote: nothing, as a file's unwritten space.
            buf[done + got..done + n].fill(0);
            done += n;
        }
        Ok(())
    }

    fn write_segment(&self, seg: u64, gen: u64, off: u64, data: &[u8]) -> io::Result<()> {
        if off != seg * self.segment_bytes || data.len() as u64 > self.segment_bytes {
            return Err(fs_err(
                libc::EINVAL,
                format!(
                    "segment {seg} is written whole, from its start ({} bytes at {off})",
                    data.len()
                ),
            ));
        }
        // Every chunk of the segment is an object, those past the data empty: a missing
        // object is then always a loss (an error), never space left unwritten.
        for c in 0..self.chunks() {
            let from = ((c * CHUNK) as usize).min(data.len());
            let to = (((c + 1) * CHUNK) as usize).min(data.len());
            self.pool.put(&self.object(seg, gen, c), &data[from..to])?;
        }
        Ok(())
    }

    fn discard(&self, seg: u64, gen: u64, _off: u64, _len: u64) -> io::Result<()> {
        for c in 0..self.chunks() {
            self.pool.remove(&self.object(seg, gen, c))?;
        }
        Ok(())
    }
}
