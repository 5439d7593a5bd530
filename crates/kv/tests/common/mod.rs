//! What the store's integration tests share: pool files that clean up after
//! themselves, values that say whose they are and whether they are whole, a random
//! number generator, and `kill -9`.
#![allow(dead_code)]

use cairn_kv::Store;
use std::path::PathBuf;

/// A pool file in /dev/shm, removed at drop.
pub struct PoolFile(pub PathBuf);

impl PoolFile {
    pub fn new(tag: &str) -> PoolFile {
        PoolFile(PathBuf::from(format!(
            "/dev/shm/cairn-kv-test-{tag}-{}.pool",
            std::process::id()
        )))
    }
}

impl Drop for PoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn get(s: &Store, k: &[u8]) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    s.get(k, &mut v).unwrap().map(|_| v)
}

/// xorshift64*.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A value of `len` bytes (at least 20) for `key` at `version`, with a checksum.
pub fn value_of(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len.max(20));
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    let mut x = key ^ version.rotate_left(17) | 1;
    while v.len() < len.max(20) - 4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    let c = cairn_format::crc(&v);
    v.extend_from_slice(&c.to_le_bytes());
    v
}

/// The version of `key`'s value `v`; panics if `v` is torn or another key's.
pub fn check_value(key: u64, v: &[u8]) -> u64 {
    let n = v.len();
    assert!(n >= 20, "value of key {key} too short");
    let c = u32::from_le_bytes(v[n - 4..].try_into().unwrap());
    assert_eq!(
        cairn_format::crc(&v[..n - 4]),
        c,
        "key {key}: a torn or foreign value"
    );
    assert_eq!(u64::from_le_bytes(v[..8].try_into().unwrap()), key);
    u64::from_le_bytes(v[8..16].try_into().unwrap())
}

/// SIGKILL `pid` (through `kill(1)`: no `unsafe` in this crate).
pub fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}
