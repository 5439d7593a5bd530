//! A profiling loop for the write path: `N` durable 1 KiB writes at random 1 KiB-aligned
//! offsets of a 64 MiB file `/write-loop` in the store (`$CAIRN_STORE`, else the default
//! store), then the p50 and p99 per write. Run it under `perf record` to see where a write
//! goes (docs/BENCHMARKS.md, "The write path"):
//!
//!   cargo build --release -p cairn --example write_loop
//!   CAIRN_STORE=DIR target/release/examples/write_loop 300000

fn main() -> std::io::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300_000);
    let fs = cairn::Fs::open_store(None)?;
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .open(&fs, "/write-loop")?;
    let buf = vec![7u8; 1024];
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut lat = Vec::with_capacity(n);
    let start = std::time::Instant::now();
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % (64 << 10)) * 1024;
        let t = std::time::Instant::now();
        f.write_at(&buf, off)?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
    lat.sort_unstable();
    println!(
        "{n} writes of 1 KiB in {total:.2?}: p50 {} ns, p99 {} ns",
        lat[n / 2],
        lat[n * 99 / 100]
    );
    drop(f);
    fs.remove_file("/write-loop")
}
