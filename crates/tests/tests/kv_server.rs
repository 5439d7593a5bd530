//! `cairn kv serve` with real clients: redis-cli against a real redis-server fed the
//! same commands, the Python `redis` package, redis-benchmark, kill -9 under load from
//! several clients, and bad input.

use cairn_kvserver::client::{Client, Reply};
use cairn_tests::harness::cairn_bin;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A pool file in /dev/shm, removed at drop.
struct Pool(PathBuf);

impl Pool {
    fn new(tag: &str) -> Pool {
        Pool(PathBuf::from(format!(
            "/dev/shm/cairn-kv-test-{tag}-{}.pool",
            std::process::id()
        )))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A server process, killed at drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_port(port: u16, child: &mut Child) {
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the server exited: {st}");
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no server on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Start `cairn kv serve` on a port the kernel chooses (`--port 0`), read from the line
/// it prints once listening: no other process can hold it (a port found free and then
/// bound by the server could be taken meanwhile, and a connection to it reach another
/// test's server).
fn start(pool: &Path, size: &str, extra: &[&str]) -> Server {
    let mut child = Command::new(cairn_bin())
        .args(["kv", "serve", "--pool"])
        .arg(pool)
        .args(["--size", size, "--port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let port = loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(n > 0, "the server exited before listening");
        if let Some(p) = line
            .split("listening on ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
        {
            break p;
        }
    };
    // Keep draining what it says (a full pipe would block it).
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    Server { child, port }
}

fn client(port: u16) -> Client {
    Client::connect(&format!("127.0.0.1:{port}")).unwrap()
}

fn call(c: &mut Client, args: &[&str]) -> Reply {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    c.call(&a).unwrap()
}

/// The same commands through redis-cli to `cairn kv serve` and to `redis-server`: the
/// same output. (Not in the script: what differs on purpose, docs/KV.md: `SELECT` of a
/// database other than 0, expiry, empty keys.)
#[test]
fn redis_cli_sees_what_redis_server_shows() {
    let pool = Pool::new("cli");
    let cairn = start(&pool.0, "64M", &[]);
    let rport = free_port();
    let mut redis = Command::new("redis-server")
        .args([
            "--port",
            &rport.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/setup.sh installs it)");
    wait_port(rport, &mut redis);
    let script = [
        "PING",
        "PING hello",
        "ECHO abc",
        "SET a 1",
        "GET a",
        "INCR a",
        "INCRBY a 41",
        "DECR a",
        "DECRBY a 2",
        "GET a",
        "SET a x",
        "INCR a",
        "SET big 9223372036854775807",
        "INCR big",
        "APPEND s hello",
        "APPEND s ' world'",
        "STRLEN s",
        "STRLEN nokey",
        "GETDEL s",
        "GETDEL s",
        "SET n v NX",
        "SET n w NX",
        "SET n w XX",
        "SET m w XX",
        "SET n z GET",
        "SET q z NX GET",
        "GET n",
        "MSET k1 v1 k2 v2 k3 v3",
        "MGET k1 k2 nokey k3",
        "EXISTS k1 k2 nokey k1",
        "DEL k1 nokey k2",
        "EXISTS k1",
        "TYPE k3",
        "TYPE nokey",
        "TTL k3",
        "TTL nokey",
        "SELECT 0",
        "GET",
        "SET onlykey",
        "MSET a",
        "NOSUCHCOMMAND x y",
        "DBSIZE",
        "KEYS k*",
        "SET 'with space' 'v a l'",
        "GET 'with space'",
        "FLUSHDB",
        "DBSIZE",
        "GET a",
    ];
    let run = |port: u16| -> String {
        let mut out = String::new();
        for line in script {
            let o = Command::new("sh")
                .arg("-c")
                .arg(format!("redis-cli -p {port} {line}"))
                .output()
                .unwrap();
            out.push_str(&format!("> {line}\n{}", String::from_utf8_lossy(&o.stdout)));
        }
        out
    };
    let (a, b) = (run(cairn.port), run(rport));
    let _ = redis.kill();
    let _ = redis.wait();
    for (x, y) in a.lines().zip(b.lines()) {
        assert_eq!(x, y, "cairn:\n{a}\nredis:\n{b}");
    }
    assert_eq!(a.lines().count(), b.lines().count());
}

/// The Python `redis` package, unmodified: commands, a pipeline, SCAN, INFO.
#[test]
fn python_redis_client_works() {
    let pool = Pool::new("py");
    let s = start(&pool.0, "64M", &[]);
    let prog = format!(
        r#"
import redis
r = redis.Redis(port={port})
assert r.ping()
r.set('a', b'\x00\xffbin')
assert r.get('a') == b'\x00\xffbin'
assert r.incr('n') == 1 and r.incrby('n', 9) == 10
p = r.pipeline(transaction=False)
for i in range(1000):
    p.set('k%d' % i, 'v%d' % i)
p.execute()
assert r.mget(['k1', 'k999', 'nokey']) == [b'v1', b'v999', None]
keys = set(r.scan_iter(match='k*', count=100))
assert len(keys) == 1000, len(keys)
assert r.dbsize() == 1002
info = r.info()
assert info['used_memory'] > 0 and info['db0']['keys'] == 1002, info
assert r.delete('a', 'nokey') == 1
try:
    r.execute_command('NOSUCH')
    raise SystemExit('no error')
except redis.ResponseError as e:
    assert 'unknown command' in str(e)
print('ok')
"#,
        port = s.port
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "python3 (the python3-redis package: scripts/setup.sh): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// redis-benchmark runs to completion, pipelined and not, and its keys are there.
#[test]
fn redis_benchmark_runs() {
    let pool = Pool::new("bench");
    let s = start(&pool.0, "64M", &["--in-place"]);
    for p in ["1", "16"] {
        let out = Command::new("redis-benchmark")
            .args(["-p", &s.port.to_string(), "-t", "set,get", "-n", "20000"])
            .args(["-c", "20", "-P", p, "--csv"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("\"SET\"") || l.starts_with("\"GET\""))
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
    }
    let mut c = client(s.port);
    assert_eq!(call(&mut c, &["EXISTS", "key:__rand_int__"]), Reply::Int(1));
}

/// A server started with `--shared` is one process among others on its pool: what
/// `cairn kv put` writes (in its own process) redis-cli reads through the server, and
/// the other way round; a server killed with -9 leaves the others going on, and a
/// `redis-benchmark` run against the server while `cairn kv` processes write is seen
/// whole by both.
#[test]
fn a_shared_server_and_other_processes_see_each_other() {
    let pool = Pool::new("shared");
    let s = start(&pool.0, "64M", &["--shared"]);
    let kv = |args: &[&str]| {
        let o = Command::new(cairn_bin())
            .arg("kv")
            .args(args)
            .arg("--pool")
            .arg(&pool.0)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    kv(&["put", "direct", "from a process"]);
    let mut c = client(s.port);
    assert_eq!(
        call(&mut c, &["GET", "direct"]),
        Reply::Bulk(b"from a process".to_vec())
    );
    call(&mut c, &["SET", "served", "through the server"]);
    assert_eq!(kv(&["get", "served"]), "through the server");
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &s.port.to_string(),
            "-t",
            "set",
            "-n",
            "20000",
            "-r",
            "1000",
        ])
        .args(["-c", "20", "-P", "8", "-d", "100", "--csv"])
        .output()
        .unwrap();
    assert!(out.status.success());
    for i in 0..50 {
        kv(&["put", &format!("k{i}"), &format!("v{i}")]);
    }
    assert_eq!(call(&mut c, &["GET", "k49"]), Reply::Bulk(b"v49".to_vec()));
    assert!(kv(&["status", "--json"]).contains("\"shared\":1"));
    // The server killed: the pool is still whole for the next process.
    drop(c);
    drop(s);
    assert_eq!(kv(&["get", "k7"]), "v7");
    assert_eq!(kv(&["get", "direct"]), "from a process");
}

/// `cairn bench spacejmp kv` in miniature: client processes sharing a store, every
/// row measured, nothing left in /dev/shm.
#[test]
fn the_shared_store_benchmark_runs() {
    let o = Command::new(cairn_bin())
        .args([
            "bench", "spacejmp", "kv", "--json", "--runs", "1", "--keys", "2000",
        ])
        .args(["--ops", "5000", "--requests", "0", "--clients", "1,2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "{v}");
    for r in rows {
        assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
    let left = cairn_tests::harness::shm_leftovers("cairn-bench-kvshared-");
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// Three clients set and delete their own keys while the server is killed (-9), five
/// times, in a pool small enough to compact all along; after each restart every key
/// holds its last acknowledged state, or the one its client had in flight.
#[test]
fn kill_9_under_load_loses_nothing_acknowledged() {
    let pool = Pool::new("kill");
    // Per key: the acknowledged state (Some(version) or None) and the one in flight.
    type Book = HashMap<u64, (Option<u64>, Option<Option<u64>>)>;
    let book: Arc<Mutex<Book>> = Arc::new(Mutex::new(HashMap::new()));
    for round in 0..6u64 {
        let extra: &[&str] = if round % 2 == 0 { &[] } else { &["--in-place"] };
        let mut s = start(&pool.0, "24M", extra);
        // Check what the previous round left.
        {
            let mut c = client(s.port);
            let mut b = book.lock().unwrap();
            for (k, (acked, flight)) in b.iter_mut() {
                let got = match call(&mut c, &["GET", &format!("k{k}")]) {
                    Reply::Bulk(v) => {
                        let v = String::from_utf8(v).unwrap();
                        let (key, ver) = v.split_once(':').unwrap();
                        assert_eq!(key, format!("k{k}"), "round {round}: a foreign value");
                        let ver = ver.split('.').next().unwrap();
                        Some(ver.parse::<u64>().unwrap())
                    }
                    Reply::Nil => None,
                    r => panic!("{r:?}"),
                };
                if got != *acked {
                    assert_eq!(
                        Some(got),
                        *flight,
                        "round {round}: key {k} holds {got:?}, acknowledged {acked:?}"
                    );
                    *acked = got;
                }
                *flight = None;
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3u64)
            .map(|w| {
                let (book, stop, port) = (book.clone(), stop.clone(), s.port);
                std::thread::spawn(move || {
                    let mut c = client(port);
                    let mut x = round * 1000 + w + 1;
                    let mut version = (round + 1) * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = w * 1000 + x % 300;
                        version += 1;
                        let del = x % 7 == 0;
                        let new = if del { None } else { Some(version) };
                        book.lock().unwrap().entry(k).or_insert((None, None)).1 = Some(new);
                        let key = format!("k{k}");
                        let r = if del {
                            c.call(&[b"DEL", key.as_bytes()])
                        } else {
                            let pad = "p".repeat((x % 3000) as usize);
                            let v = format!("{key}:{version}.{pad}");
                            c.call(&[b"SET", key.as_bytes(), v.as_bytes()])
                        };
                        match r {
                            Ok(Reply::Error(e)) => panic!("{e}"),
                            Ok(_) => {
                                let mut b = book.lock().unwrap();
                                let e = b.get_mut(&k).unwrap();
                                *e = (new, None);
                            }
                            // The server died: this call is in flight.
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        kill_9_after(
            &mut s,
            Duration::from_millis(300 + 60 * round),
            &stop,
            workers,
        );
    }
    // A kill during recovery itself, then a clean start: still everything.
    for delay in [0u64, 2, 5] {
        let port = free_port();
        let mut child = Command::new(cairn_bin())
            .args(["kv", "serve", "--pool"])
            .arg(&pool.0)
            .args(["--port", &port.to_string()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
    }
    let s = start(&pool.0, "24M", &[]);
    let mut c = client(s.port);
    let b = book.lock().unwrap();
    let mut present = 0;
    for (k, (acked, flight)) in b.iter() {
        let got = match call(&mut c, &["GET", &format!("k{k}")]) {
            Reply::Bulk(v) => {
                let v = String::from_utf8(v).unwrap();
                Some(
                    v.split(':')
                        .nth(1)
                        .unwrap()
                        .split('.')
                        .next()
                        .unwrap()
                        .parse::<u64>()
                        .unwrap(),
                )
            }
            _ => None,
        };
        assert!(
            got == *acked || Some(got) == *flight,
            "key {k}: {got:?} vs {acked:?}"
        );
        present += u64::from(got.is_some());
    }
    assert_eq!(call(&mut c, &["DBSIZE"]), Reply::Int(present as i64));
}

/// Pipelines of 16 `SET`s (and a few `DEL`s) from three clients, many of them on the
/// same few keys (a key set twice in one pipeline, as redis-benchmark's single key is),
/// while the server is killed (-9): the server commits the `SET`s it read together
/// with one fence and acknowledges them after it. After each restart every key holds
/// its last acknowledged value, or one its client had in flight since.
#[test]
fn kill_9_under_pipelined_sets_loses_nothing_acknowledged() {
    let pool = Pool::new("kill-pipelined");
    // Per key: the acknowledged state (Some(version) or None: absent) and the states
    // sent since.
    type Book = HashMap<u64, (Option<u64>, Vec<Option<u64>>)>;
    let book: Arc<Mutex<Book>> = Arc::new(Mutex::new(HashMap::new()));
    let check = |c: &mut Client, b: &mut Book, round: u64| {
        for (k, (acked, flight)) in b.iter_mut() {
            let got = match call(c, &["GET", &format!("k{k}")]) {
                Reply::Bulk(v) => {
                    let v = String::from_utf8(v).unwrap();
                    let (key, ver) = v.split_once(':').unwrap();
                    assert_eq!(key, format!("k{k}"), "round {round}: a foreign value");
                    Some(ver.split('.').next().unwrap().parse::<u64>().unwrap())
                }
                Reply::Nil => None,
                r => panic!("{r:?}"),
            };
            assert!(
                got == *acked || flight.contains(&got),
                "round {round}: key {k} holds {got:?}, acknowledged {acked:?}, in flight {flight:?}"
            );
            *acked = got;
            flight.clear();
        }
    };
    for round in 0..5u64 {
        let extra: &[&str] = if round == 3 { &["--in-place"] } else { &[] };
        let mut s = start(&pool.0, "24M", extra);
        check(&mut client(s.port), &mut book.lock().unwrap(), round);
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3u64)
            .map(|w| {
                let (book, stop, port) = (book.clone(), stop.clone(), s.port);
                std::thread::spawn(move || {
                    let mut c = client(port);
                    let mut x = round * 1000 + w + 1;
                    let mut version = (round + 1) * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        let mut req = Vec::new();
                        let mut sent = Vec::new();
                        for _ in 0..16 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            // Few keys: most pipelines set one of them more than once.
                            let k = w * 1000 + x % 12;
                            version += 1;
                            let key = format!("k{k}");
                            let new = if x % 29 == 0 {
                                cairn_kvserver::client::encode(&mut req, &[b"DEL", key.as_bytes()]);
                                None
                            } else {
                                let pad = "p".repeat((x % 2000) as usize);
                                let v = format!("{key}:{version}.{pad}");
                                cairn_kvserver::client::encode(
                                    &mut req,
                                    &[b"SET", key.as_bytes(), v.as_bytes()],
                                );
                                Some(version)
                            };
                            sent.push((k, new));
                        }
                        {
                            let mut b = book.lock().unwrap();
                            for &(k, new) in &sent {
                                b.entry(k).or_insert((None, Vec::new())).1.push(new);
                            }
                        }
                        match c.pipeline(&req, sent.len()) {
                            Ok(replies) => {
                                let mut b = book.lock().unwrap();
                                for (&(k, new), r) in sent.iter().zip(replies) {
                                    let e = b.get_mut(&k).unwrap();
                                    // Refused (the pool full while compaction lags, as
                                    // under a loaded CI machine): never applied.
                                    if let Reply::Error(m) = &r {
                                        assert!(m.starts_with("OOM"), "{r:?}");
                                        let at = e.1.iter().position(|&f| f == new).unwrap();
                                        e.1.remove(at);
                                        continue;
                                    }
                                    e.0 = new;
                                    // The states sent before this one are past.
                                    let at = e.1.iter().position(|&f| f == new).unwrap();
                                    e.1.drain(..=at);
                                }
                            }
                            // The server died: the pipeline is in flight.
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        kill_9_after(
            &mut s,
            Duration::from_millis(300 + 70 * round),
            &stop,
            workers,
        );
    }
    let s = start(&pool.0, "24M", &[]);
    let mut c = client(s.port);
    let mut b = book.lock().unwrap();
    check(&mut c, &mut b, 5);
    let present = b.values().filter(|(acked, _)| acked.is_some()).count();
    assert!(present > 0);
    assert_eq!(call(&mut c, &["DBSIZE"]), Reply::Int(present as i64));
}

/// `kill -9` the server `after` a while, then stop and join its clients.
fn kill_9_after(
    s: &mut Server,
    after: Duration,
    stop: &AtomicBool,
    workers: Vec<std::thread::JoinHandle<()>>,
) {
    std::thread::sleep(after);
    let _ = Command::new("kill")
        .args(["-9", &s.child.id().to_string()])
        .status();
    let _ = s.child.wait();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
}

fn raw(port: u16, req: &[u8]) -> (Vec<u8>, bool) {
    let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    t.write_all(req).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = t.read(&mut buf).unwrap_or(0);
    buf.truncate(n);
    // Closed by the server?
    let mut one = [0u8; 1];
    let closed = matches!(t.read(&mut one), Ok(0));
    (buf, closed)
}

/// Malformed and truncated requests, a bulk of 2^40 bytes, a value larger than a
/// segment, a full pool: error replies, the connection closed where Redis closes it,
/// the server alive and nothing acknowledged lost.
#[test]
fn bad_input_gets_error_replies() {
    let pool = Pool::new("bad");
    let s = start(&pool.0, "16M", &[]);
    let mut c = client(s.port);
    assert_eq!(
        call(&mut c, &["SET", "keep", "me"]),
        Reply::Simple("OK".into())
    );
    let (r, closed) = raw(s.port, b"*1\r\n$1099511627776\r\n");
    assert_eq!(r, b"-ERR Protocol error: invalid bulk length\r\n");
    assert!(closed);
    let (r, closed) = raw(s.port, b"*2\r\n:1\r\n");
    assert!(
        r.starts_with(b"-ERR Protocol error"),
        "{}",
        String::from_utf8_lossy(&r)
    );
    assert!(closed);
    // Cut short, then the client goes away.
    drop(
        TcpStream::connect(("127.0.0.1", s.port))
            .unwrap()
            .write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk"),
    );
    // A value larger than a segment: an error, the connection stays.
    let big = vec![b'x'; 3 << 20];
    let r = c.call(&[b"SET", b"big", &big]).unwrap();
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("ERR a value has at most")),
        "{r:?}"
    );
    assert_eq!(call(&mut c, &["PING"]), Reply::Simple("PONG".into()));
    // Fill the pool: -OOM, then what was acknowledged is still there.
    let v = vec![b'v'; 512 << 10];
    let mut n = 0;
    let err = loop {
        match c.call(&[b"SET", format!("f{n}").as_bytes(), &v]).unwrap() {
            Reply::Simple(_) => n += 1,
            r => break r,
        }
        assert!(n < 100, "the pool never filled");
    };
    assert!(
        matches!(&err, Reply::Error(e) if e.starts_with("OOM")),
        "{err:?}"
    );
    assert!(n > 5);
    for i in 0..n {
        assert!(
            matches!(call(&mut c, &["STRLEN", &format!("f{i}")]), Reply::Int(l) if l == 512 << 10)
        );
    }
    assert_eq!(call(&mut c, &["GET", "keep"]), Reply::Bulk(b"me".to_vec()));
    // Deleting makes room again (ten: whatever the open log heads hold, which are not
    // compacted, the closed segments lose enough to pack into fewer).
    assert!(n > 12, "{n}");
    let keys: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
    let mut del = vec!["DEL"];
    del.extend(keys.iter().map(String::as_str));
    assert_eq!(call(&mut c, &del), Reply::Int(10));
    assert_eq!(
        c.call(&[b"SET", b"again", &v]).unwrap(),
        Reply::Simple("OK".into())
    );
}

/// What one client can do to the server, all at once: announce bulks of 500 MiB on 64
/// connections and send 4 KiB of each (the server holds what arrives, not what is
/// announced: it once reserved the whole bulk), pipeline 2,000 GETs of a 64 KiB value
/// on 16 connections and never read the replies (a connection stops being read past
/// 4 MiB of replies pending), and hold 10,000 connections more. The server's memory
/// stays bounded, another client is served, and nothing acknowledged is lost.
#[test]
fn one_client_cannot_take_the_server_down() {
    use cairn_tests::harness::{allow_open_files, proc_status};
    const IDLE: usize = 10_000;
    allow_open_files(IDLE as u64 + 100);
    let pool = Pool::new("dos");
    let s = start(&pool.0, "64M", &[]);
    let pid = s.child.id();
    let mut c = client(s.port);
    let value = vec![b'v'; 64 << 10];
    assert_eq!(
        c.call(&[b"SET", b"v", &value]).unwrap(),
        Reply::Simple("OK".into())
    );
    let status = |f| proc_status(pid, f).expect("the server lives");
    let (vm0, rss0) = (status("VmSize"), status("VmRSS"));
    let mut held = Vec::new();
    for _ in 0..64 {
        let mut t = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        t.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$524288000\r\n")
            .unwrap();
        t.write_all(&[b'x'; 4096]).unwrap();
        held.push(t);
    }
    let gets = b"*2\r\n$3\r\nGET\r\n$1\r\nv\r\n".repeat(2000);
    for _ in 0..16 {
        let mut t = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        t.write_all(&gets).unwrap();
        held.push(t);
    }
    let t = Instant::now();
    for _ in 0..IDLE {
        held.push(TcpStream::connect(("127.0.0.1", s.port)).unwrap());
    }
    let opened = t.elapsed();
    // Another client, meanwhile.
    let t = Instant::now();
    let mut other = client(s.port);
    assert_eq!(
        call(&mut other, &["SET", "during", "yes"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        other.call(&[b"GET", b"v"]).unwrap(),
        Reply::Bulk(value.clone())
    );
    let served = t.elapsed();
    // Let the server do all it will for the greedy ones.
    std::thread::sleep(Duration::from_secs(1));
    let (vm, rss) = (status("VmSize"), status("VmRSS"));
    eprintln!(
        "{IDLE} idle connections opened in {opened:?}; another client served in {served:?}; \
         server VmSize {vm0} -> {vm} KiB, VmRSS {rss0} -> {rss} KiB"
    );
    // 64 bulks of 500 MiB reserved would be 32 GB of address space; 16 connections of
    // 4 MiB pending replies and the idle connections' buffers are well under 256 MiB.
    assert!(vm < vm0 + (1 << 20), "VmSize {vm0} -> {vm} KiB");
    assert!(rss < rss0 + (256 << 10), "VmRSS {rss0} -> {rss} KiB");
    drop(held);
    assert_eq!(
        call(&mut c, &["GET", "during"]),
        Reply::Bulk(b"yes".to_vec())
    );
    assert_eq!(c.call(&[b"GET", b"v"]).unwrap(), Reply::Bulk(value));
    assert_eq!(call(&mut c, &["EXISTS", "k"]), Reply::Int(0));
}
