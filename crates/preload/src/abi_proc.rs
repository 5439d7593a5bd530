//! The current directory, path resolution, the umask and `exec`.
//! SAFETY: see `abi.rs` (the POSIX contract of each function).

use crate::abi::{cbytes, copy_cstr, fd_call, malloc_cstr, ok0, route, run, user_cstr, Route};
use crate::ops;
use crate::real;
use crate::state::{self, err};

use libc::{c_char, c_int, mode_t, size_t};
use std::ffi::CString;

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    match unsafe { route(libc::AT_FDCWD, path) } {
        Err(e) => state::fail("chdir", e),
        Ok(Route::Cairn(cp)) => crate::abi::cairn_or_host(
            "chdir",
            || ok0(ops::chdir(&cp)),
            |h| unsafe { host_chdir(h) },
        ),
        Ok(r) => unsafe { host_chdir(r.host_ptr(path)) },
    }
}

/// `chdir` to a host directory.
///
/// SAFETY: `path` is a NUL-terminated string.
unsafe fn host_chdir(path: *const c_char) -> c_int {
    let rc = unsafe { real::chdir(path) };
    if rc == 0 {
        state::set_cwd(None);
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    fd_call(
        "fchdir",
        fd,
        || {
            let rc = unsafe { real::fchdir(fd) };
            if rc == 0 {
                state::set_cwd(None);
            }
            rc
        },
        |o| ok0(ops::fchdir(&o)),
    )
}

/// `getcwd` semantics for a Cairn directory `path`: into `buf`, or a `malloc`ed buffer
/// when `buf` is NULL (of `size` bytes, or just enough when `size` is 0).
unsafe fn give_path(path: &[u8], buf: *mut c_char, size: size_t) -> std::io::Result<*mut c_char> {
    if buf.is_null() {
        if size != 0 && size < path.len() + 1 {
            return Err(err(libc::ERANGE, "getcwd: buffer too small"));
        }
        return malloc_cstr(path);
    }
    if size == 0 {
        return Err(err(libc::EINVAL, "getcwd: zero size"));
    }
    unsafe { copy_cstr(path, buf, size) }?;
    Ok(buf)
}

#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    match state::cwd() {
        None => unsafe { real::getcwd(buf, size) },
        Some(c) => run("getcwd", || unsafe { give_path(&c.path, buf, size) }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn __getcwd_chk(buf: *mut c_char, size: size_t, _l: size_t) -> *mut c_char {
    unsafe { getcwd(buf, size) }
}

#[no_mangle]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    match state::cwd() {
        None => unsafe { real::get_current_dir_name() },
        Some(c) => run("get_current_dir_name", || malloc_cstr(&c.path)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, out: *mut c_char) -> *mut c_char {
    match unsafe { route(libc::AT_FDCWD, path) } {
        Err(e) => state::fail("realpath", e),
        Ok(Route::Cairn(cp)) => crate::abi::cairn_or_host(
            "realpath",
            || {
                let p = ops::realpath(&cp)?;
                if out.is_null() {
                    malloc_cstr(&p)
                } else {
                    unsafe { copy_cstr(&p, out, libc::PATH_MAX as usize) }?;
                    Ok(out)
                }
            },
            |h| unsafe { real::realpath(h, out) },
        ),
        Ok(r) => unsafe { real::realpath(r.host_ptr(path), out) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    out: *mut c_char,
    _l: size_t,
) -> *mut c_char {
    unsafe { realpath(path, out) }
}

#[no_mangle]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    unsafe { realpath(path, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    let old = unsafe { real::umask(mask) };
    state::umask_changed(mask & 0o777);
    old
}

/// The calls that change the process's credentials: the client follows
/// ([`state::before_credentials_change`], [`state::credentials_changed`]).
macro_rules! credential_fns {
    ($(fn $name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            state::before_credentials_change();
            let r = unsafe { real::$name($($arg),*) };
            if r == 0 {
                let e = real::errno();
                state::credentials_changed();
                real::set_errno(e);
            }
            r
        }
    )*};
}

credential_fns! {
    fn setuid(uid: libc::uid_t);
    fn seteuid(uid: libc::uid_t);
    fn setreuid(r: libc::uid_t, e: libc::uid_t);
    fn setresuid(r: libc::uid_t, e: libc::uid_t, s: libc::uid_t);
    fn setgid(gid: libc::gid_t);
    fn setegid(gid: libc::gid_t);
    fn setregid(r: libc::gid_t, e: libc::gid_t);
    fn setresgid(r: libc::gid_t, e: libc::gid_t, s: libc::gid_t);
    fn setgroups(n: size_t, list: *const libc::gid_t);
    fn initgroups(user: *const c_char, gid: libc::gid_t);
}

/// `execve`: the Cairn current directory goes to the new program in `CAIRN_CWD` (its
/// open Cairn descriptors carry themselves: see `table.rs`). A program stored on Cairn
/// runs too: what [`cairn_program`] resolves it to.
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let program = match unsafe { cairn_program(path, argv, false, true) } {
        Ok(p) => p,
        Err(e) => return run("execve", || Err::<c_int, _>(e)),
    };
    let (env, _cwd) = unsafe { child_env(envp) };
    before_exec();
    let Some(p) = program else {
        let r = unsafe { route(libc::AT_FDCWD, path) };
        let host = match &r {
            Ok(r) => r.host_ptr(path),
            Err(_) => path,
        };
        return unsafe { real::execve(host, argv, env.as_ptr()) };
    };
    unsafe { real::execve(p.path.as_ptr(), p.argv.as_ptr(), env.as_ptr()) };
    // Not started: keep its errno past the memfd's close.
    let e = real::errno();
    drop(p);
    real::set_errno(e);
    -1
}

/// `#!` interpreters followed at most this deep (Linux: 4 levels of interpreters).
const MAX_INTERP_DEPTH: u32 = 4;

/// The arguments of a `#!` script's interpreter: itself, the `#!` line's argument, the
/// script's path, then the script's arguments after its `argv[0]` (NULL-terminated).
///
/// SAFETY: `argv` is NULL or a NULL-terminated array of C strings, which (with
/// `interp`, `arg` and `path`) outlive the result.
unsafe fn script_argv(
    interp: &std::ffi::CStr,
    arg: Option<&CString>,
    path: *const c_char,
    argv: *const *const c_char,
) -> Vec<*const c_char> {
    let mut v: Vec<*const c_char> = vec![interp.as_ptr()];
    if let Some(a) = arg {
        v.push(a.as_ptr());
    }
    v.push(path);
    // SAFETY: see the function comment.
    unsafe {
        if !argv.is_null() && !(*argv).is_null() {
            let mut p = argv.add(1);
            while !(*p).is_null() {
                v.push(*p);
                p = p.add(1);
            }
        }
    }
    v.push(std::ptr::null());
    v
}

/// A sealed `memfd` named `name` holding `bytes` (a binary to run from it; the name
/// tells others the program's file is busy: `cairn_area::host::text_busy`);
/// close-on-exec unless a spawned child must open it by `/proc/self/fd`.
fn sealed_memfd(bytes: &[u8], name: &std::ffi::CStr, cloexec: bool) -> std::io::Result<c_int> {
    let fl = libc::MFD_ALLOW_SEALING | if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe { real::memfd_create(name.as_ptr(), fl) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: writing from a Rust buffer to the memfd made above.
        let k = unsafe {
            real::write(
                fd,
                bytes[done..].as_ptr() as *const libc::c_void,
                bytes.len() - done,
            )
        };
        if k <= 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: closing the memfd made above.
            unsafe { real::close(fd) };
            return Err(e);
        }
        done += k as usize;
    }
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on the memfd made above.
    unsafe { real::fcntl64(fd, libc::F_ADD_SEALS, seals as usize) };
    Ok(fd)
}

/// The environment for a new program: `envp` with `CAIRN_CWD` set to the Cairn current
/// directory (or removed). The returned string backs the added entry.
///
/// SAFETY: `envp` is NULL or a NULL-terminated array of C strings.
unsafe fn child_env<T>(envp: *const *const T) -> (Vec<*const c_char>, Option<CString>) {
    let key = format!("{}=", state::CWD_ENV);
    let mut env: Vec<*const c_char> = Vec::new();
    let mut p = envp as *const *const c_char;
    // SAFETY: see the function comment.
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            if !cbytes(*p).is_some_and(|b| b.starts_with(key.as_bytes())) {
                env.push(*p);
            }
            p = p.add(1);
        }
    }
    let extra = state::cwd().and_then(|c| {
        let mut v = key.into_bytes();
        v.extend_from_slice(&c.path);
        CString::new(v).ok()
    });
    if let Some(e) = &extra {
        env.push(e.as_ptr());
    }
    env.push(std::ptr::null());
    (env, extra)
}

/// Before another program starts with this process's descriptors: digest the log (files
/// created here must exist for it) and give every open description its own placeholder.
fn before_exec() {
    if crate::abi::in_cairn() {
        return; // LibFS starting a daemon
    }
    state::publish();
    crate::table::materialize_all();
}

type Spawn = unsafe fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

/// `posix_spawn`/`posix_spawnp` (Rust's `Command`, for one) exec inside the C library:
/// the same preparation as `execve`, then `real`.
unsafe fn spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
    search: bool,
) -> c_int {
    let (env, _cwd) = unsafe { child_env(envp as *const *const c_char) };
    // A program stored on Cairn: what the C library can start in its place.
    let target = match unsafe { cairn_program(path, argv as *const *const c_char, search, false) } {
        Ok(t) => t,
        Err(e) => return cairn_area::errno_of(&e).max(1),
    };
    before_exec();
    let Some(t) = target else {
        let real: Spawn = if search {
            real::posix_spawnp
        } else {
            real::posix_spawn
        };
        return unsafe { real(pid, path, actions, attr, argv, env.as_ptr() as _) };
    };
    // The memfd, if any, closes with `t`: the child has its own descriptor.
    unsafe {
        real::posix_spawn(
            pid,
            t.path.as_ptr(),
            actions,
            attr,
            t.argv.as_ptr() as _,
            env.as_ptr() as _,
        )
    }
}

/// What to start in place of a program stored on Cairn (the kernel cannot read it):
/// for a `#!` script its interpreter (followed while it is on Cairn too), with the
/// interpreter's arguments; for an ELF binary its copy in a sealed `memfd`, by
/// `/proc/self/fd/N` (the new program's `/proc/self/exe` names the memfd).
struct Program {
    path: CString,
    argv: Vec<*const c_char>,
    memfd: Option<c_int>,
    /// Strings `argv` points into.
    _keep: Vec<CString>,
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Some(fd) = self.memfd {
            // SAFETY: the memfd `cairn_program` made, ours to close.
            unsafe { real::close(fd) };
        }
    }
}

/// [`Program`] for `path` (searched on `PATH` with `search`), or `None` when it is the C
/// library's to start. `cloexec`: the memfd closes at `exec` (`execve` opens it by path
/// first; a spawned child must inherit it instead).
///
/// SAFETY: `path` is a C string and `argv` a NULL-terminated array of them.
unsafe fn cairn_program(
    path: *const c_char,
    argv: *const *const c_char,
    search: bool,
    cloexec: bool,
) -> std::io::Result<Option<Program>> {
    let mut keep: Vec<CString> = Vec::new();
    let mut cur = path;
    if search {
        let Ok(Some(name)) = (unsafe { user_cstr(path) }) else {
            return Ok(None);
        };
        if !name.contains(&b'/') {
            match cairn_on_path(name) {
                Some(c) => {
                    cur = c.as_ptr();
                    keep.push(c);
                }
                None => return Ok(None),
            }
        }
    }
    let mut args: Vec<*const c_char> = Vec::new();
    // SAFETY: see the function comment.
    unsafe {
        let mut p = argv;
        while !p.is_null() && !(*p).is_null() {
            args.push(*p);
            p = p.add(1);
        }
    }
    args.push(std::ptr::null());
    for depth in 0..=MAX_INTERP_DEPTH {
        let Ok(Route::Cairn(cp)) = (unsafe { route(libc::AT_FDCWD, cur) }) else {
            if depth == 0 && keep.is_empty() {
                return Ok(None);
            }
            // SAFETY: `cur` is the caller's path or a string in `keep`.
            let path = unsafe { std::ffi::CStr::from_ptr(cur) }.to_owned();
            return Ok(Some(Program {
                path,
                argv: args,
                memfd: None,
                _keep: keep,
            }));
        };
        let plan = match ops::exec_plan(&cp) {
            Ok(p) => p,
            Err(e) => match cairn_area::error::elsewhere_path(&e) {
                // A symbolic link to a host program: that one runs.
                Some(h) => {
                    let h = CString::new(h).map_err(|_| err(libc::EINVAL, "exec: path"))?;
                    cur = h.as_ptr();
                    keep.push(h);
                    continue;
                }
                None => return Err(e),
            },
        };
        match plan {
            ops::ExecPlan::Script { interp, arg } => {
                let bad = |_| err(libc::ENOEXEC, "exec: bad #! line");
                let interp = CString::new(interp).map_err(bad)?;
                let arg = arg.map(CString::new).transpose().map_err(bad)?;
                args = unsafe { script_argv(&interp, arg.as_ref(), cur, args.as_ptr()) };
                cur = interp.as_ptr();
                keep.push(interp);
                keep.extend(arg);
            }
            ops::ExecPlan::Elf { bytes, memfd_name } => {
                let fd = sealed_memfd(&bytes, &memfd_name, cloexec)?;
                let path = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
                return Ok(Some(Program {
                    path,
                    argv: args,
                    memfd: Some(fd),
                    _keep: keep,
                }));
            }
        }
    }
    Err(err(libc::ELOOP, "exec: #! interpreters nested too deep"))
}

/// The paths an `execvp`-style search of `PATH` (default `/bin:/usr/bin`) tries for
/// `name`, in order (an empty entry is the current directory).
fn path_candidates(name: &[u8]) -> Vec<Vec<u8>> {
    let path = std::env::var_os("PATH").map_or_else(
        || b"/bin:/usr/bin".to_vec(),
        |p| std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec(),
    );
    path.split(|&b| b == b':')
        .map(|d| {
            let mut c = if d.is_empty() {
                b".".to_vec()
            } else {
                d.to_vec()
            };
            c.push(b'/');
            c.extend_from_slice(name);
            c
        })
        .collect()
}

/// The first candidate of `PATH` holding `name`, if it is on Cairn (`None` when the
/// first is on the host, or none has it: the C library's search finds those).
fn cairn_on_path(name: &[u8]) -> Option<CString> {
    for c in path_candidates(name) {
        match ops::classify(libc::AT_FDCWD, &c) {
            Ok(ops::Where::Cairn(cp)) => {
                if ops::stat(&cp, true).is_ok_and(|m| m.is_file()) {
                    return CString::new(c).ok();
                }
            }
            _ => {
                let Ok(cs) = CString::new(c) else { continue };
                // SAFETY: stat of a C string into a local buffer.
                let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
                if unsafe { real::fstatat64(libc::AT_FDCWD, cs.as_ptr(), &mut st, 0) } == 0 {
                    return None;
                }
            }
        }
    }
    None
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    unsafe { spawn(pid, path, actions, attr, argv, envp, false) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    unsafe { spawn(pid, file, actions, attr, argv, envp, true) }
}

/// Cairn descriptors opened for `posix_spawn` file actions: (actions, descriptor),
/// closed when the actions are destroyed.
static SPAWN_OPENS: parking_lot::Mutex<Vec<(usize, c_int)>> = parking_lot::Mutex::new(Vec::new());

/// `posix_spawn_file_actions_addopen` of a Cairn path: the child cannot open it itself
/// (its kernel does not know the store), so it is opened here, when the action is added,
/// and the action becomes a `dup2` of that descriptor, which the new program adopts as an
/// inherited Cairn description (as across `exec`). The descriptor closes when the actions
/// are destroyed.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn_file_actions_addopen(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    path: *const c_char,
    oflag: c_int,
    mode: mode_t,
) -> c_int {
    match unsafe { route(libc::AT_FDCWD, path) } {
        Ok(Route::Cairn(cp)) => {
            let opened = match ops::open(&cp, oflag | libc::O_CLOEXEC, mode) {
                Ok(p) => p,
                Err(e) => return cairn_area::errno_of(&e),
            };
            let r = unsafe { real::posix_spawn_file_actions_adddup2(fa, opened, fd) };
            if r != 0 {
                unsafe { crate::abi_fd::close(opened) };
                return r;
            }
            SPAWN_OPENS.lock().push((fa as usize, opened));
            0
        }
        Ok(r) => unsafe {
            real::posix_spawn_file_actions_addopen(fa, fd, r.host_ptr(path), oflag, mode)
        },
        Err(e) => cairn_area::errno_of(&e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn_file_actions_destroy(
    fa: *mut libc::posix_spawn_file_actions_t,
) -> c_int {
    let mine: Vec<c_int> = {
        let mut g = SPAWN_OPENS.lock();
        let (mine, rest) = g.drain(..).partition(|&(a, _)| a == fa as usize);
        *g = rest;
        mine.into_iter().map(|(_, fd)| fd).collect()
    };
    for fd in mine {
        unsafe { crate::abi_fd::close(fd) };
    }
    unsafe { real::posix_spawn_file_actions_destroy(fa) }
}

/// `system` and `popen` start a shell inside the C library (the environment already
/// carries the current directory: `chdir` sets it).
#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    if !cmd.is_null() {
        before_exec();
    }
    unsafe { real::system(cmd) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    before_exec();
    unsafe { real::popen(cmd, mode) }
}

/// The Cairn current directory inherited through `exec`.
pub fn cwd_from_env() {
    let Some(v) = std::env::var_os(state::CWD_ENV) else {
        return;
    };
    let b = std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec();
    if crate::paths::strip_prefix(&b, state::config().prefix()).is_some() {
        state::set_cwd(Some(state::Cwd { path: b, ino: 0 }));
    }
}

extern "C" {
    static environ: *const *const c_char;
}

/// `execv`: `execve` with this process's environment (glibc's calls its own internally).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    unsafe { execve(path, argv, environ) }
}

/// `execvp`/`execvpe`: a name with a slash is `execv`/`execve`; a bare name is searched
/// on `PATH` by the C library (the environment carries the current directory), or here
/// when a directory of `PATH` is on Cairn (the C library's search cannot see it), with
/// its rules: on to the next directory when the file is missing or not permitted, and
/// a file that is neither a script nor a binary run by `/bin/sh`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let Ok(Some(name)) = (unsafe { user_cstr(file) }) else {
        return unsafe { real::execvpe(file, argv, envp) };
    };
    if name.contains(&b'/') {
        return unsafe { execve(file, argv, envp) };
    }
    let candidates = path_candidates(name);
    let on_cairn = |c: &[u8]| matches!(ops::classify(libc::AT_FDCWD, c), Ok(ops::Where::Cairn(_)));
    if name.is_empty() || !candidates.iter().any(|c| on_cairn(c)) {
        before_exec();
        return unsafe { real::execvpe(file, argv, envp) };
    }
    let mut denied = false;
    for c in candidates {
        let Ok(c) = CString::new(c) else { continue };
        unsafe { execve(c.as_ptr(), argv, envp) };
        match real::errno() {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            libc::ENOEXEC => {
                // Neither a script nor a binary: a shell script without `#!`.
                let sh = c"/bin/sh";
                let v = unsafe { script_argv(sh, None, c.as_ptr(), argv) };
                return unsafe { execve(sh.as_ptr(), v.as_ptr(), envp) };
            }
            _ => return -1,
        }
    }
    real::set_errno(if denied { libc::EACCES } else { libc::ENOENT });
    -1
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    unsafe { execvpe(file, argv, environ) }
}

/// `vfork` is `fork` here: a child sharing the parent's memory would use the parent's
/// client, and `fork` lets the parent publish its log and share its offsets first.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    unsafe { libc::fork() }
}

// `execl`, `execle` and `execlp` are variadic, which stable Rust cannot define: their
// bodies are C (`c/execl.c`), which gathers the arguments and calls `execve`/`execvp`
// above. The exported symbols are these naked Rust functions (rustc exports only Rust's
// own symbols from a cdylib): each is one jump, which leaves the argument registers, the
// stack and `%al` (the variadic call's vector-register count) as the caller set them.
extern "C" {
    fn cairn_execl(path: *const c_char, arg0: *const c_char, ...) -> c_int;
    fn cairn_execle(path: *const c_char, arg0: *const c_char, ...) -> c_int;
    fn cairn_execlp(file: *const c_char, arg0: *const c_char, ...) -> c_int;
}

/// `execl(path, arg0, ..., NULL)`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn execl(_path: *const c_char, _arg0: *const c_char) -> c_int {
    core::arch::naked_asm!("jmp {}", sym cairn_execl)
}

/// `execle(path, arg0, ..., NULL, envp)`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn execle(_path: *const c_char, _arg0: *const c_char) -> c_int {
    core::arch::naked_asm!("jmp {}", sym cairn_execle)
}

/// `execlp(file, arg0, ..., NULL)`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn execlp(_file: *const c_char, _arg0: *const c_char) -> c_int {
    core::arch::naked_asm!("jmp {}", sym cairn_execlp)
}
