//! `libcairn_preload.so`: runs unmodified, dynamically linked programs on Cairn.
//!
//! Loaded with `LD_PRELOAD` (`cairn run` sets it up), the library interposes the C
//! library's file calls. Paths under the prefix (`CAIRN_PREFIX`, default `/cairn`) —
//! and relative paths and `*at` calls from a Cairn directory — go to LibFS, whose
//! private log makes every call durable when it returns; everything else goes to the C
//! library untouched. See `docs/SHIM.md` for what is interposed and the limits.
//!
//! Modules: `paths` (which paths are Cairn's), `table` (descriptors and placeholders),
//! `state` (configuration, the client, the current directory, `fork`), `ops` (the
//! operations, safe Rust over LibFS), `maps` (streams and mappings handed out),
//! `segments` (SpaceJMP segments mapped by programs), `real` (the C library's
//! definitions), and the C entry points `abi_*` (`abi_syscall`: the same calls made
//! through `syscall(2)`).

// Unit tests leave the C entry points out (a test binary must not interpose its own
// C library), so most of the crate is unused there.
#![cfg_attr(test, allow(dead_code))]

mod maps;
mod ops;
mod paths;
mod real;
#[cfg(not(test))]
mod segments;
mod state;
mod table;

#[cfg(not(test))]
mod abi;
#[cfg(not(test))]
mod abi_copy;
#[cfg(not(test))]
mod abi_dir;
#[cfg(not(test))]
mod abi_fd;
#[cfg(not(test))]
mod abi_mmap;
#[cfg(not(test))]
mod abi_path;
#[cfg(not(test))]
mod abi_proc;
#[cfg(not(test))]
mod abi_sock;
#[cfg(not(test))]
mod abi_stdio;
#[cfg(all(not(test), target_arch = "x86_64"))]
mod abi_syscall;
#[cfg(not(test))]
mod abi_temp;
#[cfg(not(test))]
mod abi_xattr;

/// Start-up, before `main`: adopt the Cairn descriptors and current directory inherited
/// through `exec`, register the `fork` handlers and the exit-time write-back of shared
/// mappings, and give Cairn standard streams a Cairn `FILE`.
#[cfg(not(test))]
extern "C" fn init() {
    state::config();
    abi_proc::cwd_from_env();
    table::adopt_inherited();
    // SAFETY: registering handlers with the C library; they are `extern "C"` functions
    // that live as long as the process.
    unsafe {
        libc::pthread_atfork(
            Some(state::before_fork),
            Some(state::after_fork_parent),
            Some(state::after_fork_child),
        );
        libc::atexit(abi_mmap::flush_all_at_exit);
    }
    // `cairn run --vas NAME`: the main thread starts in that address space.
    if let Err(e) = segments::init_from_env() {
        eprintln!(
            "cairn-preload: address space {:?}: {e}",
            std::env::var_os("CAIRN_SJ_VAS")
        );
        std::process::exit(1);
    }
    for fd in 0..3 {
        abi_stdio::std_stream_changed(fd);
    }
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
