//! The daemon's state machine, independent of sockets: the shared-area writer, the
//! client table (one entry per active log slot), registration, digests with credit
//! accounting, dead-client recovery, status and clean shutdown. The server wraps one
//! `Core` in a mutex.

use crate::credits::CreditFloat;
use crate::digest::{self, DigestError, Mode, Outcome};
use crate::sharing::leases::Leases;
use crate::store::alloc::{BlockAlloc, InodeAlloc};
use crate::store::recovery;
use crate::store::shared::Shared;
use crate::util::{einval, now_ns};
use cairn_area::{fs_err, Area, StoreConfig, StoreDir};
use cairn_format::slot::{client_page, SlotHead};
use cairn_format::superblock::state;
use cairn_media::sys;
use cairn_proto::{ClientStatus, HostStatus, InodeStatus, Registration, StatusReport, TierStatus};
use std::fs::{File, OpenOptions};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Inode numbers handed out at registration.
pub(crate) const INODE_BATCH: u64 = 64;
/// Most inode numbers handed out per `Inodes` request.
pub(crate) const MAX_INODES_PER_REQUEST: u64 = 4096;
/// Space credits (4 KiB blocks) offered at registration.
pub(crate) const INITIAL_CREDITS: u64 = 2048;

/// Delay before retrying the recovery of a dead client's log that failed (e.g. `ENOSPC`).
const RETRY_FAILED: Duration = Duration::from_secs(5);

/// A client owning a log slot.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub slot_gen: u64,
    /// Credits granted and not yet charged by a digest.
    pub credits: u64,
    /// The connection serving it; `None` after the connection closed or the daemon
    /// restarted (the owner may re-attach, or is dead: recovered once its lock is free).
    pub conn: Option<u64>,
    /// Earliest time to try recovering it (when `conn` is `None`).
    pub retry_at: Instant,
    /// It was alive when this daemon started and has not re-attached yet.
    pub awaiting_reattach: bool,
}

/// How the allocation state was obtained at start, and what recovery did.
#[derive(Debug, Clone, Default)]
pub(crate) struct StartReport {
    pub rebuilt: bool,
    pub recovered_slots: Vec<u32>,
    pub live_slots: Vec<u32>,
}

/// The daemon state.
pub(crate) struct Core {
    pub sh: Shared,
    pub store: StoreDir,
    pub cfg: StoreConfig,
    pub clients: Vec<Option<Client>>,
    pub stopped: bool,
    /// The lease manager (its own lock; taken after the core lock, never before).
    pub leases: Arc<Leases>,
    /// Parallel digests in flight (`crate::digest::parallel`).
    pub par: crate::digest::parallel::ParState,
    /// Credits granted without this lock (`crate::credits`).
    pub float: Arc<CreditFloat>,
}

/// `Ok(Some(lock))` if nobody holds `slots/<slot>.lock` (we now do), `Ok(None)` if held.
pub(crate) fn try_lock_slot(store: &StoreDir, slot: u32) -> io::Result<Option<File>> {
    let _ = std::fs::create_dir_all(store.slots_dir());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(store.slot_lock_path(slot))?;
    match sys::flock_exclusive(&f, true) {
        Ok(()) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why a member of the trusted group cannot run the store's daemon (LibFS recognizes
/// the words "may run its daemon" and does not wait for a daemon that cannot start).
pub(crate) fn only_the_owner(cfg: &cairn_area::StoreConfig) -> String {
    let owner = cfg
        .owner_uid
        .map_or_else(|| "the owner".to_string(), |u| format!("uid {u}"));
    format!("only the store's owner ({owner}) or root may run its daemon")
}

/// Open the store's NVM tier file for reading and writing.
pub(crate) fn open_nvm(store: &StoreDir, cfg: &cairn_area::StoreConfig) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cfg.nvm_path)
        .map_err(|e| {
            let why = if e.kind() == io::ErrorKind::PermissionDenied {
                // Clients of the trusted group may read the file, never write it.
                only_the_owner(cfg)
            } else {
                "a reboot clears /dev/shm".to_string()
            };
            fs_err(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!(
                    "cannot open the NVM file {} of store {}: {e} ({why})",
                    cfg.nvm_path.display(),
                    store.path.display()
                ),
            )
        })
}

fn estale(msg: impl Into<String>) -> io::Error {
    fs_err(libc::ESTALE, msg)
}

/// The allocation state at a start: loaded when the store was stopped cleanly (and it
/// is usable), else rebuilt from the inodes (the slots with a log then replay it first).
/// Marks the store in use (`clean = 0`, `mounts + 1`) and returns the mount count.
fn allocation_state(sh: &mut Shared, clean: bool, report: &mut StartReport) -> io::Result<u64> {
    let loaded = if clean {
        match recovery::load(&sh.area) {
            Ok((b, i, t)) => {
                sh.blocks = b;
                sh.inodes = i;
                sh.tiers = t;
                true
            }
            Err(e) => {
                tracing::warn!("allocation state unusable ({e}); rebuilding it from the inodes");
                false
            }
        }
    } else {
        false
    };
    // From here on the shared area changes: the saved allocation state is stale.
    sh.set_state(state::CLEAN, 0)?;
    let mounts = sh.area.state_field(state::MOUNTS)? + 1;
    sh.set_state(state::MOUNTS, mounts)?;
    if !loaded {
        let r = recovery::rebuild(sh)?;
        report.rebuilt = true;
        for slot in 0..sh.layout.nslots {
            if sh.slot_head(slot)?.0.active {
                sh.replaying.insert(slot);
            }
        }
        tracing::warn!("unclean start: rebuilt the allocation state: {} inodes, {} blocks in use, {} undecodable inodes freed, {} unnamed inodes kept until the logs are replayed, {} inode locks repaired, {} entries of unpublished appends cleared",
            r.inodes, r.blocks, r.undecodable_freed, r.unnamed_kept, r.seqlocks_fixed, r.appends_cleared);
        for w in r.warnings {
            tracing::warn!("rebuild warning: {w}");
        }
    }
    Ok(mounts)
}

impl Core {
    /// Open the store's tier, get the allocation state (load after a clean stop, else
    /// rebuild), mark the store in use (`clean = 0`, `mounts + 1`) and recover every
    /// active slot whose owner is dead.
    pub(crate) fn open(store: &StoreDir) -> io::Result<(Core, StartReport)> {
        let cfg = store.load_config()?;
        let file = open_nvm(store, &cfg)?;
        cfg.apply_emulation();
        let mut area = Area::open(&file, true)?;
        area.attach_logs(&cfg.nvm_path, true)?;
        let remote = crate::tiers::remote::open(&cfg, area.superblock(), true)?;
        area.attach_tiers(
            [cfg.ssd_path.as_deref(), cfg.hdd_path.as_deref()],
            remote.clone().map(|t| Box::new(t) as _),
            true,
        )?;
        let l = *area.layout();
        let clean = area.state_field(state::CLEAN)? == 1;
        let mut sh = Shared::new(
            area,
            BlockAlloc::new(l.data_start, l.data_blocks),
            InodeAlloc::new(l.inode_count),
        );
        sh.remote = remote;
        // With superpages, NVM's recency chunk holds whole extents (they migrate whole).
        let nvm_grain = if sh.area.superblock().superpages() && cfg.superpages {
            cfg.recency_grain_nvm_kib.next_multiple_of(2048)
        } else {
            cfg.recency_grain_nvm_kib
        };
        sh.recency = crate::tiers::recency::Recency::new(nvm_grain, cfg.recency_grain_ssd_kib);
        let mut report = StartReport::default();
        let mounts = allocation_state(&mut sh, clean, &mut report)?;
        let v5 = sh.area.superblock().superpages();
        sh.superpages = crate::superpage::Superpages::new(&sh, &cfg, v5);
        let mut core = Core {
            sh,
            store: store.clone(),
            cfg,
            clients: vec![None; l.nslots as usize],
            stopped: false,
            leases: Arc::new(Leases::new(Duration::ZERO, &[])),
            par: Default::default(),
            float: Arc::new(CreditFloat::new(l.nslots as usize)),
        };
        core.take_over_slots(&mut report)?;
        // Every log there was at the start is replayed: inodes still unnamed are garbage.
        let freed = recovery::free_unreachable(&mut core.sh)?;
        if freed > 0 {
            tracing::info!("freed {freed} inodes no directory names after the replay");
        }
        // No lease is granted until the live clients re-attached with theirs (or the
        // lease timeout passed).
        core.leases = Arc::new(
            Leases::new(
                Duration::from_millis(core.cfg.lease_timeout_ms.max(1)),
                &report.live_slots,
            )
            .with_policy(
                Duration::from_micros(core.cfg.lease_hold_us),
                core.cfg.shared_write,
            ),
        );
        tracing::info!("store {} mounted (mount {mounts}): {} dead clients recovered, {} live clients may re-attach; {} of {} data blocks and {} of {} inodes in use",
            store.path.display(),
            report.recovered_slots.len(),
            report.live_slots.len(),
            core.sh.blocks.capacity() - core.sh.blocks.free_count(),
            core.sh.blocks.capacity(),
            core.sh.inodes.used_count(),
            core.sh.inodes.capacity());
        if report.live_slots.is_empty() {
            // No client can still have an unlinked file open.
            core.sweep_orphans();
        } else {
            // Until they re-attached with their pins, unlinks keep their files.
            core.sh.keep_unlinked = true;
        }
        Ok((core, report))
    }

    /// The slots with a log at a start: a dead client's is recovered at once; a live one
    /// (its process still holds the slot lock) waits for it to re-attach, its log's new
    /// inodes and promised space kept for it.
    fn take_over_slots(&mut self, report: &mut StartReport) -> io::Result<()> {
        for slot in 0..self.sh.layout.nslots {
            let (h, _) = self.sh.slot_head(slot)?;
            if !h.active {
                continue;
            }
            let (page, at) = self.sh.area.slot_log(slot);
            let pid = page.load_u64(at + client_page::PID as usize).unwrap_or(0) as u32;
            self.clients[slot as usize] = Some(Client {
                pid,
                uid: 0,
                gid: 0,
                slot_gen: h.slot_gen,
                credits: 0,
                conn: None,
                awaiting_reattach: true,
                retry_at: Instant::now(),
            });
            match try_lock_slot(&self.store, slot)? {
                Some(_lock) => {
                    self.recover_slot(slot);
                    report.recovered_slots.push(slot);
                }
                None => {
                    let (new, charge) = digest::logged(&self.sh, slot)?;
                    for ino in new {
                        self.sh.inodes.reserve_one(slot, ino);
                    }
                    // The space its log was promised stays promised until digested.
                    if let Some(c) = self.clients[slot as usize].as_mut() {
                        c.credits = charge;
                    }
                    report.live_slots.push(slot);
                }
            }
        }
        Ok(())
    }

    /// Slots with a client (their readers' epochs hold back reclamation).
    pub(crate) fn reader_slots(&self) -> Vec<u32> {
        (0..self.clients.len() as u32)
            .filter(|&s| self.clients[s as usize].is_some())
            .collect()
    }

    /// Free retired blocks no reader can see any more.
    pub(crate) fn reclaim(&mut self) -> u64 {
        let r = self.reader_slots();
        self.sh.reclaim(&r, false)
    }

    /// Data blocks that can still be promised to clients (the float's count as promised).
    pub(crate) fn available_credits(&self) -> u64 {
        let promised: u64 = self
            .clients
            .iter()
            .flatten()
            .map(|c| c.credits)
            .sum::<u64>()
            + self.float.held();
        let reserve = (self.sh.layout.data_blocks / 64).max(256);
        self.sh
            .blocks
            .free_count()
            .saturating_sub(promised)
            .saturating_sub(reserve)
    }

    /// Add what each client took from the float to its credits.
    fn fold_float(&mut self) {
        for (slot, c) in self.clients.iter_mut().enumerate() {
            let taken = self.float.drain(slot as u32);
            if let Some(c) = c {
                c.credits += taken;
            }
        }
    }

    /// Grant up to `want` credits to the client of `slot` (the float's pool included:
    /// it is emptied first, then refilled from what is left).
    pub(crate) fn grant(&mut self, slot: u32, want: u64) -> u64 {
        self.fold_float();
        self.float.empty_pool();
        let g = want.min(self.available_credits());
        if let Some(c) = self.clients[slot as usize].as_mut() {
            c.credits += g;
        }
        self.float.refill(self.available_credits());
        g
    }

    fn registration(&mut self, slot: u32, h: SlotHead, uid: u32, gid: u32) -> Registration {
        let inodes = self.sh.inodes.reserve(slot, INODE_BATCH);
        // A fair share on a small store, so that one client cannot hold all its space.
        let credits = self.grant(slot, INITIAL_CREDITS.min(self.sh.layout.credit_share()));
        Registration {
            slot,
            slot_gen: h.slot_gen,
            head_lsn: h.head_lsn,
            head_seq: h.head_seq,
            nvm_path: self.cfg.nvm_path.to_string_lossy().into_owned(),
            digest_threshold_pct: self.cfg.digest_threshold_pct,
            inodes,
            credits,
            uid,
            gid,
            log_fds: false,
        }
    }

    /// What a new client of a store whose logs are files of their own
    /// (`Layout::slot_files`) maps, opened here and sent over its socket
    /// (`cairn_proto::REGISTRATION_FDS`): the NVM file read-only and `slot`'s log file
    /// read-write. The client cannot open either itself (mode 0600, or 0640 for the
    /// trusted group), so the kernel lets it write its own log and nothing else.
    pub(crate) fn log_fds(&self, slot: u32) -> io::Result<Vec<std::os::fd::OwnedFd>> {
        let nvm = File::open(&self.cfg.nvm_path)?;
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.cfg.slot_log_path(slot))?;
        Ok(vec![nvm.into(), log.into()])
    }

    /// A new client: an inactive slot whose lock nobody holds, an inode batch, credits.
    pub(crate) fn register(
        &mut self,
        pid: u32,
        uid: u32,
        gid: u32,
        conn: u64,
    ) -> io::Result<Registration> {
        if self.stopped {
            return Err(fs_err(libc::ESHUTDOWN, "the daemon is stopping"));
        }
        let cred = self.admit(pid, uid, gid)?;
        for slot in 0..self.clients.len() as u32 {
            if self.clients[slot as usize].is_some() {
                continue;
            }
            let (h, _) = self.sh.slot_head(slot)?;
            if h.active {
                continue;
            }
            if try_lock_slot(&self.store, slot)?.is_none() {
                continue; // a previous owner still holds its lock
            }
            // The credentials are durable before the slot is active (crate::perm).
            self.set_slot_cred(slot, cred)?;
            let h = self.sh.set_slot_head(
                slot,
                SlotHead {
                    active: true,
                    slot_gen: h.slot_gen + 1,
                    ..h
                },
            )?;
            self.sh.reset_client_page(slot, pid)?;
            self.float.drain(slot);
            self.clients[slot as usize] = Some(Client {
                pid,
                uid,
                gid,
                slot_gen: h.slot_gen,
                credits: 0,
                conn: Some(conn),
                retry_at: Instant::now(),
                awaiting_reattach: false,
            });
            self.leases.drop_slot(slot, true);
            self.leases.set_live(slot);
            let mut r = self.registration(slot, h, uid, gid);
            r.log_fds = self.sh.layout.slot_files;
            return Ok(r);
        }
        Err(fs_err(
            libc::EMFILE,
            format!(
                "too many clients: all {} log slots are in use",
                self.clients.len()
            ),
        ))
    }

    /// A client that owned `slot` before the daemon restarted.
    pub(crate) fn reattach(
        &mut self,
        pid: u32,
        uid: u32,
        gid: u32,
        slot: u32,
        slot_gen: u64,
        conn: u64,
    ) -> io::Result<Registration> {
        if self.stopped {
            return Err(fs_err(libc::ESHUTDOWN, "the daemon is stopping"));
        }
        let cred = self.admit(pid, uid, gid)?;
        if slot as usize >= self.clients.len() {
            return Err(einval(format!("slot {slot} out of range")));
        }
        match &self.clients[slot as usize] {
            Some(c) if c.conn.is_none() && c.slot_gen == slot_gen => {}
            _ => {
                return Err(estale(format!(
                    "slot {slot} generation {slot_gen} is not waiting for its owner"
                )))
            }
        }
        let (h, _) = self.sh.slot_head(slot)?;
        if !h.active || h.slot_gen != slot_gen {
            return Err(estale(format!(
                "slot {slot} generation {slot_gen} is not active"
            )));
        }
        if try_lock_slot(&self.store, slot)?.is_some() {
            return Err(estale(format!(
                "nobody holds the lock of slot {slot}: its owner is gone"
            )));
        }
        self.check_reattach_cred(slot, &cred)?;
        self.set_slot_cred(slot, cred)?;
        self.sh.inodes.release_slot(slot);
        let (new, charge) = digest::logged(&self.sh, slot)?;
        for ino in new {
            self.sh.inodes.reserve_one(slot, ino);
        }
        if let Some(c) = self.clients[slot as usize].as_mut() {
            c.pid = pid;
            c.uid = uid;
            c.gid = gid;
            // What its undigested log used stays promised (the client's own credits
            // are replaced by the registration's, and what it took from the float
            // goes back).
            c.credits = charge;
            self.float.drain(slot);
            c.conn = Some(conn);
            c.awaiting_reattach = false;
        }
        Ok(self.registration(slot, h, uid, gid))
    }

    /// Digest `slot`'s log up to `upto` for its client (credits are returned).
    pub(crate) fn digest_client(&mut self, slot: u32, upto: u64) -> Result<Outcome, DigestError> {
        if self.stopped {
            return Err(DigestError::Failed(fs_err(
                libc::ESHUTDOWN,
                "the daemon is stopping",
            )));
        }
        // In one batch (more records superseded by later ones) unless the client's log
        // is more than half full: then in slices, so that a writer about to wait for
        // room goes on as soon as the first is published.
        let slice = self.sh.layout.ring_bytes() / digest::SLICES;
        let mut done = Outcome::default();
        loop {
            let (head, _) = self.sh.slot_head(slot)?;
            let end = if self.sh.log_pressure(slot) {
                digest::slice_end(&self.sh.area, slot, head, upto, slice)?
            } else {
                upto
            };
            let o = digest::digest(&mut self.sh, slot, Mode::Upto(end))?;
            self.digested(slot, &o);
            let last = end >= upto || o.head_lsn <= head.head_lsn;
            done.add(o);
            if last {
                return Ok(done);
            }
        }
    }

    /// After a digest of `slot`'s log: the space its records used is no longer promised
    /// to the client, the inodes it created are leased to it, and what it replaced goes
    /// once no reader can still use it.
    pub(crate) fn digested(&mut self, slot: u32, o: &Outcome) {
        self.fold_float();
        if let Some(c) = self.clients[slot as usize].as_mut() {
            c.credits = c.credits.saturating_sub(o.charge);
        }
        self.float.refill(self.available_credits());
        self.leases.record_created(slot, &o.created);
        self.reclaim();
    }

    /// Digest a live client's committed transactions (from its head for as long as they
    /// are valid): at re-attach, and when it loses its leases.
    pub(crate) fn digest_committed(&mut self, slot: u32) -> Result<Outcome, DigestError> {
        if self.stopped {
            return Err(DigestError::Failed(fs_err(
                libc::ESHUTDOWN,
                "the daemon is stopping",
            )));
        }
        if self.clients.get(slot as usize).is_none_or(|c| c.is_none()) {
            return Err(DigestError::Failed(einval(format!(
                "slot {slot} has no client"
            ))));
        }
        let o = digest::digest(&mut self.sh, slot, Mode::Committed)?;
        self.digested(slot, &o);
        Ok(o)
    }

    /// Lease expiry (PROTOCOL.md, "Leases"): `slot`'s client did not answer a
    /// revocation in time. Its `lease_gen` is incremented, its committed log digested and
    /// every lease it holds removed.
    pub(crate) fn expire_leases(&mut self, slot: u32) {
        if !self.leases.overdue(slot) {
            return; // Another waiter expired it already.
        }
        let pid = self.clients[slot as usize].as_ref().map_or(0, |c| c.pid);
        if let Err(e) = self.sh.bump_lease_gen(slot) {
            tracing::warn!("slot {slot}: cannot increment lease_gen: {e}");
        }
        match self.digest_committed(slot) {
            Ok(o) => tracing::warn!("slot {slot} (pid {pid}): did not answer a lease revocation within {} ms: every lease taken away, log digested up to {}",
                self.cfg.lease_timeout_ms, o.head_lsn),
            Err(e) => tracing::warn!("slot {slot} (pid {pid}): lease expiry: cannot digest its log: {e}"),
        }
        self.leases.drop_slot(slot, false);
    }

    /// Close the restart gate once its deadline passed: slots that did not re-attach
    /// in time lose the leases they may hold (`lease_gen` + 1).
    pub(crate) fn lease_gate_tick(&mut self) {
        let Some(missing) = self.leases.close_gate_if_due() else {
            return;
        };
        for slot in missing {
            if let Err(e) = self.sh.bump_lease_gen(slot) {
                tracing::warn!("slot {slot}: cannot increment lease_gen: {e}");
            }
            tracing::warn!(
                "slot {slot}: did not re-attach within {} ms: its leases are void",
                self.cfg.lease_timeout_ms
            );
        }
        // Every client that may still have an unlinked file open has re-attached with
        // its pins (or never will).
        self.sh.keep_unlinked = false;
        self.sweep_orphans();
    }

    /// `slot`'s client has `ino` open (it said so answering a revocation, or at
    /// re-attach): an unlink by another client keeps the inode until it unpins.
    pub(crate) fn pin(&mut self, slot: u32, ino: u64) {
        if self.sh.layout.ino_valid(ino) {
            self.sh.pins.entry(ino).or_default().insert(slot);
        }
    }

    /// Remove `slot`'s pin of `ino` (`None`: all of its pins) and free the unlinked
    /// inodes left without a pin. Not while the restart gate is open (a client that has
    /// not re-attached yet may have them open): the sweep at its closing frees them.
    pub(crate) fn unpin(&mut self, slot: u32, ino: Option<u64>) -> io::Result<()> {
        let inos: Vec<u64> = match ino {
            Some(i) => vec![i],
            None => (self.sh.pins.iter())
                .filter(|(_, s)| s.contains(&slot))
                .map(|(&i, _)| i)
                .collect(),
        };
        for i in inos {
            let left = self.sh.pins.get_mut(&i).map_or(0, |s| {
                s.remove(&slot);
                s.len()
            });
            if left == 0 {
                self.sh.pins.remove(&i);
                if self.sh.layout.ino_valid(i) && !self.leases.gate_open() {
                    digest::free_orphan(&mut self.sh, i)?;
                }
            }
        }
        self.reclaim();
        Ok(())
    }

    /// Free every unlinked inode nobody pins (after a restart: orphans of clients that
    /// are gone). Scans the inode table.
    pub(crate) fn sweep_orphans(&mut self) {
        let mut freed = 0u64;
        for ino in 1..self.sh.layout.inode_count {
            if self.sh.pins.contains_key(&ino) {
                continue;
            }
            match digest::free_orphan(&mut self.sh, ino) {
                Ok(true) => freed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!("cannot free unlinked inode {ino}: {e}"),
            }
        }
        if freed > 0 {
            tracing::info!("freed {freed} unlinked inodes nobody has open");
        }
        self.reclaim();
    }

    /// Release `slot`: inactive, reservations and credits returned. With `discard`,
    /// the log up to that LSN is dropped (malformed log) and the sequence numbers move
    /// past anything the ring may still hold.
    pub(crate) fn release(&mut self, slot: u32, discard: Option<u64>) -> io::Result<()> {
        let (h, _) = self.sh.slot_head(slot)?;
        let mut nh = SlotHead { active: false, ..h };
        if let Some(d) = discard {
            nh.head_lsn = d.max(h.head_lsn);
            nh.head_seq = h.head_seq + self.sh.layout.ring_bytes() / 64 + 1;
        }
        self.sh.set_slot_head(slot, nh)?;
        self.sh.inodes.release_slot(slot);
        self.sh.creds.remove(&slot);
        self.clients[slot as usize] = None;
        self.float.drain(slot);
        self.leases.drop_slot(slot, true);
        // Its log is digested (or discarded): its open files close.
        self.unpin(slot, None)
    }

    /// Digest a dead client's committed transactions and release its slot. Failures are
    /// logged; a batch that cannot be applied (`ENOSPC`) is retried later.
    pub(crate) fn recover_slot(&mut self, slot: u32) {
        let pid = self.clients[slot as usize].as_ref().map_or(0, |c| c.pid);
        match digest::digest(&mut self.sh, slot, Mode::Committed) {
            Ok(o) => {
                if let Err(e) = self.release(slot, None) {
                    tracing::warn!("slot {slot}: cannot release: {e}");
                    return;
                }
                tracing::info!("slot {slot} (pid {pid}): dead client recovered: {} transactions, {} records digested, log head at {}",
                    o.txns, o.records, o.head_lsn);
            }
            Err(DigestError::Malformed { msg, discard_lsn }) => {
                tracing::info!(
                    "slot {slot} (pid {pid}): dead client's log is malformed and discarded: {msg}"
                );
                if let Err(e) = self.release(slot, Some(discard_lsn)) {
                    tracing::warn!("slot {slot}: cannot release: {e}");
                }
            }
            Err(DigestError::Failed(e)) => {
                tracing::warn!(
                    "slot {slot} (pid {pid}): cannot digest the dead client's log yet: {e}"
                );
                if let Some(c) = self.clients[slot as usize].as_mut() {
                    c.retry_at = Instant::now() + RETRY_FAILED;
                }
            }
        }
    }

    /// Recover every slot whose connection is gone and whose lock nobody holds.
    pub(crate) fn recover_dead(&mut self) {
        if self.stopped {
            return;
        }
        let now = Instant::now();
        for slot in 0..self.clients.len() as u32 {
            let due = matches!(&self.clients[slot as usize],
                Some(c) if c.conn.is_none() && c.retry_at <= now);
            if !due {
                continue;
            }
            match try_lock_slot(&self.store, slot) {
                Ok(Some(_lock)) => self.recover_slot(slot),
                Ok(None) => {}
                Err(e) => tracing::warn!("slot {slot}: cannot check its lock: {e}"),
            }
        }
    }

    /// Whether a disconnected client still waits for its log to be digested (and its
    /// last attempt did not fail: failed recoveries retry later on the timer).
    pub(crate) fn dead_recovery_due(&self) -> bool {
        let now = Instant::now();
        self.clients.iter().flatten().any(|c| {
            c.conn.is_none()
                && c.retry_at <= now
                && (!c.awaiting_reattach || !cairn_media::sys::pid_alive(c.pid))
        })
    }

    /// The connection of `slot`'s client closed without `Goodbye`.
    pub(crate) fn disconnected(&mut self, slot: u32, conn: u64) -> bool {
        match self.clients[slot as usize].as_mut() {
            Some(c) if c.conn == Some(conn) => {
                c.conn = None;
                c.retry_at = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// The status report.
    /// Every tier's usage and traffic.
    fn tier_status(&self) -> Vec<TierStatus> {
        use cairn_format::BLOCK_SIZE_U64 as B;
        let b = &self.sh.blocks;
        let used = (b.capacity() - b.free_count()) * B;
        let mut out = vec![TierStatus {
            name: "nvm".into(),
            capacity_bytes: b.capacity() * B,
            used_bytes: used,
            live_bytes: used,
            live_fraction: 1.0,
            segments_free: 0,
            segments_used: 0,
            segment_bytes: 0,
            bytes_migrated_down: 0,
            bytes_migrated_up: 0,
            bytes_cleaned: 0,
        }];
        for t in &self.sh.tiers {
            let used = t.used_blocks() * B;
            let live = t.live_count() * B;
            out.push(TierStatus {
                name: cairn_format::map::TIER_NAMES[t.num as usize].into(),
                capacity_bytes: t.capacity() * B,
                used_bytes: used,
                live_bytes: live,
                live_fraction: if used == 0 {
                    1.0
                } else {
                    live as f64 / used as f64
                },
                segments_free: t.free_segments(),
                segments_used: t.data_segments() - t.free_segments(),
                segment_bytes: t.geom.segment_bytes(),
                bytes_migrated_down: 0,
                bytes_migrated_up: 0,
                bytes_cleaned: 0,
            });
        }
        for (i, s) in out.iter_mut().enumerate() {
            let k = if i == 0 {
                0
            } else {
                self.sh.tiers[i - 1].num as usize
            };
            let tr = self.sh.traffic[k];
            s.bytes_migrated_down = tr.bytes_migrated_down;
            s.bytes_migrated_up = tr.bytes_migrated_up;
            s.bytes_cleaned = tr.bytes_cleaned;
        }
        out
    }

    pub(crate) fn status(&self) -> io::Result<StatusReport> {
        let l = &self.sh.layout;
        let ring = l.ring_bytes();
        let mut clients = Vec::new();
        for (slot, c) in self.clients.iter().enumerate() {
            let Some(c) = c else { continue };
            let slot = slot as u32;
            let (h, _) = self.sh.slot_head(slot)?;
            let end = digest::log_end_estimate(&self.sh, slot)?;
            let used = end.saturating_sub(h.head_lsn);
            clients.push(ClientStatus {
                slot,
                pid: c.pid,
                uid: c.uid,
                log_capacity_bytes: ring,
                log_used_bytes: used,
                log_fill: used as f64 / ring as f64,
            });
        }
        Ok(StatusReport {
            store: self.store.path.display().to_string(),
            tiers: self.tier_status(),
            inodes: InodeStatus {
                capacity: self.sh.inodes.capacity(),
                used: self.sh.inodes.used_count(),
            },
            clients,
            digest: self.sh.counters.clone(),
            sharing: self.leases.sharing_status(),
            migration: None,
            superpages: Some(Box::new(crate::superpage::status(&self.sh))),
            host: Some(Box::new(self.host_status())),
            remote: self.sh.remote.as_ref().map(|t| {
                let alloc = self.sh.tier(cairn_format::map::TIER_REMOTE);
                Box::new(crate::tiers::remote::status(&self.cfg, t, alloc))
            }),
            backup: None,
        })
    }

    /// Remove the store's lock files (`cairn::lock`) and segments' resident copies and
    /// undo logs (`crate::sjobj`) of inodes no longer live: freed, or reused by a later
    /// generation. One of a generation newer than the published one belongs to a
    /// creation not digested yet and stays; so does one whose inode cannot be read.
    /// Nobody holds a lock on, or has attached, a stale one: either needs an open file,
    /// which keeps its inode. Returns how many went.
    pub(crate) fn sweep_host_objects(&self) -> usize {
        let uuid = self.sh.area.superblock().uuid;
        let layout = *self.sh.area.layout();
        // An object of a generation the shared area has not seen yet is a file a client
        // created and has not had digested: live while the number is reserved for a
        // client. One the client created and removed within a batch (SQLite's journal)
        // never reaches the area, and its number goes back to the free pool.
        let live = |ino: u64, gen: u64| {
            if !layout.ino_valid(ino) {
                return false;
            }
            match self.sh.area.read_inode(ino) {
                Ok(i) => {
                    (i.generation < gen && self.sh.inodes.reserved_by(ino).is_some())
                        || (i.generation == gen && i.attrs.kind != cairn_format::inode::Kind::Free)
                }
                Err(_) => true,
            }
        };
        use cairn_area::host::{stale_objects, LOCK_KIND, SEGMENT_KINDS};
        let kinds = [LOCK_KIND, SEGMENT_KINDS[0], SEGMENT_KINDS[1]];
        let stale = stale_objects(&uuid, &kinds, live);
        stale
            .iter()
            .filter(|p| std::fs::remove_file(p).is_ok())
            .count()
    }

    /// The NVM file and the store's host objects, with the memory they hold.
    fn host_status(&self) -> HostStatus {
        use cairn_area::host;
        let nvm = &self.cfg.nvm_path;
        let uuid = self.sh.area.superblock().uuid;
        let objects = host::list(&uuid);
        let logs: Vec<std::path::PathBuf> = (0..self.sh.layout.nslots)
            .filter(|_| self.sh.layout.slot_files)
            .map(|s| self.cfg.slot_log_path(s))
            .collect();
        let sj = host::kind_prefix(&uuid, host::SEGMENT_COPY_KIND);
        // Resident segments: `sj-<ino>-<gen>` (not the lock table nor undo logs).
        let resident: Vec<&std::path::PathBuf> = objects
            .iter()
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| host::parse_name(n, &sj))
                    .is_some()
            })
            .collect();
        HostStatus {
            nvm_path: nvm.display().to_string(),
            nvm_size_bytes: self.cfg.nvm_size,
            nvm_allocated_bytes: host::allocated_bytes(nvm),
            nvm_in_ram: nvm
                .parent()
                .is_some_and(|d| cairn_media::sys::in_ram(d).unwrap_or(false)),
            host_objects: objects.len() as u64,
            host_object_bytes: objects.iter().map(|p| host::allocated_bytes(p)).sum(),
            resident_segments: resident.len() as u64,
            resident_segment_bytes: resident.iter().map(|p| host::allocated_bytes(p)).sum(),
            log_files: logs.len() as u64,
            log_allocated_bytes: logs.iter().map(|p| host::allocated_bytes(p)).sum(),
        }
    }

    /// Clean stop: digest every active slot's committed transactions (dead owners'
    /// slots are released, live ones stay active for `Reattach`), free every retired
    /// block, save the allocation state and set `clean = 1`. Idempotent.
    pub(crate) fn shutdown(&mut self) -> io::Result<()> {
        if self.stopped {
            return Ok(());
        }
        for slot in 0..self.clients.len() as u32 {
            if self.clients[slot as usize].is_none() {
                continue;
            }
            let lock = try_lock_slot(&self.store, slot).unwrap_or(None);
            match digest::digest(&mut self.sh, slot, Mode::Committed) {
                Ok(_) => {
                    if lock.is_some() {
                        self.release(slot, None)?;
                    }
                }
                Err(DigestError::Malformed { msg, discard_lsn }) => {
                    tracing::info!("slot {slot}: malformed log discarded at shutdown: {msg}");
                    self.release(slot, Some(discard_lsn))?;
                }
                Err(DigestError::Failed(e)) => {
                    tracing::warn!(
                        "slot {slot}: cannot digest at shutdown ({e}); the log stays authoritative"
                    );
                }
            }
        }
        self.sh.reclaim(&[], true);
        self.sweep_host_objects();
        recovery::save(&self.sh)?;
        self.sh.persist_counters()?;
        self.sh.set_state(state::LAST_CLEAN_NS, now_ns() as u64)?;
        self.sh.set_state(state::CLEAN, 1)?;
        self.stopped = true;
        tracing::info!(
            "clean stop: {} digests, {} records digested so far",
            self.sh.counters.digests,
            self.sh.counters.records_digested
        );
        Ok(())
    }
}
