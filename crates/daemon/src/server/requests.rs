//! The requests of a client connection: one function per request (PROTOCOL.md).

use super::{err_response, Conn, Daemon, Reply};
use crate::core::{Core, MAX_INODES_PER_REQUEST};
use crate::digest::DigestError;
use crate::sharing::leases::Grant;
use crate::sjobj::{self, SjOpen};
use cairn_area::{errno_of, fs_err};
use cairn_proto::{send, Request, Response};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// Free NVM blocks a digest that failed for lack of space asks the migrator for (4 MiB,
/// or the log's size if larger).
const DIGEST_ROOM: u64 = 1024;

fn not_registered() -> Response {
    Response::Error {
        errno: libc::EINVAL,
        message: "not registered (send Register first)".into(),
    }
}

/// Answer one request of connection `c`.
pub(super) fn handle(d: &Daemon, c: &mut Conn, req: Request) -> Reply {
    // A planted bug, for the test that fail-stop works (checked builds only: the `ci`
    // profile of the test suite, or debug).
    #[cfg(debug_assertions)]
    if matches!(req, Request::Status) && std::env::var_os("CAIRN_TEST_DAEMON_PANIC").is_some() {
        panic!("planted by CAIRN_TEST_DAEMON_PANIC");
    }
    match req {
        Request::Register { pid } => register(d, c, pid),
        Request::Reattach {
            pid: _,
            slot,
            slot_gen,
            leases,
            pinned,
        } => reattach(d, c, slot, slot_gen, leases, pinned),
        Request::Digest { upto_lsn, wait } => digest(d, c, upto_lsn, wait),
        Request::Inodes { count } => inodes(d, c, count),
        Request::Credits { blocks } => credits(d, c, blocks),
        Request::Status => match d.core().status() {
            Ok(mut r) => {
                r.migration = d.migrator.progress();
                if let Some(remote) = r.remote.as_mut() {
                    remote.paused = d.migrator.paused(cairn_format::map::TIER_REMOTE);
                }
                r.backup = d
                    .last_backup
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .map(Box::new);
                Reply::Send(Response::Status(r))
            }
            Err(e) => Reply::Send(err_response(&e)),
        },
        Request::Migrate {
            from,
            to,
            max_bytes,
        } => migrate(d, from, to, max_bytes),
        Request::Clean { tier } => clean(d, tier),
        Request::SjReserve(r) => Reply::Send(
            sj_reserve(d, c, &r)
                .map(|base| Response::SjReserved { base })
                .unwrap_or_else(|e| err_response(&e)),
        ),
        Request::SjRelease { ino, gen } => Reply::Send(
            sj_release(d, c, ino, gen)
                .map(|()| Response::Ok)
                .unwrap_or_else(|e| err_response(&e)),
        ),
        Request::SjRanges => Reply::Send(Response::SjRanges(d.sj_registry().ranges().to_vec())),
        Request::Backup { remote } => Reply::Send(
            d.backup(remote.as_deref())
                .map(Response::BackedUp)
                .unwrap_or_else(|e| err_response(&e)),
        ),
        Request::TierRead {
            tier,
            seg,
            gen,
            off,
            len,
        } => Reply::Send(
            tier_read(d, c, tier, seg, gen, off, len)
                .map(Response::TierData)
                .unwrap_or_else(|e| err_response(&e)),
        ),
        Request::Goodbye { tail_lsn } => goodbye(d, c, tail_lsn),
        Request::Lease { ino, write } => lease(d, c, ino, write),
        Request::Xattr { ino, op } => {
            let Some(slot) = c.slot else {
                return Reply::Send(not_registered());
            };
            Reply::Send(xattr_call(d, slot, ino, op).unwrap_or_else(|e| err_response(&e)))
        }
        Request::UpcallChannel { slot, slot_gen } => upcall_channel(d, c, slot, slot_gen),
        Request::Commit {
            lsn,
            len,
            seq,
            versions,
        } => commit(d, c, lsn, len, seq, &versions),
        Request::UpcallAck {
            ino,
            tail_lsn,
            open,
        } => {
            if let Some(slot) = c.upcall_of {
                upcall_ack(d, slot, ino, tail_lsn, open);
            }
            Reply::Nothing
        }
        Request::Unpin { ino, tail_lsn } => unpin(d, c, ino, tail_lsn),
        Request::Credentials { tail_lsn } => credentials(d, c, tail_lsn),
        Request::Pin { ino } => pin(d, c, ino),
        Request::MapObject {
            ino,
            gen,
            write,
            create,
            tail_lsn,
        } => map_object(d, c, (ino, gen), write, create, tail_lsn),
        Request::MapRemove { ino, gen } => match c.slot {
            Some(slot) => Reply::Send(match d.core().map_remove(slot, ino, gen) {
                Ok(()) => Response::Ok,
                Err(e) => err_response(&e),
            }),
            None => Reply::Send(not_registered()),
        },
        Request::SjObject {
            ino,
            gen,
            undo,
            write,
            tail_lsn,
        } => sj_object(d, c, (ino, gen), undo, write, tail_lsn),
        Request::SjRefresh {
            ino,
            gen,
            ranges,
            tail_lsn,
        } => sj_refresh(d, c, (ino, gen), &ranges, tail_lsn),
        Request::SjDrop { ino, gen, undo } => match c.slot {
            Some(slot) => Reply::Send(match d.core().sj_drop(slot, ino, gen, undo) {
                Ok(()) => Response::Ok,
                Err(e) => err_response(&e),
            }),
            None => Reply::Send(not_registered()),
        },
        Request::Shutdown => shutdown(d, c),
    }
}

/// `Register`: a new client gets a slot, an inode batch and credits.
fn register(d: &Daemon, c: &mut Conn, claimed: u32) -> Reply {
    if c.slot.is_some() {
        return Reply::Send(Response::Error {
            errno: libc::EINVAL,
            message: "this connection is already registered".into(),
        });
    }
    // A client that exited or disconnected has its log digested before another
    // client registers. Its socket may close a moment before the kernel drops its
    // slot lock, so wait (at most 2 s) for such clients to be recoverable.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut core = loop {
        let mut core = d.core();
        core.recover_dead();
        if !core.dead_recovery_due() || std::time::Instant::now() >= deadline {
            break core;
        }
        drop(core);
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    match core.register(c.pid, c.uid, c.gid, c.id) {
        Ok(r) => {
            c.slot = Some(r.slot);
            tracing::info!(
                "slot {} (pid {}, claimed {claimed}, uid {}): client registered, generation {}",
                r.slot,
                c.pid,
                c.uid,
                r.slot_gen
            );
            if !r.log_fds {
                return Reply::Send(Response::Registered(r));
            }
            match core.log_fds(r.slot) {
                Ok(fds) => Reply::SendFds(Response::Registered(r), fds),
                // The client gives up and disconnects; its slot is recovered.
                Err(e) => Reply::Send(err_response(&e)),
            }
        }
        Err(e) => {
            tracing::warn!("pid {}: registration refused: {e}", c.pid);
            Reply::Send(err_response(&e))
        }
    }
}

/// `Reattach`: a client of the previous daemon takes its slot back, with its leases and pins.
fn reattach(
    d: &Daemon,
    c: &mut Conn,
    slot: u32,
    slot_gen: u64,
    leases: Vec<(u64, bool)>,
    pinned: Vec<u64>,
) -> Reply {
    if c.slot.is_some() {
        return Reply::Send(Response::Error {
            errno: libc::EINVAL,
            message: "this connection is already registered".into(),
        });
    }
    let mut core = d.core();
    match core.reattach(c.pid, c.uid, c.gid, slot, slot_gen, c.id) {
        Ok(r) => {
            c.slot = Some(slot);
            // Revocations the previous daemon had acknowledged may not have been
            // digested: digest the committed log before any lease is granted.
            if let Err(e) = core.digest_committed(slot) {
                tracing::info!("slot {slot}: digest at re-attach: {e}");
            }
            for ino in pinned {
                core.pin(slot, ino);
            }
            if !d.leases.reattached(slot, &leases) {
                tracing::warn!("slot {slot}: leases sent at re-attach conflict with granted ones: all taken away");
                if let Err(e) = core.sh.bump_lease_gen(slot) {
                    tracing::warn!("slot {slot}: cannot increment lease_gen: {e}");
                }
            }
            tracing::info!(
                "slot {slot} (pid {}): client re-attached, generation {slot_gen}",
                c.pid
            );
            Reply::Send(Response::Registered(r))
        }
        Err(e) => {
            tracing::warn!("pid {}: re-attach to slot {slot} refused: {e}", c.pid);
            Reply::Send(err_response(&e))
        }
    }
}

/// `Digest`: digest the client's log up to `upto_lsn` (in the pool unless `wait`).
fn digest(d: &Daemon, c: &mut Conn, upto_lsn: u64, wait: bool) -> Reply {
    let Some(slot) = c.slot else {
        return if wait {
            Reply::Send(not_registered())
        } else {
            Reply::Nothing
        };
    };
    if !wait && d.pool.threads > 0 {
        // Digests of different clients run in parallel (crate::digest::parallel).
        d.pool.submit(slot, c.id, upto_lsn, &c.refusal);
        return Reply::Nothing;
    }
    let mut core = d.core();
    let mut r = core.digest_client(slot, upto_lsn);
    let full = matches!(&r, Err(DigestError::Failed(e)) if errno_of(e) == libc::ENOSPC);
    if full && !core.sh.tiers.is_empty() {
        // NVM is full (a restarted daemon may have promised space a log still
        // needed): move cold data down and try once more.
        let want = core.sh.layout.log_blocks.max(DIGEST_ROOM);
        core = free_nvm(d, core, |c| c.sh.blocks.free_count() < want);
        r = core.digest_client(slot, upto_lsn);
    }
    kick_if_high(d, &core);
    match r {
        Ok(o) => {
            if wait {
                Reply::Send(Response::Digested {
                    head_lsn: o.head_lsn,
                    head_seq: o.head_seq,
                })
            } else {
                Reply::Nothing
            }
        }
        Err(e) => digest_failed(&mut core, c, slot, e, wait, "digest"),
    }
}

/// NVM lacks space a client waits for: move its coldest data down while `short` says so
/// (asked after reclaiming what the epoch lets go), then take the core again.
fn free_nvm<'a>(
    d: &'a Daemon,
    core: MutexGuard<'a, Core>,
    short: impl Fn(&Core) -> bool,
) -> MutexGuard<'a, Core> {
    drop(core);
    d.migrator.free_nvm(&d.core, &|c| {
        c.reclaim();
        short(c)
    });
    let mut core = d.core();
    core.reclaim();
    core
}

/// Wake the background migration when NVM passed its high watermark.
fn kick_if_high(d: &Daemon, core: &Core) {
    if crate::tiers::migrate::Migrator::nvm_high(&core.sh, core.cfg.migrate_high_pct) {
        d.migrator.kick();
    }
}

/// `Inodes`: more inode numbers.
fn inodes(d: &Daemon, c: &Conn, count: u32) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    let mut core = d.core();
    let n = (count as u64).min(MAX_INODES_PER_REQUEST);
    Reply::Send(Response::Inodes(core.sh.inodes.reserve(slot, n)))
}

/// `Credits`: more space credits, from the float if it holds them (without waiting for
/// the core: `crate::credits`), else under the core lock, moving cold data down first if
/// NVM is full.
fn credits(d: &Daemon, c: &Conn, blocks: u64) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    if d.core.float().take(slot, blocks) {
        return Reply::Send(Response::Credits { granted: blocks });
    }
    let mut core = d.core();
    core.reclaim();
    kick_if_high(d, &core);
    let mut granted = core.grant(slot, blocks);
    if granted < blocks && !core.sh.tiers.is_empty() {
        // NVM is full: move its coldest data down now, then grant again.
        let want = blocks - granted;
        core = free_nvm(d, core, |c| c.available_credits() < want);
        granted += core.grant(slot, blocks - granted);
    }
    Reply::Send(Response::Credits { granted })
}

/// `Migrate`: move cold data of tier `from` one tier down.
fn migrate(d: &Daemon, from: u8, to: u8, max_bytes: u64) -> Reply {
    if d.core().sh.layout.below(from) != Some(to) {
        return Reply::Send(err_response(&fs_err(
            libc::EINVAL,
            format!(
                "cannot migrate from tier {from} to tier {to}: data moves one tier \
                     down, to a tier the store has"
            ),
        )));
    }
    let max = max_bytes.div_ceil(cairn_format::BLOCK_SIZE_U64);
    let n = d.migrator.migrate(&d.core, from, max);
    if n == 0 {
        if let Some((errno, why)) = d.migrator.failure(to) {
            return Reply::Send(err_response(&fs_err(
                errno,
                format!(
                    "rounds into the {} tier are paused after a failure: {why}",
                    cairn_format::map::TIER_NAMES[to as usize]
                ),
            )));
        }
    }
    moved(d, from, n)
}

/// The answer to `Migrate` and `Clean`: `n` blocks moved, and what tier `tier` uses now.
fn moved(d: &Daemon, tier: u8, n: u64) -> Reply {
    let (used, _) = crate::tiers::migrate::Migrator::usage(&d.core().sh, tier);
    Reply::Send(Response::Migrated {
        bytes: n * cairn_format::BLOCK_SIZE_U64,
        used_bytes: used * cairn_format::BLOCK_SIZE_U64,
    })
}

/// `Clean`: one cleaning round on a lower tier.
fn clean(d: &Daemon, tier: u8) -> Reply {
    if tier == 0 || d.core().sh.tier(tier).is_none() {
        return Reply::Send(err_response(&fs_err(
            libc::EINVAL,
            format!("cannot clean tier {tier}: only a lower tier the store has is cleaned"),
        )));
    }
    let n = d.migrator.clean(&d.core, tier);
    moved(d, tier, n)
}

/// `TierRead`: bytes of a lower tier's segment, for a client in the trust domain (which
/// may read the NVM file and the local tiers' files anyway). Read without the core
/// lock, through the tier's cache (the remote tier's), so that a slow cluster stalls
/// only this connection.
fn tier_read(
    d: &Daemon,
    c: &Conn,
    tier: u8,
    seg: u64,
    gen: u64,
    off: u64,
    len: u32,
) -> io::Result<Vec<u8>> {
    let area = {
        let core = d.core();
        core.trusts(c.pid, c.uid, c.gid)?;
        core.sh.area.clone()
    };
    let bad = |why: &str| {
        fs_err(
            libc::EINVAL,
            format!("read of tier {tier}, segment {seg}, {len} bytes at {off}: {why}"),
        )
    };
    let (Some(g), Some(dev)) = (area.layout().tier(tier).copied(), area.tier(tier)) else {
        return Err(bad("the store has no such tier"));
    };
    let start = seg.saturating_mul(g.segment_bytes());
    if len > cairn_proto::MAX_TIER_READ
        || seg == 0
        || seg >= g.segments
        || off < start
        || off.saturating_add(len as u64) > start + g.segment_bytes()
    {
        return Err(bad("not inside one data segment, or too long"));
    }
    if area.segment_gen(tier, seg)? != gen {
        return Err(fs_err(
            libc::ESTALE,
            format!("segment {seg} of tier {tier} was rewritten since generation {gen}"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    dev.read(seg, gen, off, &mut buf)?;
    Ok(buf)
}

/// `Goodbye`: digest the leaving client's log and free its slot.
fn goodbye(d: &Daemon, c: &mut Conn, tail_lsn: u64) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Close(Some(Response::Ok));
    };
    let mut core = d.core();
    match core.digest_client(slot, tail_lsn) {
        Ok(_) => match core.release(slot, None) {
            Ok(()) => {
                c.slot = None;
                tracing::info!("slot {slot} (pid {}): client left", c.pid);
                Reply::Close(Some(Response::Ok))
            }
            Err(e) => Reply::Send(err_response(&e)),
        },
        Err(e) => digest_failed(&mut core, c, slot, e, true, "goodbye"),
    }
}

/// The registered client's slot and the core, with its records before `tail_lsn`
/// digested (what the request `what` needs first), or the reply to send instead.
fn digested<'d>(
    d: &'d Daemon,
    c: &mut Conn,
    tail_lsn: u64,
    what: &str,
) -> Result<(u32, MutexGuard<'d, Core>), Box<Reply>> {
    let Some(slot) = c.slot else {
        return Err(Box::new(Reply::Send(not_registered())));
    };
    let mut core = d.core();
    match core.digest_client(slot, tail_lsn) {
        Ok(_) => Ok((slot, core)),
        Err(e) => Err(Box::new(digest_failed(&mut core, c, slot, e, true, what))),
    }
}

/// The answer to `MapObject` and `SjObject`: the descriptor after the response.
fn object_reply(r: io::Result<(std::fs::File, bool)>) -> Reply {
    match r {
        Ok((f, writable)) => Reply::SendFds(Response::MapObject { writable }, vec![f.into()]),
        Err(e) => Reply::Send(err_response(&e)),
    }
}

/// `Unpin`: the client closed a file it had pinned.
fn unpin(d: &Daemon, c: &mut Conn, ino: u64, tail_lsn: u64) -> Reply {
    // Its records about the inode are applied before it may be freed.
    let (slot, mut core) = match digested(d, c, tail_lsn, "unpin") {
        Ok(r) => r,
        Err(reply) => return *reply,
    };
    match core.unpin(slot, Some(ino)) {
        Ok(()) => Reply::Send(Response::Ok),
        Err(e) => Reply::Send(err_response(&e)),
    }
}

/// `Credentials`: the client's process changed its credentials. What it logged before
/// `tail_lsn` is digested with the old ones; then its log is checked with the ones the
/// kernel reports for the process now.
fn credentials(d: &Daemon, c: &mut Conn, tail_lsn: u64) -> Reply {
    let (slot, mut core) = match digested(d, c, tail_lsn, "credentials") {
        Ok(r) => r,
        Err(reply) => return *reply,
    };
    let cred = match crate::perm::cred_now(c.pid) {
        Ok(cred) => cred,
        Err(e) => return Reply::Send(err_response(&e)),
    };
    if let Err(e) = core.set_slot_cred(slot, cred.clone()) {
        return Reply::Send(err_response(&e));
    }
    tracing::info!(
        "slot {slot} (pid {}): credentials now uid {} gid {} groups {:?}",
        c.pid,
        cred.uid,
        cred.gid,
        cred.groups
    );
    Reply::Send(Response::Credentials {
        uid: cred.uid,
        gid: cred.gid,
        groups: cred.groups,
    })
}

/// `Pin`: keep a reserved inode (an unnamed file) while the client lives.
fn pin(d: &Daemon, c: &Conn, ino: u64) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    let mut core = d.core();
    // A number it reserved (an unnamed file it creates), or a file it holds a lease on
    // (one it has open and is removing the last name of).
    if core.sh.inodes.reserved_by(ino) != Some(slot) && !core.leases.held_by(ino, slot) {
        return Reply::Send(err_response(&crate::util::einval(format!(
            "pin: inode {ino} is neither a number this client reserved nor one it holds a lease on"
        ))));
    }
    core.pin(slot, ino);
    Reply::Send(Response::Ok)
}

/// `MapObject`: the client's records before `tail_lsn` digested, then a descriptor of
/// the map object of file `ino`/`gen` (`crate::mapobj`).
fn map_object(
    d: &Daemon,
    c: &mut Conn,
    (ino, gen): (u64, u64),
    write: bool,
    create: bool,
    tail_lsn: u64,
) -> Reply {
    match digested(d, c, tail_lsn, "map object") {
        Ok((slot, mut core)) => object_reply(core.map_object(slot, ino, gen, write, create)),
        Err(reply) => *reply,
    }
}

/// `SjObject`: the client's records before `tail_lsn` digested, then a descriptor of a
/// segment's resident copy or undo log (`crate::sjobj`). A missing copy is built from
/// the segment's committed state a step at a time, the core lock taken for each step
/// only, header first. Nobody has a segment without a copy attached, so nobody commits
/// to it meanwhile; whoever attaches checks the copy's commit sequence against the
/// file's under the segment's writer lock all the same.
fn sj_object(
    d: &Daemon,
    c: &mut Conn,
    (ino, gen): (u64, u64),
    undo: bool,
    write: bool,
    tail_lsn: u64,
) -> Reply {
    let opened = match digested(d, c, tail_lsn, "segment object") {
        Ok((slot, core)) => core.sj_object(slot, ino, gen, undo, write),
        Err(reply) => return *reply,
    };
    object_reply(match opened {
        Ok(SjOpen::Ready(f, writable)) => Ok((f, writable)),
        Ok(SjOpen::Build {
            committed,
            path,
            nvm,
            writable,
        }) => (|| {
            let (f, tmp) = sjobj::start_copy(&path, committed.len)?;
            let filled = copy_committed(d, &committed, &f, &[(0, committed.len)])
                .and_then(|()| sjobj::finish_copy(&f, &tmp, &path, committed.len));
            if filled.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            filled?;
            // The grant stands (the client may have lost its lease meanwhile, to a
            // holder that timed out waiting for it: the copy is checked against the file
            // under the segment's writer lock before use).
            Ok((
                cairn_area::host::open_daemon_object(&path, &nvm, writable)?,
                writable,
            ))
        })(),
        Err(e) => Err(e),
    })
}

/// `SjRefresh`: the client's records before `tail_lsn` digested, then the segment's
/// committed state copied over `ranges` of its resident copy (all of it if empty).
fn sj_refresh(
    d: &Daemon,
    c: &mut Conn,
    (ino, gen): (u64, u64),
    ranges: &[(u64, u64)],
    tail_lsn: u64,
) -> Reply {
    let started = match digested(d, c, tail_lsn, "segment refresh") {
        Ok((slot, core)) => core.sj_refresh_start(slot, ino, gen),
        Err(reply) => return *reply,
    };
    let r = started.and_then(|(committed, f)| {
        if ranges.len() > cairn_proto::MAX_REFRESH_RANGES {
            return Err(fs_err(
                libc::EINVAL,
                format!("segment inode {ino}: {} ranges to refresh", ranges.len()),
            ));
        }
        if let Some(&(o, l)) = ranges
            .iter()
            .find(|&&(o, l)| o.checked_add(l).is_none_or(|e| e > committed.len))
        {
            return Err(fs_err(
                libc::EINVAL,
                format!("segment inode {ino}: range {o:#x}+{l:#x} is outside the segment"),
            ));
        }
        // Sorted and merged: the work is at most the segment, whatever the list.
        let mut merged: Vec<(u64, u64)> = Vec::new();
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        for (o, l) in sorted {
            match merged.last_mut() {
                Some((mo, ml)) if o <= *mo + *ml => *ml = (*ml).max(o + l - *mo),
                _ => merged.push((o, l)),
            }
        }
        if ranges.is_empty() {
            merged.push((0, committed.len));
        }
        copy_committed(d, &committed, &f, &merged)
    });
    Reply::Send(match r {
        Ok(()) => Response::Ok,
        Err(e) => err_response(&e),
    })
}

/// Copy segment `c`'s committed state over `ranges` of file `f`, a step of
/// [`sjobj::FILL_STEP`] bytes per hold of the core lock.
fn copy_committed(
    d: &Daemon,
    c: &sjobj::Committed,
    f: &std::fs::File,
    ranges: &[(u64, u64)],
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; sjobj::FILL_STEP];
    for &(off, len) in ranges {
        let mut at = off;
        while at < off + len {
            let n = buf.len().min((off + len - at) as usize);
            d.core().sj_fill(c, at, &mut buf[..n])?;
            f.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
    }
    Ok(())
}

/// `Shutdown`: digest everything, save the allocation state and stop.
fn shutdown(d: &Daemon, c: &Conn) -> Reply {
    if c.uid != d.uid && c.uid != 0 {
        return Reply::Send(Response::Error {
            errno: libc::EPERM,
            message: "only the daemon's user can stop it".into(),
        });
    }
    tracing::info!("shutdown requested by pid {}", c.pid);
    let r = d.quiesced_shutdown();
    d.stop.store(true, Ordering::SeqCst);
    match r {
        Ok(()) => Reply::Close(Some(Response::Ok)),
        Err(e) => Reply::Close(Some(err_response(&e))),
    }
}

/// `Lease`: wait until granted (PROTOCOL.md, "Leases"). Runs without the core lock
/// except for the work between waits (expiring a holder, closing the restart gate).
fn lease(d: &Daemon, c: &mut Conn, ino: u64, write: bool) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    if !d.core().sh.layout.ino_valid(ino) {
        return Reply::Send(Response::Error {
            errno: libc::EINVAL,
            message: format!("lease: inode number {ino} out of range"),
        });
    }
    // An inode reserved for another live client may be one it created and has not
    // digested yet (its number reached this client out of band: an inherited
    // descriptor). The creator holds its write lease, so that lease is revoked — its
    // log digested — before this one is granted.
    let creator = d.core().sh.inodes.reserved_by(ino);
    if let Some(s) = creator.filter(|&s| s != slot) {
        d.leases.record_created(s, &[ino]);
    }
    // Only regular files enter shared-write mode (when it is on at all).
    let file = d.leases.shared_write()
        && d.core()
            .sh
            .area
            .read_inode(ino)
            .is_ok_and(|i| i.attrs.kind == cairn_format::inode::Kind::File);
    loop {
        match d.leases.acquire(slot, ino, write, file) {
            Ok(Grant::Lease) => return Reply::Send(Response::Leased { ino, write }),
            Ok(Grant::Mediated) => return Reply::Send(Response::Mediated { ino }),
            Err(crate::sharing::leases::Step::Expire(h)) => d.core().expire_leases(h),
            Err(crate::sharing::leases::Step::GateDue) => d.core().lease_gate_tick(),
            Err(crate::sharing::leases::Step::NotLive) => {
                return Reply::Send(Response::Error {
                    errno: libc::ESTALE,
                    message: "lease: this client's slot is no longer live".into(),
                })
            }
        }
    }
}

/// `Commit` (shared-write mode, PROTOCOL.md): check the client's unsealed transaction
/// and the inode sequence words it claims, seal it and digest the log up to its end,
/// all under the core lock, so that commits writing one inode are applied one at a
/// time, each to the state the previous one published.
fn commit(d: &Daemon, c: &mut Conn, lsn: u64, len: u32, seq: u64, claimed: &[(u64, u64)]) -> Reply {
    let Some(slot) = c.slot else {
        return Reply::Send(not_registered());
    };
    let mut core = d.core();
    let written = match crate::digest::unsealed_writes(&core.sh, slot, lsn, len, seq) {
        Ok(w) => w,
        Err(e) => return Reply::Send(err_response(&e)),
    };
    let mut current = Vec::with_capacity(written.len());
    for &ino in &written {
        match core.sh.area.inode_seq(ino) {
            Ok(w) => current.push((ino, w)),
            Err(e) => return Reply::Send(err_response(&e)),
        }
    }
    if let Err(ended) = d.leases.check_commit(slot, claimed, &current) {
        return Reply::Send(Response::Stale { ended });
    }
    if let Err(e) = crate::digest::seal(&core.sh, slot, lsn) {
        return Reply::Send(err_response(&e));
    }
    if let Err(e) = core.digest_client(slot, lsn + len as u64) {
        return digest_failed(&mut core, c, slot, e, true, "commit");
    }
    let ended = d.leases.committed(slot, &written);
    Reply::Send(Response::Committed { ended })
}

/// `UpcallChannel`: this connection carries `slot`'s upcalls (same process only).
fn upcall_channel(d: &Daemon, c: &mut Conn, slot: u32, slot_gen: u64) -> Reply {
    let refuse = |m: &str| {
        Reply::Close(Some(Response::Error {
            errno: libc::EINVAL,
            message: format!("upcall channel: {m}"),
        }))
    };
    if c.slot.is_some() || c.upcall_of.is_some() {
        return refuse("this connection is already in use");
    }
    let ok = {
        let core = d.core();
        matches!(core.clients.get(slot as usize), Some(Some(cl))
            if cl.slot_gen == slot_gen && cl.pid == c.pid && cl.conn.is_some())
    };
    if !ok {
        return refuse("no such client of this process");
    }
    let Some(mut sock) = c.sock.take() else {
        return refuse("cannot duplicate the socket");
    };
    // The answer goes first: `channel_open` sends the revocations waiting for this
    // channel on it at once, and the client reads `Ok` before any upcall.
    if send(&mut sock, &Response::Ok).is_err() {
        return Reply::Close(None);
    }
    c.upcall_of = Some(slot);
    d.leases.channel_open(slot, c.id, sock);
    Reply::Nothing
}

/// `UpcallAck`: `slot` gave the lease on `ino` up; a writer's log is digested up to the
/// tail it answered before the lease counts as released. An inode the client has open
/// is pinned first, so that an unlink logged by the next holder keeps it.
fn upcall_ack(d: &Daemon, slot: u32, ino: u64, tail_lsn: u64, open: bool) {
    if open {
        d.core().pin(slot, ino);
    }
    let Some(was_writer) = d.leases.ack_begin(slot, ino) else {
        return;
    };
    if was_writer {
        let mut core = d.core();
        match core.digest_client(slot, tail_lsn) {
            Ok(_) => {}
            Err(DigestError::Malformed { msg, .. }) => {
                tracing::info!("slot {slot}: revocation answer with a bad tail ({msg}): digesting its committed log instead");
                if let Err(e) = core.digest_committed(slot) {
                    tracing::info!("slot {slot}: {e}");
                }
            }
            Err(DigestError::Failed(e)) => tracing::warn!(
                "slot {slot}: cannot digest its log for a revoked lease on inode {ino}: {e}"
            ),
        }
    }
    d.leases.ack_done(slot, ino);
}

/// A digest worker found the client's log malformed: refuse it (as [`digest_failed`]).
/// True if there was such a finding (the connection closes).
pub(super) fn take_refusal(d: &Daemon, c: &mut Conn) -> bool {
    let Some((slot, msg, discard_lsn)) = c.refusal.take() else {
        return false;
    };
    if c.slot == Some(slot) {
        let mut core = d.core();
        let e = DigestError::Malformed { msg, discard_lsn };
        let _ = digest_failed(&mut core, c, slot, e, false, "digest");
    }
    true
}

/// A digest for a client failed: a malformed log refuses the client (its log is
/// discarded, the slot released, the connection closed); other failures are reported.
fn digest_failed(
    core: &mut Core,
    c: &mut Conn,
    slot: u32,
    e: DigestError,
    wait: bool,
    what: &str,
) -> Reply {
    match e {
        DigestError::Malformed { msg, discard_lsn } => {
            tracing::warn!("slot {slot} (pid {}): malformed log refused ({what}): {msg}; log discarded up to {discard_lsn}, slot released",
                c.pid);
            if let Err(e) = core.release(slot, Some(discard_lsn)) {
                tracing::warn!("slot {slot}: cannot release: {e}");
            }
            c.slot = None;
            let resp = wait.then(|| Response::Error {
                errno: libc::EBADMSG,
                message: format!("malformed log: {msg}"),
            });
            Reply::Close(resp)
        }
        DigestError::Failed(e) => {
            tracing::warn!(
                "slot {slot} (pid {}): {what} failed: {e}; the log stays authoritative",
                c.pid
            );
            if wait {
                Reply::Send(err_response(&e))
            } else {
                Reply::Nothing
            }
        }
    }
}

/// `Xattr`: an extended-attribute call on `ino` by `slot`'s client, checked against the
/// inode as published (the client digested its own records about it first, and holds a
/// lease, so no other client has unpublished changes to it) and the client's
/// credentials (`cairn_format::xattr` has the rules).
fn xattr_call(d: &Daemon, slot: u32, ino: u64, op: cairn_proto::XattrOp) -> io::Result<Response> {
    use cairn_format::inode::Kind;
    use cairn_format::xattr::{self as rules, Access};
    use cairn_proto::XattrOp;
    let (inode, cred) = {
        let core = d.core();
        if !core.sh.layout.ino_valid(ino) {
            return Err(fs_err(
                libc::EINVAL,
                format!("xattr: bad inode number {ino}"),
            ));
        }
        (core.sh.inode(ino)?, crate::perm::slot_cred(&core.sh, slot)?)
    };
    if inode.attrs.kind == Kind::Free {
        return Err(fs_err(
            libc::ENOENT,
            format!("xattr: inode {ino} does not exist"),
        ));
    }
    let generation = inode.generation;
    let checked = |name: &[u8], access: Access, what: &str| -> io::Result<()> {
        let shown = String::from_utf8_lossy(name);
        let ns = rules::namespace(name).map_err(|n| {
            fs_err(
                n,
                format!("{what} {shown}: not a name Cairn stores (user., trusted. or security.)"),
            )
        })?;
        rules::check(&cred, &inode.attrs, ns, access).map_err(|n| {
            let why = match n {
                libc::ENODATA => "no such attribute",
                libc::EACCES => "permission denied",
                _ => "not permitted for this caller or file type",
            };
            fs_err(n, format!("{what} {shown}: {why}"))
        })
    };
    let live = |i: u64, g: u64| {
        let core = d.core();
        core.sh
            .inode(i)
            .is_ok_and(|n| n.attrs.kind != Kind::Free && n.generation == g)
    };
    let mut x = d.xattrs.lock().unwrap_or_else(|p| p.into_inner());
    Ok(match op {
        XattrOp::List => Response::XattrNames(
            x.of(ino, generation)
                .into_iter()
                .flat_map(|a| a.keys())
                .filter(|n| rules::listed(&cred, n))
                .cloned()
                .collect(),
        ),
        XattrOp::Get { name } => {
            checked(&name, Access::Get, "getxattr")?;
            match x.of(ino, generation).and_then(|a| a.get(&name)) {
                Some(v) => Response::XattrValue(v.clone()),
                None => {
                    return Err(fs_err(
                        libc::ENODATA,
                        format!(
                            "getxattr {}: no such attribute",
                            String::from_utf8_lossy(&name)
                        ),
                    ))
                }
            }
        }
        XattrOp::Set { name, value, flags } => {
            checked(&name, Access::Change, "setxattr")?;
            // The inode is flagged before the attribute is durable: a crash in between
            // leaves a flag without attributes, which only costs readers a request.
            flag_xattrs(d, ino, generation, true, &[])?;
            let dropped = x.change(ino, generation, &name, Some(&value), flags, &live)?;
            flag_xattrs(d, ino, generation, true, &dropped)?;
            Response::Ok
        }
        XattrOp::Remove { name } => {
            checked(&name, Access::Change, "removexattr")?;
            let dropped = x.change(ino, generation, &name, None, 0, &live)?;
            flag_xattrs(
                d,
                ino,
                generation,
                x.of(ino, generation).is_some(),
                &dropped,
            )?;
            Response::Ok
        }
    })
}

/// Keep the inodes' `xattrs` flags (readers skip the daemon for inodes without it):
/// `(ino, generation)` has attributes (`has`) or not; `dropped` inodes (gone, their
/// attributes dropped by a journal rewrite) are forgotten.
fn flag_xattrs(
    d: &Daemon,
    ino: u64,
    generation: u64,
    has: bool,
    dropped: &[(u64, u64)],
) -> io::Result<()> {
    let mut core = d.core();
    for k in dropped {
        core.sh.xattr_inodes.remove(k);
    }
    let changed = if has {
        core.sh.xattr_inodes.insert((ino, generation))
    } else {
        core.sh.xattr_inodes.remove(&(ino, generation))
    };
    let inode = core.sh.inode(ino)?;
    if changed && inode.generation == generation {
        // Written again as it is: `Shared::write_inode` sets the flag.
        core.sh.write_inode(ino, &inode)?;
    }
    Ok(())
}

/// At start: the inodes the attribute journal names are flagged (a daemon that stopped
/// between the journal and the flag, or a store older than the flag).
pub(crate) fn mark_xattr_inodes(core: &mut Core, x: &crate::xattr::Xattrs) -> io::Result<()> {
    for (ino, generation) in x.inodes() {
        core.sh.xattr_inodes.insert((ino, generation));
        match core.sh.inode(ino) {
            Ok(i) if i.generation == generation && !i.xattrs => core.sh.write_inode(ino, &i)?,
            _ => {}
        }
    }
    Ok(())
}

/// The segment file `ino` of generation `gen` as published: `Ok(None)` when it no longer
/// exists (freed, or the number reused); `EINVAL` for a bad inode number or something
/// other than a regular file.
pub(super) fn segment_inode(
    core: &Core,
    ino: u64,
    gen: u64,
) -> io::Result<Option<cairn_format::inode::Inode>> {
    use cairn_format::inode::Kind;
    if !core.sh.layout.ino_valid(ino) {
        return Err(fs_err(
            libc::EINVAL,
            format!("segment: bad inode number {ino}"),
        ));
    }
    let inode = core.sh.inode(ino)?;
    if inode.attrs.kind == Kind::Free || inode.generation != gen || inode.attrs.nlink == 0 {
        return Ok(None);
    }
    if inode.attrs.kind != Kind::File {
        return Err(fs_err(
            libc::EINVAL,
            format!("segment: inode {ino} is not a regular file"),
        ));
    }
    Ok(Some(inode))
}

/// [`segment_inode`], which must be the caller's (`c`) unless it is root (`EPERM`).
fn sj_segment_file(
    d: &Daemon,
    c: &Conn,
    ino: u64,
    gen: u64,
) -> io::Result<Option<cairn_format::inode::Inode>> {
    let inode = segment_inode(&d.core(), ino, gen)?;
    if let Some(i) = &inode {
        if c.uid != 0 && c.uid != i.attrs.uid {
            return Err(fs_err(
                libc::EPERM,
                format!("segment: uid {} does not own inode {ino}", c.uid),
            ));
        }
    }
    Ok(inode)
}

/// `SjReserve`: the segment's file must exist (digested) and be the caller's.
fn sj_reserve(d: &Daemon, c: &Conn, r: &cairn_proto::SjReservation) -> io::Result<u64> {
    if sj_segment_file(d, c, r.ino, r.gen)?.is_none() {
        return Err(fs_err(
            libc::ENOENT,
            format!(
                "segment {}: its file (inode {}) does not exist",
                r.path, r.ino
            ),
        ));
    }
    let base = d.sj_registry().reserve(r)?;
    tracing::info!(
        "segment {} (inode {}) holds {base:#x}+{:#x}",
        r.path,
        r.ino,
        r.len
    );
    Ok(base)
}

/// `SjRelease`: allowed to the file's owner, and to anyone once the file is gone.
fn sj_release(d: &Daemon, c: &Conn, ino: u64, gen: u64) -> io::Result<()> {
    sj_segment_file(d, c, ino, gen)?;
    if d.sj_registry().release(ino, gen)? {
        tracing::info!("segment inode {ino}: range released");
    }
    Ok(())
}
