//! The host objects of SpaceJMP segments (crate `cairn-sj`): a segment's resident copy
//! and undo log, which the daemon alone makes and hands out (`Request::SjObject`,
//! PROTOCOL.md "Segment objects"), read-write to the segment's owner and writers,
//! read-only to its readers. The requests are sent with the state lock held and a lease
//! on the segment's file, so the shared area holds the file's committed state while the
//! daemon reads it.

use super::Inner;
use crate::conn::response_error;
use cairn_proto::{Request, Response};
use std::fs::File;
use std::io;

impl Inner {
    /// A descriptor of the resident copy (or with `undo` the undo log) of segment file
    /// `ino`: read-write if `write` and the daemon found that we may write the file (the
    /// second value says which), else read-only. The daemon builds a missing copy.
    pub(crate) fn sj_object(&self, ino: u64, undo: bool, write: bool) -> io::Result<(File, bool)> {
        self.run(|st| {
            self.need(st, ino, false)?;
            let (gen, _) = self.attrs_held(st, ino)?;
            let req = Request::SjObject {
                ino,
                gen,
                undo,
                write,
                tail_lsn: st.log.tail(),
            };
            self.request_object(st, &req, "segment object")
        })
    }

    /// Have the daemon copy the committed state of segment file `ino` over `ranges` of
    /// its resident copy (all of it if empty).
    pub(crate) fn sj_refresh(&self, ino: u64, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.run(|st| {
            self.need(st, ino, false)?;
            let (gen, _) = self.attrs_held(st, ino)?;
            let req = Request::SjRefresh {
                ino,
                gen,
                ranges: ranges.to_vec(),
                tail_lsn: st.log.tail(),
            };
            match self.request(st, &req)? {
                Response::Ok => Ok(()),
                r => Err(response_error("refreshing a resident copy", r)),
            }
        })
    }
}
