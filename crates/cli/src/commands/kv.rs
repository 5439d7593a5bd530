//! `cairn kv`: serve a pool over the Redis protocol, and look into or change one from
//! the shell (directly, or through the server that has it open).

use crate::error::{CliError, CliResult};
use crate::{KvCommand, KvPoolArgs, KvServeArgs};
use cairn_kv::{KvError, Options, Store, UpdatePolicy};
use cairn_kvserver::client::{Client, Reply};
use cairn_kvserver::Shared;
use std::io::{Read, Write};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

fn kv_err(e: KvError) -> CliError {
    CliError::new(e.to_string())
}

pub fn run(which: KvCommand) -> CliResult {
    match which {
        KvCommand::Serve(a) => serve(&a),
        KvCommand::Status { at, json } => status(&at, json),
        KvCommand::Get { key, at } => get(&at, &key),
        KvCommand::Put { key, value, at } => put(&at, &key, &value),
        KvCommand::Del { key, at } => del(&at, &key),
    }
}

fn serve(a: &KvServeArgs) -> CliResult {
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 || threads > 1024 {
        return Err(CliError::new("--threads: 1 to 1024"));
    }
    let opts = Options {
        size: a.size,
        expected_keys: a.expected_keys,
        policy: if a.in_place {
            UpdatePolicy::InPlace
        } else {
            UpdatePolicy::Append
        },
        compact_below: a.compact_below,
        max_garbage: a.max_garbage,
        ..Options::default()
    };
    let started = std::time::Instant::now();
    let store = if a.volatile {
        Store::open_volatile(&opts)
    } else if a.shared {
        Store::open_shared(&a.pool, &opts)
    } else {
        Store::open(&a.pool, &opts)
    }
    .map_err(|e| CliError::new(format!("{}: {e}", a.pool.display())))?;
    let listener = std::net::TcpListener::bind((a.bind.as_str(), a.port))
        .map_err(crate::error::ctx_msg(format!("{}:{}", a.bind, a.port)))?;
    let port = listener.local_addr()?.port();
    let st = store.stats();
    eprintln!(
        "cairn kv serve: {} ({} keys, {} MiB pool, {:?} updates{}) recovered in {:.2} s; listening on {}:{port} with {threads} threads",
        if a.volatile { "volatile".into() } else { a.pool.display().to_string() },
        st.keys,
        st.pool_bytes >> 20,
        st.policy,
        if a.volatile {
            ", not durable"
        } else if a.shared {
            ", durable on return, shared with other processes"
        } else {
            ", durable on return"
        },
        started.elapsed().as_secs_f64(),
        a.bind,
    );
    cairn_media::sys::install_termination_flag()?;
    let shared = Arc::new(Shared {
        store,
        started,
        port,
        pool: if a.volatile {
            "(volatile)".into()
        } else {
            a.pool.display().to_string()
        },
        threads,
        clients: AtomicU64::new(0),
        connections: AtomicU64::new(0),
        commands: AtomicU64::new(0),
        next_id: AtomicU64::new(1),
    });
    cairn_kvserver::server::serve(
        shared,
        listener,
        threads,
        Arc::new(cairn_media::sys::termination_requested),
    )?;
    eprintln!("cairn kv serve: stopped");
    Ok(())
}

/// The pool opened directly (shared: other processes may have it open shared too), or
/// `None` when a server has it open on its own (then the caller talks to the server).
fn open(at: &KvPoolArgs) -> CliResult<Option<Store>> {
    if !at.pool.exists() {
        return Err(CliError::new(format!(
            "{}: no such pool (`cairn kv serve --pool {}` creates one)",
            at.pool.display(),
            at.pool.display()
        )));
    }
    let opts = Options {
        background_compaction: false,
        ..Options::default()
    };
    // Shared: alongside the processes that have it open shared (a server started with
    // `--shared` among them), or alone.
    match Store::open_shared(&at.pool, &opts) {
        Ok(s) => Ok(Some(s)),
        Err(KvError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(CliError::new(format!("{}: {e}", at.pool.display()))),
    }
}

fn server(at: &KvPoolArgs) -> CliResult<Client> {
    Client::connect(&format!("127.0.0.1:{}", at.port)).map_err(|e| {
        CliError::new(format!(
            "{}: the pool is open in another process, and no server answers on port {}: {}",
            at.pool.display(),
            at.port,
            crate::error::clean(&e)
        ))
    })
}

fn call(at: &KvPoolArgs, args: &[&[u8]]) -> CliResult<Reply> {
    match server(at)?.call(args)? {
        Reply::Error(e) => Err(CliError::new(e)),
        r => Ok(r),
    }
}

fn get(at: &KvPoolArgs, key: &str) -> CliResult {
    let v = match open(at)? {
        Some(s) => {
            let mut v = Vec::new();
            s.get(key.as_bytes(), &mut v).map_err(kv_err)?.map(|_| v)
        }
        None => match call(at, &[b"GET", key.as_bytes()])? {
            Reply::Bulk(v) => Some(v),
            _ => None,
        },
    };
    let v = v.ok_or_else(|| CliError::new(format!("{key}: no such key")))?;
    print(&v)
}

fn put(at: &KvPoolArgs, key: &str, value: &str) -> CliResult {
    let v = if value == "-" {
        let mut v = Vec::new();
        std::io::stdin().read_to_end(&mut v)?;
        v
    } else {
        value.as_bytes().to_vec()
    };
    match open(at)? {
        Some(s) => s.put(key.as_bytes(), &v).map_err(kv_err),
        None => call(at, &[b"SET", key.as_bytes(), &v]).map(|_| ()),
    }
}

fn del(at: &KvPoolArgs, key: &str) -> CliResult {
    let was = match open(at)? {
        Some(s) => s.delete(key.as_bytes()).map_err(kv_err)?,
        None => call(at, &[b"DEL", key.as_bytes()])? == Reply::Int(1),
    };
    if !was {
        return Err(CliError::new(format!("{key}: no such key")));
    }
    Ok(())
}

fn status(at: &KvPoolArgs, json: bool) -> CliResult {
    let (pairs, via): (Vec<(String, String)>, &str) = match open(at)? {
        Some(s) => (
            cairn_kvserver::commands::stats_pairs(&s.stats())
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            "pool",
        ),
        None => {
            let Reply::Bulk(text) = call(at, &[b"INFO", b"cairn"])? else {
                return Err(CliError::new("the server's INFO reply is not text"));
            };
            (
                String::from_utf8_lossy(&text)
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .filter(|(k, _)| k.starts_with("kv_"))
                    .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                    .collect(),
                "server",
            )
        }
    };
    if json {
        let mut m = serde_json::Map::new();
        m.insert("pool".into(), at.pool.display().to_string().into());
        m.insert("via".into(), via.into());
        for (k, v) in &pairs {
            let k = k.trim_start_matches("kv_").to_string();
            let val = match v.parse::<u64>() {
                Ok(n) => serde_json::Value::from(n),
                Err(_) => match v.parse::<f64>() {
                    Ok(f) if k == "overhead" => serde_json::Value::from(f),
                    _ if k == "segment_utilization_deciles" => v
                        .split(',')
                        .filter_map(|x| x.parse::<u64>().ok())
                        .collect::<Vec<_>>()
                        .into(),
                    _ => v.clone().into(),
                },
            };
            m.insert(k, val);
        }
        let text = format!("{}\n", serde_json::Value::Object(m));
        return print(text.as_bytes());
    }
    let mut text = format!("pool {} (read from the {via})\n", at.pool.display());
    for (k, v) in &pairs {
        text += &format!(
            "  {:<28} {v}\n",
            k.trim_start_matches("kv_").replace('_', " ")
        );
    }
    print(text.as_bytes())
}

/// Write `text` on standard output (a reader that went away is not an error to report).
fn print(text: &[u8]) -> CliResult {
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::broken_pipe()),
        r => Ok(r?),
    }
}
