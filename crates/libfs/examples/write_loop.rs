//! A profiling loop for the write path: `N` durable writes of `SIZE` bytes (default 1 KiB)
//! into a 64 MiB file `/write-loop` in the store (`$CAIRN_STORE`, else the default
//! store), then the p50, p99 and maximum per write and the throughput. Writes of up to
//! 4 KiB go to random `SIZE`-aligned offsets, larger ones (and all with `seq`) rotate
//! through the file (as `cairn bench latency` does). Run it under `perf record` to see where a write goes
//! (docs/BENCHMARKS.md, "The write path"):
//!
//!   cargo build --release -p cairn --example write_loop
//!   CAIRN_STORE=DIR target/release/examples/write_loop 300000 [SIZE] [seq]

const REGION: u64 = 64 << 20;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300_000);
    let size: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let sequential = args.next().as_deref() == Some("seq");
    assert!(
        (1..=REGION).contains(&size),
        "SIZE must be 1 to {REGION} bytes"
    );
    let fs = cairn::Fs::open_store(None)?;
    let f = cairn::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .open(&fs, "/write-loop")?;
    let buf = vec![7u8; size as usize];
    let slots = REGION / size;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut lat = Vec::with_capacity(n);
    let start = std::time::Instant::now();
    for i in 0..n as u64 {
        let slot = if size <= 4096 && !sequential {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % slots
        } else {
            i % slots
        };
        let t = std::time::Instant::now();
        f.write_at(&buf, slot * size)?;
        lat.push(t.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed();
    lat.sort_unstable();
    println!(
        "{n} writes of {size} B in {total:.2?} ({:.0} MB/s): p50 {} ns, p99 {} ns, max {} ns",
        (n as u64 * size) as f64 / total.as_secs_f64() / 1e6,
        lat[n / 2],
        lat[n * 99 / 100],
        lat[n - 1]
    );
    drop(f);
    fs.remove_file("/write-loop")
}
