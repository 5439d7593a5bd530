//! Helper processes (the third way of switching): a thread that must be in an address
//! space conflicting with the one its process is in (overlapping segments another
//! thread has placed) runs a function *in a helper process* switched into it.
//!
//! The helper of a handle is forked from the process at its first [`SpaceJmp::vas_call`]
//! (so the caller's code is at the same addresses there), opens a client of its own,
//! attaches the address space by path and serves calls until the handle is detached or
//! the process ends. Arguments and results travel in an exchange area at the same
//! address in both processes (`cairn_media::helper`). The function switches the helper
//! into the address space with [`InHelper::enter`] (taking its locks); what it does not
//! commit is dropped when the guard goes. (The C interface's trampoline switches in and
//! back around the C function, as `sj_vas_switch` does.)

use crate::guard::Switched;
use crate::space::{CommitMode, SpaceJmp, Vh};
use cairn_area::fs_err;
use cairn_media::helper::{self as h, Failure};
use std::io;
use std::sync::Arc;

/// The largest call, in bytes of its buffer.
pub const CALL_MAX: usize = 1 << 20;

/// A helper process of a handle, seen from the caller.
pub(crate) type Helper = h::Helper<InHelper>;

/// What a function run by [`SpaceJmp::vas_call`] gets: the helper's `SpaceJmp` and its
/// handle of the address space.
pub struct InHelper {
    sj: Arc<SpaceJmp>,
    vh: Vh,
}

impl InHelper {
    /// The helper's `SpaceJmp` (its own client and mappings).
    pub fn sj(&self) -> &SpaceJmp {
        &self.sj
    }

    /// The helper's handle of the address space the call is for.
    pub fn vh(&self) -> Vh {
        self.vh
    }

    /// Switch the helper's thread into the address space (waiting for its locks); the
    /// guard switches back, dropping what was not committed.
    pub fn enter(&self) -> io::Result<Switched<'_>> {
        self.sj.enter(self.vh)
    }
}

impl Drop for InHelper {
    fn drop(&mut self) {
        let _ = self.sj.vas_detach(self.vh);
        SpaceJmp::helper_done();
    }
}

fn failure(e: io::Error) -> Failure {
    Failure::new(cairn_area::errno_of(&e), cairn_area::error::message(&e))
}

impl SpaceJmp {
    /// Run `f` in the helper process of handle `vh` (started at the first call) with
    /// `buf`: copied into an exchange area that lies at the same address in both
    /// processes (at most [`CALL_MAX`] bytes), and back into `buf` after the call.
    /// Returns `f`'s value. The helper is a thread that may be in `vh` while this
    /// process's threads are in address spaces that conflict with it.
    ///
    /// `EIO` if the helper died during the call (the next call starts a new one),
    /// `EMSGSIZE` for a buffer too large, `ENOTSUP` inside a helper, the attach error
    /// (`EACCES`, `ENOENT`…) if the helper could not attach the address space.
    pub fn vas_call(
        &self,
        vh: Vh,
        f: fn(&InHelper, &mut [u8]) -> i64,
        buf: &mut [u8],
    ) -> io::Result<i64> {
        self.check_process()?;
        // A helper that died is replaced at the next call (`helper_of`).
        self.helper_of(vh)?.call(f, buf).map_err(|fl| {
            fs_err(
                fl.errno,
                format!("call in the helper of handle {}: {fl}", vh.0),
            )
        })
    }

    /// The helper of `vh`, started if it has none (or its last one died).
    fn helper_of(&self, vh: Vh) -> io::Result<Arc<Helper>> {
        if SpaceJmp::in_helper() {
            return Err(fs_err(
                libc::ENOTSUP,
                "vas_call inside a helper process (helpers do not start helpers)",
            ));
        }
        let (vid, mode) = {
            let st = self.state();
            let hd = st.handle(vh.0)?;
            if let Some(hp) = hd.helper.as_ref().filter(|hp| !hp.is_gone()) {
                return Ok(hp.clone());
            }
            let vid = hd.vid.ok_or_else(|| {
                fs_err(
                    libc::EINVAL,
                    "the primary address space has no helper (it is every thread's own)",
                )
            })?;
            (vid, hd.mode)
        };
        let path = self.vas_path_of(vid)?;
        let started = Arc::new(
            Helper::spawn(CALL_MAX, || self.helper_setup(&path, mode)).map_err(|fl| {
                fs_err(
                    fl.errno,
                    format!("starting the helper process of {path}: {fl}"),
                )
            })?,
        );
        let mut st = self.state();
        let hd = st
            .handle_mut(vh.0)
            .ok()
            .filter(|hd| hd.vid == Some(vid))
            .ok_or_else(|| fs_err(libc::EBADF, format!("handle {}: detached meanwhile", vh.0)))?;
        match hd.helper.as_ref().filter(|hp| !hp.is_gone()) {
            // Another thread started one meanwhile: use it (ours ends when dropped).
            Some(hp) => Ok(hp.clone()),
            None => {
                hd.helper = Some(started.clone());
                Ok(started)
            }
        }
    }

    /// In the forked child: a `SpaceJmp` of its own with the address space attached.
    fn helper_setup(&self, path: &str, mode: CommitMode) -> Result<InHelper, Failure> {
        let sj = self.fork_child().map_err(failure)?;
        let vid = sj.vas_find(path).map_err(failure)?;
        let vh = sj.vas_attach(vid, mode).map_err(failure)?;
        Ok(InHelper { sj, vh })
    }

    /// The process id of `vh`'s helper, if it has one running.
    pub fn helper_pid(&self, vh: Vh) -> Option<u32> {
        let st = self.state();
        let hp = st.handle(vh.0).ok()?.helper.as_ref()?;
        (!hp.is_gone()).then(|| hp.pid())
    }
}
