//! The log writer: transactions reserved in the ring, encoded, sealed and made durable
//! (`commit`, and the write path's `WRITE` transactions), the overlay updated with what
//! they did; in shared-write mode, sealed by the daemon (`commit_mediated`).

use super::{transient, Inner, Lease, Stale, State, Tx};
use crate::conn::response_error;
use crate::extents::Src;
use crate::ring::WRITE_HEAD;
use cairn_area::fs_err;
use cairn_area::time::change_time_ns;
use cairn_format::inode::{Attrs, Kind};
use cairn_format::log::{
    seal_txn, txn_len, write_charge, write_txn_len, Record, KIND_COMMIT, TXN_HEADER,
    WRITE_HEADER_LEN,
};
use cairn_format::MAX_FILE_SIZE;
use cairn_media::fence;
use cairn_proto::{Request, Response};
use smallvec::SmallVec;
use std::io;

impl Inner {
    /// Find room for a transaction of `len` bytes: wrap to the next lap if it would
    /// straddle the end, wait for the digest while the ring is full
    /// ([`Inner::wait_for_room`]). Returns its LSN.
    pub(super) fn reserve(&self, st: &mut State, len: usize) -> io::Result<u64> {
        let len = len as u64;
        let mut stalls = 0;
        loop {
            self.refresh(st)?;
            if let Some(start) = st.log.place(len) {
                st.log.wrap_to(start)?;
                return Ok(start);
            }
            let head = st.log.head();
            self.wait_for_room(st)?;
            if st.log.head() == head {
                stalls += 1;
                if stalls == 3 {
                    return Err(fs_err(
                        libc::ENOSPC,
                        "the operation log stays full (the daemon does not digest it)",
                    ));
                }
            }
        }
    }

    /// Encode `recs` as one transaction, reserve room and `charge` credits for it, seal,
    /// write it back and fence it: durable when this returns (in shared-write mode, `med`
    /// not empty, once the daemon sealed it: `commit_mediated`). Returns its LSN and its
    /// length ([`write_data_offsets`]: where its `WRITE` records' data lie). `E2BIG`
    /// beyond a quarter of the log.
    ///
    /// `local` (a sealed transaction only, `med` empty) runs between the copy and the
    /// fence, with the LSN and length: bookkeeping only this thread sees until the state
    /// lock is released (the overlay, the log's tail), done while the copy drains. It
    /// must neither fail nor tell anyone outside the process.
    fn append_records(
        &self,
        st: &mut State,
        recs: &[Record<'_>],
        charge: u64,
        med: &[(u64, u64)],
        local: impl FnOnce(&mut State, u64, usize),
    ) -> io::Result<(u64, usize)> {
        let payload: usize = recs.iter().map(|r| r.encoded_len()).sum();
        let len = txn_len(payload);
        if len as u64 > st.log.max_txn() {
            return Err(fs_err(
                libc::E2BIG,
                format!(
                    "a transaction of {len} bytes is larger than a quarter of the log ({} bytes)",
                    st.log.ring().bytes()
                ),
            ));
        }
        // Built in a buffer, except large writes: those go straight into the ring,
        // copied once (`Ring::put_writes`).
        let direct =
            payload >= DIRECT_MIN && recs.iter().all(|r| matches!(r, Record::Write { .. }));
        let mut buf = (!direct).then(|| {
            let mut buf = st.log.take_buf();
            buf.clear();
            buf.resize(len, 0);
            let mut off = TXN_HEADER;
            for r in recs {
                r.encode_into(&mut buf[off..]);
                off += r.encoded_len();
            }
            buf
        });
        // Space credits after the reservation: a re-attach while it waited replaced them.
        let lsn = match self
            .reserve(st, len)
            .and_then(|l| self.ensure_credits(st, charge).map(|()| l))
        {
            Ok(l) => l,
            Err(e) => {
                if let Some(buf) = buf {
                    st.log.put_buf(buf);
                }
                return Err(e);
            }
        };
        st.log.spend(charge);
        let (seq, sealed) = (st.log.seq(), med.is_empty());
        let put = match &mut buf {
            None => {
                (st.log.ring().put_writes(lsn, seq, recs, sealed)).map(|n| debug_assert_eq!(n, len))
            }
            Some(buf) => {
                seal_txn(buf, KIND_COMMIT, seq, recs.len() as u32);
                if !sealed {
                    buf[..4].fill(0);
                }
                st.log.ring().put_txn(lsn, buf)
            }
        };
        if let Some(buf) = buf {
            st.log.put_buf(buf);
        }
        put?;
        if sealed {
            local(st, lsn, len);
        }
        fence();
        if !sealed {
            self.commit_mediated(st, lsn, len, med)?;
        }
        Ok((lsn, len))
    }

    /// Append a metadata transaction and apply it to the overlay. Returns its tag.
    pub(super) fn commit(&self, st: &mut State, tx: Tx) -> io::Result<u64> {
        // Every inode the transaction logs a record about needs the write lease.
        for (ino, _, _) in &tx.inodes {
            self.need(st, *ino, true)?;
        }
        for ino in tx.write.iter().map(|w| w.0).chain(tx.punch.map(|p| p.0)) {
            self.need(st, ino, true)?;
        }
        for (dir, ..) in &tx.dirents {
            self.need(st, *dir, true)?;
        }
        // Inodes in shared-write mode: the daemon commits the transaction.
        let written = tx.inodes.iter().map(|e| e.0);
        let written = written.chain(tx.write.iter().map(|w| w.0));
        let written = written.chain(tx.punch.map(|p| p.0));
        let med = Self::claims(st, written.chain(tx.dirents.iter().map(|d| d.0)));
        let recs = tx.records();
        let (lsn, len) = self.append_records(st, &recs, tx.charge(), &med, |_, _, _| ())?;
        let data_off = write_data_offsets(&recs).last().unwrap_or(0);
        drop(recs);
        // Committed.
        for &(kind, ino, gen) in &tx.gone {
            self.drop_rendezvous(kind, ino, gen);
        }
        if !med.is_empty() {
            st.log.appended(lsn, len as u64);
            // Digested: nothing of it (or before it) belongs in the overlay. (Committed:
            // no error may make the caller run the operation again.)
            let _ = self.refresh(st);
            return Ok(st.log.tail());
        }
        let tag = st.log.appended(lsn, len as u64);
        st.apply_committed(tx, tag, lsn + data_off as u64);
        self.maybe_request_digest(st);
        Ok(tag)
    }

    /// The `Commit` claims of a transaction writing `inos`: each shared-write inode with
    /// the sequence word it had before the operation read it.
    pub(super) fn claims(st: &State, inos: impl IntoIterator<Item = u64>) -> Vec<(u64, u64)> {
        let seen = st.seen.borrow();
        let mut med: Vec<(u64, u64)> = Vec::new();
        for ino in inos {
            if st.leases.get(ino) == Some(Lease::Mediated) && !med.iter().any(|m| m.0 == ino) {
                // `need` recorded it (0, never a published word, if it did not).
                med.push((ino, seen.get(&ino).copied().unwrap_or(0)));
            }
        }
        med
    }

    /// Shared-write mode (PROTOCOL.md, "Commit"): have the daemon seal and digest the
    /// transaction of `len` bytes just written unsealed at `lsn`, claiming the sequence
    /// words `med`. `Ok`: committed and digested. `Err(Stale)`: not committed (the caller
    /// runs the operation again). If the daemon went away meanwhile, the transaction's
    /// magic tells whether it was sealed: then it is committed (and digested at the
    /// re-attach).
    pub(super) fn commit_mediated(
        &self,
        st: &mut State,
        lsn: u64,
        len: usize,
        med: &[(u64, u64)],
    ) -> io::Result<()> {
        let req = Request::Commit {
            lsn,
            len: len as u32,
            seq: st.log.seq(),
            versions: med.to_vec(),
        };
        match self.request(st, &req) {
            Ok(Response::Committed { ended }) => {
                for ino in ended {
                    st.leases.set(ino, Lease::Read);
                }
                Ok(())
            }
            Ok(Response::Stale { ended }) => {
                for ino in ended {
                    st.drop_lease(ino);
                }
                Err(io::Error::other(Stale))
            }
            r => {
                if st.log.ring().is_sealed(lsn)? {
                    for (ino, _) in med {
                        st.drop_lease(*ino);
                    }
                    return Ok(());
                }
                match r {
                    Ok(r) => Err(response_error("commit", r)),
                    // Not sealed: not committed. The daemon went away while it was
                    // restarting: run the operation again (it re-attaches).
                    Err(e) if transient(&e) => {
                        for (ino, _) in med {
                            st.drop_lease(*ino);
                        }
                        Err(io::Error::other(Stale))
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// The write path: `WRITE` transactions encoded straight into the ring. `pos`
    /// `None` appends at the current size. Returns the offset just past the data written
    /// and the number of bytes written (fewer than asked only when a write split into
    /// several transactions failed part-way).
    pub(crate) fn write_data(
        &self,
        st: &mut State,
        ino: u64,
        pos: Option<u64>,
        data: &[u8],
    ) -> io::Result<(u64, usize)> {
        let (end, n) = self.write_logged(st, ino, pos, data)?;
        if n > 0 {
            st.mirror_to_mapobj(ino, end - n as u64, &data[..n])?;
        }
        Ok((end, n))
    }

    /// The write lease on `ino` and its attributes, which must be a regular file's
    /// (`EISDIR`, `EINVAL` otherwise).
    fn file_for_write(&self, st: &mut State, ino: u64) -> io::Result<(u64, Attrs)> {
        self.need(st, ino, true)?;
        let (gen, attrs) = self.attrs_held(st, ino)?;
        match attrs.kind {
            Kind::File => Ok((gen, attrs)),
            Kind::Dir => Err(fs_err(libc::EISDIR, "write: is a directory")),
            _ => Err(fs_err(libc::EINVAL, "write: not a regular file")),
        }
    }

    /// [`Inner::write_data`] to the log only.
    pub(super) fn write_logged(
        &self,
        st: &mut State,
        ino: u64,
        pos: Option<u64>,
        data: &[u8],
    ) -> io::Result<(u64, usize)> {
        let (gen, mut attrs) = self.file_for_write(st, ino)?;
        let mut off = pos.unwrap_or(attrs.size);
        if data.is_empty() {
            return Ok((off, 0));
        }
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(fs_err(
                libc::EFBIG,
                format!("write: beyond the largest file size ({MAX_FILE_SIZE} bytes)"),
            ));
        }
        // After the checks that refuse the write, as Linux's file_remove_privs.
        if self.kill_privs(st, ino, &attrs)? {
            (_, attrs) = self.attrs_held(st, ino)?;
        }
        let max = st.log.max_txn() as usize - 128;
        let mut done = 0;
        while done < data.len() {
            let med = Self::claims(st, [ino]);
            let med = (!med.is_empty()).then_some(med);
            let n = max.min(data.len() - done);
            let chunk = &data[done..done + n];
            let charge = write_charge(off, n as u64);
            // A write split into several transactions that fails part-way returns the
            // bytes already committed (a short write), as POSIX requires.
            let partial = |e: io::Error| if done > 0 { Ok((off, done)) } else { Err(e) };
            let size = attrs.size.max(off + n as u64);
            let now = change_time_ns(attrs.mtime.max(attrs.ctime));
            let tlen = write_txn_len(n);
            let lsn = match self.reserve(st, tlen) {
                Ok(l) => l,
                Err(e) => return partial(e),
            };
            // Space credits after the reservation: a re-attach while it waited replaced
            // them with what the new daemon promised (the log as it was then).
            if let Err(e) = self.ensure_credits(st, charge) {
                return partial(e);
            }
            st.log.spend(charge);
            let seq = st.log.seq();
            st.log
                .ring()
                .put_write(lsn, seq, ino, off, size, now, chunk, med.is_none())?;
            attrs.size = size;
            attrs.mtime = now;
            attrs.ctime = now;
            match &med {
                None => {
                    // Sealed: the overlay learns the write while the copy drains
                    // (nothing outside this thread sees it before the state lock is
                    // released).
                    let tag = st.log.appended(lsn, tlen as u64);
                    st.ov.written(ino, gen, attrs, tag).write(
                        off,
                        off + n as u64,
                        Src::Log(lsn + WRITE_HEAD as u64),
                        tag,
                    );
                    fence();
                    self.maybe_request_digest(st);
                }
                Some(med) => {
                    fence();
                    if let Err(e) = self.commit_mediated(st, lsn, tlen, med) {
                        return partial(e);
                    }
                    st.log.appended(lsn, tlen as u64);
                    // Committed: from here no error may make the caller write it again.
                    let _ = self.refresh(st);
                }
            }
            off += n as u64;
            done += n;
            if med.is_some() && done < data.len() {
                // Shared-write mode: the next part is checked against what the inode
                // is now.
                st.seen.get_mut().remove(&ino);
                match self
                    .need(st, ino, true)
                    .and_then(|_| self.attrs_held(st, ino))
                {
                    Ok((_, a)) => attrs = a,
                    Err(_) => return Ok((off, done)),
                }
            }
        }
        Ok((off, done))
    }

    /// Write `runs` (inode, offset, bytes) of regular files as **one** transaction: after
    /// any crash either all of them are in the files or none is; durable on return. The
    /// runs of one file may not overlap. `E2BIG` when the transaction would be larger
    /// than a quarter of the log (the caller must make the change atomic another way).
    pub(crate) fn write_runs(&self, st: &mut State, runs: &[(u64, u64, &[u8])]) -> io::Result<()> {
        let nonempty: SmallVec<[(u64, u64, &[u8]); 8]>;
        let runs = if runs.iter().any(|r| r.2.is_empty()) {
            nonempty = runs.iter().copied().filter(|r| !r.2.is_empty()).collect();
            &nonempty[..]
        } else {
            runs
        };
        if runs.is_empty() {
            return Ok(());
        }
        let mut sorted: SmallVec<[(u64, u64, u64); 8]> = runs
            .iter()
            .map(|r| (r.0, r.1, r.1.saturating_add(r.2.len() as u64)))
            .collect();
        sorted.sort_unstable();
        if sorted
            .windows(2)
            .any(|w| w[0].0 == w[1].0 && w[0].2 > w[1].1)
        {
            return Err(fs_err(libc::EINVAL, "write_runs: the runs overlap"));
        }
        if sorted.iter().any(|r| r.2 > MAX_FILE_SIZE) {
            return Err(fs_err(
                libc::EFBIG,
                format!("write: beyond the largest file size ({MAX_FILE_SIZE} bytes)"),
            ));
        }
        // Each file: its lease, attributes and size after the writes.
        let mut files: SmallVec<[(u64, u64, Attrs); 2]> = SmallVec::new();
        for &(ino, _, end) in &sorted {
            if let Some(f) = files.iter_mut().find(|f| f.0 == ino) {
                f.2.size = f.2.size.max(end);
                continue;
            }
            let (gen, mut attrs) = self.file_for_write(st, ino)?;
            if self.kill_privs(st, ino, &attrs)? {
                (_, attrs) = self.attrs_held(st, ino)?;
            }
            attrs.size = attrs.size.max(end);
            files.push((ino, gen, attrs));
        }
        let now = change_time_ns(
            (files.iter())
                .map(|f| f.2.mtime.max(f.2.ctime))
                .max()
                .unwrap_or(0),
        );
        let size_of = |ino: u64| files.iter().find(|f| f.0 == ino).map_or(0, |f| f.2.size);
        let recs: SmallVec<[Record<'_>; 8]> = runs
            .iter()
            .map(|&(ino, offset, data)| Record::Write {
                ino,
                offset,
                size: size_of(ino),
                mtime: now,
                data,
            })
            .collect();
        let med = Self::claims(st, files.iter().map(|f| f.0));
        let charge: u64 = runs
            .iter()
            .map(|&(_, o, d)| write_charge(o, d.len() as u64))
            .sum();
        // Sealed: the overlay learns the writes while the copy drains.
        let overlay = |st: &mut State, lsn: u64, len: usize| {
            let tag = st.log.appended(lsn, len as u64);
            for &(ino, gen, mut attrs) in &files {
                attrs.mtime = now;
                attrs.ctime = now;
                st.ov.written(ino, gen, attrs, tag);
            }
            for (&(ino, offset, data), d) in runs.iter().zip(write_data_offsets(&recs)) {
                if let Some(o) = st.ov.get_mut(ino) {
                    o.write(
                        offset,
                        offset + data.len() as u64,
                        Src::Log(lsn + d as u64),
                        tag,
                    );
                }
            }
        };
        let (lsn, len) = self.append_records(st, &recs, charge, &med, overlay)?;
        if !med.is_empty() {
            st.log.appended(lsn, len as u64);
            let _ = self.refresh(st);
        } else {
            self.maybe_request_digest(st);
        }
        for &(ino, offset, data) in runs {
            st.mirror_to_mapobj(ino, offset, data)?;
        }
        Ok(())
    }
}

/// Payload bytes from which a transaction of `WRITE` records is encoded straight into
/// the ring ([`crate::ring::Ring::put_writes`]); smaller ones are encoded in a buffer
/// and copied whole, in whole lines ([`crate::ring::Ring::put_txn`]).
const DIRECT_MIN: usize = 16 << 10;

impl Tx {
    /// The space credits the transaction takes (as the digest charges its records).
    fn charge(&self) -> u64 {
        let w = self
            .write
            .as_ref()
            .map_or(0, |(_, data, _, _)| write_charge(0, data.len() as u64));
        let p = self.punch.map_or(0, |(_, off, len, _)| {
            cairn_format::log::punch_charge(off, len)
        });
        w + p
    }

    /// The log records of the transaction, in the order they are logged: inodes, the
    /// write, the punch, then directory entries.
    fn records(&self) -> Vec<Record<'_>> {
        let mut recs: Vec<Record<'_>> = Vec::new();
        for (ino, gen, a) in &self.inodes {
            recs.push(Record::InodeSet {
                ino: *ino,
                generation: *gen,
                attrs: *a,
            });
        }
        if let Some((ino, data, size, mtime)) = &self.write {
            recs.push(Record::Write {
                ino: *ino,
                offset: 0,
                size: *size,
                mtime: *mtime,
                data,
            });
        }
        if let Some((ino, offset, len, mtime)) = self.punch {
            recs.push(Record::Punch {
                ino,
                offset,
                len,
                mtime,
            });
        }
        for (dir, name, ino, kind) in &self.dirents {
            recs.push(Record::DirentSet {
                dir: *dir,
                name,
                ino: *ino,
                kind: *kind,
            });
        }
        recs
    }
}

/// Where the data of each `WRITE` record of `recs` lies in their transaction (an offset
/// from its start), in order.
fn write_data_offsets<'a>(recs: &'a [Record<'_>]) -> impl Iterator<Item = usize> + 'a {
    recs.iter()
        .scan(TXN_HEADER, |off, r| {
            let at = *off;
            *off += r.encoded_len();
            Some((at, r))
        })
        .filter(|(_, r)| matches!(r, Record::Write { .. }))
        .map(|(at, _)| at + WRITE_HEADER_LEN)
}

impl State {
    /// A committed write of `data` at `offset` of `ino`, also into the file's map object
    /// if it has one (`mapobj`), so that its mappings see it.
    fn mirror_to_mapobj(&self, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.objs.get(&ino) {
            Some(o) => std::os::unix::fs::FileExt::write_all_at(&**o, data, offset)
                .map_err(|e| fs_err(libc::EIO, format!("write to the map object: {e}"))),
            None => Ok(()),
        }
    }

    /// The overlay after transaction `tx` committed with tag `tag` (its write's data at
    /// `data_lsn` in the log).
    fn apply_committed(&mut self, tx: Tx, tag: u64, data_lsn: u64) {
        for &(ino, gen, a) in &tx.inodes {
            self.ov.set(ino, gen, a, tag);
        }
        for &(ino, start, end) in &tx.zero {
            if let Some(o) = self.ov.get_mut(ino) {
                o.write(start, end, Src::Zero, tag);
            }
        }
        if let Some((ino, data, _, _)) = &tx.write {
            if let Some(o) = self.ov.get_mut(*ino) {
                o.write(0, data.len() as u64, Src::Log(data_lsn), tag);
            }
        }
        for (dir, name, ino, kind) in tx.dirents {
            if let Some(o) = self.ov.get_mut(dir) {
                o.dirent(name, (ino != 0).then_some((ino, kind)), tag);
            }
        }
    }
}
