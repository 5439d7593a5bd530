//! `cairn restore`: rebuild a store from its newest backup in a RADOS pool
//! (`crate::backup`, docs/REMOTE.md "Backup and restore"), on this machine: a new store
//! directory, NVM file and local tier files; the remote tier's objects are used where
//! they are. The restored store starts as after a crash (its daemon rebuilds the
//! allocation state and replays the logs).

use super::mkfs::{restrict, skeleton};
use crate::util::{hex, random_bytes};
use cairn_area::{fs_err, StoreDir};
use cairn_format::superblock::Superblock;
use cairn_format::BLOCK_SIZE;
use cairn_remote::backup::{self, Manifest};
use cairn_remote::{Pool, Spec};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

/// Options of [`restore`].
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// `ceph:POOL`.
    pub url: String,
    pub conf: Option<PathBuf>,
    pub user: Option<String>,
    /// The new store directory.
    pub store: PathBuf,
    /// The store to restore (a prefix of its id); `None`: the pool's only one.
    pub id: Option<String>,
    /// The new NVM file (`None`: `/dev/shm/cairn-<random hex>.nvm`).
    pub nvm_path: Option<PathBuf>,
    /// The new SSD and HDD tier files (`None`: `ssd.tier`, `hdd.tier` in the store).
    pub ssd: Option<PathBuf>,
    pub hdd: Option<PathBuf>,
    /// Restore even though the store's daemon said it runs less than a minute ago.
    pub force: bool,
}

/// The stores backed up in the pool of `url`, newest first.
pub fn list_backups(
    url: &str,
    conf: Option<&std::path::Path>,
    user: Option<&str>,
) -> io::Result<Vec<Manifest>> {
    let pool = connect(url, conf, user)?;
    backup::list(&pool)
}

fn connect(url: &str, conf: Option<&std::path::Path>, user: Option<&str>) -> io::Result<Pool> {
    let spec = Spec::parse(url, conf, user)?;
    Pool::connect(
        &spec,
        Duration::from_millis(cairn_area::store::DEFAULT_REMOTE_TIMEOUT_MS),
    )
}

/// The backup `id` names among `all` (the only one without `id`).
fn choose(all: Vec<Manifest>, id: Option<&str>, url: &str) -> io::Result<Manifest> {
    let mut found: Vec<Manifest> = all
        .into_iter()
        .filter(|m| id.is_none_or(|i| m.uuid.starts_with(i)))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(fs_err(
            libc::ENOENT,
            match id {
                Some(i) => format!("no backup of a store {i}… in {url}"),
                None => format!("no backup in {url}"),
            },
        )),
        _ => Err(fs_err(
            libc::EINVAL,
            format!(
                "{} stores are backed up in {url} ({}): choose one with --id",
                found.len(),
                found
                    .iter()
                    .map(|m| m.uuid.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn io_ctx(what: String) -> impl Fn(io::Error) -> io::Error {
    move |e| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {e}"),
        )
    }
}

/// Rebuild the store; `progress(done, total)` in bytes as pieces arrive. Returns the
/// backup restored.
pub fn restore(opts: &RestoreOptions, progress: &dyn Fn(u64, u64)) -> io::Result<Manifest> {
    let pool = connect(&opts.url, opts.conf.as_deref(), opts.user.as_deref())?;
    let m = choose(backup::list(&pool)?, opts.id.as_deref(), &opts.url)?;
    if let Some((ns, who)) = backup::last_heartbeat(&pool, &m.uuid)? {
        let age = cairn_area::time::now_ns() - ns;
        if age < crate::backup::ALIVE_FOR_NS && !opts.force {
            return Err(fs_err(
                libc::EBUSY,
                format!(
                    "store {} still runs ({who}, {} s ago): a second copy would remove \
                     the first one's objects in the pool; stop it, or wait a minute after \
                     it stopped answering (--force restores anyway)",
                    m.uuid,
                    age / 1_000_000_000
                ),
            ));
        }
    }
    let mut made = Vec::new();
    let r = rebuild(&pool, &m, opts, progress, &mut made);
    if r.is_err() {
        // Nothing half made stays (the directory itself may have existed).
        for p in made.iter().rev() {
            let _ = std::fs::remove_file(p);
        }
    }
    r.map(|()| m)
}

/// The store of backup `m` at `opts.store`; every file it creates is pushed on `made`.
fn rebuild(
    pool: &Pool,
    m: &Manifest,
    opts: &RestoreOptions,
    progress: &dyn Fn(u64, u64),
    made: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let store = StoreDir::new(&opts.store);
    if store.exists() {
        return Err(fs_err(
            libc::EEXIST,
            format!(
                "a Cairn store already exists at {} (restore makes a new one)",
                store.path.display()
            ),
        ));
    }
    std::fs::create_dir_all(&store.path)
        .map_err(io_ctx(format!("creating {}", store.path.display())))?;
    let total = m.bytes();
    let mut done = 0u64;
    let mut fetch = |p: &backup::Piece| -> io::Result<Vec<u8>> {
        let b = backup::fetch(pool, p)?;
        done += b.len() as u64;
        progress(done, total);
        Ok(b)
    };
    // The store directory's files; then the configuration, pointing at this machine.
    let is_log = |name: &str| name.starts_with(crate::backup::SLOT_LOG_PREFIX);
    for (name, p) in &m.files {
        if name != "cairn.toml" && !is_log(name) {
            let data = fetch(p)?;
            let path = store.path.join(name);
            made.push(path.clone());
            std::fs::write(&path, data).map_err(io_ctx(format!("writing {}", path.display())))?;
        }
    }
    let toml = m
        .files
        .iter()
        .find(|(n, _)| n == "cairn.toml")
        .ok_or_else(|| fs_err(libc::EIO, "the backup holds no cairn.toml"))?;
    made.push(store.config_path());
    std::fs::write(store.config_path(), fetch(&toml.1)?)?;
    let mut cfg = store.load_config()?;
    cfg.nvm_path = match &opts.nvm_path {
        Some(p) => p.clone(),
        None => PathBuf::from(format!("/dev/shm/cairn-{}.nvm", hex(&random_bytes(8)?))),
    };
    cfg.owner_uid = Some(cairn_media::sys::ids().0);
    if opts.conf.is_some() {
        cfg.ceph_conf = opts.conf.clone();
    }
    if opts.user.is_some() {
        cfg.ceph_user = opts.user.clone();
    }
    // The NVM file.
    let nvm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&cfg.nvm_path)
        .map_err(io_ctx(format!("creating {}", cfg.nvm_path.display())))?;
    made.push(cfg.nvm_path.clone());
    // Fully allocated, as mkfs makes it: stores through a mapping never fault for lack
    // of space.
    cairn_media::sys::fallocate(&nvm, m.nvm_size).map_err(io_ctx(format!(
        "allocating {} bytes for {}",
        m.nvm_size,
        cfg.nvm_path.display()
    )))?;
    let mut off = 0u64;
    let mut sb = None;
    for p in &m.nvm {
        if p.object.is_empty() && off > 0 {
            // Zeros, which fallocate gave.
            off += p.len;
            continue;
        }
        let data = fetch(p)?;
        if off == 0 {
            sb = Some(
                Superblock::decode(&data[..BLOCK_SIZE], m.nvm_size)
                    .map_err(|e| fs_err(libc::EIO, format!("the backup's superblock: {}", e.0)))?,
            );
        }
        nvm.write_all_at(&data, off)?;
        off += data.len() as u64;
    }
    nvm.sync_all()?;
    let sb = sb.ok_or_else(|| fs_err(libc::EIO, "the backup holds no NVM file"))?;
    // The logs (format version 7): every slot's file, with the active ones' contents.
    let slots = crate::offline::mkfs::make_slot_files(&cfg.nvm_path, &sb.layout)?;
    made.extend(slots.iter().cloned());
    for (name, p) in m.files.iter().filter(|(n, _)| is_log(n)) {
        let slot = name[crate::backup::SLOT_LOG_PREFIX.len()..].parse::<usize>();
        let data = fetch(p)?;
        match slot.ok().and_then(|s| slots.get(s)) {
            Some(path) if data.len() as u64 == sb.layout.slot_file_bytes() => {
                std::fs::write(path, data)
                    .and_then(|()| std::fs::File::open(path)?.sync_all())
                    .map_err(io_ctx(format!("writing {}", path.display())))?
            }
            _ => {
                return Err(fs_err(
                    libc::EIO,
                    format!("the backup's {name} is not a log of this store"),
                ))
            }
        }
    }
    // The local lower tiers: a sparse file each, its header, its segments in use.
    for (i, path) in [&opts.ssd, &opts.hdd].into_iter().enumerate() {
        let tier = i as u8 + 1;
        let Some(g) = sb.layout.tier(tier).copied() else {
            continue;
        };
        let name = cairn_format::map::TIER_NAMES[tier as usize];
        let path = path
            .clone()
            .unwrap_or_else(|| store.path.join(format!("{name}.tier")));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_ctx(format!(
                "creating the {name} tier {}",
                path.display()
            )))?;
        made.push(path.clone());
        f.set_len(g.segments * g.segment_bytes())?;
        f.write_all_at(&cairn_format::tier::encode_header(tier, &sb.uuid, &g), 0)?;
        for c in m.segments.iter().filter(|c| c.tier == tier) {
            let mut at = c.seg * g.segment_bytes();
            for p in &c.pieces {
                if !p.object.is_empty() {
                    f.write_all_at(&fetch(p)?, at)?;
                }
                at += p.len;
            }
        }
        f.sync_all()?;
        restrict(&path, cfg.trusted_gid, 0o600, 0o640)?;
        match tier {
            1 => cfg.ssd_path = Some(path),
            _ => cfg.hdd_path = Some(path),
        }
    }
    restrict(&cfg.nvm_path, cfg.trusted_gid, 0o600, 0o640)?;
    skeleton(&store, sb.layout.nslots, cfg.trusted_gid)?;
    store.save_config(&cfg)
}
