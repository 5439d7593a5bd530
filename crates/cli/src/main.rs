//! `cairn`: the command-line interface of the Cairn file system.
//!
//! Store administration (`mkfs`, `daemon`, `status`, `stop`), file operations inside a
//! store (`put`, `get`, `cat`, `ls`, `mkdir`, `rm`, `mv`, `ln`, `stat`) and the latency
//! benchmark (`bench latency`). Errors print `cairn: <message>` on stderr and exit with 1;
//! usage errors exit with 2.

#![forbid(unsafe_code)]

mod bench;
mod commands;
mod error;
mod progress;
mod util;

use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

/// Cairn: a Strata-style file system with a per-process NVM operation log.
#[derive(Debug, Parser)]
#[command(name = "cairn", version, max_term_width = 100)]
pub struct Cli {
    /// Store directory [default: $CAIRN_STORE, else the default store, created on first use]
    #[arg(long, global = true, value_name = "DIR")]
    pub store: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new store (configuration file and NVM tier file)
    Mkfs(MkfsArgs),
    /// Remove a store: stop its daemon, delete its NVM file, its host objects in
    /// /dev/shm, its lower-tier files and its directory, and say what that freed
    Rmfs {
        /// Also when clients are attached (they lose the store)
        #[arg(long)]
        force: bool,
        /// Print what was removed as JSON
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon (cairnd) of a store
    Daemon(DaemonArgs),
    /// Copy a host file (or stdin with `-`) into the store
    Put {
        /// Host file, or `-` for standard input
        src: PathBuf,
        /// Destination in the store (an existing directory receives SRC's file name)
        dst: PathBuf,
    },
    /// Copy a file from the store to the host (or stdout with `-`)
    Get {
        /// File in the store
        src: PathBuf,
        /// Host destination, or `-` for standard output (an existing directory receives
        /// SRC's file name)
        dst: PathBuf,
    },
    /// Print files of the store on standard output
    Cat {
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// List a directory of the store (default: /)
    Ls {
        /// Long format: mode, links, owner, group (names where the host knows them), size,
        /// mtime (UTC), name, symlink target
        #[arg(short = 'l')]
        long: bool,
        /// Show entries whose names start with `.`
        #[arg(short = 'a')]
        all: bool,
        path: Option<PathBuf>,
    },
    /// Create directories
    Mkdir {
        /// Create missing parents; no error if the directory exists
        #[arg(short = 'p', long = "parents")]
        parents: bool,
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Remove files, symlinks and (with -r) directories
    Rm {
        /// Remove directories and their contents
        #[arg(short = 'r', short_alias = 'R', long = "recursive")]
        recursive: bool,
        /// Ignore nonexistent paths
        #[arg(short = 'f', long = "force")]
        force: bool,
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Rename or move a file or directory (atomic); into B if B is a directory
    Mv { from: PathBuf, to: PathBuf },
    /// Make a hard link, or with -s a symbolic link, LINK pointing to TARGET
    Ln {
        /// Make a symbolic link
        #[arg(short = 's', long = "symbolic")]
        symbolic: bool,
        target: PathBuf,
        link: PathBuf,
    },
    /// Show a file's metadata, like stat(1)
    Stat {
        /// Follow a symlink given as PATH
        #[arg(short = 'L', long = "dereference")]
        dereference: bool,
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
    },
    /// Show tier usage, inodes, clients and digest counters
    Status {
        /// Print the status report as JSON
        #[arg(long)]
        json: bool,
    },
    /// Stop the store's daemon cleanly (digests every log first)
    Stop,
    /// Check a stopped store (exit 0 clean, 1 errors corrected, 4 errors left, 8 could not
    /// check)
    Fsck {
        /// Print the report as JSON
        #[arg(long)]
        json: bool,
        /// Repair what can be repaired: recover an unclean store, fix link counts,
        /// rebuild a wrong allocation state
        #[arg(long)]
        repair: bool,
    },
    /// Move the coldest data of a tier to the tier below now (in whole segments)
    Migrate {
        /// The tier to drain: nvm, ssd or hdd
        #[arg(long, value_name = "TIER")]
        tier: String,
        /// The tier to move to, which must be the next one below the store has (ssd,
        /// hdd or remote) [default: that one]
        #[arg(long, value_name = "TIER")]
        to: Option<String>,
        /// Bytes to move [default: down to the low watermark]
        #[arg(long, value_name = "BYTES", value_parser = util::parse_size)]
        free: Option<u64>,
    },
    /// Back up the whole store into a Ceph RADOS pool now (docs/REMOTE.md)
    Backup {
        /// The pool: ceph:POOL [default: the remote tier's, else backup_remote of
        /// cairn.toml]
        #[arg(long, value_name = "ceph:POOL")]
        remote: Option<String>,
        /// Print the report as JSON
        #[arg(long)]
        json: bool,
    },
    /// Rebuild a store on this machine from its newest backup in a Ceph RADOS pool
    Restore {
        /// The pool: ceph:POOL
        #[arg(long, value_name = "ceph:POOL")]
        remote: String,
        /// The Ceph configuration file [default: /etc/ceph/ceph.conf]
        #[arg(long, value_name = "PATH")]
        ceph_conf: Option<PathBuf>,
        /// The Ceph user [default: admin]
        #[arg(long, value_name = "NAME")]
        ceph_user: Option<String>,
        /// The store to restore (its id, or a prefix of it) [default: the pool's only one]
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// The new NVM file [default: /dev/shm/cairn-<random>.nvm]
        #[arg(long, value_name = "PATH")]
        nvm_path: Option<PathBuf>,
        /// The new SSD tier file [default: ssd.tier in the store]
        #[arg(long, value_name = "PATH")]
        ssd: Option<PathBuf>,
        /// The new HDD tier file [default: hdd.tier in the store]
        #[arg(long, value_name = "PATH")]
        hdd: Option<PathBuf>,
        /// List the backups in the pool instead
        #[arg(long)]
        list: bool,
        /// Restore even if the store's daemon said it runs less than a minute ago
        #[arg(long)]
        force: bool,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Compact a lower tier now: move the live data of partly dead segments together
    /// until no round frees a segment
    Clean {
        /// The tier to clean: ssd or hdd
        #[arg(long, value_name = "TIER")]
        tier: String,
    },
    /// Mount the store with FUSE at MOUNTPOINT, so that every program can use it
    Mount {
        /// Serve in this process until unmounted (default: in the background)
        #[arg(long)]
        foreground: bool,
        /// Seconds the kernel may cache a file's attributes (dropped at once when
        /// another client changes the file, through the mount's lease; 0: not cached)
        #[arg(long, value_name = "SECS", default_value_t = 60.0,
              value_parser = parse_timeout)]
        attr_timeout: f64,
        /// Seconds the kernel may cache names (dropped when another client changes the
        /// directory, through the mount's lease; 0: every lookup asks the mount)
        #[arg(long, value_name = "SECS", default_value_t = 60.0,
              value_parser = parse_timeout)]
        entry_timeout: f64,
        mountpoint: PathBuf,
    },
    /// Unmount a FUSE mount of a store
    Umount { mountpoint: PathBuf },
    /// Run a command with libcairn_preload.so, so that its file calls under PREFIX go to
    /// the store (starts the daemon if needed)
    Run {
        /// Paths under this directory are the store's root
        #[arg(long, value_name = "PREFIX", default_value = "/cairn")]
        prefix: PathBuf,
        /// Start the command's main thread in this address space (SpaceJMP; a name or a
        /// path of the store); its stores to the segments are committed at exit
        #[arg(long, value_name = "NAME")]
        vas: Option<String>,
        /// With --vas: drop the stores not committed (by msync) at exit instead
        #[arg(long, requires = "vas")]
        vas_abort_on_exit: bool,
        /// The command and its arguments (after `--`)
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<std::ffi::OsString>,
    },
    /// Benchmarks
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// SpaceJMP: persistent segments at fixed addresses and address spaces that
    /// processes attach and switch between (docs/SPACEJMP.md)
    Sj {
        #[command(subcommand)]
        which: SjCommand,
    },
    /// Genomics data sets in address spaces: SAM/BAM loaded once into a segment, and
    /// samtools-like tools that switch into it (docs/SPACEJMP.md)
    Sam {
        #[command(subcommand)]
        which: SamCommand,
    },
    /// The persistent key-value store (cairn-kv) and its Redis-compatible server
    Kv {
        #[command(subcommand)]
        which: KvCommand,
    },
    /// Huge pages for ordinary processes (Ingens): promote well-used 2 MiB regions of
    /// the watched processes, fairly; `cairn hugepaged status` shows what it did
    Hugepaged(HugepagedArgs),
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct HugepagedArgs {
    #[command(subcommand)]
    pub status: Option<HugepagedCommand>,
    /// Watch this process (repeatable)
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Watch the processes of this cgroup (its cgroup.procs, read every interval)
    #[arg(long, value_name = "PATH", conflicts_with = "pids")]
    pub cgroup: Option<PathBuf>,
    /// Watch every process
    #[arg(long, conflicts_with_all = ["pids", "cgroup"])]
    pub all: bool,
    /// Promote a region once this fraction of its base pages is present
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub threshold: f64,
    /// Promotions per second at most, in MiB
    #[arg(long, value_name = "MIB", default_value_t = 256.0)]
    pub rate: f64,
    /// CPU use at most, as a fraction of one core on average (scans and the kernel's
    /// copies for promotions count)
    #[arg(long, value_name = "F", default_value_t = 0.5)]
    pub cpu: f64,
    /// Share of a process, PID=S (repeatable; default: 100 x its cgroup's cpu.weight, or
    /// 10000 x cpu.shares/1024 under cgroup v1, else 10000)
    #[arg(long = "share", value_name = "PID=S")]
    pub shares: Vec<String>,
    /// Idleness penalty τ of the promotion metric, in (0, 1] (1: none)
    #[arg(long, value_name = "T", default_value_t = 0.5)]
    pub tau: f64,
    /// Seconds between scans
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub interval: f64,
    /// Do not track accesses (no clear_refs: every region counts as busy)
    #[arg(long)]
    pub no_access: bool,
    /// Ask the kernel to compact memory when the fragmentation index passes 0.8
    #[arg(long)]
    pub compact: bool,
    /// Decide and report, but promote nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Stop after this many seconds (default: until SIGINT/SIGTERM)
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Where the daemon writes its status every interval
    #[arg(long, value_name = "PATH", default_value = "/run/cairn-hugepaged.json")]
    pub status_file: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum HugepagedCommand {
    /// What the running daemon did, per process
    Status {
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "PATH", default_value = "/run/cairn-hugepaged.json")]
        status_file: PathBuf,
    },
    /// Simulate Linux's, FreeBSD's and Ingens' policies on a synthetic trace: `redis`
    /// (objects written, 70% deleted) or `fairness` (two processes, scarce huge pages),
    /// or on a trace recorded from real processes (`--trace`)
    Simulate {
        #[arg(long, default_value = "redis", value_parser = ["redis", "fairness"])]
        scenario: String,
        /// Redis: objects of 8 KiB
        #[arg(long, value_name = "N", default_value_t = 65_536)]
        objects: u64,
        /// Redis: fraction of the deleted objects whose pages the allocator gives back
        #[arg(long, value_name = "F", default_value_t = 1.0)]
        purged: f64,
        /// Replay a trace recorded by `cairn hugepaged record` instead of a scenario
        #[arg(long, value_name = "PATH")]
        trace: Option<PathBuf>,
        /// Print every interval's figures as JSON
        #[arg(long)]
        json: bool,
    },
    /// Record which base pages of the processes' 2 MiB regions are present (and which
    /// regions are accessed) every interval, for `simulate --trace`
    Record {
        /// A process to record (repeatable)
        #[arg(long = "pid", value_name = "PID", required = true)]
        pids: Vec<u32>,
        /// The trace file to write (one JSON interval per line)
        #[arg(long, value_name = "PATH")]
        out: PathBuf,
        /// Seconds between snapshots
        #[arg(long, value_name = "SECS", default_value_t = 2.0)]
        interval: f64,
        /// Stop after this many seconds (default: when the processes have exited, or
        /// at SIGINT/SIGTERM)
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Do not track accesses (no clear_refs)
        #[arg(long)]
        no_access: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SjCommand {
    /// Segments: named files of the store at fixed addresses
    Seg {
        #[command(subcommand)]
        which: SjSegCommand,
    },
    /// Address spaces: named sets of segments, with what each grants
    Vas {
        #[command(subcommand)]
        which: SjVasCommand,
    },
    /// Every segment's lock: the writer, the readers, waiters, dead owners taken over,
    /// commits, and a commit being published
    Locks {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SamCommand {
    /// Write synthetic paired-end reads as SAM (deterministic: the same seed and count
    /// give the same file), and as BAM with --bam
    Gen {
        /// The SAM file to write
        out: PathBuf,
        /// Records to write
        #[arg(long, value_name = "N", default_value_t = 8_000_000,
              value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
        reads: u64,
        #[arg(long, value_name = "N", default_value_t = 1)]
        seed: u64,
        /// Also write it as BAM here
        #[arg(long, value_name = "FILE")]
        bam: Option<PathBuf>,
    },
    /// Load a SAM or BAM file as data set NAME (a segment and its address spaces), in
    /// one commit
    Load {
        file: PathBuf,
        /// The data set's name
        #[arg(long)]
        name: String,
        /// Permission bits of its segment and address spaces (octal)
        #[arg(long, value_name = "MODE", default_value = "0600")]
        mode: String,
    },
    /// samtools flagstat of a data set
    Flagstat { name: String },
    /// Sort a data set (the order is kept in it, in one commit)
    Sort {
        name: String,
        /// name (samtools sort -n) or coord (samtools sort)
        #[arg(long, value_name = "ORDER", default_value = "coord")]
        by: String,
        /// Print the order: each record's name, flag, reference and position
        #[arg(long)]
        print: bool,
    },
    /// Index a data set's coordinate order (sort --by coord first)
    Index { name: String },
    /// The records of a data set overlapping REGION (NAME, NAME:BEG or NAME:BEG-END,
    /// 1-based, as samtools view), through its index
    View {
        name: String,
        region: String,
        /// Print their count only (samtools view -c)
        #[arg(short = 'c', long)]
        count: bool,
    },
    /// A data set's reads, references and roots
    Info { name: String },
    /// List the data sets
    Ls,
    /// Remove a data set
    Rm { name: String },
}

#[derive(Debug, Subcommand)]
pub enum SjSegCommand {
    /// Make a segment (NAME: a name under /.sj/seg, or a path of the store)
    Create {
        name: String,
        /// Its length (e.g. 64M, 1G; 128K at least)
        #[arg(long, value_name = "SIZE", value_parser = util::parse_size)]
        size: u64,
        /// Its base address in the segment window (hex), or `auto` for the first free
        /// range
        #[arg(long, value_name = "ADDR|auto", default_value = "auto")]
        base: String,
        /// Switching into an address space with it takes its lock (readers or a writer)
        #[arg(long)]
        lockable: bool,
        /// It may share addresses with other segments that allow it
        #[arg(long)]
        overlap: bool,
        /// Read-only: no address space may grant writes
        #[arg(long)]
        read_only: bool,
        /// Permission bits of its file (octal)
        #[arg(long, value_name = "MODE", default_value = "0640")]
        mode: String,
    },
    /// List the store's segments
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show a segment: range, flags, commits, resident memory, attached processes,
    /// dead writers taken over
    Stat {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove a segment (refused while a process has it attached)
    Rm { name: String },
    /// Drop a segment's resident copy from memory (the next attach rebuilds it)
    Evict { name: String },
}

#[derive(Debug, Subcommand)]
pub enum SjVasCommand {
    /// Make an empty address space (NAME: a name under /.sj/vas, or a path)
    Create {
        name: String,
        #[arg(long, value_name = "MODE", default_value = "0640")]
        mode: String,
    },
    /// Add a segment to an address space
    Add {
        name: String,
        seg: String,
        /// What the address space grants: r or rw
        #[arg(long, default_value = "rw", value_parser = ["r", "rw"])]
        prot: String,
    },
    /// Remove a segment from an address space
    RmSeg { name: String, seg: String },
    /// Show an address space's segments
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List the address spaces under /.sj/vas
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Make a new address space with the segments of another
    Clone { src: String, dst: String },
    /// Remove an address space (its segments stay)
    Rm { name: String },
}

#[derive(Debug, Args)]
pub struct KvPoolArgs {
    /// Pool file
    #[arg(long, value_name = "PATH", default_value = "/dev/shm/cairn-kv.pool")]
    pub pool: PathBuf,
    /// Port of the server that has the pool open, used when it is (127.0.0.1)
    #[arg(long, default_value_t = 6379)]
    pub port: u16,
}

#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// Serve a pool over the Redis protocol (RESP 2 and 3) until SIGINT or SIGTERM
    Serve(KvServeArgs),
    /// A pool's figures: keys, live data, memory, compaction, segment utilization
    Status {
        #[command(flatten)]
        at: KvPoolArgs,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Print a key's value on standard output
    Get {
        key: String,
        #[command(flatten)]
        at: KvPoolArgs,
    },
    /// Set a key (VALUE, or standard input with `-`)
    Put {
        key: String,
        value: String,
        #[command(flatten)]
        at: KvPoolArgs,
    },
    /// Remove a key
    Del {
        key: String,
        #[command(flatten)]
        at: KvPoolArgs,
    },
}

#[derive(Debug, Args)]
pub struct KvServeArgs {
    /// Pool file (created if missing)
    #[arg(long, value_name = "PATH", default_value = "/dev/shm/cairn-kv.pool")]
    pub pool: PathBuf,
    /// Size of a new pool (e.g. 256M, 4G)
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size, default_value = "1G")]
    pub size: u64,
    /// TCP port
    #[arg(long, default_value_t = 6379)]
    pub port: u16,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Worker threads [default: one per CPU]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Update values in place when they fit (Nibble-2) instead of appending (Nibble)
    #[arg(long, conflicts_with = "shared")]
    pub in_place: bool,
    /// Keep the data in memory only (no pool file, no fences, nothing kept at exit)
    #[arg(long, conflicts_with = "shared")]
    pub volatile: bool,
    /// Open the pool shared: other processes (`cairn kv get`/`put`/`del`, programs that
    /// open it with `Store::open_shared` or `cairn_kv_open_shared`) read and write it at
    /// the same time, in their own process
    #[arg(long)]
    pub shared: bool,
    /// Keys the index is sized for [default: one per KiB of pool]
    #[arg(long, value_name = "N")]
    pub expected_keys: Option<u64>,
    /// Background compaction runs while fewer than this fraction of segments are free
    #[arg(long, value_name = "F", default_value_t = 0.2)]
    pub compact_below: f64,
    /// Background compaction also runs while more than this fraction of the bytes of
    /// the segments in use is dead, and free segments give their memory back (bounds
    /// memory over live data; costs compaction traffic) [default: the pool's size is
    /// the bound]
    #[arg(long, value_name = "F")]
    pub max_garbage: Option<f64>,
}

#[derive(Debug, Args)]
pub struct MkfsArgs {
    /// Size of the NVM tier file (e.g. 256M, 2G) [default: 2G]
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size)]
    pub nvm_size: Option<u64>,
    /// Path of the NVM tier file [default: /dev/shm/cairn-<uuid>.nvm]
    #[arg(long, value_name = "PATH")]
    pub nvm_path: Option<PathBuf>,
    /// Size of each client's operation log [default: 32M]
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size)]
    pub log_size: Option<u64>,
    /// Log slots, i.e. clients registered at once [default: 8]
    #[arg(long, value_name = "N")]
    pub max_clients: Option<u32>,
    /// Inode table entries [default: one per 8 KiB of NVM]
    #[arg(long, value_name = "N")]
    pub inodes: Option<u64>,
    /// Log fill (percent) at which LibFS asks for a digest [default: 30]
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub digest_threshold: Option<u32>,
    /// Overwrite an existing store
    #[arg(long)]
    pub force: bool,
    /// The on-media format version to write: 5 or 6 make a store older builds read (before
    /// 7 the client logs are in the NVM file, which every trusted client opens
    /// read-write: no isolation by the kernel) [default: 7, the current one]
    #[arg(long, value_name = "N")]
    pub format_version: Option<u32>,
    /// Also trust members of this group (name or gid): they may map the store directly
    /// [default: only root and the owner]
    #[arg(long, value_name = "NAME|GID")]
    pub trusted_group: Option<String>,
    /// SSD tier: a file (created) or a block device
    #[arg(long, value_name = "PATH")]
    pub ssd: Option<PathBuf>,
    /// Size of the SSD tier [default: the size of the existing file or device]
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size, requires = "ssd")]
    pub ssd_size: Option<u64>,
    /// HDD tier: a file (created) or a block device (needs --ssd)
    #[arg(long, value_name = "PATH", requires = "ssd")]
    pub hdd: Option<PathBuf>,
    /// Size of the HDD tier [default: the size of the existing file or device]
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size, requires = "hdd")]
    pub hdd_size: Option<u64>,
    /// Segment size of the lower tiers, the unit they are written and cleaned in
    /// [default: 64M on the SSD, 256M on the HDD, 64M on the remote tier]
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size)]
    pub segment_size: Option<u64>,
    /// Remote tier below the local ones: ceph:POOL, a RADOS pool that exists
    #[arg(long, value_name = "ceph:POOL")]
    pub remote: Option<String>,
    /// The Ceph configuration file naming the monitors and the keyring
    /// [default: /etc/ceph/ceph.conf]
    #[arg(long, value_name = "PATH", requires = "remote")]
    pub ceph_conf: Option<PathBuf>,
    /// The Ceph user to connect as [default: admin]
    #[arg(long, value_name = "NAME", requires = "remote")]
    pub ceph_user: Option<String>,
    /// Size of the remote tier: the most data it holds [default: 256G]
    #[arg(long, value_name = "SIZE", value_parser = util::parse_size, requires = "remote")]
    pub remote_size: Option<u64>,
    /// Emulate slower media (for experiments): `strata` (NVM with 300 ns reads and 1/8
    /// of this machine's memory bandwidth, an NVMe SSD, an HDD) [default: off]
    #[arg(long, value_name = "PROFILE")]
    pub emulate: Option<String>,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Detach once the socket is listening (log to DIR/cairnd.log)
    #[arg(long)]
    pub background: bool,
    /// Create the store with the default configuration if it does not exist
    #[arg(long)]
    pub create: bool,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Durable write and read latency: Cairn vs the host file system vs tmpfs
    Latency(bench::LatencyArgs),
    /// Two processes updating a file through a lock file (Strata's sharing worst case),
    /// and 1-2 client scaling of private writes
    Share(bench::ShareArgs),
    /// SQLite, RocksDB and Redis on Cairn (FUSE mount), the host file system and tmpfs
    Apps(bench::AppsArgs),
    /// Cairn across NVM, SSD and HDD (a three-tier store made for the run) against the
    /// host file system: multi-layer appends, a Zipfian mix, write amplification
    Tiers(bench::TiersArgs),
    /// The remote tier and backups on Ceph clusters started for the run (1 and 3 OSDs):
    /// migration against `rados bench`, cold reads against raw librados, backup lag and
    /// restore, an OSD killed during migration
    Remote(bench::RemoteArgs),
    /// Superpage extents of the NVM tier against 4 KiB blocks and tmpfs: random loads,
    /// copies and reads, page faults to map; the promotion of a file
    Superpages(bench::SuperpagesArgs),
    /// The key-value store: embedded YCSB-style mixes (append and in-place), and
    /// `cairn kv serve` against redis-server under redis-benchmark
    Kv(bench::KvArgs),
    /// Huge pages for ordinary processes: base pages, Linux's greedy policy and `cairn
    /// hugepaged` on TLB-bound loops, Ingens' Redis bloat experiment, redis-benchmark GET,
    /// two processes sharing a promotion budget
    Hugepage(bench::HugepageArgs),
    /// SpaceJMP on Cairn against malloc, PMDK and Boost.Interprocess: switch latency,
    /// attach cost, commits, pointer chasing, writers killed during commits
    Spacejmp(bench::SpacejmpArgs),
    /// Filebench's varmail flow (a mail server: small files appended, fsync'd, read and
    /// deleted by 16 threads) through the shim, on the host file system and on tmpfs,
    /// and what the digest skipped and wrote
    Mail(bench::MailArgs),
    /// One worker process of `bench mail` (started by it)
    #[command(hide = true)]
    MailWorker(bench::MailWorkerArgs),
    /// One worker process of `bench spacejmp` (started by it)
    #[command(hide = true)]
    SpacejmpWorker(bench::SpacejmpWorkerArgs),
    /// One client process of `bench spacejmp kv` (started by it)
    #[command(hide = true)]
    KvSharedWorker(bench::KvSharedWorkerArgs),
    /// One worker process of `bench hugepage` (started by it)
    #[command(hide = true)]
    HugepageWorker(bench::HugepageWorkerArgs),
    /// One worker process of `bench share` (started by it)
    #[command(hide = true)]
    ShareWorker(bench::ShareWorkerArgs),
    /// One churn run of `bench kv` (started by it)
    #[command(hide = true)]
    KvChurnWorker(bench::KvChurnWorkerArgs),
}

fn parse_timeout(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: a number of seconds from 0 to 3600")),
    }
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                std::process::exit(0);
            }
            let text = e.render().to_string();
            let text = text.trim_end();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // `cairn` alone: the help, on stderr, as a usage error.
                let _ = writeln!(std::io::stderr(), "{text}");
            } else {
                let text = text.strip_prefix("error: ").unwrap_or(text);
                let _ = writeln!(std::io::stderr(), "cairn: {text}");
            }
            std::process::exit(2);
        }
    };
    // `run` returns before exiting so that every `Fs` is dropped (and says goodbye to the
    // daemon) first.
    let code = match commands::run(cli) {
        Ok(()) => 0,
        Err(e) => {
            // One line per error, ending with a newline whatever the message ends with.
            let message = e.message.trim_end();
            if !message.is_empty() {
                let _ = writeln!(std::io::stderr(), "cairn: {message}");
            }
            e.code
        }
    };
    std::process::exit(code);
}
