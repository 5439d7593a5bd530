//! A helper process: a child forked from this process that runs functions on request.
//!
//! The child is a copy of the caller's memory image, so a function pointer of the caller
//! is valid in it, and an **exchange area** (`MAP_SHARED` anonymous memory made before
//! the fork) lies at the same address in both: arguments and results travel there, and
//! a pointer into it means the same bytes in both processes.
//!
//! Protocol, in the area's first page (futex word `state`):
//! `SETUP` → (child) `IDLE` or `FAILED`; (parent) `CALL` → (child) `DONE` → (parent)
//! `IDLE`; (parent) `QUIT` → the child exits. The parent serializes its calls. The child
//! notices a parent that died (it is re-parented) within [`PARENT_CHECK`], and the parent
//! a child that died within [`CHILD_CHECK`] of waiting for it.
//!
//! Only the calling thread is copied into the child; locks other threads held at the
//! fork stay held there forever. The child's setup must therefore not take any lock the
//! parent's other threads may hold (in particular, it must not use the parent's objects:
//! it builds its own), as with any `fork` without `exec`.

use rustix::thread::futex;
use std::io;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

/// A function the helper runs: its context (built in the child) and the call's bytes in
/// the exchange area. Returns the call's result.
pub type Call<C> = fn(&C, &mut [u8]) -> i64;

/// The state while the child sets up (the fresh area's zero).
#[allow(dead_code)]
const SETUP: u32 = 0;
const IDLE: u32 = 1;
const CALL: u32 = 2;
const DONE: u32 = 3;
const QUIT: u32 = 4;
const FAILED: u32 = 5;

// Header layout (first page of the area).
const STATE: usize = 0;
const ERRNO: usize = 4;
const FUNC: usize = 8;
const LEN: usize = 16;
const RESULT: usize = 24;
const MSG_LEN: usize = 32;
/// Non-zero while the child (`SLEEP_CHILD`) or the parent (`SLEEP_PARENT`) sleeps on the
/// state word: the other side wakes it only then (a spinning side needs no system call).
const SLEEP_CHILD: usize = 40;
const SLEEP_PARENT: usize = 44;
const MSG: usize = 64;
const MSG_MAX: usize = 1024;
const HEADER: usize = 4096;

/// How often a waiting child checks that its parent lives.
pub const PARENT_CHECK: Duration = Duration::from_millis(200);
/// How often a waiting parent checks that its child lives.
pub const CHILD_CHECK: Duration = Duration::from_millis(10);
/// How long a caller spins for a reply, and the child for the next call, before they
/// sleep on the futex: calls in a row cost no system call and no wake-up.
const SPIN: Duration = Duration::from_micros(50);

/// `MAP_SHARED` anonymous memory: a header page, then `data` bytes.
struct Exchange {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the area is plain shared memory; every header access is atomic, and the data
// area is touched by one side at a time (the protocol's state word hands it over).
unsafe impl Send for Exchange {}
// SAFETY: as for `Send`.
unsafe impl Sync for Exchange {}

impl Exchange {
    fn new(data: usize) -> io::Result<Exchange> {
        let len = HEADER + data.next_multiple_of(4096);
        // SAFETY: a new anonymous mapping at an address the kernel chooses; nothing of
        // ours is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Exchange { ptr: p.cast(), len })
    }

    fn data_len(&self) -> usize {
        self.len - HEADER
    }

    fn u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HEADER && off.is_multiple_of(4));
        // SAFETY: inside the header page, 4-aligned (the mapping is page aligned); the
        // reference lives no longer than `&self`, and so the mapping.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }

    fn u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER && off.is_multiple_of(8));
        // SAFETY: as in `u32`, 8-aligned.
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    fn state(&self) -> &AtomicU32 {
        self.u32(STATE)
    }

    /// Set the state and wake the other side if it sleeps (`other`: its sleep word).
    fn set(&self, s: u32, other: usize) {
        self.state().store(s, SeqCst);
        if self.u32(other).load(SeqCst) != 0 {
            let _ = futex::wake(self.state(), futex::Flags::empty(), 1);
        }
    }

    /// Sleep while the state is `s`, at most `t` (`mine`: this side's sleep word).
    fn sleep(&self, s: u32, t: Duration, mine: usize) {
        let ts = futex::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: t.subsec_nanos() as i64,
        };
        // Announce the sleep before the kernel checks the state again: a `set` after
        // this sees the word, one before it changed the state and the wait returns.
        self.u32(mine).store(1, SeqCst);
        let _ = futex::wait(self.state(), futex::Flags::empty(), s, Some(&ts));
        self.u32(mine).store(0, SeqCst);
    }

    /// Wait while the state is `s`: spin for [`SPIN`], then sleep `t` at a time; `alive`
    /// is asked before each sleep (false: stop waiting). The state seen last.
    fn wait_while(&self, s: u32, t: Duration, mine: usize, mut alive: impl FnMut() -> bool) -> u32 {
        let start = std::time::Instant::now();
        loop {
            let now = self.state().load(SeqCst);
            if now != s {
                return now;
            }
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if !alive() {
                return now;
            }
            self.sleep(s, t, mine);
        }
    }

    /// The data area. Only the side the protocol hands it to may hold it.
    #[allow(clippy::mut_from_ref)]
    fn data(&self, len: usize) -> &mut [u8] {
        assert!(len <= self.data_len(), "exchange: {len} bytes do not fit");
        // SAFETY: inside the mapping; the protocol gives the data area to one side at a
        // time and its holder takes one slice of it per call.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(HEADER), len) }
    }

    /// Record a failure for the other side.
    fn put_failure(&self, f: &Failure) {
        let n = f.text.len().min(MSG_MAX);
        // SAFETY: `MSG..MSG + MSG_MAX` lies in the header page; the side writing it
        // holds the protocol's turn.
        unsafe { std::ptr::copy_nonoverlapping(f.text.as_ptr(), self.ptr.add(MSG), n) };
        self.u32(MSG_LEN).store(n as u32, SeqCst);
        self.u32(ERRNO).store(f.errno as u32, SeqCst);
    }

    fn failure(&self) -> Failure {
        let n = (self.u32(MSG_LEN).load(SeqCst) as usize).min(MSG_MAX);
        let mut b = vec![0u8; n];
        // SAFETY: as in `put_failure`; this side holds the turn.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(MSG), b.as_mut_ptr(), n) };
        Failure {
            errno: self.u32(ERRNO).load(SeqCst) as i32,
            text: String::from_utf8_lossy(&b).into_owned(),
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no reference into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Why a helper could not start or a call failed: an errno and a message (what
/// crosses between the processes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub errno: i32,
    pub text: String,
}

impl Failure {
    pub fn new(errno: i32, text: impl Into<String>) -> Failure {
        Failure {
            errno,
            text: text.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// A running helper process, seen from its parent.
pub struct Helper<C> {
    pid: libc::pid_t,
    ex: Exchange,
    calls: Mutex<()>,
    /// The exit status, once the child is gone.
    gone: Mutex<Option<String>>,
    _ctx: PhantomData<fn(&C)>,
}

impl<C> Helper<C> {
    /// Fork a helper. In the child, `setup` builds the context the calls get (its
    /// failure is this call's); the child then serves calls until the `Helper` is
    /// dropped or this process dies, drops the context and exits. `data` is the largest
    /// call in bytes.
    pub fn spawn(
        data: usize,
        setup: impl FnOnce() -> Result<C, Failure>,
    ) -> Result<Helper<C>, Failure> {
        let ex = Exchange::new(data).map_err(|e| os_failure("helper: exchange area", &e))?;
        // SAFETY: getpid cannot fail.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the parent continues as before. The child runs only `child_main`: it
        // uses its own copy of memory, takes no lock other threads may hold (the
        // caller's contract for `setup`) and ends with `_exit`, never returning here.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(os_failure("helper: fork", &io::Error::last_os_error()));
        }
        if pid == 0 {
            child_main(&ex, parent, setup);
        }
        let h = Helper {
            pid,
            ex,
            calls: Mutex::new(()),
            gone: Mutex::new(None),
            _ctx: PhantomData,
        };
        match h
            .ex
            .wait_while(SETUP, CHILD_CHECK, SLEEP_PARENT, || h.reap().is_none())
        {
            IDLE => Ok(h),
            FAILED => Err(h.ex.failure()),
            _ => Err(Failure::new(
                libc::EIO,
                format!(
                    "the helper process died while starting ({})",
                    h.reap().unwrap_or_default()
                ),
            )),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// The largest call, in bytes.
    pub fn capacity(&self) -> usize {
        self.ex.data_len()
    }

    /// Whether the child has ended (then every call fails).
    pub fn is_gone(&self) -> bool {
        self.reap().is_some()
    }

    /// Reap the child if it ended: why it ended.
    fn reap(&self) -> Option<String> {
        let mut gone = self.gone.lock().unwrap_or_else(|e| e.into_inner());
        if gone.is_none() {
            let mut status = 0;
            // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid {
                *gone = Some(if libc::WIFSIGNALED(status) {
                    format!("killed by signal {}", libc::WTERMSIG(status))
                } else {
                    format!("exit status {}", libc::WEXITSTATUS(status))
                });
            } else if r < 0 {
                *gone = Some(format!("wait: {}", io::Error::last_os_error()));
            }
        }
        gone.clone()
    }

    /// Run `f` in the helper with `buf` (copied into the exchange area, and back after
    /// the call): `f`'s result. `EMSGSIZE` if `buf` does not fit, `EIO` if the helper
    /// died (before or during the call).
    pub fn call(&self, f: Call<C>, buf: &mut [u8]) -> Result<i64, Failure> {
        if buf.len() > self.ex.data_len() {
            return Err(Failure::new(
                libc::EMSGSIZE,
                format!(
                    "a helper call of {} bytes: at most {} fit in the exchange area",
                    buf.len(),
                    self.ex.data_len()
                ),
            ));
        }
        let _turn = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = self.reap() {
            return Err(died(&why));
        }
        self.ex.data(buf.len()).copy_from_slice(buf);
        self.ex.u64(FUNC).store(f as usize as u64, SeqCst);
        self.ex.u64(LEN).store(buf.len() as u64, SeqCst);
        self.ex.set(CALL, SLEEP_CHILD);
        if self
            .ex
            .wait_while(CALL, CHILD_CHECK, SLEEP_PARENT, || self.reap().is_none())
            != DONE
        {
            return Err(died(&self.reap().unwrap_or_default()));
        }
        buf.copy_from_slice(self.ex.data(buf.len()));
        let r = self.ex.u64(RESULT).load(SeqCst) as i64;
        self.ex.state().store(IDLE, SeqCst);
        Ok(r)
    }
}

fn os_failure(what: &str, e: &io::Error) -> Failure {
    Failure::new(
        e.raw_os_error().unwrap_or(libc::EIO),
        format!("{what}: {e}"),
    )
}

fn died(why: &str) -> Failure {
    Failure::new(libc::EIO, format!("the helper process ended ({why})"))
}

impl<C> Drop for Helper<C> {
    /// Ask the child to finish and wait for it (killing it after five seconds).
    fn drop(&mut self) {
        if self.reap().is_some() {
            return;
        }
        self.ex.set(QUIT, SLEEP_CHILD);
        let start = std::time::Instant::now();
        while self.reap().is_none() {
            if start.elapsed() > Duration::from_secs(5) {
                // SAFETY: our own child, not yet reaped (so its pid is not reused).
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The child: set up, serve, exit. Never returns.
fn child_main<C>(
    ex: &Exchange,
    parent: libc::pid_t,
    setup: impl FnOnce() -> Result<C, Failure>,
) -> ! {
    // A panic must not unwind into the copy of the parent's stack.
    let guarded = |f: &mut dyn FnMut()| {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
            // SAFETY: ends the child without running the parent's atexit handlers or
            // destructors of memory it only copied.
            unsafe { libc::_exit(101) }
        }
    };
    let mut setup = Some(setup);
    let mut made = None;
    guarded(&mut || made = setup.take().map(|s| s()));
    let ctx = match made.expect("setup ran") {
        Ok(c) => c,
        Err(f) => {
            ex.put_failure(&f);
            ex.set(FAILED, SLEEP_PARENT);
            // SAFETY: ends the child without running the parent's atexit handlers or
            // destructors of memory it only copied.
            unsafe { libc::_exit(1) }
        }
    };
    ex.set(IDLE, SLEEP_PARENT);
    loop {
        // SAFETY: getppid cannot fail.
        let parent_lives = || unsafe { libc::getppid() } == parent;
        match ex.wait_while(IDLE, PARENT_CHECK, SLEEP_CHILD, parent_lives) {
            CALL => {
                let len = ex.u64(LEN).load(SeqCst) as usize;
                let bits = ex.u64(FUNC).load(SeqCst) as usize;
                // SAFETY: the parent stored a `Call<C>` of this very program image (the
                // child is its fork, and `Helper<C>` types the calls as this `C`), so the
                // bits are a valid function pointer of this type here too.
                let f: Call<C> = unsafe { std::mem::transmute::<usize, Call<C>>(bits) };
                let mut r = 0;
                guarded(&mut || r = f(&ctx, ex.data(len)));
                ex.u64(RESULT).store(r as u64, SeqCst);
                ex.set(DONE, SLEEP_PARENT);
                // The parent sets IDLE once it has the result.
                ex.wait_while(DONE, PARENT_CHECK, SLEEP_CHILD, parent_lives);
            }
            IDLE => break, // the parent died
            _ => break,    // QUIT
        }
    }
    drop(ctx);
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(base: &u64, buf: &mut [u8]) -> i64 {
        let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
        buf[..8].copy_from_slice(&(v * 2).to_le_bytes());
        (base + v) as i64
    }

    fn pid(_: &u64, _: &mut [u8]) -> i64 {
        std::process::id() as i64
    }

    fn die(_: &u64, _: &mut [u8]) -> i64 {
        // SAFETY: ends the helper child at once, as a crash would.
        unsafe { libc::_exit(3) }
    }

    #[test]
    fn a_helper_runs_calls_in_its_own_process_and_reports_its_death() {
        let h = Helper::spawn(4096, || Ok(40u64)).unwrap();
        let mut b = 2u64.to_le_bytes();
        assert_eq!(h.call(add, &mut b).unwrap(), 42);
        assert_eq!(u64::from_le_bytes(b), 4, "the buffer comes back");
        assert_eq!(h.call(pid, &mut []).unwrap(), h.pid() as i64);
        assert_ne!(h.pid(), std::process::id());
        assert_eq!(
            h.call(add, &mut [0u8; 8192]).unwrap_err().errno,
            libc::EMSGSIZE
        );
        let e = h.call(die, &mut []).unwrap_err();
        assert_eq!(e.errno, libc::EIO, "{e}");
        assert!(e.text.contains("exit status 3"), "{e}");
        assert!(h.is_gone());
        assert_eq!(h.call(add, &mut b).unwrap_err().errno, libc::EIO);
    }

    #[test]
    fn a_setup_failure_is_the_spawn_failure() {
        let e = Helper::<u64>::spawn(4096, || {
            Err(Failure::new(libc::ENOENT, "no such address space"))
        })
        .err()
        .unwrap();
        assert_eq!(e, Failure::new(libc::ENOENT, "no such address space"));
    }

    #[test]
    fn dropping_the_helper_ends_its_process() {
        let h = Helper::spawn(4096, || Ok(0u64)).unwrap();
        let pid = h.pid();
        drop(h);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
}
