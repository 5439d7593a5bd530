//! `cairn kv serve`: a Redis-compatible server over a `cairn-kv` store (docs/KV.md).
#![forbid(unsafe_code)]

pub mod resp;
