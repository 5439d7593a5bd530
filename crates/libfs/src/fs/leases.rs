//! Leases (PROTOCOL.md, "Leases"): asking the daemon for one, the upcall channel on
//! which it revokes them, and giving them up.

use super::{need_lease, Inner, Lease, LeaseLostHook, State};
use crate::conn::response_error;
use crate::leases::Acquiring;
use cairn_area::{fs_err, StoreDir};
use cairn_proto::{Request, Response, Upcall};
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Open the upcall channel of `slot` (PROTOCOL.md, "Leases": `UpcallChannel`).
pub(super) fn open_upcall_channel(
    store: &StoreDir,
    slot: u32,
    slot_gen: u64,
) -> io::Result<UnixStream> {
    let mut s = UnixStream::connect(store.socket_path())?;
    cairn_proto::send(&mut s, &Request::UpcallChannel { slot, slot_gen })?;
    match cairn_proto::recv::<Response>(&mut s)? {
        Response::Ok => Ok(s),
        r => Err(response_error("open the upcall channel", r)),
    }
}

/// The upcall thread: answers revocations; when the channel breaks, re-attaches and
/// reopens it (with a growing delay) until the client goes away.
pub(super) fn upcall_loop(weak: Weak<Inner>, mut s: UnixStream) {
    loop {
        let up = cairn_proto::recv::<Upcall>(&mut s);
        if let Ok(Upcall::Revoke { ino }) = up {
            let Some(inner) = weak.upgrade() else { return };
            let (tail, open) = inner.revoke_local(ino);
            inner.tell_lease_lost(Some(ino));
            drop(inner);
            let ack = Request::UpcallAck {
                ino,
                tail_lsn: tail,
                open,
            };
            if cairn_proto::send(&mut s, &ack).is_ok() {
                continue;
            }
        }
        let mut delay = Duration::from_millis(20);
        loop {
            std::thread::sleep(delay);
            let Some(inner) = weak.upgrade() else { return };
            if inner.closing.load(Ordering::SeqCst) {
                return;
            }
            match inner.reopen_upcall() {
                Ok(ns) => {
                    // The new channel is listed before the old one closes, so that the
                    // list never names a closed (and maybe reused) descriptor.
                    inner
                        .upcall_thread_fd
                        .store(std::os::fd::AsRawFd::as_raw_fd(&ns), Ordering::SeqCst);
                    s = ns;
                    break;
                }
                Err(_) => delay = (delay * 2).min(Duration::from_millis(500)),
            }
        }
    }
}

impl Inner {
    /// The daemon took every lease away (expiry, or a restart we did not re-attach to
    /// in time): have our log digested (best effort: the daemon digested its committed
    /// part already when it expired us), then forget the leases and the overlay.
    pub(super) fn leases_lost(&self, st: &mut State, g: u64) {
        self.tell_lease_lost(None);
        st.leases.lost_all(g);
        st.objs.clear();
        let _ = self.digest_wait(st);
        st.ov.clear();
    }

    /// Check that the lease `write` (or any lease) on `ino` is held.
    #[inline]
    pub(crate) fn need(&self, st: &State, ino: u64, write: bool) -> io::Result<()> {
        match st.leases.get(ino) {
            Some(Lease::Write) => Ok(()),
            Some(Lease::Read) if !write => Ok(()),
            Some(Lease::Mediated) => {
                let mut seen = st.seen.borrow_mut();
                if let std::collections::hash_map::Entry::Vacant(v) = seen.entry(ino) {
                    v.insert(self.area.inode_seq(ino)?);
                }
                Ok(())
            }
            _ => Err(need_lease(ino, write)),
        }
    }

    /// Ask the daemon for a lease (without the state lock) and record the grant.
    /// A revocation of this inode processed after we asked may have been for this very
    /// grant: then it is not trusted, and the operation, run again, asks again.
    pub(super) fn acquire(&self, ino: u64, write: bool, a: Acquiring) -> io::Result<()> {
        let r = self.lease_request(ino, write);
        let mut st = self.lock_state();
        let grant = match &r {
            Ok(Response::Leased { .. }) if write => Lease::Write,
            Ok(Response::Leased { .. }) => Lease::Read,
            Ok(Response::Mediated { .. }) => Lease::Mediated,
            _ => {
                st.leases.refused(ino, a);
                return Err(match r {
                    Ok(r) => response_error("lease", r),
                    Err(e) => e,
                });
            }
        };
        if st.leases.granted(ino, a, grant) {
            self.learn_object(&mut st, ino, grant == Lease::Write);
        }
        Ok(())
    }

    pub(super) fn lease_request(&self, ino: u64, write: bool) -> io::Result<Response> {
        let req = Request::Lease { ino, write };
        let mut last = None;
        for _ in 0..2 {
            {
                let mut conn = self.lock_conn();
                if let Some(c) = conn.as_mut() {
                    match c.roundtrip(&req) {
                        Ok(r) => return Ok(r),
                        Err(e) => {
                            *conn = None;
                            last = Some(e);
                        }
                    }
                }
            }
            // Re-attach: the state lock first, then the connection.
            let mut st = self.lock_state();
            let mut conn = self.lock_conn();
            if conn.is_none() {
                self.reattach_patiently(&mut st, &mut conn)?;
            }
        }
        Err(fs_err(
            libc::EIO,
            format!(
                "lost the connection to the daemon: {}",
                last.map_or_else(|| "re-attach failed".to_string(), |e| e.to_string())
            ),
        ))
    }

    /// Run the lease-lost hook, if one is installed (it must not call into this client:
    /// it may run under the state lock).
    pub(super) fn tell_lease_lost(&self, ino: Option<u64>) {
        if let Some(h) = &*self.lease_lost.read().unwrap_or_else(|p| p.into_inner()) {
            h(ino);
        }
    }

    pub(crate) fn set_lease_lost_hook(&self, h: Option<LeaseLostHook>) {
        *self.lease_lost.write().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// The upcall thread: a revocation of the lease on `ino`. Drops the lease and the
    /// inode's overlay under the state lock (no call on it is in progress) and returns
    /// the log tail to answer with, and whether the inode is open here (then the daemon
    /// pins it, and the last close unpins it).
    pub(super) fn revoke_local(&self, ino: u64) -> (u64, bool) {
        let mut st = self.lock_state();
        let open = st.handles.is_open(ino);
        if open {
            st.handles.pin(ino);
        }
        st.drop_lease(ino);
        st.leases.revoked(ino);
        st.ov.forget(ino);
        (st.log.tail(), open)
    }

    /// Start the upcall thread (once, after the `Inner` is shared).
    pub(crate) fn start_upcalls(this: &Arc<Inner>) -> io::Result<()> {
        let Some(ch) = this
            .upcall
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|u| u.try_clone())
            .transpose()?
        else {
            return Ok(());
        };
        let weak = Arc::downgrade(this);
        this.upcall_thread_fd
            .store(std::os::fd::AsRawFd::as_raw_fd(&ch), Ordering::SeqCst);
        std::thread::Builder::new()
            .name("cairn-upcalls".into())
            .spawn(move || upcall_loop(weak, ch))?;
        Ok(())
    }

    /// The upcall channel broke (the daemon stopped or died): re-attach if the main
    /// connection has not been renewed since the channel was opened (without starting a
    /// daemon), then open a new channel.
    pub(super) fn reopen_upcall(&self) -> io::Result<UnixStream> {
        let mut st = self.lock_state();
        let mut conn = self.lock_conn();
        if conn.is_none()
            || self.conn_epoch.load(Ordering::SeqCst) == self.upcall_epoch.load(Ordering::SeqCst)
        {
            *conn = None;
            self.reattach(&mut st, &mut conn, false)?;
        }
        let ch = open_upcall_channel(&self.store, self.slot, self.slot_gen)?;
        self.upcall_epoch
            .store(self.conn_epoch.load(Ordering::SeqCst), Ordering::SeqCst);
        *self.upcall.lock().unwrap_or_else(|p| p.into_inner()) = Some(ch.try_clone()?);
        Ok(ch)
    }
}
