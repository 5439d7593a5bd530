//! Recovery: redo the in-place updates the journal holds, then scan every segment;
//! the newest record of each key wins.

use crate::format::{
    self, decode_journal, decode_record_header, record_valid, Kind, JOURNAL_SLOTS,
    JOURNAL_SLOT_BYTES, JOURNAL_START, RECORD_HEADER, SEGMENT_BYTES, SEGMENT_HEADER,
};
use crate::log::{seg_of, Core};
use crate::pool::Pool;
use crate::store::KvError;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The identity hasher for keys that are hashes already.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = self.0.rotate_left(8) ^ u64::from(x);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}
use std::sync::atomic::Ordering;

/// What recovery found for a key: the newest record.
struct Found {
    version: u64,
    loc: u64,
    len: u64,
    kind: Kind,
    data: u64,
}

impl Core {
    /// The version of the valid record at `loc` in a segment opened under `seq`.
    fn version_at(&self, loc: u64, seq: u64) -> Option<u64> {
        let room = SEGMENT_BYTES - loc % SEGMENT_BYTES;
        let h = self
            .pool
            .map
            .bytes(loc as usize, RECORD_HEADER as usize)
            .ok()?;
        let h = decode_record_header(h, room)?;
        let rec = self.pool.map.bytes(loc as usize, h.len as usize).ok()?;
        record_valid(seq, &h, rec).then_some(h.version)
    }

    /// Redo the journal's in-place updates that may have been cut short: an entry whose
    /// segment is still the incarnation it names and whose target holds an older or
    /// damaged record is written again (in version order, so the newest wins). Entries
    /// of completed updates, and of segments since reused, change nothing.
    fn redo_journal(&self) -> Result<u64, KvError> {
        let mut entries = Vec::new();
        for slot in 0..JOURNAL_SLOTS {
            let off = (JOURNAL_START + slot * JOURNAL_SLOT_BYTES) as usize;
            let b = self.pool.map.bytes(off, JOURNAL_SLOT_BYTES as usize)?;
            let Some(e) = decode_journal(b) else { continue };
            let Some(rh) = decode_record_header(&e.record, e.record.len() as u64) else {
                continue;
            };
            let s = seg_of(e.target);
            if s == 0
                || s >= self.pool.header.segments
                || e.target % SEGMENT_BYTES < SEGMENT_HEADER
                || e.target % SEGMENT_BYTES + rh.len > SEGMENT_BYTES
            {
                continue;
            }
            entries.push((rh.version, e));
        }
        entries.sort_by_key(|(v, _)| *v);
        let mut redone = 0;
        for (version, e) in entries {
            let base = Pool::seg_off(seg_of(e.target));
            let h = self.pool.map.bytes(base, SEGMENT_HEADER as usize)?;
            if format::decode_segment_header(h) != Some(e.seg_seq) {
                continue;
            }
            if self
                .version_at(e.target, e.seg_seq)
                .is_some_and(|v| v >= version)
            {
                continue;
            }
            self.pool.map.write(e.target as usize, &e.record)?;
            self.persist(e.target, e.record.len() as u64)?;
            redone += 1;
        }
        Ok(redone)
    }

    /// Scan every segment; the newest record of each key wins; install the values.
    /// Every tombstone counts as live until compaction drops it (as at run time).
    pub fn recover(&self) -> Result<(), KvError> {
        self.redo_journal()?;
        let segments = self.pool.header.segments;
        // By key hash (already a good hash: no rehashing), the newest record of each key
        // with that hash (several only on a 64-bit collision; keys compared in place).
        let mut newest: HashMap<u64, Vec<Found>, BuildHasherDefault<Identity>> = HashMap::default();
        let (mut max_seq, mut max_version) = (0u64, 0u64);
        let mut free = Vec::new();
        for s in (1..segments).rev() {
            let base = Pool::seg_off(s);
            let buf = self.pool.map.bytes(base, SEGMENT_BYTES as usize)?;
            let Some(seq) = format::decode_segment_header(buf) else {
                free.push(s);
                continue;
            };
            max_seq = max_seq.max(seq);
            self.segs.recovered(s, seq);
            let mut off = SEGMENT_HEADER;
            while off + RECORD_HEADER <= SEGMENT_BYTES {
                let at = off as usize;
                let Some(rh) = decode_record_header(&buf[at..], SEGMENT_BYTES - off) else {
                    break;
                };
                if !record_valid(seq, &rh, &buf[at..at + rh.len as usize]) {
                    break;
                }
                max_version = max_version.max(rh.version);
                let k = at + RECORD_HEADER as usize;
                let key = &buf[k..k + rh.key_len];
                let kh = self.index.key_hash(key);
                let f = Found {
                    version: rh.version,
                    loc: base as u64 + off,
                    len: rh.len,
                    kind: rh.kind,
                    data: (rh.key_len + rh.value_len) as u64,
                };
                let horizon = (rh.kind == Kind::Tombstone).then(|| {
                    let v = &buf[k + rh.key_len..k + rh.key_len + rh.value_len];
                    u64::from_le_bytes(v.try_into().unwrap_or([0; 8]))
                });
                self.segs.recovered_record(s, off + rh.len, rh.len, horizon);
                let same = newest.entry(kh).or_default();
                match same.iter_mut().find(|o| self.key_is(o.loc, key)) {
                    Some(old) if old.version >= f.version => {}
                    Some(old) => *old = f,
                    None => same.push(f),
                }
                off += rh.len;
            }
        }
        for (&h, same) in &newest {
            for f in same.iter().filter(|f| f.kind == Kind::Value) {
                self.segs.recovered_live(seg_of(f.loc), f.len);
                let rh = self.header_at(f.loc)?;
                let key = self
                    .pool
                    .map
                    .bytes((f.loc + RECORD_HEADER) as usize, rh.key_len)?;
                let g = self.index.lock_key(h);
                self.index
                    .set(&g, h, &|l| self.key_is(l, key), f.loc)
                    .map_err(|()| {
                        KvError::Io(std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!(
                                "the pool holds more keys than an index of {} buckets has \
                                 room for: open it with a larger expected_keys \
                                 (`cairn kv serve --expected-keys N`)",
                                self.index.buckets()
                            ),
                        ))
                    })?;
                self.region.keys().fetch_add(1, Ordering::Relaxed);
                self.region.data().fetch_add(f.data, Ordering::Relaxed);
            }
        }
        self.region
            .version()
            .store(max_version + 1, Ordering::Relaxed);
        self.region.next_seq().store(max_seq + 1, Ordering::Relaxed);
        // Segments holding nothing current (emptied by a compaction the crash
        // interrupted before they were reused) are free; they keep their sequence number
        // until reused, for the tombstones that name their records.
        for s in 1..segments {
            if self.segs.seq(s) != 0 && self.segs.live(s) == 0 {
                free.push(s);
            }
        }
        let mut free_list = self.segs.free_list();
        free_list.recovered(free);
        self.release_cold(&mut free_list, 0);
        drop(free_list);
        if cfg!(debug_assertions) {
            self.check();
        }
        Ok(())
    }
}
