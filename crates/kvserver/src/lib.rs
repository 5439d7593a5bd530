//! `cairn kv serve`: a Redis-compatible server over a `cairn-kv` store (docs/KV.md).
//!
//! Modules: `resp` (the protocol, pure), `glob` (Redis's patterns), `commands` (each
//! command against the store), `server` (the acceptor and the `epoll` workers).
#![forbid(unsafe_code)]

pub mod client;
pub mod commands;
mod glob;
pub mod resp;
pub mod server;

pub use commands::Shared;

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
