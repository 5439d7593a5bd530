//! The Redis protocol (RESP 2 and 3), pure: parsing requests from a byte buffer and
//! encoding replies into one. No I/O.
//!
//! Requests are arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`), what every
//! client sends, or inline commands (`PING\r\n`), what people type into `telnet`.
//! Limits are Redis's: a bulk of at most 512 MiB, an array of at most 1,048,576
//! elements, an inline command of at most 64 KiB; beyond them the request is a protocol
//! error, after which Redis replies with the error and closes the connection.

/// Longest bulk string (Redis's `proto-max-bulk-len`).
pub const MAX_BULK: usize = 512 << 20;
/// Most elements in a request.
pub const MAX_ARGS: usize = 1 << 20;
/// Longest inline request (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const MAX_INLINE: usize = 64 << 10;

/// A request that cannot be parsed: the error reply's text (the connection is closed
/// after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

fn perr<T>(m: &str) -> Result<T, ProtocolError> {
    Err(ProtocolError(format!("Protocol error: {m}")))
}

/// A parsed request (its arguments and the bytes it took), `None` when the buffer does
/// not hold all of it yet, or the protocol error.
pub type Parsed = Result<Option<(Vec<Vec<u8>>, usize)>, ProtocolError>;

/// The arguments of the request [`parse_into`] parsed last, without copying them: where
/// they are in the buffer (an array's bulk strings), or the bytes an inline command's
/// quotes and escapes made. Reused from request to request (no allocation once grown).
#[derive(Debug, Default)]
pub struct Args {
    ranges: Vec<(usize, usize)>,
    owned: Vec<Vec<u8>>,
    inline: bool,
}

impl Args {
    /// How many arguments.
    pub fn len(&self) -> usize {
        if self.inline {
            self.owned.len()
        } else {
            self.ranges.len()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `i` of the request parsed from `buf` (the bytes given to [`parse_into`]).
    pub fn get<'a>(&'a self, buf: &'a [u8], i: usize) -> &'a [u8] {
        if self.inline {
            &self.owned[i]
        } else {
            let (a, b) = self.ranges[i];
            &buf[a..b]
        }
    }
}

/// Parse one request from the start of `buf` into `args`: the bytes it took, or `None`
/// when the buffer does not hold all of it yet.
pub fn parse_into(buf: &[u8], args: &mut Args) -> Result<Option<usize>, ProtocolError> {
    args.ranges.clear();
    args.inline = false;
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        args.inline = true;
        args.owned.clear();
        return Ok(parse_inline(buf)?.map(|(a, n)| {
            args.owned = a;
            n
        }));
    }
    let Some(end) = line_end(buf, 1) else {
        if buf.len() > MAX_INLINE {
            return perr("too big mbulk count string");
        }
        return Ok(None);
    };
    let n = match number(&buf[1..end]) {
        Some(n) if n <= MAX_ARGS as i64 => n,
        _ => return perr("invalid multibulk length"),
    };
    let mut at = end + 2;
    if n <= 0 {
        return Ok(Some(at));
    }
    for _ in 0..n {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return perr(&format!("expected '$', got '{}'", buf[at] as char));
        }
        let Some(end) = line_end(buf, at + 1) else {
            if buf.len() - at > MAX_INLINE {
                return perr("too big bulk count string");
            }
            return Ok(None);
        };
        let len = match number(&buf[at + 1..end]) {
            Some(l) if (0..=MAX_BULK as i64).contains(&l) => l as usize,
            _ => return perr("invalid bulk length"),
        };
        let start = end + 2;
        if buf.len() < start + len + 2 {
            return Ok(None);
        }
        if &buf[start + len..start + len + 2] != b"\r\n" {
            return perr("bulk string not terminated by CRLF");
        }
        args.ranges.push((start, start + len));
        at = start + len + 2;
    }
    Ok(Some(at))
}

/// Where `\r\n` ends the line starting at `from`, if the buffer holds it.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    let mut i = 0;
    while let Some(p) = rest[i..].iter().position(|&b| b == b'\r') {
        let at = i + p;
        if rest.get(at + 1) == Some(&b'\n') {
            return Some(from + at);
        }
        i = at + 1;
    }
    None
}

/// A decimal integer (with an optional sign) of a header line.
fn number(b: &[u8]) -> Option<i64> {
    let (neg, digits) = match b.split_first() {
        Some((b'-', d)) => (true, d),
        Some((b'+', d)) => (false, d),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        // Longer ones (still valid integers) and anything else the slow way.
        return std::str::from_utf8(b).ok()?.parse().ok();
    }
    let n = digits
        .iter()
        .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
    Some(if neg { -n } else { n })
}

/// Parse one request from the start of `buf`: its arguments and the bytes it took, or
/// `None` when the buffer does not hold all of it yet.
pub fn parse(buf: &[u8]) -> Parsed {
    let mut args = Args::default();
    Ok(parse_into(buf, &mut args)?.map(|n| {
        let v = (0..args.len()).map(|i| args.get(buf, i).to_vec()).collect();
        (v, n)
    }))
}

/// How many bytes the request at the start of `buf` announces it still needs at least
/// (for reading large bulks in one go), if it says.
pub fn wanted(buf: &[u8]) -> usize {
    // Only the common case: the last announced bulk's length.
    let Some(p) = buf.iter().rposition(|&b| b == b'$') else {
        return 0;
    };
    let Some(end) = line_end(buf, p + 1) else {
        return 0;
    };
    match number(&buf[p + 1..end]) {
        Some(l) if (0..=MAX_BULK as i64).contains(&l) => {
            (end + 2 + l as usize + 2).saturating_sub(buf.len())
        }
        _ => 0,
    }
}

fn parse_inline(buf: &[u8]) -> Parsed {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_INLINE {
            return perr("too big inline request");
        }
        return Ok(None);
    };
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    let mut args = Vec::new();
    let mut cur: Option<Vec<u8>> = None;
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < line.len() {
        let c = line[i];
        match quote {
            Some(q) if c == q => {
                quote = None;
                args.push(cur.take().unwrap_or_default());
            }
            Some(b'"') if c == b'\\' && i + 1 < line.len() => {
                i += 1;
                let e = match line[i] {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    o => o,
                };
                cur.get_or_insert_with(Vec::new).push(e);
            }
            Some(_) => cur.get_or_insert_with(Vec::new).push(c),
            None if c == b'"' || c == b'\'' => {
                if let Some(a) = cur.take() {
                    args.push(a);
                }
                quote = Some(c);
                cur = Some(Vec::new());
            }
            None if c == b' ' || c == b'\t' => {
                if let Some(a) = cur.take() {
                    args.push(a);
                }
            }
            None => cur.get_or_insert_with(Vec::new).push(c),
        }
        i += 1;
    }
    if quote.is_some() {
        return perr("unbalanced quotes in request");
    }
    if let Some(a) = cur {
        args.push(a);
    }
    Ok(Some((args, nl + 1)))
}

/// A reply being encoded for one connection (its protocol version decides how nulls,
/// maps and a few other types look).
pub struct Out<'a> {
    pub buf: &'a mut Vec<u8>,
    pub resp3: bool,
}

impl Out<'_> {
    pub fn simple(&mut self, s: &str) {
        self.buf.push(b'+');
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn ok(&mut self) {
        self.simple("OK");
    }

    /// An error reply: `msg` starts with its code (`ERR`, `WRONGTYPE`, `OOM`, ...).
    pub fn error(&mut self, msg: &str) {
        self.buf.push(b'-');
        // A reply is one line.
        for &b in msg.as_bytes() {
            self.buf
                .push(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn int(&mut self, n: i64) {
        self.buf.push(b':');
        self.buf.extend_from_slice(n.to_string().as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn bulk(&mut self, b: &[u8]) {
        self.buf.push(b'$');
        self.buf.extend_from_slice(b.len().to_string().as_bytes());
        self.buf.extend_from_slice(b"\r\n");
        self.buf.extend_from_slice(b);
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn null(&mut self) {
        self.buf
            .extend_from_slice(if self.resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    pub fn array(&mut self, n: usize) {
        self.buf.push(b'*');
        self.buf.extend_from_slice(n.to_string().as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// A map of `n` pairs (RESP 3), or an array of `2n` elements (RESP 2).
    pub fn map(&mut self, n: usize) {
        if self.resp3 {
            self.buf.push(b'%');
            self.buf.extend_from_slice(n.to_string().as_bytes());
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.array(2 * n);
        }
    }

    /// A verbatim text (RESP 3, `INFO`'s reply), or a bulk string (RESP 2).
    pub fn text(&mut self, s: &str) {
        if self.resp3 {
            self.buf.push(b'=');
            self.buf
                .extend_from_slice((s.len() + 4).to_string().as_bytes());
            self.buf.extend_from_slice(b"\r\ntxt:");
            self.buf.extend_from_slice(s.as_bytes());
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.bulk(s.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn arrays_whole_cut_and_pipelined() {
        let req = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n";
        let (a, n) = parse(req).unwrap().unwrap();
        assert_eq!((a, n), (args(&["GET", "k"]), 20));
        let (b, m) = parse(&req[n..]).unwrap().unwrap();
        assert_eq!((b, n + m), (args(&["PING"]), req.len()));
        // Every prefix of a request is "not yet".
        for cut in 0..20 {
            assert_eq!(parse(&req[..cut]).unwrap(), None, "cut at {cut}");
        }
        // Binary values.
        let (c, _) = parse(b"*2\r\n$3\r\nSET\r\n$4\r\n\r\n\0\xff\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(c[1], b"\r\n\0\xff");
        assert_eq!(parse(b"*0\r\n").unwrap(), Some((vec![], 4)));
    }

    #[test]
    fn inline_commands() {
        assert_eq!(
            parse(b"SET k \"a b\\n\" 'c d'\r\n").unwrap(),
            Some((args(&["SET", "k", "a b\n", "c d"]), 21))
        );
        assert_eq!(parse(b"PING\n").unwrap(), Some((args(&["PING"]), 5)));
        assert_eq!(parse(b"\r\n").unwrap(), Some((vec![], 2)));
        assert_eq!(parse(b"PIN").unwrap(), None);
        assert!(parse(b"SET \"k\r\n").is_err(), "unbalanced quotes");
        assert!(parse(&vec![b'a'; MAX_INLINE + 1]).is_err());
    }

    #[test]
    fn bad_requests_are_protocol_errors() {
        let e = |b: &[u8]| parse(b).unwrap_err().0;
        assert_eq!(
            e(b"*1\r\n$1099511627776\r\n"),
            "Protocol error: invalid bulk length"
        );
        assert_eq!(e(b"*1\r\n$-5\r\n"), "Protocol error: invalid bulk length");
        assert_eq!(e(b"*x\r\n"), "Protocol error: invalid multibulk length");
        assert_eq!(
            e(b"*99999999\r\n"),
            "Protocol error: invalid multibulk length"
        );
        assert_eq!(e(b"*1\r\n:3\r\n"), "Protocol error: expected '$', got ':'");
        assert_eq!(
            e(b"*1\r\n$1\r\nab\r\n"),
            "Protocol error: bulk string not terminated by CRLF"
        );
        assert!(parse(&[b"*1\r\n$".as_slice(), &vec![b'9'; MAX_INLINE + 10]].concat()).is_err());
    }

    #[test]
    fn replies_in_both_protocols() {
        let mut b = Vec::new();
        let mut o = Out {
            buf: &mut b,
            resp3: false,
        };
        o.null();
        o.map(1);
        o.bulk(b"k");
        o.int(-3);
        o.error("ERR a\r\nb");
        o.text("x");
        assert_eq!(
            b,
            b"$-1\r\n*2\r\n$1\r\nk\r\n:-3\r\n-ERR a  b\r\n$1\r\nx\r\n"
        );
        let mut b = Vec::new();
        let mut o = Out {
            buf: &mut b,
            resp3: true,
        };
        o.null();
        o.map(1);
        o.text("x");
        assert_eq!(b, b"_\r\n%1\r\n=5\r\ntxt:x\r\n");
    }

    #[test]
    fn wanted_bytes_of_a_large_bulk() {
        assert_eq!(wanted(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100\r\nab"), 100);
        assert_eq!(wanted(b"*1\r\n$4\r\nPING\r\n"), 0);
    }
}
