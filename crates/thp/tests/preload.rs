//! `libcairn_thp.so` in real processes: a Python program calls each allocator function
//! through ctypes (as a C program would) and reads from its own smaps whether the block
//! it got is marked `MADV_HUGEPAGE` (`hg`). Without glibc's tunable, which the earlier
//! library relied on and which glibc ignores where it cannot read the THP mode.

use std::path::PathBuf;
use std::process::Command;

/// The library built in the tests' profile (`cargo test` does not build a cdylib for
/// its tests: scripts/test.sh builds the workspace first). One older than its source
/// would test old code, so it fails the test.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join("libcairn_thp.so"))
        .find(|p| p.is_file())
        .expect("libcairn_thp.so is not built: cargo build --workspace (same profile)");
    let modified = |p: &std::path::Path| p.metadata().unwrap().modified().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    assert!(
        modified(&lib) >= modified(&src),
        "{} is older than {}: cargo build -p cairn-thp (same profile)",
        lib.display(),
        src.display()
    );
    lib
}

/// Allocates with each function, prints `name advised` per block, then frees them all
/// (and, under jemalloc, how many bytes jemalloc counted for the 64 MiB malloc).
const SCRIPT: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None)
V, S = ctypes.c_void_p, ctypes.c_size_t
for name, args in [("malloc", [S]), ("calloc", [S, S]), ("realloc", [V, S]),
                   ("memalign", [S, S]), ("aligned_alloc", [S, S]), ("free", [V])]:
    f = getattr(libc, name); f.restype = V; f.argtypes = args
libc.posix_memalign.restype = ctypes.c_int
libc.posix_memalign.argtypes = [ctypes.POINTER(V), S, S]

def advised(p, size):
    mid = p + size // 2
    inside = False
    for line in open("/proc/self/smaps"):
        f = line.split()
        if "-" in f[0] and not f[0].endswith(":"):
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            inside = lo <= mid < hi
        elif inside and f[0] == "VmFlags:":
            return "hg" in f[1:]
    raise SystemExit("block not mapped")

BIG = 64 << 20
blocks = []
def check(name, p, size):
    assert p, name
    print(name, advised(p, size))
    blocks.append(p)

check("malloc", libc.malloc(BIG), BIG)
check("calloc", libc.calloc(BIG // 8, 8), BIG)
check("realloc", libc.realloc(libc.malloc(100), BIG), BIG)
check("memalign", libc.memalign(1 << 21, BIG), BIG)
check("aligned_alloc", libc.aligned_alloc(4096, BIG), BIG)
out = V()
assert libc.posix_memalign(ctypes.byref(out), 4096, BIG) == 0
check("posix_memalign", out.value, BIG)
assert libc.posix_memalign(ctypes.byref(out), 3, BIG) != 0
check("small", libc.malloc(1 << 20), 1 << 20)
for p in blocks:
    libc.free(p)
if hasattr(libc, "mallctl"):
    libc.mallctl.argtypes = [ctypes.c_char_p, V, ctypes.POINTER(S), V, S]
    def allocated():
        v, n = ctypes.c_uint64(), S(8)
        assert libc.mallctl(b"thread.allocated", ctypes.byref(v), ctypes.byref(n), None, 0) == 0
        return v.value
    before = allocated()
    p = libc.malloc(BIG)
    print("jemalloc_counted", allocated() - before >= BIG)
    libc.free(p)
"#;

/// Run the script with `LD_PRELOAD` set to `preload`; its `name value` lines.
fn run(preload: &str) -> Vec<(String, bool)> {
    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .env("LD_PRELOAD", preload)
        .env_remove("GLIBC_TUNABLES")
        .output()
        .expect("python3 (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v == "True")
        })
        .collect()
}

const BIG_BLOCKS: [&str; 6] = [
    "malloc",
    "calloc",
    "realloc",
    "memalign",
    "aligned_alloc",
    "posix_memalign",
];

#[test]
fn every_large_block_is_marked_and_small_ones_are_not() {
    let lib = library();
    let got = run(lib.to_str().unwrap());
    let names: Vec<_> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names[..6], BIG_BLOCKS, "{got:?}");
    for (name, advised) in &got {
        assert_eq!(*advised, name != "small", "{name}: {got:?}");
    }
    // The check itself: without the library nothing is marked.
    let plain = run("");
    assert!(plain.iter().all(|(_, a)| !a), "{plain:?}");
}

/// A program with its own allocator (jemalloc, as Debian's redis-server links it) keeps
/// it: the wrappers call jemalloc's functions, which count the block, and jemalloc's
/// `free` takes back what they returned.
#[test]
fn a_program_s_own_allocator_is_followed_not_replaced() {
    let Some(je) = [
        "/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib64/libjemalloc.so.2",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file()) else {
        eprintln!("skipped: no libjemalloc.so.2 (scripts/setup.sh installs redis-server, which brings it)");
        return;
    };
    let lib = library();
    let got = run(&format!("{} {je}", lib.display()));
    // jemalloc maps its memory with `mmap`, which the library marks whole: small
    // blocks are marked too, as under THP `always`.
    for name in BIG_BLOCKS {
        assert!(got.contains(&(name.to_string(), true)), "{name}: {got:?}");
    }
    assert!(
        got.contains(&("jemalloc_counted".to_string(), true)),
        "{got:?}"
    );
}
