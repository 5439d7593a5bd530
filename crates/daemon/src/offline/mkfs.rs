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
use std::path::{Path, PathBuf};

/// Options of [`mkfs`]. `Default` gives the `StoreConfig` defaults (2 GiB tier, client
/// logs scaled to it by [`scaled_logs`]: 8 of 32 MiB, one inode per 8 KiB, digest at 30%)
/// for the store `./cairn-store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MkfsOptions {
    /// The store directory (created if missing).
    pub store: PathBuf,
    /// The NVM tier file; `None`: `/dev/shm/cairn-<random hex>.nvm`.
    pub nvm_path: Option<PathBuf>,
    /// Bytes of the NVM tier (a multiple of 4 KiB).
    pub nvm_size: u64,
    /// Bytes of each client's log ring (a multiple of 4 KiB, at least 64 KiB); 0: scaled
    /// to the tier ([`scaled_logs`]).
    pub log_size: u64,
    /// Log slots: clients registered at once (1..=4096); 0: scaled to the tier
    /// ([`scaled_logs`]).
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
    /// Segment size of the lower tiers; `None`: [`DEFAULT_SSD_SEGMENT`],
    /// [`DEFAULT_HDD_SEGMENT`] and [`DEFAULT_REMOTE_SEGMENT`].
    pub segment_size: Option<u64>,
    /// The remote tier, if any.
    pub remote: Option<RemoteOptions>,
    /// The format version to write (5, 6 or 7; 0: the current one,
    /// `cairn_format::superblock::FORMAT_VERSION`): an older one makes a store an older
    /// build reads, without what came later (before 7, the client logs are in the NVM
    /// file, which every client of the trust domain opens read-write).
    pub format_version: u32,
}

/// The remote tier at mkfs: a RADOS pool that exists (`ceph osd pool create`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    /// `ceph:POOL`.
    pub url: String,
    /// The cluster's configuration file (`None`: `/etc/ceph/ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The user to connect as (`None`: `admin`).
    pub user: Option<String>,
    /// Bytes of the tier (its address space: the most data it holds); `None`:
    /// [`DEFAULT_REMOTE_SIZE`].
    pub size: Option<u64>,
}

/// Default remote tier: 256 GiB (its allocation bitmap takes 8 MiB of NVM).
pub const DEFAULT_REMOTE_SIZE: u64 = 256 << 30;
/// Default remote segment: 64 MiB, four objects of 16 MiB.
pub const DEFAULT_REMOTE_SEGMENT: u64 = 64 << 20;

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
            log_size: 0,
            max_clients: 0,
            inodes: d.inodes,
            digest_threshold_pct: d.digest_threshold_pct,
            force: false,
            trusted_gid: None,
            ssd: None,
            hdd: None,
            segment_size: None,
            remote: None,
            format_version: 0,
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

/// The geometry of a local lower tier from its options.
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
    geom(size, segment)
}

/// `size` bytes in segments of `segment` bytes.
fn geom(size: u64, segment: u64) -> io::Result<TierGeom> {
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
fn tiers_of(opts: &MkfsOptions) -> io::Result<[TierGeom; 3]> {
    let mut g = [TierGeom::default(); 3];
    if let Some(t) = &opts.ssd {
        g[0] = tier_geom("SSD", t, opts.segment_size.unwrap_or(DEFAULT_SSD_SEGMENT))?;
    }
    if let Some(t) = &opts.hdd {
        g[1] = tier_geom("HDD", t, opts.segment_size.unwrap_or(DEFAULT_HDD_SEGMENT))?;
    }
    if let Some(r) = &opts.remote {
        let size = r.size.unwrap_or(DEFAULT_REMOTE_SIZE);
        g[2] = geom(size, opts.segment_size.unwrap_or(DEFAULT_REMOTE_SEGMENT))?;
    }
    Ok(g)
}

/// The smallest NVM tier mkfs lays out when it chooses the client logs itself (8 logs
/// of 1 MiB take half of it). Smaller tiers need `--max-clients` and `--log-size`.
pub const MIN_NVM_SIZE: u64 = 16 << 20;

/// The client logs mkfs gives a tier of `nvm_size` bytes, `(slots, bytes of each log)`,
/// where `slots` or `log_size` is 0 (not chosen by the user). The logs take an eighth of
/// the tier: one slot per 256 MiB (8 to 64), each log the largest power of two that fits
/// its share (1 MiB to 32 MiB; from 64 KiB when the slots were chosen). A 2 GiB tier
/// gets 8 logs of 32 MiB, 256 MiB gets 8 of 4 MiB, 16 GiB gets 64 of 32 MiB.
pub fn scaled_logs(nvm_size: u64, slots: u32, log_size: u64) -> (u32, u64) {
    const MAX_LOG: u64 = 32 << 20;
    let floor = if slots == 0 { 1 << 20 } else { 64 << 10 };
    let slots = match slots {
        0 => (nvm_size / (256 << 20)).clamp(8, 64) as u32,
        n => n,
    };
    let log_size = match log_size {
        0 => {
            let share = (nvm_size / 8 / u64::from(slots)).max(1);
            (1u64 << share.ilog2()).clamp(floor, MAX_LOG)
        }
        n => n,
    };
    (slots, log_size)
}

/// `opts` with the client logs it leaves to mkfs chosen ([`scaled_logs`]); `EINVAL`
/// below [`MIN_NVM_SIZE`] when mkfs would choose both.
pub fn resolve_logs(opts: &MkfsOptions) -> io::Result<MkfsOptions> {
    if opts.max_clients == 0 && opts.log_size == 0 && opts.nvm_size < MIN_NVM_SIZE {
        return Err(einval(format!(
            "an NVM tier of {} is below the smallest one mkfs lays out by itself, {} MiB \
             (8 client logs of 1 MiB and their inodes); give --nvm-size {}M or more, or \
             choose the logs with --max-clients and --log-size (64K at least)",
            cairn_area::units::human_bytes(opts.nvm_size),
            MIN_NVM_SIZE >> 20,
            MIN_NVM_SIZE >> 20
        )));
    }
    let (max_clients, log_size) = scaled_logs(opts.nvm_size, opts.max_clients, opts.log_size);
    Ok(MkfsOptions {
        max_clients,
        log_size,
        ..opts.clone()
    })
}

/// The layout `opts` give (logs resolved), or `EINVAL` saying why they do not fit.
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
    let version = format_version(opts)?;
    Layout::compute_for(
        Params {
            total_bytes: opts.nvm_size,
            nslots: opts.max_clients,
            log_bytes: opts.log_size,
            inode_count: inodes,
            tiers: tiers_of(opts)?,
        },
        version,
    )
    .map_err(|e| {
        einval(format!(
            "cannot lay out the NVM tier ({} client logs of {}, {inodes} inodes): {}; give a \
             larger --nvm-size, or fewer or smaller logs (--max-clients, --log-size) or fewer \
             inodes (--inodes)",
            opts.max_clients,
            cairn_area::units::human_bytes(opts.log_size),
            e.0
        ))
    })
}

/// The format version `opts` asks for, checked against what the store needs.
fn format_version(opts: &MkfsOptions) -> io::Result<u32> {
    use cairn_format::superblock::{FORMAT_VERSION, VERSION_REMOTE, VERSION_SUPERPAGES};
    let v = match opts.format_version {
        0 => FORMAT_VERSION,
        v => v,
    };
    if !(VERSION_SUPERPAGES..=FORMAT_VERSION).contains(&v) {
        return Err(einval(format!(
            "format version {v} cannot be made: {VERSION_SUPERPAGES} to {FORMAT_VERSION} can"
        )));
    }
    if opts.remote.is_some() && v < VERSION_REMOTE {
        return Err(einval(format!(
            "a remote tier needs format version {VERSION_REMOTE} or later"
        )));
    }
    Ok(v)
}

/// Create a store: the directory, the NVM tier file (fully allocated, so stores through a
/// mapping can never fault for lack of space), the superblock, the daemon state, the slot
/// heads, the root directory, the allocation state, a lock file per slot, and
/// `cairn.toml`. Refuses an existing store unless `force` (`EEXIST`), and a store whose
/// daemon runs (`EBUSY`). Long (about 140 lines): the steps above, in the order that makes
/// a crash part-way leave no store rather than a broken one (the superblock last).
pub fn mkfs(opts: &MkfsOptions) -> io::Result<StoreConfig> {
    let opts = &resolve_logs(opts)?;
    let layout = layout_of(opts)?;
    let store = StoreDir::new(&opts.store);
    let nvm_path = match &opts.nvm_path {
        Some(p) => p.clone(),
        None => PathBuf::from(format!("/dev/shm/cairn-{}.nvm", hex(&random_bytes(8)?))),
    };
    check_free_space(&nvm_path, opts, &layout, &store)?;
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
                    "a Cairn store already exists at {} (--force replaces it; its contents \
                     are lost)",
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
            match cairn_area::store::remove_nvm_files(&old.nvm_path) {
                Ok(_) => {}
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
    let r = restrict(&nvm_path, tg, 0o600, 0o640)
        .and_then(|()| make_slot_files(&nvm_path, &layout).map(drop))
        .and_then(|()| format_file(&file, &layout, opts))
        .and_then(|()| {
            skeleton(&store, layout.nslots, tg)?;
            // The old store's extended attributes and segment registry go with it (the
            // daemon starts new ones).
            for p in ["", "tmp", "old"]
                .map(|ext| store.xattr_path().with_extension(ext))
                .into_iter()
                .chain([store.sj_registry_path()])
            {
                match std::fs::remove_file(p) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
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
                remote: opts.remote.as_ref().map(|r| r.url.clone()),
                ceph_conf: opts.remote.as_ref().and_then(|r| r.conf.clone()),
                ceph_user: opts.remote.as_ref().and_then(|r| r.user.clone()),
                ..StoreConfig::with_defaults(nvm_path.clone())
            };
            store.save_config(&cfg)?;
            Ok(cfg)
        });
    if r.is_err() {
        drop(file);
        let _ = cairn_area::store::remove_nvm_files(&nvm_path);
    }
    r
}

/// Make the file of every log slot of a store of format version 7 (`Layout::slot_files`)
/// next to its NVM file `nvm_path`: zeros, fully allocated (a client's stores into its
/// ring never fault for lack of space), mode 0600 whatever the trusted group: only the
/// daemon opens them, and hands each client a descriptor of its own slot's file alone
/// (ARCHITECTURE.md, "Isolation"). Returns their paths (none for an older layout).
pub(crate) fn make_slot_files(nvm_path: &Path, l: &Layout) -> io::Result<Vec<PathBuf>> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if !l.slot_files {
        return Ok(Vec::new());
    }
    let mut made = Vec::with_capacity(l.nslots as usize);
    for slot in 0..l.nslots {
        let path = cairn_area::store::slot_log_path(nvm_path, slot);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                fs_err(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("cannot create the log file {}: {e}", path.display()),
                )
            })?;
        made.push(path.clone());
        // `create` keeps the mode of a file that was there (`--force`).
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        sys::fallocate(&f, l.slot_file_bytes()).map_err(|e| {
            fs_err(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!(
                    "cannot allocate {} bytes for the log file {}: {e}",
                    l.slot_file_bytes(),
                    path.display()
                ),
            )
        })?;
    }
    Ok(made)
}

/// The files of a store directory besides its configuration, with the modes that let
/// exactly the trust domain use them: a lock file per slot, the daemon's lock and log,
/// and the directories.
pub(crate) fn skeleton(store: &StoreDir, nslots: u32, tg: Option<u32>) -> io::Result<()> {
    std::fs::create_dir_all(store.slots_dir())?;
    for s in 0..nslots {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(store.slot_lock_path(s))?;
        restrict(&store.slot_lock_path(s), tg, 0o600, 0o660)?;
    }
    // Only the owner and root run the daemon: its lock is theirs alone (a member that
    // could open it could hold it and keep every daemon from starting); members read its
    // log.
    for (p, group_mode) in [
        (store.daemon_lock_path(), 0o600),
        (store.daemon_log_path(), 0o640),
    ] {
        OpenOptions::new().append(true).create(true).open(&p)?;
        restrict(&p, tg, 0o600, group_mode)?;
    }
    // Members reach their slot locks; nobody but the owner and root creates, renames or
    // removes anything in the store directory (the daemon's state).
    restrict(&store.slots_dir(), tg, 0o700, 0o750)?;
    // Everyone may reach the socket (and get a clear refusal if untrusted).
    restrict(&store.path, tg, 0o755, 0o755)
}

/// `ENOSPC` unless the file system that will hold the NVM file at `nvm_path` has room
/// for all of it (mkfs allocates the whole file), counting what `--force` frees there
/// (the old store's NVM file, or a file at `nvm_path` itself).
fn check_free_space(
    nvm_path: &Path,
    opts: &MkfsOptions,
    layout: &Layout,
    store: &StoreDir,
) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = match nvm_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(dir_meta) = std::fs::metadata(dir) else {
        return Ok(()); // Creating the file reports the missing directory.
    };
    let mut free = sys::free_space(dir)?;
    // The client logs are files of their own beside the NVM file (format version 7).
    let logs = if layout.slot_files {
        layout.nslots as u64 * layout.slot_file_bytes()
    } else {
        0
    };
    let need = opts.nvm_size + logs;
    if opts.force {
        let old = store.load_config().ok().map(|c| c.nvm_path);
        let mut freed: Vec<PathBuf> = vec![nvm_path.to_path_buf()];
        freed.extend(old.filter(|p| p != nvm_path));
        for p in freed.iter().flat_map(|p| cairn_area::store::nvm_files(p)) {
            if let Ok(m) = std::fs::metadata(&p) {
                if m.is_file() && m.dev() == dir_meta.dev() {
                    free = free.saturating_add(m.blocks() * 512);
                }
            }
        }
    }
    if free < need {
        let ram = if sys::in_ram(dir).unwrap_or(false) {
            " (tmpfs: memory)"
        } else {
            ""
        };
        return Err(fs_err(
            libc::ENOSPC,
            format!(
                "the NVM file and the client logs need {} but {}{ram} has {} free; give a \
                 smaller --nvm-size, fewer or smaller logs (--max-clients, --log-size), or \
                 --nvm-path on a file system with room",
                cairn_area::units::human_bytes(need),
                dir.display(),
                cairn_area::units::human_bytes(free)
            ),
        ));
    }
    Ok(())
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
        restrict(&t.path, opts.trusted_gid, 0o600, 0o640)?;
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
    // The oldest version that has what the store needs, so that older builds read it.
    let sb = Superblock {
        version: format_version(opts)?,
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
    if let Some(r) = &opts.remote {
        // Connects, checks the pool and writes the tier's header object.
        let spec = cairn_remote::Spec::parse(&r.url, r.conf.as_deref(), r.user.as_deref())?;
        let timeout =
            std::time::Duration::from_millis(cairn_area::store::DEFAULT_REMOTE_TIMEOUT_MS);
        cairn_remote::RadosTier::create(&spec, timeout, &uuid, 3, l.tiers[2])?;
    }
    // The superblock last (its copy in the last block first): a tier without a valid
    // superblock is not a store.
    persist((l.sb_copy * BLOCK_SIZE_U64) as usize, &sb.encode())?;
    cairn_media::fence();
    persist(0, &sb.encode())?;
    cairn_media::fence();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_logs_follow_the_tier() {
        assert_eq!(scaled_logs(16 << 20, 0, 0), (8, 1 << 20));
        assert_eq!(scaled_logs(64 << 20, 0, 0), (8, 1 << 20));
        assert_eq!(scaled_logs(256 << 20, 0, 0), (8, 4 << 20));
        assert_eq!(scaled_logs(2 << 30, 0, 0), (8, 32 << 20));
        assert_eq!(scaled_logs(4 << 30, 0, 0), (16, 32 << 20));
        assert_eq!(scaled_logs(64 << 30, 0, 0), (64, 32 << 20));
        // What the user chose stays; the other scales around it.
        assert_eq!(scaled_logs(256 << 20, 2, 0), (2, 16 << 20));
        assert_eq!(scaled_logs(16 << 20, 64, 0), (64, 64 << 10));
        assert_eq!(scaled_logs(256 << 20, 0, 64 << 10), (8, 64 << 10));
        assert_eq!(scaled_logs(256 << 20, 3, 1 << 20), (3, 1 << 20));
    }

    /// Every tier from the minimum up lays out with the logs mkfs chooses, and the logs
    /// never take more than half of it.
    #[test]
    fn every_tier_from_the_minimum_lays_out() {
        let mut sizes: Vec<u64> = (MIN_NVM_SIZE..=(512 << 20)).step_by(4096 * 61).collect();
        sizes.extend([
            MIN_NVM_SIZE,
            1 << 30,
            (2 << 30) + 4096,
            3 << 30,
            16 << 30,
            1 << 40,
        ]);
        for nvm_size in sizes {
            let opts = resolve_logs(&MkfsOptions {
                nvm_size,
                ..Default::default()
            })
            .unwrap();
            let layout = layout_of(&opts).unwrap_or_else(|e| panic!("{nvm_size}: {e}"));
            let logs = u64::from(opts.max_clients) * opts.log_size;
            assert!(logs * 2 <= nvm_size, "{nvm_size}: logs take {logs}");
            assert!(layout.data_blocks > 0);
        }
    }

    #[test]
    fn below_the_minimum_the_error_names_it_and_the_options() {
        let e = resolve_logs(&MkfsOptions {
            nvm_size: MIN_NVM_SIZE - 4096,
            ..Default::default()
        })
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("16 MiB") && text.contains("--log-size"),
            "{text}"
        );
        // With the logs chosen, a smaller tier is allowed.
        let opts = resolve_logs(&MkfsOptions {
            nvm_size: 4 << 20,
            max_clients: 2,
            log_size: 256 << 10,
            ..Default::default()
        })
        .unwrap();
        layout_of(&opts).unwrap();
        // Logs in the NVM file (before format version 7) must fit in it.
        let big_logs = MkfsOptions {
            nvm_size: 4 << 20,
            max_clients: 8,
            log_size: 1 << 20,
            ..Default::default()
        };
        layout_of(&big_logs).unwrap();
        let e = layout_of(&MkfsOptions {
            format_version: 6,
            ..big_logs
        })
        .unwrap_err();
        assert!(e.to_string().contains("--max-clients"), "{e}");
    }
}
