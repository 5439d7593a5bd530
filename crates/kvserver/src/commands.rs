//! The commands: each request's arguments executed against the store, the reply
//! encoded for the connection's protocol. Replies and error texts are Redis's, so that
//! clients and tools see what they expect.

use crate::glob::matches;
use crate::resp::Out;
use cairn_kv::{Change, KvError, Store};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The version this server reports to clients (the Redis behaviour it follows).
pub const REDIS_VERSION: &str = "7.2.0";

/// What the server shares with every connection (for `INFO`, `CLIENT ID`).
pub struct Shared {
    pub store: Store,
    pub started: Instant,
    pub port: u16,
    pub pool: String,
    pub threads: usize,
    pub clients: AtomicU64,
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    pub next_id: AtomicU64,
}

/// One connection's state.
pub struct Session {
    pub id: u64,
    pub resp3: bool,
    pub name: Vec<u8>,
}

/// What the connection does after a command.
#[derive(Debug, PartialEq, Eq)]
pub enum After {
    Continue,
    /// Close once the reply is written (`QUIT`).
    Close,
}

fn lower(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_lowercase()
}

fn arity(o: &mut Out<'_>, name: &str) {
    o.error(&format!(
        "ERR wrong number of arguments for '{name}' command"
    ));
}

fn syntax(o: &mut Out<'_>) {
    o.error("ERR syntax error");
}

/// The reply for a store error.
pub(crate) fn store_error(o: &mut Out<'_>, e: &KvError) {
    match e {
        KvError::Full => o.error("OOM command not allowed when used memory > 'maxmemory'."),
        KvError::IndexFull => o.error(
            "OOM command not allowed: the index is full (open the pool with more expected keys)",
        ),
        KvError::TooBig(m) => o.error(&format!("ERR {m}")),
        KvError::Io(e) => o.error(&format!("ERR I/O error: {e}")),
    }
}

/// A 64-bit integer as Redis parses one: an optional `-`, digits, no leading zero, no
/// sign on zero.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    if digits.is_empty()
        || digits.len() > 19
        || !digits.iter().all(u8::is_ascii_digit)
        || (digits[0] == b'0' && (digits.len() > 1 || b.len() > 1))
    {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

const NOT_INT: &str = "ERR value is not an integer or out of range";

/// Execute one request.
pub fn execute(sh: &Shared, se: &mut Session, args: &[&[u8]], o: &mut Out<'_>) -> After {
    let Some(cmd) = args.first() else {
        return After::Continue;
    };
    // The name in lower case, on the stack (every known one is short; a longer one, or
    // one that is not UTF-8, is unknown whatever its case).
    let mut lowered = [0u8; 16];
    let name = match lowered.get_mut(..cmd.len()) {
        Some(l) => {
            l.copy_from_slice(cmd);
            l.make_ascii_lowercase();
            std::str::from_utf8(l).unwrap_or("")
        }
        None => "",
    };
    let a = &args[1..];
    let s = &sh.store;
    match name {
        "ping" => match a {
            [] => o.simple("PONG"),
            [m] => o.bulk(m),
            _ => arity(o, name),
        },
        "echo" => match a {
            [m] => o.bulk(m),
            _ => arity(o, name),
        },
        "quit" => {
            o.ok();
            return After::Close;
        }
        "get" => match a {
            [k] => get(s, k, o),
            _ => arity(o, name),
        },
        "set" => set(s, a, o),
        "getdel" => match a {
            [k] => {
                let r = s.update(k, |cur| Ok((Change::Delete, cur.map(<[u8]>::to_vec))));
                match r {
                    Ok(Some(v)) => o.bulk(&v),
                    Ok(None) => o.null(),
                    Err(e) => store_error(o, &e),
                }
            }
            _ => arity(o, name),
        },
        "del" | "unlink" => count(name, a, o, |k| s.delete(k)),
        "exists" => count(name, a, o, |k| s.contains(k)),
        "mget" => {
            if a.is_empty() {
                arity(o, name);
                return After::Continue;
            }
            let mut vals = Vec::with_capacity(a.len());
            for k in a {
                let mut v = Vec::new();
                match s.get(k, &mut v) {
                    Ok(Some(_)) => vals.push(Some(v)),
                    // A key Redis could not hold is simply absent.
                    Ok(None) | Err(KvError::TooBig(_)) => vals.push(None),
                    Err(e) => {
                        store_error(o, &e);
                        return After::Continue;
                    }
                }
            }
            o.array(vals.len());
            for v in vals {
                match v {
                    Some(v) => o.bulk(&v),
                    None => o.null(),
                }
            }
        }
        "mset" => {
            if a.is_empty() || !a.len().is_multiple_of(2) {
                arity(o, name);
                return After::Continue;
            }
            for kv in a.chunks(2) {
                if let Err(e) = s.put(kv[0], kv[1]) {
                    store_error(o, &e);
                    return After::Continue;
                }
            }
            o.ok();
        }
        "incr" | "decr" => match a {
            [k] => incr(s, k, if name == "incr" { 1 } else { -1 }, o),
            _ => arity(o, name),
        },
        "incrby" | "decrby" => match a {
            [k, by] => match parse_i64(by) {
                Some(by) if name == "incrby" => incr(s, k, by, o),
                Some(by) => match by.checked_neg() {
                    Some(by) => incr(s, k, by, o),
                    None => o.error("ERR decrement would overflow"),
                },
                None => o.error(NOT_INT),
            },
            _ => arity(o, name),
        },
        "append" => match a {
            [k, v] => {
                let r = s.update(k, |cur| {
                    let mut n = cur.map(<[u8]>::to_vec).unwrap_or_default();
                    n.extend_from_slice(v);
                    let len = n.len();
                    Ok((Change::Put(Cow::Owned(n)), len))
                });
                match r {
                    Ok(len) => o.int(len as i64),
                    Err(e) => store_error(o, &e),
                }
            }
            _ => arity(o, name),
        },
        "strlen" => match a {
            [k] => match s.get_with(k, <[u8]>::len) {
                Ok(n) => o.int(n.unwrap_or(0) as i64),
                Err(KvError::TooBig(_)) => o.int(0),
                Err(e) => store_error(o, &e),
            },
            _ => arity(o, name),
        },
        "type" => match a {
            [k] => match s.contains(k) {
                Ok(true) => o.simple("string"),
                _ => o.simple("none"),
            },
            _ => arity(o, name),
        },
        "ttl" | "pttl" => match a {
            // Keys never expire here: -1 for a key, -2 for none.
            [k] => o.int(if s.contains(k).unwrap_or(false) {
                -1
            } else {
                -2
            }),
            _ => arity(o, name),
        },
        "dbsize" => o.int(s.len() as i64),
        "flushdb" | "flushall" => match a {
            [] => flush(s, o),
            [m] if ["async", "sync"].contains(&lower(m).as_str()) => flush(s, o),
            _ => syntax(o),
        },
        "scan" => scan(s, a, o),
        "keys" => match a {
            [p] => {
                let mut keys = Vec::new();
                let mut c = 0;
                loop {
                    c = s.scan(c, 1024, |k| {
                        if matches(p, k) {
                            keys.push(k.to_vec());
                        }
                    });
                    if c == 0 {
                        break;
                    }
                }
                o.array(keys.len());
                for k in keys {
                    o.bulk(&k);
                }
            }
            _ => arity(o, name),
        },
        "select" => match a {
            [db] => match parse_i64(db) {
                Some(0) => o.ok(),
                Some(_) => o.error("ERR DB index is out of range"),
                None => o.error(NOT_INT),
            },
            _ => arity(o, name),
        },
        "client" => client(se, a, o),
        "hello" => hello(se, a, o),
        "command" => match a.first().map(|c| lower(c)).as_deref() {
            None | Some("docs") => {
                if se.resp3 && !a.is_empty() {
                    o.map(0);
                } else {
                    o.array(0);
                }
            }
            Some("count") => o.int(COMMANDS.len() as i64),
            Some("info") => {
                o.array(a.len() - 1);
                for _ in 1..a.len() {
                    o.null();
                }
            }
            Some(_) => o.error(&format!(
                "ERR unknown subcommand '{}'. Try COMMAND HELP.",
                String::from_utf8_lossy(a[0])
            )),
        },
        "config" => config(sh, a, o),
        "info" => {
            let text = info(sh, a);
            o.text(&text);
        }
        _ => {
            let mut m = format!(
                "ERR unknown command '{}', with args beginning with: ",
                String::from_utf8_lossy(&cmd[..cmd.len().min(128)])
            );
            for x in a.iter().take(8) {
                m.push_str(&format!(
                    "'{}' ",
                    String::from_utf8_lossy(&x[..x.len().min(128)])
                ));
            }
            o.error(&m);
        }
    }
    After::Continue
}

/// The commands this server knows (`COMMAND COUNT`, docs/KV.md).
pub const COMMANDS: &[&str] = &[
    "ping", "echo", "quit", "get", "set", "getdel", "del", "unlink", "exists", "mget", "mset",
    "incr", "decr", "incrby", "decrby", "append", "strlen", "type", "ttl", "pttl", "dbsize",
    "flushdb", "flushall", "scan", "keys", "select", "client", "hello", "command", "config",
    "info",
];

/// `DEL`, `EXISTS`: how many of the keys `f` says yes for (each key counted as often
/// as it is named).
fn count(name: &str, a: &[&[u8]], o: &mut Out<'_>, f: impl Fn(&[u8]) -> Result<bool, KvError>) {
    if a.is_empty() {
        return arity(o, name);
    }
    let mut n = 0;
    for k in a {
        match f(k) {
            Ok(yes) => n += i64::from(yes),
            Err(e) => return store_error(o, &e),
        }
    }
    o.int(n);
}

fn get(s: &Store, k: &[u8], o: &mut Out<'_>) {
    let mut v = Vec::new();
    match s.get(k, &mut v) {
        Ok(Some(_)) => o.bulk(&v),
        Ok(None) | Err(KvError::TooBig(_)) => o.null(),
        Err(e) => store_error(o, &e),
    }
}

fn set(s: &Store, a: &[&[u8]], o: &mut Out<'_>) {
    if a.len() < 2 {
        return arity(o, "set");
    }
    let (k, v) = (&a[0], &a[1]);
    let (mut nx, mut xx, mut get) = (false, false, false);
    let mut i = 2;
    while i < a.len() {
        match lower(a[i]).as_str() {
            "nx" if !xx => nx = true,
            "xx" if !nx => xx = true,
            "get" => get = true,
            "keepttl" => {}
            "ex" | "px" | "exat" | "pxat" => {
                // Expiry would need a clock in every record: not part of this store.
                return o.error(
                    "ERR cairn-kv does not expire keys (EX, PX, EXAT and PXAT are not supported)",
                );
            }
            _ => return syntax(o),
        }
        i += 1;
    }
    let r = s.update(k, |cur| {
        let old = if get { cur.map(<[u8]>::to_vec) } else { None };
        let go = !(nx && cur.is_some() || xx && cur.is_none());
        let change = if go {
            Change::Put(Cow::Borrowed(*v))
        } else {
            Change::Keep
        };
        Ok((change, (go, old)))
    });
    match r {
        Ok((_, Some(old))) if get => o.bulk(&old),
        Ok((_, None)) if get => o.null(),
        Ok((true, _)) => o.ok(),
        Ok((false, _)) => o.null(),
        Err(e) => store_error(o, &e),
    }
}

fn incr(s: &Store, k: &[u8], by: i64, o: &mut Out<'_>) {
    let r = s.update(k, |cur| {
        let n = match cur {
            None => 0,
            Some(v) => parse_i64(v).ok_or_else(|| KvError::TooBig(NOT_INT[4..].into()))?,
        };
        let m = n
            .checked_add(by)
            .ok_or_else(|| KvError::TooBig("increment or decrement would overflow".into()))?;
        Ok((Change::Put(Cow::Owned(m.to_string().into_bytes())), m))
    });
    match r {
        Ok(m) => o.int(m),
        Err(e) => store_error(o, &e),
    }
}

fn flush(s: &Store, o: &mut Out<'_>) {
    let mut c = 0;
    loop {
        let mut keys = Vec::new();
        c = s.scan(c, 1024, |k| keys.push(k.to_vec()));
        for k in keys {
            if let Err(e) = s.delete(&k) {
                return store_error(o, &e);
            }
        }
        if c == 0 {
            break;
        }
    }
    o.ok();
}

fn scan(s: &Store, a: &[&[u8]], o: &mut Out<'_>) {
    let Some(cursor) = a.first() else {
        return arity(o, "scan");
    };
    let Some(cursor) = std::str::from_utf8(cursor)
        .ok()
        .and_then(|c| c.parse::<u64>().ok())
    else {
        return o.error("ERR invalid cursor");
    };
    let (mut pattern, mut count, mut strings_only) = (None, 10usize, true);
    let mut i = 1;
    while i < a.len() {
        let opt = lower(a[i]);
        let Some(val) = a.get(i + 1) else {
            return syntax(o);
        };
        match opt.as_str() {
            "match" => pattern = Some(*val),
            "count" => match parse_i64(val) {
                Some(n) if n >= 1 => count = n as usize,
                Some(_) => return syntax(o),
                None => return o.error(NOT_INT),
            },
            "type" => strings_only = lower(val) == "string",
            _ => return syntax(o),
        }
        i += 2;
    }
    let mut keys = Vec::new();
    let next = s.scan(cursor, count, |k| {
        if strings_only && pattern.as_ref().is_none_or(|p| matches(p, k)) {
            keys.push(k.to_vec());
        }
    });
    o.array(2);
    o.bulk(next.to_string().as_bytes());
    o.array(keys.len());
    for k in keys {
        o.bulk(&k);
    }
}

fn client(se: &mut Session, a: &[&[u8]], o: &mut Out<'_>) {
    let Some(sub) = a.first() else {
        return arity(o, "client");
    };
    match (lower(sub).as_str(), &a[1..]) {
        ("setname", [n]) => {
            if n.iter().any(|&b| b <= b' ' || b > b'~') {
                return o.error(
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            se.name = n.to_vec();
            o.ok();
        }
        ("getname", []) => {
            if se.name.is_empty() {
                o.null();
            } else {
                o.bulk(&se.name.clone());
            }
        }
        ("id", []) => o.int(se.id as i64),
        ("setinfo", [_, _]) => o.ok(),
        ("info", []) => o.text(&format!(
            "id={} name={} db=0 resp={}\n",
            se.id,
            String::from_utf8_lossy(&se.name),
            if se.resp3 { 3 } else { 2 }
        )),
        ("list", []) => o.text(&format!(
            "id={} name={} db=0\n",
            se.id,
            String::from_utf8_lossy(&se.name)
        )),
        ("setname" | "getname" | "id" | "setinfo" | "info" | "list", _) => {
            arity(o, &format!("client|{}", lower(sub)))
        }
        _ => o.error(&format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

fn hello(se: &mut Session, a: &[&[u8]], o: &mut Out<'_>) {
    let mut i = 0;
    if let Some(v) = a.first() {
        match parse_i64(v) {
            Some(2) => se.resp3 = false,
            Some(3) => se.resp3 = true,
            Some(_) => return o.error("NOPROTO unsupported protocol version"),
            None => return o.error("ERR Protocol version is not an integer or out of range"),
        }
        i = 1;
    }
    while i < a.len() {
        match lower(a[i]).as_str() {
            "auth" if i + 2 < a.len() => {
                return o
                    .error("WRONGPASS cairn-kv has no users or passwords (AUTH is not supported)");
            }
            "setname" if i + 1 < a.len() => {
                se.name = a[i + 1].to_vec();
                i += 2;
            }
            _ => return syntax(o),
        }
    }
    o.resp3 = se.resp3;
    o.map(7);
    o.bulk(b"server");
    o.bulk(b"redis");
    o.bulk(b"version");
    o.bulk(REDIS_VERSION.as_bytes());
    o.bulk(b"proto");
    o.int(if se.resp3 { 3 } else { 2 });
    o.bulk(b"id");
    o.int(se.id as i64);
    o.bulk(b"mode");
    o.bulk(b"standalone");
    o.bulk(b"role");
    o.bulk(b"master");
    o.bulk(b"modules");
    o.array(0);
}

fn config(sh: &Shared, a: &[&[u8]], o: &mut Out<'_>) {
    let Some(sub) = a.first() else {
        return arity(o, "config");
    };
    match lower(sub).as_str() {
        "get" => {
            if a.len() < 2 {
                return arity(o, "config|get");
            }
            let st = sh.store.stats();
            let table: Vec<(&str, String)> = vec![
                ("save", String::new()),
                ("appendonly", "no".into()),
                ("appendfsync", "always".into()),
                ("databases", "1".into()),
                ("maxmemory", st.pool_bytes.to_string()),
                ("maxmemory-policy", "noeviction".into()),
                ("port", sh.port.to_string()),
                ("io-threads", sh.threads.to_string()),
                ("proto-max-bulk-len", crate::resp::MAX_BULK.to_string()),
            ];
            let found: Vec<&(&str, String)> = table
                .iter()
                .filter(|(k, _)| {
                    a[1..]
                        .iter()
                        .any(|p| matches(&p.to_ascii_lowercase(), k.as_bytes()))
                })
                .collect();
            o.map(found.len());
            for (k, v) in found {
                o.bulk(k.as_bytes());
                o.bulk(v.as_bytes());
            }
        }
        "resetstat" => {
            sh.commands.store(0, Ordering::Relaxed);
            o.ok();
        }
        "set" => {
            o.error("ERR CONFIG SET is not supported by cairn-kv (see `cairn kv serve --help`)")
        }
        _ => o.error(&format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(sub)
        )),
    }
}

/// Resident memory of this process in bytes (`/proc/self/statm`).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |p| p * 4096)
}

fn human(b: u64) -> String {
    let mut v = b as f64;
    for u in ["B", "K", "M", "G", "T"] {
        if v < 1024.0 {
            return format!("{v:.2}{u}");
        }
        v /= 1024.0;
    }
    format!("{v:.2}P")
}

/// The store's figures as `INFO`'s `# Cairn` section names them (`cairn kv status`
/// reads them back from a server).
pub fn stats_pairs(st: &cairn_kv::Stats) -> Vec<(&'static str, String)> {
    let u: Vec<String> = st.utilization.iter().map(u64::to_string).collect();
    vec![
        ("kv_keys", st.keys.to_string()),
        ("kv_data_bytes", st.data_bytes.to_string()),
        ("kv_live_bytes", st.live_bytes.to_string()),
        ("kv_used_bytes", st.used_bytes.to_string()),
        ("kv_index_bytes", st.index_bytes.to_string()),
        ("kv_pool_bytes", st.pool_bytes.to_string()),
        ("kv_resident_bytes", st.resident_bytes.to_string()),
        ("kv_garbage", format!("{:.4}", st.garbage)),
        ("kv_overhead", format!("{:.4}", st.overhead())),
        ("kv_free_segments", st.free_segments.to_string()),
        ("kv_retired_segments", st.retired_segments.to_string()),
        ("kv_durable", u8::from(st.durable).to_string()),
        ("kv_policy", format!("{:?}", st.policy)),
        ("kv_appends", st.appends.to_string()),
        ("kv_in_place_updates", st.in_place_updates.to_string()),
        ("kv_compacted_bytes", st.compacted_bytes.to_string()),
        ("kv_compacted_segments", st.compacted_segments.to_string()),
        ("kv_compaction_rounds", st.compaction_rounds.to_string()),
        ("kv_compaction_errors", st.compaction_errors.to_string()),
        ("kv_segment_utilization_deciles", u.join(",")),
        ("kv_shared", u8::from(st.shared).to_string()),
        ("kv_processes_reaped", st.processes_reaped.to_string()),
        ("kv_repairs", st.repairs.to_string()),
    ]
}

/// `INFO`'s text: the sections asked for (all by default).
pub fn info(sh: &Shared, a: &[&[u8]]) -> String {
    let want: Vec<String> = a.iter().map(|x| lower(x)).collect();
    let all = want.is_empty()
        || want
            .iter()
            .any(|w| w == "all" || w == "everything" || w == "default");
    let on = |s: &str| all || want.iter().any(|w| w == s);
    let st = sh.store.stats();
    let used = st.used_bytes + st.index_bytes;
    let mut t = String::new();
    if on("server") {
        t.push_str(&format!(
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\ncairn_kv_version:{}\r\nos:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nio_threads_active:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::process::id(),
            sh.port,
            sh.started.elapsed().as_secs(),
            sh.threads,
        ));
    }
    if on("clients") {
        t.push_str(&format!(
            "# Clients\r\nconnected_clients:{}\r\n\r\n",
            sh.clients.load(Ordering::Relaxed)
        ));
    }
    if on("memory") {
        t.push_str(&format!(
            "# Memory\r\nused_memory:{used}\r\nused_memory_human:{}\r\nused_memory_rss:{}\r\nused_memory_dataset:{}\r\nmaxmemory:{}\r\nmaxmemory_policy:noeviction\r\nmem_overhead_ratio:{:.3}\r\n\r\n",
            human(used),
            rss(),
            st.data_bytes,
            st.pool_bytes,
            st.overhead(),
        ));
    }
    if on("persistence") {
        t.push_str(&format!(
            "# Persistence\r\nloading:0\r\naof_enabled:0\r\nrdb_changes_since_last_save:0\r\ncairn_durable_on_return:{}\r\ncairn_pool:{}\r\n\r\n",
            u8::from(st.durable),
            sh.pool,
        ));
    }
    if on("stats") {
        t.push_str(&format!(
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\r\n",
            sh.connections.load(Ordering::Relaxed),
            sh.commands.load(Ordering::Relaxed),
        ));
    }
    if on("cairn") {
        t.push_str("# Cairn\r\n");
        for (k, v) in stats_pairs(&st) {
            t.push_str(&format!("{k}:{v}\r\n"));
        }
        t.push_str("\r\n");
    }
    if on("keyspace") {
        t.push_str("# Keyspace\r\n");
        if st.keys > 0 {
            t.push_str(&format!("db0:keys={},expires=0,avg_ttl=0\r\n", st.keys));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_redis_parses_them() {
        for (s, v) in [("0", Some(0)), ("-5", Some(-5)), ("123", Some(123))] {
            assert_eq!(parse_i64(s.as_bytes()), v, "{s}");
        }
        for s in [
            "",
            "-",
            "+1",
            "01",
            "-0",
            " 1",
            "1 ",
            "9223372036854775808",
            "1e3",
        ] {
            assert_eq!(parse_i64(s.as_bytes()), None, "{s}");
        }
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    }
}
