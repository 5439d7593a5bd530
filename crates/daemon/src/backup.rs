//! Backups of the whole store into a RADOS pool (docs/REMOTE.md, "Backup and restore";
//! the manifest and its objects: `cairn_remote::backup`).
//!
//! A backup is a crash image of the store at one moment, the *snapshot*: under the core
//! lock (no digest, no map switch, no allocation runs) the whole NVM file is copied into
//! memory, with the lists of lower-tier segments in use, and the current epoch is held
//! so that none of those segments is freed or reused until they are copied. Clients go on
//! writing their logs meanwhile: a log record torn by the copy fails its checksum and
//! ends that log's replay, so each log is restored as a prefix, as after a power cut
//! (everything a client was told was durable before the snapshot is in it). Then,
//! without the lock: the NVM chunks and local segments that changed since the previous
//! backup are written, the store directory's files, and last the manifest. A restored
//! store starts as after a crash: the daemon rebuilds its allocation state and replays
//! every log.
//!
//! The remote tier's segments are not copied (they are in the pool already): their
//! objects are kept, even once the store frees the segments, while a backup naming them
//! is the newest (`RadosTier::set_keep`). So a backup goes into the remote tier's pool
//! when the store has one.

use crate::digest::parallel::CoreLock;
use crate::util::now_ns;
use cairn_area::{fs_err, StoreConfig, StoreDir};
use cairn_format::map::TIER_REMOTE;
use cairn_proto::BackupReport;
use cairn_remote::backup::{self, Manifest, Piece, SegmentCopy, NVM_CHUNK};
use cairn_remote::{Pool, RadosTier, Spec};
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::Arc;
use std::time::Instant;

/// Files of the store directory a backup holds (the rest is rebuilt: lock files, the
/// socket, the log).
fn store_files(store: &StoreDir) -> [(&'static str, std::path::PathBuf); 3] {
    [
        ("cairn.toml", store.config_path()),
        ("xattrs", store.xattr_path()),
        ("sj-registry", store.sj_registry_path()),
    ]
}

/// The name in a backup of the log file of an active slot (format version 7), followed
/// by the slot's number.
pub const SLOT_LOG_PREFIX: &str = "log.slot";

/// What the snapshot copied under the core lock.
struct Snapshot {
    nvm: Vec<u8>,
    files: Vec<(String, Vec<u8>)>,
    /// Local lower tiers' segments in use: (tier, segment, generation).
    local: Vec<(u8, u64, u64)>,
    /// The remote tier's.
    remote: Vec<(u64, u64)>,
    /// The epoch held until the local segments are copied.
    epoch: u64,
    taken_ns: i64,
    area: Arc<cairn_area::Area>,
}

/// The pool backups of this store go to: `url` if given, else the remote tier's, else
/// `backup_remote`. A store with a remote tier backs up into that tier's pool only.
fn destination(
    cfg: &StoreConfig,
    tier: Option<&RadosTier>,
    url: Option<&str>,
) -> io::Result<(String, Arc<Pool>)> {
    if let Some(t) = tier {
        let own = cfg.remote.clone().unwrap_or_default();
        if url.is_some_and(|u| u != own) {
            return Err(fs_err(
                libc::ENOTSUP,
                format!(
                    "a store with a remote tier is backed up into its pool ({own}): its \
                     remote segments are not copied elsewhere"
                ),
            ));
        }
        return Ok((own, t.pool()?));
    }
    let url = url.or(cfg.backup_remote.as_deref()).ok_or_else(|| {
        fs_err(
            libc::EINVAL,
            "no pool to back up into: give --remote ceph:POOL, or set backup_remote in \
             cairn.toml",
        )
    })?;
    let spec = Spec::parse(url, cfg.ceph_conf.as_deref(), cfg.ceph_user.as_deref())?;
    let pool = Pool::connect(&spec, crate::tiers::remote::timeout(cfg))?;
    Ok((url.to_string(), Arc::new(pool)))
}

/// How often a daemon says in the pool that its store runs.
pub(crate) const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

/// A heartbeat younger than this keeps `cairn restore` from making a second copy of a
/// running store (both would remove each other's objects).
pub const ALIVE_FOR_NS: i64 = 60_000_000_000;

/// Say in `pool` that the store runs here (`backup::heartbeat`); failures are only
/// logged.
pub(crate) fn heartbeat(core: &CoreLock, pool: Option<&Pool>) {
    let Some(pool) = pool else { return };
    let (uuid, dir) = {
        let c = core.serial();
        (
            backup::uuid_hex(&c.sh.area.superblock().uuid),
            c.store.path.display().to_string(),
        )
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let who = format!(
        "host {} pid {} store {dir}",
        host.trim(),
        std::process::id()
    );
    if let Err(e) = backup::heartbeat(pool, &uuid, &who) {
        tracing::debug!("heartbeat: {e}");
    }
}

/// Take a backup now (one at a time: the caller serializes). `url`: the pool asked for.
pub(crate) fn take(core: &CoreLock, url: Option<&str>) -> io::Result<BackupReport> {
    let t0 = Instant::now();
    let (cfg, store, tier, uuid) = {
        let c = core.serial();
        (
            c.cfg.clone(),
            c.store.clone(),
            c.sh.remote.clone(),
            backup::uuid_hex(&c.sh.area.superblock().uuid),
        )
    };
    let (url, pool) = destination(&cfg, tier.as_ref(), url)?;
    heartbeat(core, Some(&pool));
    let prev = backup::read_manifest(&pool, &uuid)?;
    let snap = snapshot(core, &store, tier.as_ref(), prev.as_ref())?;
    let snapshot_ms = t0.elapsed().as_millis() as u64;
    let r = upload(&pool, &uuid, prev.as_ref(), &snap);
    // The held epoch goes whatever happened.
    {
        let mut c = core.serial();
        if let Some(i) = c.sh.held_epochs.iter().position(|&e| e == snap.epoch) {
            c.sh.held_epochs.swap_remove(i);
        }
        c.reclaim();
    }
    let (m, written) = r?;
    backup::write_manifest(&pool, &m)?;
    if let Some(t) = &tier {
        t.set_keep(m.remote.iter().copied().collect());
    }
    // The previous backup's objects this one does not name.
    let now: HashSet<&str> = m.objects().collect();
    let mut removed = 0;
    for o in prev.iter().flat_map(|p| p.objects()) {
        if !now.contains(o) && pool.remove(o).unwrap_or(false) {
            removed += 1;
        }
    }
    let objects = m.objects().count() as u64;
    Ok(BackupReport {
        url,
        seq: m.seq,
        taken_ns: m.taken_ns,
        snapshot_ms,
        total_ms: t0.elapsed().as_millis() as u64,
        objects_written: written.0,
        bytes_written: written.1,
        objects_kept: objects - written.0,
        objects,
        bytes: m.bytes(),
        objects_removed: removed,
        remote_segments: m.remote.len() as u64,
    })
}

/// The NVM file as a crash image: every block but the free data blocks, whose bytes
/// nothing names (they read as zeros), so that the copy, under the core lock, costs
/// what the store holds rather than its size.
fn copy_nvm(sh: &crate::store::shared::Shared) -> io::Result<Vec<u8>> {
    use cairn_format::BLOCK_SIZE;
    let map = sh.map();
    let mut nvm = vec![0u8; map.len()];
    let l = &sh.layout;
    let (start, end) = (l.data_start, l.data_start + l.data_blocks);
    let copy = |nvm: &mut [u8], from: u64, to: u64| {
        let (a, b) = (
            from as usize * BLOCK_SIZE,
            (to as usize * BLOCK_SIZE).min(nvm.len()),
        );
        map.read(a, &mut nvm[a..b])
    };
    copy(&mut nvm, 0, start)?;
    let mut b = start;
    while b < end {
        if !sh.blocks.is_used(b) {
            b += 1;
            continue;
        }
        let run = b;
        while b < end && sh.blocks.is_used(b) {
            b += 1;
        }
        copy(&mut nvm, run, b)?;
    }
    copy(&mut nvm, end, l.total_blocks)?;
    Ok(nvm)
}

/// The snapshot, under the core lock.
fn snapshot(
    core: &CoreLock,
    store: &StoreDir,
    tier: Option<&RadosTier>,
    prev: Option<&Manifest>,
) -> io::Result<Snapshot> {
    let mut c = core.serial();
    let sh = &mut c.sh;
    let nvm = copy_nvm(sh)?;
    let mut files = Vec::new();
    for (name, path) in store_files(store) {
        match std::fs::read(&path) {
            Ok(b) => files.push((name.to_string(), b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("reading {}: {e}", path.display()),
                ))
            }
        }
    }
    // The logs of a store of format version 7 are files of their own: an active slot's
    // goes with the snapshot (copied as the NVM file is, while its client may write it).
    if sh.layout.slot_files {
        for slot in 0..sh.layout.nslots {
            if !sh.slot_head(slot)?.0.active {
                continue;
            }
            let (m, page) = sh.area.slot_log(slot);
            let mut b = vec![0u8; sh.layout.slot_file_bytes() as usize];
            m.read(page, &mut b)?;
            files.push((format!("{SLOT_LOG_PREFIX}{slot}"), b));
        }
    }
    let mut local = Vec::new();
    let mut remote = Vec::new();
    for t in &sh.tiers {
        for seg in 1..t.geom.segments {
            if t.seg_live(seg) == 0 {
                continue;
            }
            let gen = sh.area.segment_gen(t.num, seg)?;
            if t.num == TIER_REMOTE {
                remote.push((seg, gen));
            } else {
                local.push((t.num, seg, gen));
            }
        }
    }
    // Until its manifest is written, the previous backup is the newest: both keep
    // their remote segments' objects.
    if let Some(t) = tier {
        let keep = remote
            .iter()
            .chain(prev.iter().flat_map(|p| p.remote.iter()))
            .copied()
            .collect();
        t.set_keep(keep);
    }
    let epoch = sh.epoch();
    sh.held_epochs.push(epoch);
    Ok(Snapshot {
        nvm,
        files,
        local,
        remote,
        epoch,
        taken_ns: now_ns(),
        area: sh.area.clone(),
    })
}

/// Write what changed since `prev` (a few objects at a time: `backup::Uploads`); the
/// manifest of the new backup (not written yet) and the objects and bytes written.
fn upload(
    pool: &Pool,
    uuid: &str,
    prev: Option<&Manifest>,
    s: &Snapshot,
) -> io::Result<(Manifest, (u64, u64))> {
    let seq = prev.map_or(1, |p| p.seq + 1);
    let mut up = backup::Uploads::new(pool);
    let mut put = |name: String, data: &[u8]| up.put(name, data);
    let same = |old: Option<&Piece>, data: &[u8]| {
        old.filter(|p| p.len == data.len() as u64 && p.crc == cairn_format::crc(data))
            .cloned()
    };
    let mut nvm = Vec::new();
    for (i, chunk) in s.nvm.chunks(NVM_CHUNK as usize).enumerate() {
        let old = prev.and_then(|p| p.nvm.get(i));
        nvm.push(match same(old, chunk) {
            Some(p) => p,
            None => put(format!("cairn.{uuid}.backup.nvm.{i:x}.{seq:x}"), chunk)?,
        });
    }
    let old_segs: HashMap<(u8, u64, u64), &SegmentCopy> = prev
        .iter()
        .flat_map(|p| p.segments.iter())
        .map(|c| ((c.tier, c.seg, c.gen), c))
        .collect();
    let mut segments = Vec::new();
    for &(tier, seg, gen) in &s.local {
        if let Some(c) = old_segs.get(&(tier, seg, gen)) {
            segments.push((*c).clone());
            continue;
        }
        let g = *s.area.layout().tier(tier).expect("a tier the store has");
        let mut buf = cairn_media::AlignedBuf::zeroed(g.segment_bytes() as usize);
        s.area.read_tier(tier, seg * g.segment_bytes(), &mut buf)?;
        let mut pieces = Vec::new();
        for (k, part) in buf.chunks(cairn_remote::CHUNK as usize).enumerate() {
            let name = format!("cairn.{uuid}.backup.{tier}.{seg:x}.{gen:x}.{k:x}");
            pieces.push(put(name, part)?);
        }
        segments.push(SegmentCopy {
            tier,
            seg,
            gen,
            pieces,
        });
    }
    let mut files = Vec::new();
    for (name, data) in &s.files {
        let old = prev.and_then(|p| p.files.iter().find(|(n, _)| n == name).map(|(_, p)| p));
        let piece = match same(old, data) {
            Some(p) => p,
            None => put(format!("cairn.{uuid}.backup.file.{name}.{seq:x}"), data)?,
        };
        files.push((name.clone(), piece));
    }
    let written = up.finish()?;
    Ok((
        Manifest {
            version: backup::MANIFEST_VERSION,
            uuid: uuid.to_string(),
            seq,
            taken_ns: s.taken_ns,
            nvm_size: s.nvm.len() as u64,
            nvm,
            segments,
            remote: s.remote.clone(),
            files,
        },
        written,
    ))
}
