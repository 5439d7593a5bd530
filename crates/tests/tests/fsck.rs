//! `cairn fsck`: each class of damage, written into a stopped store's NVM file, is found
//! (exit 4), and repaired where `--repair` promises it (exit 1, then 0); bad input is an
//! operational error (exit 8), never a panic.

use cairn_format::inode::{current_copy, Inode, COPY_OFF, INODE_BYTES};
use cairn_format::superblock::{Layout, Superblock};
use cairn_format::BLOCK_SIZE;
use cairn_tests::harness::{cairn_bin, StoreSize};
use cairn_tests::TestStore;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;

/// A stopped store holding a few files: its NVM file, layout and the inode numbers of
/// `/a` (two names: `/a` and `/b`), `/d` and `/d/f`.
struct Damaged {
    store: TestStore,
    nvm: File,
    l: Layout,
    a: u64,
    d: u64,
    f: u64,
}

fn store() -> Damaged {
    store_of_format(None)
}

/// [`store`] in on-media format `version` (`None`: the current one).
fn store_of_format(version: Option<u32>) -> Damaged {
    let size = StoreSize {
        nvm: "8M",
        log: "512K",
        clients: 2,
        inodes: Some(1024),
        tiers: None,
    };
    let store = TestStore::with_format(size, version);
    let (a, d, f) = {
        let fs = store.fs();
        fs.write("/a", vec![1u8; 10_000]).unwrap();
        fs.hard_link("/a", "/b").unwrap();
        fs.create_dir("/d").unwrap();
        fs.write("/d/f", vec![2u8; 5_000]).unwrap();
        fs.symlink("a", "/s").unwrap();
        (
            fs.metadata("/a").unwrap().ino(),
            fs.metadata("/d").unwrap().ino(),
            fs.metadata("/d/f").unwrap().ino(),
        )
    };
    store.stop();
    let (nvm, l) = nvm_and_layout(&store);
    Damaged {
        store,
        nvm,
        l,
        a,
        d,
        f,
    }
}

/// A stopped store's NVM file (read-write) and its layout.
fn nvm_and_layout(store: &TestStore) -> (File, Layout) {
    let cfg = cairn_area::StoreDir::new(store.path())
        .load_config()
        .unwrap();
    let nvm = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cfg.nvm_path)
        .unwrap();
    let mut sb = vec![0u8; BLOCK_SIZE];
    nvm.read_exact_at(&mut sb, 0).unwrap();
    let l = Superblock::decode(&sb, nvm.metadata().unwrap().len())
        .unwrap()
        .layout;
    (nvm, l)
}

impl Damaged {
    fn inode(&self, ino: u64) -> Inode {
        let mut b = [0u8; INODE_BYTES];
        self.nvm
            .read_exact_at(&mut b, self.l.inode_off(ino))
            .unwrap();
        Inode::decode(&b).unwrap()
    }

    /// Overwrite the current copy of inode `ino` (a valid, checksummed copy).
    fn set_inode(&self, ino: u64, i: &Inode) {
        let off = self.l.inode_off(ino);
        let mut seq = [0u8; 8];
        self.nvm.read_exact_at(&mut seq, off).unwrap();
        let c = current_copy(u64::from_le_bytes(seq));
        self.nvm
            .write_all_at(&i.encode_copy(), off + COPY_OFF[c] as u64)
            .unwrap();
    }

    /// Flip the saved allocation bit of data block `blk`, keeping the header valid.
    fn flip_block_bit(&self, blk: u64) {
        let l = &self.l;
        let boff = (l.alloc_start + 1) * BLOCK_SIZE as u64;
        let mut bm = vec![0u8; l.alloc_bitmap_bytes()];
        self.nvm.read_exact_at(&mut bm, boff).unwrap();
        let i = blk - l.data_start;
        bm[(i / 8) as usize] ^= 1 << (i % 8);
        self.nvm.write_all_at(&bm, boff).unwrap();
        let hdr = cairn_format::alloc::encode_header(l.data_blocks, l.inode_count, &bm);
        self.nvm
            .write_all_at(&hdr, l.alloc_start * BLOCK_SIZE as u64)
            .unwrap();
    }

    fn fsck(&self, args: &[&str]) -> (i32, String) {
        fsck_at(self.store.path().into(), args)
    }

    /// Run `fsck args`: it exits with `code` and says each of `says`.
    fn expect(&self, args: &[&str], code: i32, says: &[&str]) {
        let (got, text) = self.fsck(args);
        assert_eq!(got, code, "fsck {args:?}: {text}");
        for s in says {
            assert!(text.contains(s), "fsck {args:?} does not say {s:?}: {text}");
        }
    }
}

fn fsck_at(store: PathBuf, args: &[&str]) -> (i32, String) {
    let out = Command::new(cairn_bin())
        .arg("--store")
        .arg(&store)
        .arg("fsck")
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("panicked"), "fsck panicked: {text}");
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn a_healthy_store_is_clean() {
    let s = store();
    s.expect(&[], 0, &["clean"]);
    let (code, text) = s.fsck(&["--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["directories"], 2);
    assert!(v["problems"].as_array().unwrap().is_empty());
}

#[test]
fn wrong_link_counts_are_found_and_repaired() {
    let s = store();
    let mut a = s.inode(s.a);
    a.attrs.nlink = 1;
    s.set_inode(s.a, &a);
    let mut d = s.inode(s.d);
    d.attrs.nlink = 7;
    s.set_inode(s.d, &d);
    s.expect(
        &[],
        4,
        &["link count 1 but 2 names", "link count 7 but 2 names"],
    );
    s.expect(&["--repair"], 1, &[]);
    assert_eq!(s.fsck(&[]).0, 0);
    assert_eq!(s.inode(s.a).attrs.nlink, 2);
}

#[test]
fn leaked_and_lost_blocks_are_found_and_the_allocation_state_rebuilt() {
    let s = store();
    // A block nobody references marked in use (leaked), and one of /d/f's blocks marked
    // free (it would be handed out again).
    // (The middle of the data region: data is allocated from its start, metadata from
    // its end.)
    s.flip_block_bit(s.l.data_start + s.l.data_blocks / 2);
    let f = s.inode(s.f);
    let node = f.map_root;
    s.flip_block_bit(node);
    s.expect(
        &[],
        4,
        &[
            "1 NVM data blocks marked in use but not referenced",
            "1 NVM data blocks referenced but marked free",
        ],
    );
    s.expect(&["--repair"], 1, &["allocation state rebuilt"]);
    s.expect(&[], 0, &[]);
    // The data is intact.
    let fs = s.store.fs();
    assert_eq!(fs.read("/d/f").unwrap(), vec![2u8; 5_000]);
}

#[test]
fn structural_damage_is_found_and_left_for_the_user() {
    // A block shared by two files.
    let s = store();
    let mut f = s.inode(s.f);
    let a = s.inode(s.a);
    f.map_root = a.map_root;
    f.map_height = a.map_height;
    s.set_inode(s.f, &f);
    s.expect(&["--repair"], 4, &["referenced more than once"]);

    // A directory entry naming a free inode, and an unreachable named file.
    let s = store();
    let free = Inode {
        generation: s.inode(s.f).generation,
        ..Default::default()
    };
    s.set_inode(s.f, &free);
    let mut orphan = s.inode(s.a);
    orphan.attrs.nlink = 1;
    s.set_inode(900, &orphan);
    s.expect(
        &[],
        4,
        &[
            "/d/f: names free inode",
            "inode 900: File with 1 links is not reachable",
        ],
    );

    // A directory whose parent field is wrong, and a torn inode.
    let s = store();
    let mut d = s.inode(s.d);
    d.attrs.parent = s.f;
    s.set_inode(s.d, &d);
    let off = s.l.inode_off(s.a);
    let mut seq = [0u8; 8];
    s.nvm.read_exact_at(&mut seq, off).unwrap();
    let c = current_copy(u64::from_le_bytes(seq));
    s.nvm
        .write_all_at(&[0xee; 16], off + COPY_OFF[c] as u64 + 20)
        .unwrap();
    s.expect(&[], 4, &["parent field", "checksum mismatch"]);
}

#[test]
fn an_unclean_store_is_recovered_by_repair() {
    use std::io::BufRead;
    let s = store();
    s.store.fs().create_dir("/late").unwrap();
    // A client logs 30 calls and stays; then it and the daemon die: the store is not
    // clean and the client's log holds calls nobody digested.
    let mut worker = Command::new(env!("CARGO_BIN_EXE_cairn-test-worker"))
        .arg(s.store.path())
        .args(["3", "30", "/late"])
        .env("CAIRN_WORKER_HOLD", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(worker.stdout.take().unwrap());
    assert!(out.lines().any(|l| l.is_ok_and(|l| l == "DONE")));
    if let Some(pid) = s.store.daemon_pid() {
        cairn_tests::harness::kill9(pid);
    }
    worker.kill().unwrap();
    worker.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    s.expect(
        &[],
        0,
        &[
            "not stopped cleanly",
            "committed transactions not digested yet",
        ],
    );
    let (_, text) = s.fsck(&[]);
    assert!(!text.contains(": 0 committed transactions"), "{text}");
    s.expect(&["--repair"], 1, &["recovered"]);
    s.expect(&[], 0, &["clean"]);
    // Everything the client acknowledged is there: the reference after its 30 calls.
    let fs = s.store.fs();
    let got = cairn_tests::snapshot(&cairn_tests::CairnFs { fs: &fs }, "/late").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let host = cairn_tests::HostFs {
        root: dir.path().to_path_buf(),
    };
    cairn_tests::FsOps::mkdir(&host, "/late").unwrap();
    for op in cairn_tests::gen_ops(3, 30, "/late") {
        cairn_tests::apply(&host, &op);
    }
    let want = cairn_tests::snapshot(&host, "/late").unwrap();
    assert!(got == want, "{}", cairn_tests::diff(&got, &want));
}

#[test]
fn bad_input_is_an_operational_error() {
    // A running daemon.
    let s = store();
    let fs = s.store.fs();
    s.expect(&[], 8, &["stop it first"]);
    drop(fs);
    s.store.stop();

    // Garbage, a truncated NVM file, a newer format version.
    let cfg = cairn_area::StoreDir::new(s.store.path())
        .load_config()
        .unwrap();
    let good = std::fs::read(&cfg.nvm_path).unwrap();
    // (The superblock and its copy in the last block.)
    let copy = s.l.sb_copy as usize * BLOCK_SIZE;
    assert_eq!(copy + BLOCK_SIZE, good.len());
    let mut garbage = good.clone();
    garbage[..4096].fill(0x5a);
    garbage[copy..].fill(0x5a);
    std::fs::write(&cfg.nvm_path, &garbage).unwrap();
    s.expect(&[], 8, &["magic", "no intact copy"]);
    std::fs::write(&cfg.nvm_path, &good[..good.len() / 2]).unwrap();
    s.expect(&[], 8, &[]);
    let mut newer = good.clone();
    for at in [8, copy + 8] {
        newer[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    }
    std::fs::write(&cfg.nvm_path, &newer).unwrap();
    s.expect(&[], 8, &["version 99"]);
    std::fs::write(&cfg.nvm_path, &good).unwrap();
    assert_eq!(s.fsck(&[]).0, 0);

    // The extended-attribute journal of another store.
    let journal = s.store.path().join("xattrs");
    let j = std::fs::read(&journal).unwrap();
    let mut other = j.clone();
    other[16] ^= 0xff;
    std::fs::write(&journal, &other).unwrap();
    s.expect(&[], 4, &["journal of another store"]);
    std::fs::write(&journal, &j).unwrap();

    // A missing NVM file, and no store at all.
    std::fs::remove_file(&cfg.nvm_path).unwrap();
    s.expect(&[], 8, &["cannot open the NVM file"]);
    std::fs::write(&cfg.nvm_path, &good).unwrap();
    let none = tempfile::tempdir().unwrap();
    let (code, text) = fsck_at(none.path().join("nothing"), &[]);
    assert_eq!(code, 8, "{text}");
    assert!(text.contains("no Cairn store"), "{text}");
}

/// The superblock and its copy (the last block): whichever is damaged, `--repair`
/// rewrites it from the other; a store whose superblock is damaged does not start, and
/// says how to restore it.
#[test]
fn a_damaged_superblock_or_copy_is_restored_from_the_other() {
    let s = store();
    let copy = s.l.sb_copy * BLOCK_SIZE as u64;
    assert!(copy > s.l.data_start * BLOCK_SIZE as u64);
    let mut good = vec![0u8; BLOCK_SIZE];
    s.nvm.read_exact_at(&mut good, 0).unwrap();
    let mut c = vec![0u8; BLOCK_SIZE];
    s.nvm.read_exact_at(&mut c, copy).unwrap();
    assert_eq!(c, good, "mkfs writes the copy");

    // A damaged copy.
    s.nvm.write_all_at(&[0xee; 16], copy + 100).unwrap();
    s.expect(&[], 4, &["copy of the superblock in block"]);
    s.expect(&["--repair"], 1, &["rewritten from the superblock"]);
    s.expect(&[], 0, &["clean"]);
    s.nvm.read_exact_at(&mut c, copy).unwrap();
    assert_eq!(c, good);

    // A damaged superblock: the store does not start...
    s.nvm.write_all_at(&[0u8; 64], 0).unwrap();
    let Err(err) = cairn::Fs::open(s.store.path()) else {
        panic!("a store without superblock opened");
    };
    assert!(err.to_string().contains("fsck --repair"), "{err}");
    // ...fsck checks nothing else until it is restored from the copy...
    s.expect(
        &[],
        4,
        &[
            "superblock (block 0) is damaged",
            "intact",
            "nothing else was checked",
        ],
    );
    s.expect(&["--repair"], 1, &["restored from its copy"]);
    s.expect(&[], 0, &["clean"]);
    // ...and then everything is there.
    let fs = s.store.fs();
    assert_eq!(fs.read("/d/f").unwrap(), vec![2u8; 5_000]);
    assert_eq!(fs.read("/b").unwrap(), vec![1u8; 10_000]);
}

/// A store of format version 3 (no copy of the superblock; its data region runs to the
/// last block; its logs in the NVM file) still opens, works, and checks clean.
#[test]
fn a_version_3_store_opens_and_checks_clean() {
    use cairn_format::superblock::{state, Params};
    // Made as version 6 (the logs in the NVM file, as in version 3), then relabelled.
    let s = store_of_format(Some(6));
    let l = &s.l;
    assert!(!l.slot_files);
    let nvm_path = cairn_area::StoreDir::new(s.store.path())
        .load_config()
        .unwrap()
        .nvm_path;
    assert_eq!(
        cairn_area::store::nvm_files(&nvm_path),
        std::slice::from_ref(&nvm_path)
    );
    let v3 = Layout::compute_for(
        Params {
            total_bytes: l.total_blocks * BLOCK_SIZE as u64,
            nslots: l.nslots,
            log_bytes: l.log_blocks * BLOCK_SIZE as u64,
            inode_count: l.inode_count,
            tiers: l.tiers,
        },
        3,
    )
    .unwrap();
    assert_eq!(v3.data_blocks, l.data_blocks + 1);
    let mut b = vec![0u8; BLOCK_SIZE];
    s.nvm.read_exact_at(&mut b, 0).unwrap();
    let sb = Superblock {
        version: 3,
        layout: v3,
        ..Superblock::decode(&b, u64::MAX).unwrap()
    };
    let enc = sb.encode();
    assert_eq!(enc[8..12], 3u32.to_le_bytes());
    s.nvm.write_all_at(&enc, 0).unwrap();
    s.nvm
        .write_all_at(&[0u8; BLOCK_SIZE], l.sb_copy * BLOCK_SIZE as u64)
        .unwrap();
    // The saved allocation state was sized for the other layout: marked unclean, the
    // start rebuilds it from the references.
    s.nvm
        .write_all_at(&0u64.to_le_bytes(), (BLOCK_SIZE + state::CLEAN) as u64)
        .unwrap();
    {
        let fs = s.store.fs();
        assert_eq!(fs.read("/d/f").unwrap(), vec![2u8; 5_000]);
        fs.write("/new", vec![3u8; 100_000]).unwrap();
    }
    s.store.stop();
    s.expect(&[], 0, &["clean", "version 3 or older"]);
    let fs = s.store.fs();
    assert_eq!(fs.read("/new").unwrap(), vec![3u8; 100_000]);
}

#[test]
fn unreachable_inodes_are_put_into_lost_and_found() {
    let s = store();
    // A file and an empty directory nothing names (as lost directory entries would leave
    // them), unknown to the saved allocation state too.
    let f = s.inode(s.f);
    let file = Inode {
        attrs: cairn_format::inode::Attrs {
            nlink: 1,
            size: 0,
            ..f.attrs
        },
        generation: 3,
        ..Default::default()
    };
    s.set_inode(900, &file);
    let d = s.inode(s.d);
    let dir = Inode {
        attrs: cairn_format::inode::Attrs {
            nlink: 2,
            parent: 7,
            ..d.attrs
        },
        generation: 5,
        ..Default::default()
    };
    s.set_inode(901, &dir);
    s.expect(
        &[],
        4,
        &[
            "inode 900: File with 1 links is not reachable",
            "inode 901: Dir with 2 links is not reachable",
        ],
    );
    s.expect(&["--repair"], 1, &["/lost+found"]);
    s.expect(&[], 0, &[]);
    let fs = s.store.fs();
    let m = fs.metadata("/lost+found/#900").unwrap();
    assert_eq!((m.ino(), m.nlink(), m.len()), (900, 1, 0));
    assert!(fs.metadata("/lost+found/#901").unwrap().is_dir());
    assert_eq!(
        fs.metadata("/lost+found/#901/..").unwrap().ino(),
        fs.metadata("/lost+found").unwrap().ino()
    );
    assert_eq!(fs.metadata("/lost+found").unwrap().nlink(), 3);
}

/// A lower tier's segment table that says a segment in use was never written.
#[test]
fn a_segment_table_contradicting_the_maps_is_found() {
    let store = TestStore::with_size(StoreSize {
        nvm: "8M",
        log: "512K",
        clients: 2,
        inodes: Some(1024),
        tiers: Some(cairn_tests::harness::Tiers {
            ssd: "8M",
            ssd_device: None,
            hdd: None,
            segment: "256K",
        }),
    });
    {
        let fs = store.fs();
        fs.write("/big", vec![9u8; 3 << 20]).unwrap();
        fs.digest().unwrap();
    }
    let (moved, _) = cairn::daemon_migrate(Some(store.path()), 0, 1, 2 << 20).unwrap();
    assert!(moved > 0);
    store.stop();
    assert_eq!(fsck_at(store.path().into(), &[]).0, 0);
    let (nvm, l) = nvm_and_layout(&store);
    // Every segment's gen word set to 0: those holding data now contradict the maps.
    for seg in 1..l.tiers[0].segments {
        nvm.write_all_at(&[0u8; 8], l.seg_entry_off(1, seg))
            .unwrap();
    }
    let (code, text) = fsck_at(store.path().into(), &[]);
    assert_eq!(code, 4, "{text}");
    assert!(
        text.contains("its table says it was never written"),
        "{text}"
    );
}
