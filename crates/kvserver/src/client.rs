//! A minimal blocking client (for `cairn kv get/put/del/status` when a server has the
//! pool open, and for tests): one command, one reply.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

/// Append one command to `b` as RESP (an array of bulk strings).
pub fn encode(b: &mut Vec<u8>, args: &[&[u8]]) {
    b.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        b.extend_from_slice(a);
        b.extend_from_slice(b"\r\n");
    }
}

/// A connection to a server.
pub struct Client {
    r: BufReader<TcpStream>,
}

fn bad(m: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad reply: {m}"))
}

impl Client {
    pub fn connect(addr: &str) -> io::Result<Client> {
        Ok(Client {
            r: BufReader::new(TcpStream::connect(addr)?),
        })
    }

    /// Send one command and read its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut b = Vec::new();
        encode(&mut b, args);
        self.r.get_mut().write_all(&b)?;
        self.reply()
    }

    /// Send commands already encoded ([`encode`]) in one write, and read `n` replies
    /// (pipelining).
    pub fn pipeline(&mut self, encoded: &[u8], n: usize) -> io::Result<Vec<Reply>> {
        self.r.get_mut().write_all(encoded)?;
        (0..n).map(|_| self.reply()).collect()
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l.trim_end_matches(['\r', '\n']).to_string())
    }

    /// Read one reply.
    pub fn reply(&mut self) -> io::Result<Reply> {
        let l = self.line()?;
        let (t, rest) = l.split_at(1.min(l.len()));
        let n = || rest.parse::<i64>().map_err(|_| bad(&l));
        Ok(match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(n()?),
            "_" => Reply::Nil,
            "$" | "=" if n()? < 0 => Reply::Nil,
            "$" | "=" => {
                let mut v = vec![0u8; n()? as usize + 2];
                self.r.read_exact(&mut v)?;
                v.truncate(v.len() - 2);
                if t == "=" {
                    v.drain(..4.min(v.len()));
                }
                Reply::Bulk(v)
            }
            "*" | "%" if n()? < 0 => Reply::Nil,
            "*" | "%" => {
                let k = n()? as usize * if t == "%" { 2 } else { 1 };
                let mut v = Vec::with_capacity(k);
                for _ in 0..k {
                    v.push(self.reply()?);
                }
                Reply::Array(v)
            }
            _ => return Err(bad(&l)),
        })
    }
}
