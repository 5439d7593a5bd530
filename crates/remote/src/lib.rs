//! The remote tier: a lower tier whose segments are objects of a Ceph RADOS pool, through
//! librados (the `ceph` crate, which holds the `unsafe` of this path but for one call,
//! in `ffi`).
//!
//! A segment written under generation `gen` is the objects
//! `cairn.<store uuid>.<tier>.<segment>.<gen>.<chunk>` (numbers in hex), each at most
//! [`CHUNK`] bytes: RADOS refuses a write above `osd_max_write_size` (90 MiB by default)
//! and an object above `osd_max_object_size` (128 MiB). The generation in the name means a
//! reused segment never aliases its old objects, and a write is acknowledged
//! (`rados_write_full` returns once every replica has it) before anything names it.
//! Every chunk of a written segment is an object (empty past the round's data), so a
//! missing object is a loss and reads as an error, while bytes past an object's end read
//! as zeros, as a file's unwritten space does. [`pool`] bounds every librados call in
//! time; [`tier`] is the tier device; [`backup`] keeps whole stores in a pool.
#![deny(unsafe_code)]

pub mod backup;
mod ffi;
mod pool;
mod tier;

pub use pool::{Pool, Slice};
pub use tier::{RadosTier, RemoteStats, CHUNK};

use cairn_area::fs_err;
use std::io;
use std::path::{Path, PathBuf};

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
pub(crate) fn rados_err(what: &str, e: ceph::error::RadosError) -> io::Error {
    // The errno's own text is added by `fs_err`.
    match &e {
        // librados' own operation timeout (`Pool` sets it): the cluster did not answer.
        ceph::error::RadosError::ApiError(n) if *n as i32 == libc::ETIMEDOUT => fs_err(
            libc::ETIMEDOUT,
            format!("{what}: the Ceph cluster did not answer in time"),
        ),
        ceph::error::RadosError::ApiError(n) => fs_err(*n as i32, what),
        ceph::error::RadosError::IoError(io) => fs_err(
            io.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {io}"),
        ),
        _ => fs_err(libc::EIO, format!("{what}: {e}")),
    }
}
