//! The store directory: configuration file, socket, locks and the default store.

use crate::error::fs_err;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};

/// Name of the configuration file inside the store directory.
pub const CONFIG_FILE: &str = "cairn.toml";

/// `cairn.toml`: everything chosen at mkfs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoreConfig {
    /// Configuration format version (1).
    pub format_version: u32,
    /// The NVM tier file.
    pub nvm_path: PathBuf,
    pub nvm_size: u64,
    /// Bytes of each client's operation log ring.
    pub log_size: u64,
    /// Log slots (clients registered at once).
    pub max_clients: u32,
    /// Inode table entries.
    pub inodes: u64,
    /// Log fill (percent) at which LibFS asks for a digest.
    pub digest_threshold_pct: u32,
    /// How long a lease holder may take to answer a revocation before it loses every
    /// lease (milliseconds; absent in older configurations: 1000).
    #[serde(default = "default_lease_timeout_ms")]
    pub lease_timeout_ms: u64,
    /// A lease is not revoked sooner than this after it was granted (microseconds;
    /// 0: at once). Absent in older configurations: 200.
    #[serde(default = "default_lease_hold_us")]
    pub lease_hold_us: u64,
    /// Whether regular files written by several processes at once enter shared-write
    /// mode. Absent in older configurations: the default.
    #[serde(default = "default_shared_write")]
    pub shared_write: bool,
    /// The store owner (the uid that ran mkfs and owns the store directory and the NVM
    /// file). Absent in older configurations: the owner of the NVM file is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
    /// Members of this group are in the trust domain too (`cairn mkfs --trusted-group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_gid: Option<u32>,
    /// The SSD tier's file or block device (its geometry is in the superblock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssd_path: Option<PathBuf>,
    /// The HDD tier's file or block device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hdd_path: Option<PathBuf>,
    /// The remote tier: `ceph:POOL` (docs/REMOTE.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// The Ceph configuration file naming the cluster's monitors and keyring (absent:
    /// `/etc/ceph/ceph.conf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceph_conf: Option<PathBuf>,
    /// The Ceph user the daemon connects as (absent: `admin`, i.e. `client.admin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceph_user: Option<String>,
    /// The daemon's DRAM cache of remote-tier data, shared by every client (MiB).
    #[serde(default = "default_remote_cache_mib")]
    pub remote_cache_mib: u64,
    /// How long one operation on the remote tier may take before it fails with
    /// `ETIMEDOUT` (milliseconds): a round waiting for an unreachable cluster gives up,
    /// and migration to the tier pauses.
    #[serde(default = "default_remote_timeout_ms")]
    pub remote_timeout_ms: u64,
    /// Where backups go (`ceph:POOL`) for a store without a remote tier (one with a
    /// remote tier backs up into its pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_remote: Option<String>,
    /// The daemon takes a backup every this many seconds (0: only `cairn backup`).
    #[serde(default)]
    pub backup_interval_s: u64,
    /// Use (percent of a tier's data blocks) above which the daemon migrates the
    /// coldest data to the tier below.
    #[serde(default = "default_migrate_high_pct")]
    pub migrate_high_pct: u32,
    /// Use a migration brings the tier down to.
    #[serde(default = "default_migrate_low_pct")]
    pub migrate_low_pct: u32,
    /// Whether the daemon migrates, promotes and cleans in the background (false: only
    /// `cairn migrate` and a full NVM tier move data).
    #[serde(default = "default_background_migration")]
    pub background_migration: bool,
    /// Recency chunk of NVM data (KiB): the unit migration ranks and moves.
    #[serde(default = "default_recency_grain_nvm_kib")]
    pub recency_grain_nvm_kib: u64,
    /// Recency chunk of SSD and HDD data (KiB).
    #[serde(default = "default_recency_grain_ssd_kib")]
    pub recency_grain_ssd_kib: u64,
    /// A lower tier is cleaned when fewer than this percentage of its segments are free
    /// (and always when only the one reserved for cleaning is).
    #[serde(default = "default_clean_free_pct")]
    pub clean_free_pct: u32,
    /// Each client's DRAM cache of lower-tier data (MiB; 0: none).
    #[serde(default = "default_read_cache_mib")]
    pub read_cache_mib: u64,
    /// Read-ahead on sequential misses of lower-tier data (KiB).
    #[serde(default = "default_readahead_kib")]
    pub readahead_kib: u64,
    /// Whether the daemon promotes well-used 2 MiB ranges of files into superpage
    /// extents of the NVM tier (format version 5; ARCHITECTURE.md, "Superpages").
    #[serde(default = "default_superpages")]
    pub superpages: bool,
    /// A 2 MiB range of a file is promoted when at least this percentage of its 512
    /// blocks hold data in NVM (Ingens: 90).
    #[serde(default = "default_superpage_promote_pct")]
    pub superpage_promote_pct: u32,
    /// A superpage extent is demoted to 4 KiB blocks when fewer than this percentage of
    /// its blocks still hold data (holes punched into it).
    #[serde(default = "default_superpage_demote_pct")]
    pub superpage_demote_pct: u32,
    /// Most data promotion and compaction copy per second (MiB).
    #[serde(default = "default_superpage_rate_mib")]
    pub superpage_rate_mib: u64,
    /// Emulated media (for experiments; all absent = off): per tier, nanoseconds added
    /// to every read and a bandwidth cap in MB/s (10^6 bytes per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvm_read_latency_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvm_bandwidth_mbps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssd_read_latency_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssd_bandwidth_mbps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hdd_read_latency_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hdd_bandwidth_mbps: Option<u64>,
}

fn default_background_migration() -> bool {
    true
}

fn default_recency_grain_nvm_kib() -> u64 {
    1024
}

fn default_recency_grain_ssd_kib() -> u64 {
    4096
}

/// Default `clean_free_pct`.
pub const DEFAULT_CLEAN_FREE_PCT: u32 = 5;

fn default_clean_free_pct() -> u32 {
    DEFAULT_CLEAN_FREE_PCT
}

/// Default `remote_cache_mib`.
pub const DEFAULT_REMOTE_CACHE_MIB: u64 = 256;

fn default_remote_cache_mib() -> u64 {
    DEFAULT_REMOTE_CACHE_MIB
}

/// Default `remote_timeout_ms`.
pub const DEFAULT_REMOTE_TIMEOUT_MS: u64 = 30_000;

fn default_remote_timeout_ms() -> u64 {
    DEFAULT_REMOTE_TIMEOUT_MS
}

/// Default `read_cache_mib`.
pub const DEFAULT_READ_CACHE_MIB: u64 = 64;
/// Default `readahead_kib` (Strata's 256 KiB).
pub const DEFAULT_READAHEAD_KIB: u64 = 256;

fn default_read_cache_mib() -> u64 {
    DEFAULT_READ_CACHE_MIB
}

fn default_readahead_kib() -> u64 {
    DEFAULT_READAHEAD_KIB
}

/// Default `superpage_promote_pct` (Ingens' 90%).
pub const DEFAULT_SUPERPAGE_PROMOTE_PCT: u32 = 90;
/// Default `superpage_demote_pct`.
pub const DEFAULT_SUPERPAGE_DEMOTE_PCT: u32 = 50;
/// Default `superpage_rate_mib`.
pub const DEFAULT_SUPERPAGE_RATE_MIB: u64 = 256;

fn default_superpages() -> bool {
    true
}

fn default_superpage_promote_pct() -> u32 {
    DEFAULT_SUPERPAGE_PROMOTE_PCT
}

fn default_superpage_demote_pct() -> u32 {
    DEFAULT_SUPERPAGE_DEMOTE_PCT
}

fn default_superpage_rate_mib() -> u64 {
    DEFAULT_SUPERPAGE_RATE_MIB
}

/// Default `migrate_high_pct` (Strata's 95%).
pub const DEFAULT_MIGRATE_HIGH_PCT: u32 = 95;
/// Default `migrate_low_pct`.
pub const DEFAULT_MIGRATE_LOW_PCT: u32 = 85;

fn default_migrate_high_pct() -> u32 {
    DEFAULT_MIGRATE_HIGH_PCT
}

fn default_migrate_low_pct() -> u32 {
    DEFAULT_MIGRATE_LOW_PCT
}

/// Default `lease_timeout_ms`.
pub const DEFAULT_LEASE_TIMEOUT_MS: u64 = 1000;

fn default_lease_timeout_ms() -> u64 {
    DEFAULT_LEASE_TIMEOUT_MS
}

/// Default `lease_hold_us`.
pub const DEFAULT_LEASE_HOLD_US: u64 = 200;

fn default_lease_hold_us() -> u64 {
    DEFAULT_LEASE_HOLD_US
}

/// Default `shared_write`.
pub const DEFAULT_SHARED_WRITE: bool = false;

fn default_shared_write() -> bool {
    DEFAULT_SHARED_WRITE
}

impl StoreConfig {
    /// The store's owner: `owner_uid`, or in an older configuration without it the
    /// owner of the NVM file.
    pub fn owner(&self) -> io::Result<u32> {
        use std::os::unix::fs::MetadataExt;
        match self.owner_uid {
            Some(u) => Ok(u),
            None => Ok(std::fs::metadata(&self.nvm_path)?.uid()),
        }
    }

    /// Set the emulation profile `name` (ARCHITECTURE.md, "Tiers"): `strata` is the
    /// Strata paper's NVM (300 ns added to reads, 1/8 of `dram_mbps`, this machine's
    /// copy bandwidth) with an NVMe SSD (80 µs, 2,000 MB/s) and an HDD (5 ms, 200 MB/s);
    /// `off` clears every knob.
    pub fn set_emulation_profile(&mut self, name: &str, dram_mbps: u64) -> io::Result<()> {
        let p = match name {
            "strata" => [
                Some((300, (dram_mbps / 8).max(1))),
                Some((80_000, 2_000)),
                Some((5_000_000, 200)),
            ],
            "off" => [None, None, None],
            _ => {
                return Err(fs_err(
                    libc::EINVAL,
                    format!("unknown emulation profile {name:?}: use strata or off"),
                ))
            }
        };
        let lat = |i: usize| p[i].map(|x: (u64, u64)| x.0);
        let bw = |i: usize| p[i].map(|x: (u64, u64)| x.1);
        (self.nvm_read_latency_ns, self.nvm_bandwidth_mbps) = (lat(0), bw(0));
        (self.ssd_read_latency_ns, self.ssd_bandwidth_mbps) = (lat(1), bw(1));
        (self.hdd_read_latency_ns, self.hdd_bandwidth_mbps) = (lat(2), bw(2));
        Ok(())
    }

    /// Set this process's media emulation (`cairn_media::emulate`) from the
    /// configuration (tiers without settings are not emulated).
    pub fn apply_emulation(&self) {
        let t = [
            (self.nvm_read_latency_ns, self.nvm_bandwidth_mbps),
            (self.ssd_read_latency_ns, self.ssd_bandwidth_mbps),
            (self.hdd_read_latency_ns, self.hdd_bandwidth_mbps),
        ];
        for (i, (lat, bw)) in t.into_iter().enumerate() {
            cairn_media::emulate::set(i as u8, lat.unwrap_or(0), bw.unwrap_or(0));
        }
    }

    /// The path of lower tier `tier` (1 = SSD, 2 = HDD).
    pub fn tier_path(&self, tier: u8) -> Option<&Path> {
        match tier {
            1 => self.ssd_path.as_deref(),
            2 => self.hdd_path.as_deref(),
            _ => None,
        }
    }

    /// The file holding log slot `slot` (client page and ring) of a store of format
    /// version 7 (`Layout::slot_files`): next to the NVM file, on the same medium.
    pub fn slot_log_path(&self, slot: u32) -> PathBuf {
        slot_log_path(&self.nvm_path, slot)
    }

    /// Defaults for a new store whose NVM file will be `nvm_path`.
    pub fn with_defaults(nvm_path: PathBuf) -> StoreConfig {
        StoreConfig {
            format_version: 1,
            nvm_path,
            nvm_size: 2 << 30,
            log_size: 32 << 20,
            max_clients: 8,
            inodes: 0, // 0: derive from nvm_size (one per 8 KiB) at mkfs
            digest_threshold_pct: 30,
            lease_timeout_ms: default_lease_timeout_ms(),
            lease_hold_us: default_lease_hold_us(),
            shared_write: default_shared_write(),
            owner_uid: None,
            trusted_gid: None,
            ssd_path: None,
            hdd_path: None,
            remote: None,
            ceph_conf: None,
            ceph_user: None,
            remote_cache_mib: DEFAULT_REMOTE_CACHE_MIB,
            remote_timeout_ms: DEFAULT_REMOTE_TIMEOUT_MS,
            backup_remote: None,
            backup_interval_s: 0,
            migrate_high_pct: DEFAULT_MIGRATE_HIGH_PCT,
            migrate_low_pct: DEFAULT_MIGRATE_LOW_PCT,
            background_migration: default_background_migration(),
            recency_grain_nvm_kib: default_recency_grain_nvm_kib(),
            recency_grain_ssd_kib: default_recency_grain_ssd_kib(),
            clean_free_pct: DEFAULT_CLEAN_FREE_PCT,
            read_cache_mib: DEFAULT_READ_CACHE_MIB,
            readahead_kib: DEFAULT_READAHEAD_KIB,
            superpages: default_superpages(),
            superpage_promote_pct: DEFAULT_SUPERPAGE_PROMOTE_PCT,
            superpage_demote_pct: DEFAULT_SUPERPAGE_DEMOTE_PCT,
            superpage_rate_mib: DEFAULT_SUPERPAGE_RATE_MIB,
            nvm_read_latency_ns: None,
            nvm_bandwidth_mbps: None,
            ssd_read_latency_ns: None,
            ssd_bandwidth_mbps: None,
            hdd_read_latency_ns: None,
            hdd_bandwidth_mbps: None,
        }
    }
}

/// A store directory and the paths inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreDir {
    pub path: PathBuf,
}

impl StoreDir {
    pub fn new(path: impl Into<PathBuf>) -> StoreDir {
        StoreDir { path: path.into() }
    }

    /// The store named by `explicit`, else `$CAIRN_STORE`, else the default store.
    pub fn resolve(explicit: Option<&Path>) -> StoreDir {
        if let Some(p) = explicit {
            return StoreDir::new(p);
        }
        match std::env::var_os("CAIRN_STORE") {
            Some(p) if !p.is_empty() => StoreDir::new(PathBuf::from(p)),
            _ => StoreDir::new(default_store_path()),
        }
    }

    pub fn config_path(&self) -> PathBuf {
        self.path.join(CONFIG_FILE)
    }
    pub fn socket_path(&self) -> PathBuf {
        self.path.join("cairnd.sock")
    }
    pub fn daemon_lock_path(&self) -> PathBuf {
        self.path.join("cairnd.lock")
    }
    pub fn daemon_log_path(&self) -> PathBuf {
        self.path.join("cairnd.log")
    }
    /// The daemon's journal of extended attributes.
    pub fn xattr_path(&self) -> PathBuf {
        self.path.join("xattrs")
    }
    /// The daemon's segment registry (SpaceJMP segments' address ranges).
    pub fn sj_registry_path(&self) -> PathBuf {
        self.path.join("sj-registry")
    }
    pub fn slots_dir(&self) -> PathBuf {
        self.path.join("slots")
    }
    pub fn slot_lock_path(&self, slot: u32) -> PathBuf {
        self.slots_dir().join(format!("{slot}.lock"))
    }

    /// Whether a store exists here (its configuration file does).
    pub fn exists(&self) -> bool {
        self.config_path().is_file()
    }

    /// Read `cairn.toml`.
    pub fn load_config(&self) -> io::Result<StoreConfig> {
        let p = self.config_path();
        let text = std::fs::read_to_string(&p).map_err(|e| {
            fs_err(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("no Cairn store at {} (cannot read {}; create one with `cairn mkfs --store {}`)",
                    self.path.display(), p.display(), self.path.display()),
            )
        })?;
        let cfg: StoreConfig = toml::from_str(&text)
            .map_err(|e| fs_err(libc::EINVAL, format!("{}: {e}", p.display())))?;
        if cfg.format_version != 1 {
            return Err(fs_err(
                libc::EINVAL,
                format!(
                    "{}: unsupported format_version {}",
                    p.display(),
                    cfg.format_version
                ),
            ));
        }
        Ok(cfg)
    }

    /// Write `cairn.toml` (atomically: temporary file + rename).
    pub fn save_config(&self, cfg: &StoreConfig) -> io::Result<()> {
        let text = toml::to_string_pretty(cfg).map_err(|e| fs_err(libc::EINVAL, e.to_string()))?;
        let tmp = self.path.join(".cairn.toml.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, self.config_path())?;
        std::fs::File::open(&self.path)?.sync_all()
    }
}

/// `$XDG_DATA_HOME/cairn/default`, else `$HOME/.local/share/cairn/default`, else
/// `/tmp/cairn-<uid>/default`.
pub fn default_store_path() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("cairn").join("default");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(h).join(".local/share/cairn/default");
    }
    PathBuf::from(format!("/tmp/cairn-{}/default", cairn_media::sys::ids().0))
}

/// The file of log slot `slot` of the store whose NVM file is `nvm` (format version 7).
pub fn slot_log_path(nvm: &Path, slot: u32) -> PathBuf {
    let mut p = nvm.as_os_str().to_owned();
    p.push(format!(".slot{slot}"));
    PathBuf::from(p)
}

/// The NVM file `nvm` and the log slot files beside it (format version 7, named
/// [`slot_log_path`]; slots are numbered from 0 without gaps) that exist.
pub fn nvm_files(nvm: &Path) -> Vec<PathBuf> {
    let exists = |p: &PathBuf| std::fs::symlink_metadata(p).is_ok();
    let slots = (0..).map(|s| slot_log_path(nvm, s)).take_while(exists);
    Some(nvm.to_path_buf())
        .filter(exists)
        .into_iter()
        .chain(slots)
        .collect()
}

/// Remove a store's NVM file and its log slot files ([`nvm_files`]); returns the paths
/// removed.
pub fn remove_nvm_files(nvm: &Path) -> io::Result<Vec<PathBuf>> {
    let files = nvm_files(nvm);
    for p in &files {
        match std::fs::remove_file(p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_files_are_found_and_removed_with_the_nvm_file() {
        let d = tempfile::tempdir().unwrap();
        let nvm = d.path().join("s.nvm");
        assert!(nvm_files(&nvm).is_empty());
        std::fs::write(&nvm, b"").unwrap();
        for s in [0, 1, 2, 4] {
            std::fs::write(slot_log_path(&nvm, s), b"").unwrap();
        }
        assert_eq!(slot_log_path(&nvm, 2), d.path().join("s.nvm.slot2"));
        // Slots are numbered without gaps: the first missing one ends the list.
        let want: Vec<PathBuf> = [nvm.clone()]
            .into_iter()
            .chain((0..3).map(|s| slot_log_path(&nvm, s)))
            .collect();
        assert_eq!(nvm_files(&nvm), want);
        assert_eq!(remove_nvm_files(&nvm).unwrap(), want);
        assert!(!nvm.exists() && slot_log_path(&nvm, 4).exists());
        assert!(remove_nvm_files(&nvm).unwrap().is_empty());
    }

    #[test]
    fn config_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let s = StoreDir::new(d.path());
        assert!(!s.exists());
        assert!(s.load_config().is_err());
        let c = StoreConfig::with_defaults("/dev/shm/x.nvm".into());
        s.save_config(&c).unwrap();
        assert!(s.exists());
        assert_eq!(s.load_config().unwrap(), c);
    }

    #[test]
    fn older_config_without_trust_fields_loads() {
        let d = tempfile::tempdir().unwrap();
        let s = StoreDir::new(d.path());
        std::fs::write(
            s.config_path(),
            "format_version = 1\nnvm_path = \"/dev/shm/x.nvm\"\nnvm_size = 1048576\n\
             log_size = 65536\nmax_clients = 2\ninodes = 128\ndigest_threshold_pct = 30\n",
        )
        .unwrap();
        let c = s.load_config().unwrap();
        assert_eq!((c.owner_uid, c.trusted_gid), (None, None));
        let mut c2 = c.clone();
        c2.owner_uid = Some(0);
        c2.trusted_gid = Some(27);
        s.save_config(&c2).unwrap();
        let text = std::fs::read_to_string(s.config_path()).unwrap();
        assert!(
            text.contains("owner_uid = 0") && text.contains("trusted_gid = 27"),
            "{text}"
        );
        assert_eq!(s.load_config().unwrap(), c2);
    }
}
