//! `mkfs`: create a store directory and format its NVM tier file.

use crate::util::{einval, hex, now_ns, random_bytes};
use cairn_area::{fs_err, StoreConfig, StoreDir};
use cairn_format::inode::{Attrs, Inode, Kind};
use cairn_format::slot::{SlotHead, PUBLISHED_HEAD_OFF};
use cairn_format::superblock::{encode_state, Layout, Params, Superblock, TierGeom};
use cairn_format::{alloc, BLOCK_SIZE, BLOCK_SIZE_U64, ROOT_INO};
use cairn_media::{sys, Mapping};
use std::fs::OpenOptions;
use std::io;
use std::path::PathBuf;

/// Options of [`mkfs`]. `Default` gives the `StoreConfig` defaults (2 GiB tier, 32 MiB
/// logs, 8 clients, one inode per 8 KiB, digest at 30%) for the store `./cairn-store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MkfsOptions {
    /// The store directory (created if missing).
    pub store: PathBuf,
    /// The NVM tier file; `None`: `/dev/shm/cairn-<random hex>.nvm`.
    pub nvm_path: Option<PathBuf>,
    /// Bytes of the NVM tier (a multiple of 4 KiB).
    pub nvm_size: u64,
    /// Bytes of each client's log ring (a multiple of 4 KiB, at least 64 KiB).
    pub log_size: u64,
    /// Log slots: clients registered at once (1..=4096).
    pub max_clients: u32,
    /// Inode table entries; 0: one per 8 KiB of the tier.
    pub inodes: u64,
    /// Log fill (percent, 1..=99) at which LibFS asks for a digest.
    pub digest_threshold_pct: u32,
    /// Replace an existing store (its NVM file is deleted).
    pub force: bool,
    /// A group whose members are in the trust domain (besides root and the owner): the
    /// NVM file and the slot lock files get mode 0660 with this group.
    pub trusted_gid: Option<u32>,
    /// The SSD tier, if any.
    pub ssd: Option<TierOptions>,
    /// The HDD tier, if any (needs an SSD tier).
    pub hdd: Option<TierOptions>,
    /// Segment size of both lower tiers; `None`: [`DEFAULT_SSD_SEGMENT`] and
    /// [`DEFAULT_HDD_SEGMENT`].
    pub segment_size: Option<u64>,
}

/// A lower tier at mkfs: a file (created if missing) or a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierOptions {
    pub path: PathBuf,
    /// Bytes; `None`: the size of the existing file or device.
    pub size: Option<u64>,
}

/// Default SSD segment: 64 MiB, a multiple of common flash erase blocks (Strata migrates
/// in erase-block units; its testbed SSD's was 512 MiB).
pub const DEFAULT_SSD_SEGMENT: u64 = 64 << 20;
/// Default HDD segment: 256 MiB, the zone size of host-managed SMR drives.
pub const DEFAULT_HDD_SEGMENT: u64 = 256 << 20;

impl Default for MkfsOptions {
    fn default() -> Self {
        let d = StoreConfig::with_defaults(PathBuf::new());
        MkfsOptions {
            store: PathBuf::from("cairn-store"),
            nvm_path: None,
            nvm_size: d.nvm_size,
            log_size: d.log_size,
            max_clients: d.max_clients,
            inodes: d.inodes,
            digest_threshold_pct: d.digest_threshold_pct,
            force: false,
            trusted_gid: None,
            ssd: None,
            hdd: None,
            segment_size: None,
        }
    }
}

impl MkfsOptions {
    /// Default options for the store `store`.
    pub fn new(store: impl Into<PathBuf>) -> MkfsOptions {
        MkfsOptions {
            store: store.into(),
            ..Default::default()
        }
    }
}

/// The size of an existing file or block device (`None`: it does not exist).
fn existing_size(path: &std::path::Path) -> io::Result<Option<u64>> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() => {
            let f = std::fs::File::open(path)?;
            Ok(Some(sys::block_device_size(&f)?))
        }
        Ok(m) if m.is_file() => Ok(Some(m.len())),
        Ok(_) => Err(einval(format!(
            "{} is neither a regular file nor a block device",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The geometry of a lower tier from its options.
fn tier_geom(name: &str, t: &TierOptions, segment: u64) -> io::Result<TierGeom> {
    let size = match (t.size, existing_size(&t.path)?) {
        (Some(s), _) => s,
        (None, Some(s)) if s > 0 => s,
        _ => {
            return Err(einval(format!(
                "the {name} tier {} does not exist: give its size (--{}-size)",
                t.path.display(),
                name.to_lowercase()
            )))
        }
    };
    if !segment.is_multiple_of(BLOCK_SIZE_U64) {
        return Err(einval(format!(
            "segment size {segment} must be a multiple of 4096"
        )));
    }
    Ok(TierGeom {
        segments: size / segment,
        segment_blocks: segment / BLOCK_SIZE_U64,
    })
}

/// The lower tiers' geometry `opts` give.
fn tiers_of(opts: &MkfsOptions) -> io::Result<[TierGeom; 2]> {
    let mut g = [TierGeom::default(); 2];
    if let Some(t) = &opts.ssd {
        g[0] = tier_geom("SSD", t, opts.segment_size.unwrap_or(DEFAULT_SSD_SEGMENT))?;
    }
    if let Some(t) = &opts.hdd {
        g[1] = tier_geom("HDD", t, opts.segment_size.unwrap_or(DEFAULT_HDD_SEGMENT))?;
    }
    Ok(g)
}

/// The layout `opts` give, or `EINVAL` saying why they do not fit.
fn layout_of(opts: &MkfsOptions) -> io::Result<Layout> {
    if !opts.nvm_size.is_multiple_of(BLOCK_SIZE_U64) || opts.nvm_size < (1 << 20) {
        return Err(einval(format!(
            "NVM size {} must be a multiple of 4096 and at least 1 MiB",
            opts.nvm_size
        )));
    }
    if !opts.log_size.is_multiple_of(BLOCK_SIZE_U64) || opts.log_size < (64 << 10) {
        return Err(einval(format!(
            "log size {} must be a multiple of 4096 and at least 64 KiB",
            opts.log_size
        )));
    }
    if opts.max_clients == 0 || opts.max_clients > 4096 {
        return Err(einval(format!(
            "max clients {} must be between 1 and 4096",
            opts.max_clients
        )));
    }
    if opts.digest_threshold_pct == 0 || opts.digest_threshold_pct > 99 {
        return Err(einval(format!(
            "digest threshold {}% must be between 1 and 99",
            opts.digest_threshold_pct
        )));
    }
    let inodes = if opts.inodes == 0 {
        opts.nvm_size / 8192
    } else {
        opts.inodes
    };
    if !(16..=(1u64 << 40)).contains(&inodes) {
        return Err(einval(format!(
            "inode count {inodes} must be between 16 and 2^40"
        )));
    }
    Layout::compute(Params {
        total_bytes: opts.nvm_size,
        nslots: opts.max_clients,
        log_bytes: opts.log_size,
        inode_count: inodes,
        tiers: tiers_of(opts)?,
    })
    .map_err(|e| einval(format!("cannot lay out the NVM tier: {}", e.0)))
}

/// Create a store: the directory, the NVM tier file (fully allocated, so stores through a
/// mapping can never fault for lack of space), the superblock, the daemon state, the slot
/// heads, the root directory, the allocation state, a lock file per slot, and
/// `cairn.toml`. Refuses an existing store unless `force` (`EEXIST`), and a store whose
/// daemon runs (`EBUSY`). Long (about 140 lines): the steps above, in the order that makes
/// a crash part-way leave no store rather than a broken one (the superblock last).
pub fn mkfs(opts: &MkfsOptions) -> io::Result<StoreConfig> {
    let layout = layout_of(opts)?;
    let store = StoreDir::new(&opts.store);
    std::fs::create_dir_all(&store.path).map_err(|e| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!(
                "cannot create the store directory {}: {e}",
                store.path.display()
            ),
        )
    })?;
    if store.exists() {
        if !opts.force {
            return Err(fs_err(
                libc::EEXIST,
                format!(
                    "a Cairn store already exists at {} (use --force to replace it)",
                    store.path.display()
                ),
            ));
        }
        if let Ok(f) = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(store.daemon_lock_path())
        {
            if sys::flock_exclusive(&f, true).is_err() {
                return Err(fs_err(
                    libc::EBUSY,
                    format!(
                        "a daemon is serving the store at {}; stop it first",
                        store.path.display()
                    ),
                ));
            }
        }
        if let Ok(old) = store.load_config() {
            match std::fs::remove_file(&old.nvm_path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(fs_err(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        format!(
                            "cannot remove the old NVM file {}: {e}",
                            old.nvm_path.display()
                        ),
                    ))
                }
            }
            // The old store's lower tiers, when they are files the new store does not
            // reuse (devices are left alone; a reused path is overwritten below).
            let keep = [&opts.ssd, &opts.hdd].map(|t| t.as_ref().map(|t| t.path.clone()));
            for p in [old.ssd_path, old.hdd_path].into_iter().flatten() {
                let file = std::fs::metadata(&p).is_ok_and(|m| m.is_file());
                if file && !keep.contains(&Some(p.clone())) {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
        let _ = std::fs::remove_file(store.socket_path());
    }
    let nvm_path = match &opts.nvm_path {
        Some(p) => p.clone(),
        None => PathBuf::from(format!("/dev/shm/cairn-{}.nvm", hex(&random_bytes(8)?))),
    };
    let mut oo = OpenOptions::new();
    oo.read(true).write(true);
    if opts.force {
        oo.create(true).truncate(true);
    } else {
        oo.create_new(true);
    }
    let file = oo.open(&nvm_path).map_err(|e| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("cannot create the NVM file {}: {e}", nvm_path.display()),
        )
    })?;
    let tg = opts.trusted_gid;
    let r = restrict(&nvm_path, tg, 0o600, 0o660)
        .and_then(|()| format_file(&file, &layout, opts))
        .and_then(|()| {
            std::fs::create_dir_all(store.slots_dir())?;
            for s in 0..layout.nslots {
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(store.slot_lock_path(s))?;
                restrict(&store.slot_lock_path(s), tg, 0o600, 0o660)?;
            }
            // The old store's extended attributes go with it (the daemon starts a new
            // journal).
            for ext in ["", "tmp", "old"] {
                match std::fs::remove_file(store.xattr_path().with_extension(ext)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            // The trust domain may run the daemon: its lock and log files are theirs too.
            for p in [store.daemon_lock_path(), store.daemon_log_path()] {
                OpenOptions::new().append(true).create(true).open(&p)?;
                restrict(&p, tg, 0o600, 0o660)?;
            }
            restrict(&store.slots_dir(), tg, 0o700, 0o2770)?;
            // Everyone may reach the socket (and get a clear refusal if untrusted).
            restrict(&store.path, tg, 0o755, 0o2775)?;
            let cfg = StoreConfig {
                format_version: 1,
                nvm_path: nvm_path.clone(),
                nvm_size: opts.nvm_size,
                log_size: opts.log_size,
                max_clients: opts.max_clients,
                inodes: layout.inode_count,
                digest_threshold_pct: opts.digest_threshold_pct,
                lease_timeout_ms: cairn_area::store::DEFAULT_LEASE_TIMEOUT_MS,
                lease_hold_us: cairn_area::store::DEFAULT_LEASE_HOLD_US,
                shared_write: cairn_area::store::DEFAULT_SHARED_WRITE,
                owner_uid: Some(sys::ids().0),
                trusted_gid: opts.trusted_gid,
                ssd_path: opts.ssd.as_ref().map(|t| t.path.clone()),
                hdd_path: opts.hdd.as_ref().map(|t| t.path.clone()),
                ..StoreConfig::with_defaults(nvm_path.clone())
            };
            store.save_config(&cfg)?;
            Ok(cfg)
        });
    if r.is_err() {
        drop(file);
        let _ = std::fs::remove_file(&nvm_path);
    }
    r
}

/// Give `path` the mode that lets exactly the trust domain use it: `owner_mode` without a
/// trusted group; with one, `group_mode` and that group (docs/FORMAT.md, "The store
/// directory").
pub(crate) fn restrict(
    path: &std::path::Path,
    trusted_gid: Option<u32>,
    owner_mode: u32,
    group_mode: u32,
) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let errno = |e: &io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let mode = match trusted_gid {
        Some(g) => {
            std::os::unix::fs::chown(path, None, Some(g)).map_err(|e| {
                fs_err(
                    errno(&e),
                    format!(
                        "cannot give {} to the trusted group {g}: {e} (root or a member of the group can)",
                        path.display()
                    ),
                )
            })?;
            group_mode
        }
        None => owner_mode,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
        fs_err(
            errno(&e),
            format!("cannot set the mode of {} to {mode:o}: {e}", path.display()),
        )
    })
}

/// Prepare a lower tier: create the file (or check the device), trim it whole, write its
/// header and make it durable. An existing non-empty file or a device is overwritten
/// only with `force`.
fn format_tier(
    tier: u8,
    t: &TierOptions,
    g: &TierGeom,
    uuid: &[u8; 16],
    opts: &MkfsOptions,
) -> io::Result<()> {
    use std::os::unix::fs::{FileExt, FileTypeExt};
    let name = cairn_format::map::TIER_NAMES[tier as usize];
    let ctx = |e: io::Error, what: &str| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what} the {name} tier {}: {e}", t.path.display()),
        )
    };
    let existing = std::fs::metadata(&t.path).ok();
    let device = existing
        .as_ref()
        .is_some_and(|m| m.file_type().is_block_device());
    if existing.as_ref().is_some_and(|m| device || m.len() > 0) && !opts.force {
        return Err(fs_err(
            libc::EEXIST,
            format!(
                "the {name} tier {} exists and is not empty; --force overwrites it",
                t.path.display()
            ),
        ));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(!device)
        .truncate(false)
        .open(&t.path)
        .map_err(|e| ctx(e, "cannot open"))?;
    let bytes = g.blocks() * BLOCK_SIZE_U64;
    if !device {
        f.set_len(bytes).map_err(|e| ctx(e, "cannot size"))?;
        restrict(&t.path, opts.trusted_gid, 0o600, 0o660)?;
    }
    sys::discard(&f, 0, bytes).map_err(|e| ctx(e, "cannot trim"))?;
    f.write_all_at(&cairn_format::tier::encode_header(tier, uuid, g), 0)
        .and_then(|()| f.sync_all())
        .map_err(|e| ctx(e, "cannot write the header of"))
}

fn format_file(file: &std::fs::File, l: &Layout, opts: &MkfsOptions) -> io::Result<()> {
    sys::fallocate(file, opts.nvm_size).map_err(|e| {
        fs_err(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!(
                "cannot allocate {} bytes for the NVM file: {e}",
                opts.nvm_size
            ),
        )
    })?;
    // Stale contents (force over an existing file) are cleared by the truncate above;
    // fallocate gives zeros.
    let m = Mapping::new(file, 0, opts.nvm_size as usize, true, false)?;
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&random_bytes(16)?);
    let now = now_ns();
    let sb = Superblock {
        version: cairn_format::superblock::FORMAT_VERSION,
        layout: *l,
        uuid,
        created_ns: now,
    };
    let persist = |off: usize, data: &[u8]| -> io::Result<()> {
        m.write(off, data)?;
        m.flush(off, data.len())
    };
    persist(BLOCK_SIZE, &encode_state(true))?;
    for s in 0..l.nslots {
        let h = SlotHead {
            gen: 1,
            active: false,
            head_lsn: 0,
            head_seq: 1,
            slot_gen: 0,
        };
        let off = l.slot_entry_off(s) as usize;
        persist(off, &h.encode())?;
        m.store_u64(off + PUBLISHED_HEAD_OFF as usize, 0)?;
    }
    let (uid, gid) = sys::ids();
    let root = Inode {
        attrs: Attrs {
            kind: Kind::Dir,
            perm: 0o755,
            uid,
            gid,
            nlink: 2,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            parent: ROOT_INO,
            rdev: 0,
        },
        generation: 1,
        ..Default::default()
    };
    persist(l.inode_off(ROOT_INO) as usize, &root.encode())?;
    // Allocation state: no data block used; inodes 0 and 1 used.
    let mut bm = vec![0u8; l.alloc_bitmap_bytes()];
    let ib = l.data_blocks.div_ceil(8) as usize;
    bm[ib] |= 0b11;
    persist(((l.alloc_start + 1) * BLOCK_SIZE_U64) as usize, &bm)?;
    persist(
        (l.alloc_start * BLOCK_SIZE_U64) as usize,
        &alloc::encode_header(l.data_blocks, l.inode_count, &bm),
    )?;
    cairn_media::fence();
    for (i, t) in [&opts.ssd, &opts.hdd].into_iter().enumerate() {
        if let Some(t) = t {
            format_tier(i as u8 + 1, t, &l.tiers[i], &uuid, opts)?;
        }
    }
    // The superblock last (its copy in the last block first): a tier without a valid
    // superblock is not a store.
    persist((l.sb_copy * BLOCK_SIZE_U64) as usize, &sb.encode())?;
    cairn_media::fence();
    persist(0, &sb.encode())?;
    cairn_media::fence();
    Ok(())
}
