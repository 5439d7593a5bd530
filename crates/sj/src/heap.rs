//! Memory inside a segment: an allocator whose whole state lives in the segment, and the
//! segment's named roots (FORMAT.md, "Segments and address spaces").
//!
//! The allocator's state is ordinary segment memory, so it commits and aborts with the
//! data: a process that dies before its commit leaves neither its objects nor their
//! allocation behind, and there is nothing to collect at recovery. Memory is handed out
//! in 64 KiB chunks: a *run* is one chunk cut into objects of one size class (16 B to
//! 2 KiB), a *span* is one or more chunks holding one larger object. Each chunk starts
//! with a header, so the header of any object is at its offset rounded down to a chunk.
//! Freed objects go on their class's free list (the link in their first 8 bytes); freed
//! spans on a list of free spans sorted by offset, merged with free neighbours.
//!
//! Everything here works on offsets from the segment's base through [`Mem`], so that it
//! is tested on a plain buffer; the segment's API turns offsets into addresses.

use cairn_area::fs_err;
use cairn_format::sj::heap::*;
use cairn_format::sj::{self, CHUNK, HEAP_STATE_OFF};
use std::io;

/// The words of a segment (offsets from its base, 8-byte aligned).
pub trait Mem {
    /// The segment's length.
    fn size(&self) -> u64;
    fn load(&self, off: u64) -> io::Result<u64>;
    fn store(&mut self, off: u64, v: u64) -> io::Result<()>;
    /// Copy `buf.len()` bytes at `off`.
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write(&mut self, off: u64, data: &[u8]) -> io::Result<()>;
}

fn corrupt(what: impl std::fmt::Display) -> io::Error {
    fs_err(libc::EIO, format!("segment heap damaged: {what}"))
}

fn einval(what: impl Into<String>) -> io::Error {
    fs_err(libc::EINVAL, what.into())
}

/// The heap state's initial words for a segment of `len` bytes: `(offset, value)`.
pub fn initial_state(len: u64) -> Vec<(u64, u64)> {
    vec![
        (HEAP_STATE_OFF + MAGIC_OFF, MAGIC),
        (HEAP_STATE_OFF + NEXT_CHUNK_OFF, FIRST_CHUNK),
        (HEAP_STATE_OFF + END_OFF, len / CHUNK * CHUNK),
    ]
}

/// Figures of a heap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes in live objects (each rounded to its class or its span).
    pub bytes: u64,
    pub objects: u64,
    /// Chunks handed out so far (runs and spans, live or free), and all the heap has.
    pub chunks_used: u64,
    pub chunks_total: u64,
}

/// The allocator over a segment's words.
pub struct Heap<'m, M: Mem + ?Sized> {
    m: &'m mut M,
}

impl<'m, M: Mem + ?Sized> Heap<'m, M> {
    /// The heap of segment memory `m` (`EIO` if its state is not a heap's).
    pub fn open(m: &'m mut M) -> io::Result<Heap<'m, M>> {
        let h = Heap { m };
        if h.state(MAGIC_OFF)? != MAGIC {
            return Err(corrupt("no heap state (not a segment, or not initialized)"));
        }
        let end = h.state(END_OFF)?;
        let next = h.state(NEXT_CHUNK_OFF)?;
        if end > h.m.size() || !end.is_multiple_of(CHUNK) || next < FIRST_CHUNK || next > end {
            return Err(corrupt(format!("heap bounds {next:#x}..{end:#x}")));
        }
        Ok(h)
    }

    fn state(&self, f: u64) -> io::Result<u64> {
        self.m.load(HEAP_STATE_OFF + f)
    }

    fn set_state(&mut self, f: u64, v: u64) -> io::Result<()> {
        self.m.store(HEAP_STATE_OFF + f, v)
    }

    fn class_word(&self, c: usize, w: u64) -> io::Result<u64> {
        self.state(CLASSES_OFF + c as u64 * CLASS_LEN + w * 8)
    }

    fn set_class_word(&mut self, c: usize, w: u64, v: u64) -> io::Result<()> {
        self.set_state(CLASSES_OFF + c as u64 * CLASS_LEN + w * 8, v)
    }

    /// A chunk header: `(kind, class, chunks, next)` after checking its magic.
    fn header(&self, chunk: u64) -> io::Result<(u32, u64, u64, u64)> {
        let w0 = self.m.load(chunk)?;
        if w0 as u32 != CHUNK_MAGIC {
            return Err(corrupt(format!("no chunk header at {chunk:#x}")));
        }
        Ok((
            (w0 >> 32) as u32,
            self.m.load(chunk + 8)?,
            self.m.load(chunk + 16)?,
            self.m.load(chunk + 24)?,
        ))
    }

    fn set_header(
        &mut self,
        chunk: u64,
        kind: u32,
        class: u64,
        chunks: u64,
        next: u64,
    ) -> io::Result<()> {
        self.m
            .store(chunk, u64::from(CHUNK_MAGIC) | (u64::from(kind) << 32))?;
        self.m.store(chunk + 8, class)?;
        self.m.store(chunk + 16, chunks)?;
        self.m.store(chunk + 24, next)
    }

    /// `k` contiguous chunks: the first free span that is large enough (split), else
    /// never-used ones. `ENOMEM` when the segment has no room.
    fn take_chunks(&mut self, k: u64) -> io::Result<u64> {
        let mut prev = 0u64;
        let mut at = self.state(FREE_SPANS_OFF)?;
        let mut guard = 0u64;
        while at != 0 {
            guard += 1;
            if guard > self.m.size() / CHUNK {
                return Err(corrupt("a cycle in the free spans"));
            }
            let (kind, _, n, next) = self.header(at)?;
            if kind != KIND_FREE || n == 0 {
                return Err(corrupt(format!("free span list reaches {at:#x}")));
            }
            if n >= k {
                let rest = if n > k {
                    let r = at + k * CHUNK;
                    self.set_header(r, KIND_FREE, 0, n - k, next)?;
                    r
                } else {
                    next
                };
                if prev == 0 {
                    self.set_state(FREE_SPANS_OFF, rest)?;
                } else {
                    let (pk, pc, pn, _) = self.header(prev)?;
                    self.set_header(prev, pk, pc, pn, rest)?;
                }
                return Ok(at);
            }
            prev = at;
            at = next;
        }
        let next = self.state(NEXT_CHUNK_OFF)?;
        let end = self.state(END_OFF)?;
        if k > (end - next) / CHUNK {
            return Err(fs_err(
                libc::ENOMEM,
                format!(
                    "segment heap: no room for {} KiB ({} KiB free at the end)",
                    k * CHUNK / 1024,
                    (end - next) / 1024
                ),
            ));
        }
        self.set_state(NEXT_CHUNK_OFF, next + k * CHUNK)?;
        Ok(next)
    }

    /// Allocate `n` bytes (16-byte aligned; 64-byte aligned when the class size is a
    /// multiple of 64; spans are 64-byte aligned). Returns the object's offset.
    pub fn alloc(&mut self, n: u64) -> io::Result<u64> {
        let n = n.max(1);
        let off = match class_of(n) {
            Some(c) => self.alloc_small(c)?,
            None => {
                let k = (n
                    .checked_add(CHUNK_HEADER)
                    .ok_or_else(|| einval("alloc: too large"))?)
                .div_ceil(CHUNK);
                let at = self.take_chunks(k)?;
                self.set_header(at, KIND_SPAN, 0, k, 0)?;
                at + CHUNK_HEADER
            }
        };
        let size = self.usable(off)?;
        self.set_state(BYTES_OFF, self.state(BYTES_OFF)? + size)?;
        self.set_state(OBJECTS_OFF, self.state(OBJECTS_OFF)? + 1)?;
        Ok(off)
    }

    fn alloc_small(&mut self, c: usize) -> io::Result<u64> {
        let size = CLASSES[c];
        let head = self.class_word(c, 0)?;
        if head != 0 {
            self.check_object(head, Some(c))?;
            let next = self.m.load(head)?;
            if next != 0 {
                self.check_object(next, Some(c))?;
            }
            self.set_class_word(c, 0, next)?;
            return Ok(head);
        }
        let (mut bump, mut end) = (self.class_word(c, 1)?, self.class_word(c, 2)?);
        if bump == 0 || bump + size > end {
            let chunk = self.take_chunks(1)?;
            self.set_header(chunk, KIND_RUN, c as u64, 1, 0)?;
            bump = chunk + CHUNK_HEADER;
            end = chunk + CHUNK;
        }
        self.set_class_word(c, 1, bump + size)?;
        self.set_class_word(c, 2, end)?;
        Ok(bump)
    }

    /// Check that `off` is an object of a run (of class `class`, if given) or a span:
    /// its class, or `None` for a span.
    fn check_object(&self, off: u64, class: Option<usize>) -> io::Result<Option<usize>> {
        let end = self.state(END_OFF)?;
        if off < FIRST_CHUNK + CHUNK_HEADER || off >= end || !off.is_multiple_of(8) {
            return Err(einval(format!(
                "{off:#x} is not an object of the segment's heap"
            )));
        }
        let chunk = off / CHUNK * CHUNK;
        let (kind, c, _, _) = self.header(chunk)?;
        match kind {
            KIND_RUN => {
                let c = c as usize;
                if c >= CLASSES.len() || class.is_some_and(|want| want != c) {
                    return Err(corrupt(format!("run at {chunk:#x} has class {c}")));
                }
                if !(off - chunk - CHUNK_HEADER).is_multiple_of(CLASSES[c]) {
                    return Err(einval(format!("{off:#x} is not the start of an object")));
                }
                Ok(Some(c))
            }
            KIND_SPAN if off == chunk + CHUNK_HEADER && class.is_none() => Ok(None),
            _ => Err(einval(format!("{off:#x} is not an allocated object"))),
        }
    }

    /// The usable size of the object at `off`.
    pub fn usable(&self, off: u64) -> io::Result<u64> {
        Ok(match self.check_object(off, None)? {
            Some(c) => CLASSES[c],
            None => {
                let (_, _, k, _) = self.header(off - CHUNK_HEADER)?;
                k * CHUNK - CHUNK_HEADER
            }
        })
    }

    /// Free the object at `off` (`EINVAL` for anything else; the obvious double frees
    /// too).
    pub fn free(&mut self, off: u64) -> io::Result<()> {
        let size = self.usable(off)?;
        match self.check_object(off, None)? {
            Some(c) => {
                let head = self.class_word(c, 0)?;
                if head == off {
                    return Err(einval(format!("free of {off:#x}: already free")));
                }
                self.m.store(off, head)?;
                self.set_class_word(c, 0, off)?;
            }
            None => self.free_span(off - CHUNK_HEADER)?,
        }
        self.set_state(BYTES_OFF, self.state(BYTES_OFF)?.saturating_sub(size))?;
        self.set_state(OBJECTS_OFF, self.state(OBJECTS_OFF)?.saturating_sub(1))?;
        Ok(())
    }

    /// Put span `at` on the free list (sorted by offset), merged with free neighbours.
    fn free_span(&mut self, at: u64) -> io::Result<()> {
        let (_, _, k, _) = self.header(at)?;
        let mut prev = 0u64;
        let mut cur = self.state(FREE_SPANS_OFF)?;
        while cur != 0 && cur < at {
            prev = cur;
            cur = self.header(cur)?.3;
        }
        // Merge with the next span when adjacent.
        let (mut n, mut next) = (k, cur);
        if cur != 0 && at + k * CHUNK == cur {
            let (_, _, cn, cnext) = self.header(cur)?;
            n += cn;
            next = cnext;
        }
        if prev != 0 {
            let (pk, pc, pn, _) = self.header(prev)?;
            if prev + pn * CHUNK == at {
                return self.set_header(prev, pk, pc, pn + n, next);
            }
            self.set_header(prev, pk, pc, pn, at)?;
        } else {
            self.set_state(FREE_SPANS_OFF, at)?;
        }
        self.set_header(at, KIND_FREE, 0, n, next)
    }

    pub fn stats(&self) -> io::Result<HeapStats> {
        Ok(HeapStats {
            bytes: self.state(BYTES_OFF)?,
            objects: self.state(OBJECTS_OFF)?,
            chunks_used: (self.state(NEXT_CHUNK_OFF)? - FIRST_CHUNK) / CHUNK,
            chunks_total: (self.state(END_OFF)? - FIRST_CHUNK) / CHUNK,
        })
    }
}

/// The address root `name` holds (`None`: no such root).
pub fn root(m: &(impl Mem + ?Sized), name: &str) -> io::Result<Option<u64>> {
    for i in 0..sj::ROOTS {
        let mut e = [0u8; sj::ROOT_LEN as usize];
        m.read(sj::ROOTS_OFF + i * sj::ROOT_LEN, &mut e)?;
        if let Some((n, addr)) = sj::decode_root(&e) {
            if n == name.as_bytes() {
                return Ok(Some(addr));
            }
        }
    }
    Ok(None)
}

/// Every root: `(name, address)`.
pub fn roots(m: &(impl Mem + ?Sized)) -> io::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for i in 0..sj::ROOTS {
        let mut e = [0u8; sj::ROOT_LEN as usize];
        m.read(sj::ROOTS_OFF + i * sj::ROOT_LEN, &mut e)?;
        if let Some((n, addr)) = sj::decode_root(&e) {
            out.push((String::from_utf8_lossy(n).into_owned(), addr));
        }
    }
    Ok(out)
}

/// Set root `name` to `addr` (0: remove it). `ENOSPC` when all roots are taken,
/// `ENAMETOOLONG` for a name longer than 55 bytes.
pub fn set_root(m: &mut (impl Mem + ?Sized), name: &str, addr: u64) -> io::Result<()> {
    let Some(entry) = sj::encode_root(name.as_bytes(), addr) else {
        return Err(fs_err(
            libc::ENAMETOOLONG,
            format!("root name {name:?}: 1 to {} bytes", sj::ROOT_NAME_MAX),
        ));
    };
    let mut free = None;
    for i in 0..sj::ROOTS {
        let at = sj::ROOTS_OFF + i * sj::ROOT_LEN;
        let mut e = [0u8; sj::ROOT_LEN as usize];
        m.read(at, &mut e)?;
        match sj::decode_root(&e) {
            Some((n, _)) if n == name.as_bytes() => {
                return if addr == 0 {
                    m.write(at, &[0u8; sj::ROOT_LEN as usize])
                } else {
                    m.write(at, &entry)
                };
            }
            None if free.is_none() => free = Some(at),
            _ => {}
        }
    }
    if addr == 0 {
        return Ok(());
    }
    match free {
        Some(at) => m.write(at, &entry),
        None => Err(fs_err(
            libc::ENOSPC,
            format!("all {} roots of the segment are taken", sj::ROOTS),
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A segment in a buffer.
    pub struct Buf(pub Vec<u8>);

    impl Mem for Buf {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn load(&self, off: u64) -> io::Result<u64> {
            let o = off as usize;
            let b = self.0.get(o..o + 8).ok_or_else(|| einval("oob"))?;
            Ok(u64::from_le_bytes(b.try_into().unwrap()))
        }
        fn store(&mut self, off: u64, v: u64) -> io::Result<()> {
            let o = off as usize;
            self.0
                .get_mut(o..o + 8)
                .ok_or_else(|| einval("oob"))?
                .copy_from_slice(&v.to_le_bytes());
            Ok(())
        }
        fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
            let o = off as usize;
            buf.copy_from_slice(self.0.get(o..o + buf.len()).ok_or_else(|| einval("oob"))?);
            Ok(())
        }
        fn write(&mut self, off: u64, data: &[u8]) -> io::Result<()> {
            let o = off as usize;
            self.0
                .get_mut(o..o + data.len())
                .ok_or_else(|| einval("oob"))?
                .copy_from_slice(data);
            Ok(())
        }
    }

    pub fn segment(len: u64) -> Buf {
        let mut b = Buf(vec![0u8; len as usize]);
        for (off, v) in initial_state(len) {
            b.store(off, v).unwrap();
        }
        b
    }

    #[test]
    fn small_and_large_objects() {
        let mut m = segment(1 << 20);
        let mut h = Heap::open(&mut m).unwrap();
        let a = h.alloc(10).unwrap();
        let b = h.alloc(16).unwrap();
        assert_eq!(b, a + 16);
        assert_eq!(h.usable(a).unwrap(), 16);
        let big = h.alloc(100_000).unwrap();
        assert_eq!(h.usable(big).unwrap(), 2 * CHUNK - CHUNK_HEADER);
        assert_eq!(h.stats().unwrap().objects, 3);
        h.free(a).unwrap();
        assert!(h.free(a).is_err(), "double free");
        assert_eq!(h.alloc(5).unwrap(), a, "a freed object is reused");
        assert!(h.free(a + 8).is_err(), "not an object's start");
        assert!(h.free(big + 64).is_err());
        h.free(big).unwrap();
        assert_eq!(h.alloc(100_000).unwrap(), big, "a freed span is reused");
        // Out of room: ENOMEM, nothing changed.
        let before = h.stats().unwrap();
        let e = h.alloc(1 << 20).unwrap_err();
        assert_eq!(cairn_area::errno_of(&e), libc::ENOMEM);
        assert_eq!(h.stats().unwrap(), before);
    }

    #[test]
    fn roots_by_name() {
        let mut m = segment(1 << 20);
        assert_eq!(root(&m, "list").unwrap(), None);
        set_root(&mut m, "list", 0x1000).unwrap();
        set_root(&mut m, "tree", 0x2000).unwrap();
        set_root(&mut m, "list", 0x3000).unwrap();
        assert_eq!(root(&m, "list").unwrap(), Some(0x3000));
        assert_eq!(roots(&m).unwrap().len(), 2);
        set_root(&mut m, "list", 0).unwrap();
        assert_eq!(root(&m, "list").unwrap(), None);
        assert!(set_root(&mut m, &"x".repeat(56), 1).is_err());
        for i in 0..sj::ROOTS - 1 {
            set_root(&mut m, &format!("r{i}"), 8).unwrap();
        }
        assert_eq!(
            cairn_area::errno_of(&set_root(&mut m, "one-too-many", 8).unwrap_err()),
            libc::ENOSPC
        );
    }

    proptest! {
        /// Model test: random allocations and frees against a set of live objects.
        /// Live objects never overlap, stay inside the heap, survive other operations,
        /// and the counters match.
        #[test]
        fn allocations_never_overlap(ops in proptest::collection::vec((0u8..4, 1u64..200_000, any::<u16>()), 1..300)) {
            let mut m = segment(4 << 20);
            let mut live: Vec<(u64, u64, u8)> = Vec::new();
            for (op, n, pick) in ops {
                let n = if op == 0 { n } else { n % 3000 + 1 };
                if op == 3 && !live.is_empty() {
                    let (off, _, tag) = live.swap_remove(pick as usize % live.len());
                    let mut b = [0u8; 1];
                    m.read(off + 8, &mut b).unwrap();
                    prop_assert_eq!(b[0], tag);
                    Heap::open(&mut m).unwrap().free(off).unwrap();
                    continue;
                }
                let got = {
                    let mut h = Heap::open(&mut m).unwrap();
                    h.alloc(n).map(|off| (off, h.usable(off).unwrap()))
                };
                match got {
                    Ok((off, size)) => {
                        prop_assert!(size >= n);
                        prop_assert!(n > 2048 || size <= n + n / 4 + 16, "{} bytes for {}", size, n);
                        prop_assert!(off % 16 == 0 && (size % 64 != 0 || off % 64 == 0));
                        for &(o, s, _) in &live {
                            prop_assert!(off + size <= o || o + s <= off, "overlap");
                        }
                        let tag = pick as u8;
                        // Fill the object: nothing of the heap's may live there.
                        let fill = vec![tag; size as usize];
                        m.write(off, &fill).unwrap();
                        live.push((off, size, tag));
                    }
                    Err(e) => prop_assert_eq!(cairn_area::errno_of(&e), libc::ENOMEM),
                }
                let h = Heap::open(&mut m).unwrap();
                let st = h.stats().unwrap();
                prop_assert_eq!(st.objects, live.len() as u64);
                prop_assert_eq!(st.bytes, live.iter().map(|l| l.1).sum::<u64>());
            }
        }
    }
}
