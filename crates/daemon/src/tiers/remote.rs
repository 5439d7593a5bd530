//! The remote tier in the daemon (docs/REMOTE.md): opened from `cairn.toml`, its orphan
//! objects swept, its status. Its storage is `cairn_remote::RadosTier`; the daemon is
//! the only process connected to the cluster (clients read the tier through it:
//! `Request::TierRead`), so one connection, one set of librados threads and one cache
//! serve every client.

use super::TierAlloc;
use crate::digest::parallel::CoreLock;
use cairn_area::{fs_err, StoreConfig};
use cairn_format::map::TIER_REMOTE;
use cairn_format::superblock::Superblock;
use cairn_proto::RemoteStatus;
use cairn_remote::{RadosTier, Spec};
use std::io;
use std::time::Duration;

/// Where the store's remote tier lives, from `cairn.toml`.
pub(crate) fn spec(cfg: &StoreConfig) -> io::Result<Spec> {
    let url = cfg.remote.as_deref().ok_or_else(|| {
        fs_err(
            libc::EINVAL,
            "the store has a remote tier but cairn.toml names no remote (remote = \"ceph:POOL\")",
        )
    })?;
    Spec::parse(url, cfg.ceph_conf.as_deref(), cfg.ceph_user.as_deref())
}

/// Every operation's time limit.
pub(crate) fn timeout(cfg: &StoreConfig) -> Duration {
    Duration::from_millis(cfg.remote_timeout_ms.max(100))
}

/// The remote tier of the store `sb` describes, if it has one; not connected yet (the
/// first use connects, so an unreachable cluster does not keep the daemon from
/// starting). `cache`: with the daemon's cache of `remote_cache_mib`.
pub(crate) fn open(
    cfg: &StoreConfig,
    sb: &Superblock,
    cache: bool,
) -> io::Result<Option<RadosTier>> {
    let Some(g) = sb.layout.tier(TIER_REMOTE) else {
        return Ok(None);
    };
    let bytes = if cache { cfg.remote_cache_mib << 20 } else { 0 };
    Ok(Some(RadosTier::open(
        &spec(cfg)?,
        timeout(cfg),
        &sb.uuid,
        TIER_REMOTE,
        *g,
        bytes,
    )))
}

/// Remove the objects of the remote tier that no segment in use names under its
/// current generation: a round's copy the daemon never switched to (it crashed, or
/// gave up on a slow cluster) and segments discarded while the cluster was away.
/// Safe while rounds run: a round takes its segment (busy) and bumps its generation
/// under the core lock before it writes, and each object is judged under that lock.
pub(crate) fn sweep(core: &CoreLock, t: &RadosTier) -> io::Result<u64> {
    t.sweep(|seg, gen| {
        let c = core.serial();
        let current = c.sh.area.segment_gen(TIER_REMOTE, seg).ok();
        c.sh.tier(TIER_REMOTE)
            .is_some_and(|a| a.in_use(seg) && current == Some(gen))
    })
}

/// The remote tier's part of `cairn status` (`paused` is the migrator's to say).
pub(crate) fn status(cfg: &StoreConfig, t: &RadosTier, alloc: Option<&TierAlloc>) -> RemoteStatus {
    let s = t.stats();
    let chunks = alloc.map_or(0, |a| a.geom.segment_bytes().div_ceil(cairn_remote::CHUNK));
    let segments = alloc.map_or(0, |a| a.data_segments() - a.free_segments());
    let (last_error, last_error_ns) = s.last_error.map_or((None, 0), |(m, t)| (Some(m), t));
    RemoteStatus {
        url: cfg.remote.clone().unwrap_or_default(),
        connected: s.connected,
        objects: segments * chunks,
        objects_written: s.objects_written,
        bytes_written: s.bytes_written,
        objects_removed: s.objects_removed,
        orphans_removed: s.orphans_removed,
        reads: s.reads,
        bytes_read: s.bytes_read,
        cache_hits: s.cache_hits,
        cache_misses: s.cache_misses,
        paused: false,
        last_error,
        last_error_ns,
    }
}
