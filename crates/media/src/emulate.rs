//! Emulated media, for experiments (off unless configured): per tier (0 = NVM, 1 = SSD,
//! 2 = HDD) a latency added to every read and a bandwidth cap, in the manner of the
//! Strata paper's NVM emulation (reads 300 ns slower, 1/8 of DRAM bandwidth). A transfer
//! of `n` bytes takes at least `n / bandwidth` (each transfer on its own: concurrent
//! transfers are not throttled together) plus, for a read, the latency. The settings are
//! per process; NVM reads and writes are charged in [`crate::Mapping`] (every copy to or
//! from the NVM tier, not the 8-byte atomic loads and stores), the lower tiers by their
//! readers and writers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
static READ_NS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static BYTES_PER_SEC: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Emulate tier `tier` with `read_ns` added per read and a cap of `mbps` MB/s (10^6
/// bytes per second; 0: no cap).
pub fn set(tier: u8, read_ns: u64, mbps: u64) {
    let t = tier.min(2) as usize;
    READ_NS[t].store(read_ns, Ordering::Relaxed);
    BYTES_PER_SEC[t].store(mbps.saturating_mul(1_000_000), Ordering::Relaxed);
    let any = (0..3).any(|i| {
        READ_NS[i].load(Ordering::Relaxed) != 0 || BYTES_PER_SEC[i].load(Ordering::Relaxed) != 0
    });
    ON.store(any, Ordering::Relaxed);
}

/// Whether any tier is emulated.
pub fn active() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Charge a read of `bytes` from tier `tier` (waits).
#[inline]
pub fn read(tier: u8, bytes: usize) {
    if active() {
        charge(tier, bytes, true);
    }
}

/// Charge a write of `bytes` to tier `tier` (waits).
#[inline]
pub fn write(tier: u8, bytes: usize) {
    if active() {
        charge(tier, bytes, false);
    }
}

fn charge(tier: u8, bytes: usize, is_read: bool) {
    let t = tier.min(2) as usize;
    let mut ns = if is_read {
        READ_NS[t].load(Ordering::Relaxed)
    } else {
        0
    };
    let bps = BYTES_PER_SEC[t].load(Ordering::Relaxed);
    if bps != 0 {
        ns += (bytes as u128 * 1_000_000_000 / bps as u128) as u64;
    }
    wait(Duration::from_nanos(ns));
}

/// This machine's memory copy bandwidth in MB/s (best of a few 64 MiB copies), the
/// base of the `strata` profile's NVM bandwidth (1/8 of DRAM's).
pub fn dram_copy_mbps() -> u64 {
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    ((64u64 << 20) as f64 / best.max(1e-9) / 1e6) as u64
}

/// Wait `d`: spin below 100 µs (sleep is far coarser), sleep above.
fn wait(d: Duration) {
    if d.is_zero() {
        return;
    }
    if d >= Duration::from_micros(100) {
        std::thread::sleep(d);
        return;
    }
    let start = Instant::now();
    while start.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn charges_latency_and_bandwidth() {
        // Tier 2 only (other tests of this crate use NVM mappings).
        super::set(2, 200_000, 100);
        let t = std::time::Instant::now();
        super::read(2, 1_000_000); // 200 µs + 10 ms at 100 MB/s
        assert!(t.elapsed() >= std::time::Duration::from_micros(10_200));
        let t = std::time::Instant::now();
        super::write(2, 100_000); // 1 ms, no latency
        let e = t.elapsed();
        assert!(e >= std::time::Duration::from_millis(1), "{e:?}");
        super::set(2, 0, 0);
        assert!(!super::active());
    }
}
