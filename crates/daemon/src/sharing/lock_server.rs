//! The socket side of locking: lock channels (a client's extra connections that carry
//! its lock requests, so that a blocked `F_SETLKW` never holds up its log digests), and
//! noticing that a requester closed its connection while its request waited.
//!
//! Lock requests are only accepted on a connection bound with `LockChannel` to the
//! registered client of the same process; all of a client's locks belong to its
//! registered connection and are dropped when that connection closes.

use crate::sharing::locks::{ClientId, LockRequest, LockService};
use cairn_proto::{Request, Response};
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Per-connection lock state.
pub(crate) struct ConnLocks {
    /// The client this lock channel acts for.
    client: Option<ClientId>,
    /// The connection, to notice its closing while a request waits.
    sock: Option<UnixStream>,
}

impl ConnLocks {
    pub(crate) fn new(s: &UnixStream) -> ConnLocks {
        ConnLocks {
            client: None,
            sock: s.try_clone().ok(),
        }
    }
}

/// Whether the peer closed the connection (or sent something while its request waits,
/// which the protocol forbids: treated as a cancellation too).
fn peer_gone(s: &UnixStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let r = (&*s).read(&mut b);
    let _ = s.set_nonblocking(false);
    match r {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

fn einval(msg: &str) -> Response {
    Response::Error {
        errno: libc::EINVAL,
        message: msg.into(),
    }
}

/// Serve one lock request. `registered`: the connection is a client's registered one
/// (which cannot be a lock channel). `None`: close the connection without an answer (the
/// requester went away while waiting).
pub(crate) fn handle(
    svc: &LockService,
    cl: &mut ConnLocks,
    pid: u32,
    registered: bool,
    req: Request,
) -> Option<Response> {
    if let Request::LockChannel { slot, slot_gen } = req {
        if registered || cl.client.is_some() {
            return Some(einval("this connection cannot become a lock channel"));
        }
        return Some(match svc.bind(slot, slot_gen, pid) {
            Ok(c) => {
                cl.client = Some(c);
                Response::Ok
            }
            Err(r) => r,
        });
    }
    let Some(client) = cl.client else {
        return Some(einval(
            "lock requests are served on lock channels only (send LockChannel first)",
        ));
    };
    match req {
        Request::Lock {
            ino,
            owner,
            typ,
            start,
            len,
            wait,
            timeout_ms,
        } => {
            let r = LockRequest {
                ino,
                owner,
                typ,
                start,
                len,
                wait,
                timeout: timeout_ms.map(Duration::from_millis),
            };
            let sock = cl.sock.as_ref();
            let mut cancelled = || sock.is_some_and(peer_gone);
            svc.lock(client, r, &mut cancelled)
        }
        Request::Unlock {
            ino,
            owner,
            start,
            len,
        } => Some(svc.unlock(client, ino, owner, start, len)),
        Request::GetLock {
            ino,
            owner,
            typ,
            start,
            len,
        } => Some(svc.get_lock(client, ino, owner, typ, start, len)),
        Request::ReleaseLocks { ino, file, posix } => Some(svc.release(client, ino, file, posix)),
        Request::Delegate { ino } => Some(svc.delegate(client, ino)),
        Request::ReturnLocks { ino, locks } => Some(svc.return_locks(client, ino, &locks)),
        _ => Some(einval("not a lock request")),
    }
}
