//! The client↔daemon protocol. Messages are postcard-encoded enums in frames of
//! `u32 little-endian length | payload` over the store's Unix socket (`cairnd.sock`).
//! The daemon learns the client's credentials from the socket (`SO_PEERCRED`), never from
//! a message.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Frames up to this size are read into room made at once; larger ones as they arrive.
const EAGER_FRAME: usize = 64 << 10;

/// Largest frame accepted (a status report of many clients fits easily).
pub const MAX_FRAME: u32 = 16 << 20;

/// A client's request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Request {
    /// Become a client: get a log slot, an inode batch and space credits.
    Register { pid: u32 },
    /// Re-attach to a slot this process already owns (after the daemon restarted),
    /// with the leases it holds (`(ino, write)`) and the inodes it pinned (open files it
    /// said were open when their lease was revoked).
    Reattach {
        pid: u32,
        slot: u32,
        slot_gen: u64,
        leases: Vec<(u64, bool)>,
        pinned: Vec<u64>,
    },
    /// Digest the log up to `upto_lsn` (exclusive). With `wait` the daemon answers
    /// `Digested` when done; without, it answers nothing.
    Digest { upto_lsn: u64, wait: bool },
    /// More inode numbers.
    Inodes { count: u32 },
    /// More space credits (4 KiB data blocks).
    Credits { blocks: u64 },
    /// Report the store's status.
    Status,
    /// Move up to `max_bytes` of the coldest file data of tier `from` to tier `to`
    /// (0 = NVM, 1 = SSD, 2 = HDD; `to = from + 1`), at least one segment's worth if
    /// there is that much. Answered with `Migrated`.
    Migrate { from: u8, to: u8, max_bytes: u64 },
    /// The client is leaving: digest up to `tail_lsn` and release the slot.
    Goodbye { tail_lsn: u64 },
    /// Digest everything, write the allocation state and stop the daemon.
    Shutdown,
    /// A lease on inode `ino` (`write`: exclusive). Answered by `Leased` once granted
    /// (after revoking conflicting leases from other clients; PROTOCOL.md, "Leases").
    Lease { ino: u64, write: bool },
    /// Make this (second) connection the upcall channel of the registered client of
    /// `slot` (same process: the daemon checks the peer's pid). Answer `Ok`; then the
    /// daemon sends [`Upcall`]s on it and the client answers them with `UpcallAck`.
    UpcallChannel { slot: u32, slot_gen: u64 },
    /// On the upcall channel: the lease on `ino` is given up; every record the client
    /// logged about it lies before `tail_lsn`. `open`: the client has the inode open, so
    /// the daemon pins it (an unlink then keeps it, with `nlink = 0`, until `Unpin`).
    /// No answer.
    UpcallAck { ino: u64, tail_lsn: u64, open: bool },
    /// The client closed the last handle of pinned inode `ino`; its records about it lie
    /// before `tail_lsn`. The daemon digests up to there, unpins, and frees the inode if
    /// it is unlinked and nobody else pinned it. Answer `Ok`.
    Unpin { ino: u64, tail_lsn: u64 },
    /// The client's process changed its credentials (`setuid`, `setgroups`, …). Its
    /// records before `tail_lsn` were made with the old ones: the daemon digests them
    /// with those, then reads the process's file system uid and gid and supplementary
    /// groups from the kernel (`/proc/<pid>/status`: never the client's word) and checks
    /// its log with them from then on. Answer `Credentials`.
    Credentials { tail_lsn: u64 },
    /// Pin `ino`, an inode number this client reserved and is about to create without a
    /// name (`O_TMPFILE`), or a file it holds a lease on (it has it open) and is about to
    /// remove the last name of: its digest keeps the inode, unlinked, until `Unpin` (or
    /// the client's end). Answer `Ok`; `EINVAL` for any other inode.
    Pin { ino: u64 },
    /// Shared-write mode (PROTOCOL.md, "Shared-write mode"): the transaction of `len`
    /// bytes at `lsn` with sequence number `seq` is in the client's ring with a zero
    /// magic. `versions`: for each inode it writes that is in shared-write mode, the
    /// sequence word of the inode the client saw before reading it. If every one is still
    /// current, the daemon seals the transaction (writes the magic), digests the log up
    /// to its end and answers `Committed`; otherwise it leaves it unsealed and answers
    /// `Stale`.
    Commit {
        lsn: u64,
        len: u32,
        seq: u64,
        versions: Vec<(u64, u64)>,
    },
    /// An extended-attribute call on inode `ino` (PROTOCOL.md, "Extended attributes").
    /// The client has digested its own records about the inode first. Answers:
    /// `XattrValue` (get), `XattrNames` (list), `Ok` (set, remove), or `Error`.
    Xattr { ino: u64, op: XattrOp },
    /// One cleaning round on lower tier `tier` (1 = SSD, 2 = HDD): the live blocks of
    /// its partly dead segments compacted into one free segment (a round gains nothing,
    /// and moves 0 bytes, unless at least two victims fit). Answered with `Migrated`
    /// (`used_bytes` of `tier`).
    Clean { tier: u8 },
    /// Segments (PROTOCOL.md, "Segment registry"): give the segment file the reservation
    /// names its range. Answer `SjReserved` (the same range again for a segment that has
    /// one), or `Error` (`EINVAL` outside the window or misaligned, `EEXIST` overlapping
    /// another segment, `ENOSPC` no free range). The caller must have created the file.
    SjReserve(SjReservation),
    /// Give back the range of segment `ino`/`gen` (its file is being removed). `Ok`,
    /// also when it had none.
    SjRelease { ino: u64, gen: u64 },
    /// The registry's ranges: answer `SjRanges`.
    SjRanges,
    /// Read `len` bytes (at most [`MAX_TIER_READ`]) at byte `off` of lower tier `tier`,
    /// inside segment `seg` written under generation `gen` (PROTOCOL.md, "Remote
    /// reads"): answer `TierData`, or `Error` (`ESTALE` if the segment was rewritten
    /// since, `EINVAL` outside it, the tier's own errno, e.g. `ETIMEDOUT`).
    TierRead {
        tier: u8,
        seg: u64,
        gen: u64,
        off: u64,
        len: u32,
    },
    /// Take a backup of the whole store now, into the pool `remote` (`ceph:POOL`; `None`:
    /// the remote tier's pool, else `backup_remote` of `cairn.toml`): answer `BackedUp`
    /// once its manifest is written (docs/REMOTE.md, "Backup and restore").
    Backup { remote: Option<String> },
    /// A descriptor of the map object of file `ino` of generation `gen` (PROTOCOL.md,
    /// "Map objects"), which the daemon alone creates and removes. The client's records
    /// before `tail_lsn` are digested first, so the daemon checks the file as the
    /// client sees it. `create`: make the object from the file if there is none (needs
    /// the file's write lease). `write`: open it read-write, which needs the owner or
    /// write permission; otherwise read-only, which needs read permission or the owner.
    /// Answer `MapObject` followed by the descriptor ([`send_fds`]); `ENOENT` if there is
    /// no object and `create` is false.
    MapObject {
        ino: u64,
        gen: u64,
        write: bool,
        create: bool,
        tail_lsn: u64,
    },
    /// Remove the map object of `ino`/`gen` if nobody maps it (the daemon takes its
    /// `flock` exclusively; the caller holds the write lease and has written it back):
    /// `Ok` (also when there is none), or `EBUSY`.
    MapRemove { ino: u64, gen: u64 },
    /// A descriptor of a host object of segment `ino`/`gen` (docs/SPACEJMP.md, "Who may
    /// write what"), which the daemon alone creates and removes: its resident copy, or
    /// with `undo` its explicit-mode undo log. The client's records before `tail_lsn`
    /// are digested first; the client holds a lease on the file (so the shared area has
    /// its committed state). `write`: read-write, which needs the owner or write
    /// permission; otherwise read-only, which needs read permission or the owner. A
    /// missing resident copy is made from the segment's committed state (file and
    /// pending staged commit); a missing undo log is made empty, for a writer only.
    /// Answer `MapObject` followed by the descriptor.
    SjObject {
        ino: u64,
        gen: u64,
        undo: bool,
        write: bool,
        tail_lsn: u64,
    },
    /// Copy the committed state of segment `ino`/`gen` over `ranges` (byte offset,
    /// length; at most [`MAX_REFRESH_RANGES`]) of its resident copy, or over all of it if
    /// `ranges` is empty: the repair
    /// of a dead writer's work by a process that may only read the segment (it holds
    /// the segment's writer lock and a lease on the file). `Ok`.
    SjRefresh {
        ino: u64,
        gen: u64,
        ranges: Vec<(u64, u64)>,
        tail_lsn: u64,
    },
    /// Remove the resident copy of segment `ino`/`gen` (and with `undo` its undo log):
    /// the segment was removed (the daemon checks that `ino`/`gen` is gone), or it is
    /// evicted by a client that owns or may write it. `Ok`, also when there was none.
    SjDrop { ino: u64, gen: u64, undo: bool },
}

/// The most ranges one `SjRefresh` lists (a client with more asks for the whole copy).
pub const MAX_REFRESH_RANGES: usize = 1 << 16;

/// The most bytes one `TierRead` returns.
pub const MAX_TIER_READ: u32 = 4 << 20;

/// What `SjReserve` asks for: segment file `ino` of generation `gen` (at `path`) gets
/// `len` bytes at `base` (`None`: the first free range); `overlap`: it may share addresses
/// with other segments that allow it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SjReservation {
    pub ino: u64,
    pub gen: u64,
    pub path: String,
    pub base: Option<u64>,
    pub len: u64,
    pub overlap: bool,
}

/// A segment's range in the registry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SjRange {
    pub ino: u64,
    pub gen: u64,
    /// The segment's path when it was registered.
    pub path: String,
    pub base: u64,
    /// The segment's length, and the range it holds (rounded up to its alignment).
    pub len: u64,
    pub reserved: u64,
    pub overlap: bool,
}

/// What an `Xattr` request does.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum XattrOp {
    Get {
        name: Vec<u8>,
    },
    List,
    /// `flags`: `XATTR_CREATE` (fail with `EEXIST` if it exists) or `XATTR_REPLACE`
    /// (fail with `ENODATA` if it does not).
    Set {
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    Remove {
        name: Vec<u8>,
    },
}

/// A message from the daemon on a client's upcall channel.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Upcall {
    /// Give up the lease on `ino` (drop it and its cached state) and answer `UpcallAck`.
    Revoke { ino: u64 },
}

/// What a registered client needs to run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Registration {
    pub slot: u32,
    pub slot_gen: u64,
    pub head_lsn: u64,
    pub head_seq: u64,
    /// Path of the NVM tier file to map.
    pub nvm_path: String,
    /// Percentage of log fill at which LibFS asks for a digest.
    pub digest_threshold_pct: u32,
    pub inodes: Vec<u64>,
    pub credits: u64,
    /// The credentials the daemon saw on the socket.
    pub uid: u32,
    pub gid: u32,
    /// The store's logs are files of their own (format version 7): right after this
    /// response the daemon sends [`REGISTRATION_FDS`] descriptors ([`send_fds`]): the NVM
    /// file opened read-only, then this slot's log file opened read-write. The client
    /// maps them and opens neither by path.
    pub log_fds: bool,
}

/// Descriptors that follow a [`Registration`] with `log_fds`.
pub const REGISTRATION_FDS: usize = 2;

impl Response {
    /// How many descriptors the daemon sends right after this response ([`send_fds`]).
    pub fn fds_following(&self) -> usize {
        match self {
            Response::Registered(r) if r.log_fds => REGISTRATION_FDS,
            Response::MapObject { .. } => 1,
            _ => 0,
        }
    }
}

/// Send `fds` over a Unix stream socket (`SCM_RIGHTS`) with one byte of data, which the
/// peer reads with [`recv_fds`]; the descriptors stay open here.
pub fn send_fds(
    sock: &std::os::unix::net::UnixStream,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    use rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > 4 || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "at most 4 descriptors at a time",
        ));
    }
    let n = sendmsg(
        sock,
        &[io::IoSlice::new(&[0])],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if n != 1 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "descriptors not sent",
        ));
    }
    Ok(())
}

/// Receive exactly `n` descriptors that the peer sent with [`send_fds`] (close-on-exec);
/// `InvalidData` if the byte came without them, `UnexpectedEof` if the peer closed.
pub fn recv_fds(
    sock: &std::os::unix::net::UnixStream,
    n: usize,
) -> io::Result<Vec<std::os::fd::OwnedFd>> {
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let r = recvmsg(
        sock,
        &mut [io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    if r.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection instead of sending descriptors",
        ));
    }
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = msg {
            fds.extend(got);
        }
    }
    if fds.len() != n {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected {n} descriptors from the daemon, got {}",
                fds.len()
            ),
        ));
    }
    Ok(fds)
}

/// The daemon's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Response {
    Registered(Registration),
    Digested {
        head_lsn: u64,
        head_seq: u64,
    },
    Inodes(Vec<u64>),
    Credits {
        granted: u64,
    },
    Status(StatusReport),
    /// Answer to `Migrate`: bytes moved, and the bytes of tier `from` still in use.
    Migrated {
        bytes: u64,
        used_bytes: u64,
    },
    Ok,
    /// Answer to `Credentials`: what the daemon now checks the client's log with.
    Credentials {
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
    /// The lease asked for with `Lease` is granted.
    Leased {
        ino: u64,
        write: bool,
    },
    /// Answer to `Lease`: the inode is in shared-write mode. The client may read it from
    /// the shared area and changes it only through `Commit`.
    Mediated {
        ino: u64,
    },
    /// Answer to `Commit`: sealed and digested. `ended`: inodes whose shared-write mode
    /// ended (the client keeps a read lease on them).
    Committed {
        ended: Vec<u64>,
    },
    /// Answer to `Commit`: not sealed; the client runs the operation again. `ended`:
    /// inodes it claimed that are not in shared-write mode (it drops what it held on
    /// them and asks for a lease).
    Stale {
        ended: Vec<u64>,
    },
    /// Answer to `Xattr` get: the value.
    XattrValue(Vec<u8>),
    /// Answer to `Xattr` list: the names the caller may see, sorted.
    XattrNames(Vec<Vec<u8>>),
    /// Answer to `SjReserve`: the segment's base.
    SjReserved {
        base: u64,
    },
    /// Answer to `SjRanges`, sorted by base.
    SjRanges(Vec<SjRange>),
    /// Answer to `TierRead`: the bytes.
    TierData(Vec<u8>),
    /// Answer to `Backup`.
    BackedUp(BackupReport),
    /// Answer to `MapObject` and `SjObject`: one descriptor follows, read-write if
    /// `writable`.
    MapObject {
        writable: bool,
    },
    /// A failure, with a POSIX errno and a message.
    Error {
        errno: i32,
        message: String,
    },
}

/// One tier in a status report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TierStatus {
    pub name: String,
    pub capacity_bytes: u64,
    /// NVM: blocks in use; a lower tier: blocks of its segments in use (space is given
    /// out in whole segments).
    pub used_bytes: u64,
    /// Bytes of live data (and of replaced data waiting for its epoch).
    pub live_bytes: u64,
    /// `live_bytes / used_bytes` (1 when nothing is used).
    pub live_fraction: f64,
    /// Lower tiers: segments free and in use (0 for NVM).
    pub segments_free: u64,
    pub segments_used: u64,
    pub segment_bytes: u64,
    /// Bytes moved from this tier to the one below, into it from the one below, and
    /// copied by the cleaner within it (`TierTraffic`).
    pub bytes_migrated_down: u64,
    pub bytes_migrated_up: u64,
    pub bytes_cleaned: u64,
}

/// Migration and cleaning traffic of one tier since the store was created.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct TierTraffic {
    /// Bytes moved from this tier to the one below.
    pub bytes_migrated_down: u64,
    /// Bytes moved into this tier from the one below.
    pub bytes_migrated_up: u64,
    /// Bytes the cleaner copied within this tier.
    pub bytes_cleaned: u64,
}

/// A migration or cleaning in flight.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct MigrationStatus {
    /// "migrate" or "clean".
    pub kind: String,
    pub from: String,
    pub to: String,
    pub bytes_done: u64,
    pub bytes_planned: u64,
}

/// One client in a status report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClientStatus {
    pub slot: u32,
    pub pid: u32,
    pub uid: u32,
    pub log_capacity_bytes: u64,
    pub log_used_bytes: u64,
    /// `log_used_bytes / log_capacity_bytes`.
    pub log_fill: f64,
}

/// Digest counters since the store was created (persisted at clean stops) or the daemon
/// started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct DigestCounters {
    pub records_digested: u64,
    pub records_skipped: u64,
    pub log_bytes_written: u64,
    pub shared_bytes_written: u64,
    pub digests: u64,
}

/// Inode usage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct InodeStatus {
    pub capacity: u64,
    pub used: u64,
}

/// `cairn status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusReport {
    pub store: String,
    pub tiers: Vec<TierStatus>,
    pub inodes: InodeStatus,
    pub clients: Vec<ClientStatus>,
    pub digest: DigestCounters,
    pub sharing: SharingStatus,
    /// The migration or cleaning round in flight, if any.
    pub migration: Option<MigrationStatus>,
    /// Superpages of the NVM tier (absent from daemons before them).
    #[serde(default)]
    pub superpages: Option<Box<SuperpageStatus>>,
    /// The host files behind the store and the memory they hold (absent from daemons
    /// before them).
    #[serde(default)]
    pub host: Option<Box<HostStatus>>,
    /// The remote tier, if the store has one.
    #[serde(default)]
    pub remote: Option<Box<RemoteStatus>>,
    /// The newest backup this daemon took, if any.
    #[serde(default)]
    pub backup: Option<Box<BackupReport>>,
}

/// What a backup did (`cairn backup`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct BackupReport {
    /// `ceph:POOL`.
    pub url: String,
    /// The backup's number (1 for the store's first).
    pub seq: u64,
    /// The moment it holds (ns since the Unix epoch): every write acknowledged before.
    pub taken_ns: i64,
    /// Time the store's daemon was held while the snapshot was copied, and in all.
    pub snapshot_ms: u64,
    pub total_ms: u64,
    /// Objects (and bytes) written now; those the previous backup had that were kept.
    pub objects_written: u64,
    pub bytes_written: u64,
    pub objects_kept: u64,
    /// The backup's whole size: objects and bytes.
    pub objects: u64,
    pub bytes: u64,
    /// Objects of the previous backup no longer needed, removed.
    pub objects_removed: u64,
    /// The remote tier's segments it names (their objects stay while it is the newest).
    pub remote_segments: u64,
}

/// The remote tier in a status report (counters since the daemon started).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct RemoteStatus {
    /// `ceph:POOL`.
    pub url: String,
    /// Whether the daemon is connected to the cluster now.
    pub connected: bool,
    /// Objects the tier's segments in use are (every chunk of a segment is one).
    pub objects: u64,
    pub objects_written: u64,
    pub bytes_written: u64,
    pub objects_removed: u64,
    /// Objects no segment in use named (left by a crash or a given-up write), removed.
    pub orphans_removed: u64,
    /// Reads of the cluster and their bytes; blocks found in and missing from the
    /// daemon's cache.
    pub reads: u64,
    pub bytes_read: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Migration to the tier is paused (the cluster failed); it resumes by itself.
    pub paused: bool,
    /// The last failure and when (ns since the Unix epoch).
    pub last_error: Option<String>,
    pub last_error_ns: i64,
}

/// The host files of a store outside its directory: the NVM tier file and the host
/// objects in `/dev/shm` (map objects of shared mappings, FIFO and socket rendezvous).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct HostStatus {
    /// The NVM tier file.
    pub nvm_path: String,
    /// Its size, and the bytes its file system has allocated to it.
    pub nvm_size_bytes: u64,
    pub nvm_allocated_bytes: u64,
    /// Whether the NVM file is on tmpfs or ramfs: its allocated bytes are RAM (or swap),
    /// and its contents do not survive a reboot.
    pub nvm_in_ram: bool,
    /// Host objects of the store in `/dev/shm` (RAM), and the bytes they hold.
    pub host_objects: u64,
    pub host_object_bytes: u64,
    /// Of those: resident copies of segments (SpaceJMP), pinned in memory until evicted.
    #[serde(default)]
    pub resident_segments: u64,
    #[serde(default)]
    pub resident_segment_bytes: u64,
    /// The client log files beside the NVM file (format version 7; 0 before), and the
    /// bytes their file system allocated to them (RAM on tmpfs, as the NVM file's).
    #[serde(default)]
    pub log_files: u64,
    #[serde(default)]
    pub log_allocated_bytes: u64,
}

/// Superpages of the NVM tier (ARCHITECTURE.md, "Superpages").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct SuperpageStatus {
    /// Whether ranges are placed in and promoted to 2 MiB extents.
    pub enabled: bool,
    /// Why not, when not.
    pub off_reason: Option<String>,
    /// Whether the kernel backs extents with huge pages (else they use 4 KiB pages).
    pub huge_pages: bool,
    pub huge_pages_refusal: Option<String>,
    /// Bytes of file data ranges held in superpage extents.
    pub extent_bytes: u64,
    /// Free 2 MiB extents, and all the data region could hold.
    pub extents_free: u64,
    pub extents_total: u64,
    /// Since the store was made.
    pub promotions: u64,
    pub demotions: u64,
    pub bytes_promoted: u64,
    pub bytes_compacted: u64,
    /// Extents digests filled directly (a range written whole in one digest).
    pub placed: u64,
    /// Collapses the kernel refused since the daemon started.
    pub collapse_failures: u64,
    /// Ingens' free-memory fragmentation index of the tier: the share of free space
    /// that cannot serve a 2 MiB extent (0: none, 1: all).
    pub fragmentation_index: f64,
    /// Bytes of extents that hold no file data (past a file's end, or punched holes
    /// not yet demoted), and their share of `extent_bytes`.
    pub internal_fragmentation_bytes: u64,
    pub internal_fragmentation: f64,
    /// Ranges waiting to be looked at for promotion.
    pub candidates: u64,
    /// Extents waiting to be collapsed into huge folios.
    #[serde(default)]
    pub collapse_pending: u64,
}

/// Sharing between clients since the daemon started: shared-write mode and lease
/// revocations.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct SharingStatus {
    /// Inodes in shared-write mode now.
    pub mediated_inodes: u64,
    /// Times an inode entered the mode.
    pub mode_entries: u64,
    /// Transactions the daemon sealed for clients (`Commit`).
    pub commits: u64,
    /// `Commit`s answered `Stale` (run again by the client).
    pub stale_commits: u64,
    /// Leases revoked (an upcall to the holder; a writer's log digested before the lease
    /// moves).
    #[serde(default)]
    pub revocations: u64,
}

/// Write one framed message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    send_with(w, msg, &mut Vec::new())
}

/// [`send`] through `buf`, which a caller may reuse so that sending does not allocate
/// once it is large enough.
pub fn send_with<T: Serialize>(w: &mut impl Write, msg: &T, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    buf.extend_from_slice(&[0; 4]);
    *buf = postcard::to_extend(msg, std::mem::take(buf))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let len = buf.len() - 4;
    if len as u64 > MAX_FRAME as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message too large",
        ));
    }
    buf[..4].copy_from_slice(&(len as u32).to_le_bytes());
    w.write_all(buf)
}

/// Read one framed message; `UnexpectedEof` when the peer closed the connection.
pub fn recv<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<T> {
    recv_with(r, &mut Vec::new())
}

/// [`recv`] through a reusable `buf`.
pub fn recv_with<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
) -> io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is too large"),
        ));
    }
    buf.clear();
    let len = len as usize;
    if len <= EAGER_FRAME {
        buf.resize(len, 0);
        r.read_exact(buf)?;
    } else {
        // Room for what arrives, not for what the frame announces: a peer that announces
        // 16 MiB and sends 10 bytes costs 10 bytes.
        let mut chunk = [0u8; 8192];
        while buf.len() < len {
            let want = (len - buf.len()).min(chunk.len());
            let n = r.read(&mut chunk[..want])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("frame cut short at {} of {len} bytes", buf.len()),
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    postcard::from_bytes(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, Undecodable(e.to_string())))
}

/// What [`recv`] fails with when a whole frame arrived but its content does not decode:
/// the peer speaks another version of the protocol (a client and a daemon of different
/// builds). The stream is still in step, so the daemon answers it (`EPROTO`).
#[derive(Debug)]
pub struct Undecodable(pub String);

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a message that does not decode ({})", self.0)
    }
}

impl std::error::Error for Undecodable {}

/// Whether `e` is [`recv`]'s [`Undecodable`].
pub fn undecodable(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Undecodable>())
}

/// Why a client and a daemon do not understand each other, and what to do.
pub fn version_mismatch(who: &str, e: &io::Error) -> String {
    format!(
        "{who} sent {e}: the program and the store's daemon are different builds of Cairn; \
         stop the daemon (`cairn stop`) so that the next command starts the program's own"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_garbage() {
        let mut buf = Vec::new();
        send(
            &mut buf,
            &Request::Digest {
                upto_lsn: 99,
                wait: true,
            },
        )
        .unwrap();
        send(
            &mut buf,
            &Response::Error {
                errno: 28,
                message: "full".into(),
            },
        )
        .unwrap();
        let mut r = &buf[..];
        assert_eq!(
            recv::<Request>(&mut r).unwrap(),
            Request::Digest {
                upto_lsn: 99,
                wait: true
            }
        );
        assert!(matches!(
            recv::<Response>(&mut r).unwrap(),
            Response::Error { errno: 28, .. }
        ));
        assert_eq!(
            recv::<Request>(&mut r).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
        let garbage = [5u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert!(recv::<Request>(&mut &garbage[..]).is_err());
        let huge = [0xffu8, 0xff, 0xff, 0xff];
        assert!(recv::<Request>(&mut &huge[..]).is_err());
    }
}
