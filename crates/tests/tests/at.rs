//! The `*at` calls (`cairn::At`): paths relative to a directory given by its inode
//! number, as the POSIX shim's `openat`/`mkdirat`/… and the FUSE mount use them.

use cairn::{At, OpenOptions};
use cairn_tests::TestStore;
use std::io::ErrorKind;
use std::path::Path;

fn at(dir: u64, p: &str) -> At<'_> {
    At {
        dir,
        path: Path::new(p),
    }
}

#[test]
fn paths_relative_to_a_directory_inode() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.create_dir_all("/a/b").unwrap();
    fs.create_dir("/c").unwrap();
    let a = fs.metadata("/a").unwrap().ino();
    let c = fs.metadata("/c").unwrap().ino();

    fs.write(at(a, "b/f"), b"one").unwrap();
    assert_eq!(fs.read("/a/b/f").unwrap(), b"one");
    assert_eq!(fs.read(at(a, "./b/../b/f")).unwrap(), b"one");
    // `..` from the base, and absolute paths from the root whatever the base.
    assert_eq!(fs.read(at(c, "../a/b/f")).unwrap(), b"one");
    assert_eq!(fs.read(at(c, "/a/b/f")).unwrap(), b"one");

    fs.create_dir(at(a, "d")).unwrap();
    fs.create_dir_all(at(a, "d/e/g")).unwrap();
    assert!(fs.metadata("/a/d/e/g").unwrap().is_dir());
    let names: Vec<String> = fs
        .read_dir(at(a, "."))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(names, ["b", "d"]);
    // Entries of an `At` listing know their base.
    for e in fs.read_dir(at(a, "b")).unwrap() {
        let e = e.unwrap();
        assert_eq!(e.metadata().unwrap().len(), 3);
    }

    // Two bases: rename and hard link between them.
    fs.rename(at(a, "b/f"), at(c, "f2")).unwrap();
    assert!(!fs.exists("/a/b/f"));
    assert_eq!(fs.read("/c/f2").unwrap(), b"one");
    fs.hard_link(at(c, "f2"), at(a, "h")).unwrap();
    assert_eq!(fs.metadata(at(a, "h")).unwrap().nlink(), 2);
    // A relative symlink resolves from its own directory, not from the base.
    fs.symlink("f2", at(c, "s")).unwrap();
    assert_eq!(fs.read_link(at(c, "s")).unwrap(), Path::new("f2"));
    assert_eq!(fs.read(at(a, "../c/s")).unwrap(), b"one");
    assert!(fs
        .symlink_metadata(at(c, "s"))
        .unwrap()
        .file_type()
        .is_symlink());

    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fs, at(c, "f2"))
        .unwrap();
    f.write_at(b"ONE", 0).unwrap();
    assert_eq!(fs.read("/c/f2").unwrap(), b"ONE");
    let ino = f.ino();
    assert_eq!(fs.metadata_ino(ino).unwrap().len(), 3);
    assert_eq!(fs.metadata_ino(c).unwrap().ino(), c);

    fs.set_permissions(at(c, "f2"), cairn::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(
        fs.metadata("/c/f2").unwrap().permissions().mode() & 0o777,
        0o600
    );
    fs.remove_file(at(a, "h")).unwrap();
    fs.remove_dir_all(at(a, "d")).unwrap();
    assert!(!fs.exists("/a/d"));
    fs.remove_dir(at(a, "b")).unwrap();
    assert_eq!(fs.read_dir("/a").unwrap().count(), 0);

    // A base that is not a directory, or that was removed.
    let e = fs.read(at(ino, "x")).unwrap_err();
    assert_eq!(cairn_area::errno_of(&e), libc::ENOTDIR, "{e}");
    fs.remove_dir("/a").unwrap();
    let e = fs.write(at(a, "x"), b"").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let e = fs.metadata_ino(a).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
}

#[test]
fn an_inode_itself_and_chown() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.create_dir("/d").unwrap();
    fs.write("/d/f", b"data").unwrap();
    fs.symlink("f", "/d/s").unwrap();
    let f = fs.metadata("/d/f").unwrap().ino();
    let s = fs.symlink_metadata("/d/s").unwrap().ino();
    let d = fs.metadata("/d").unwrap().ino();
    // Calls on the inode itself.
    assert_eq!(fs.metadata(At::inode(f)).unwrap().len(), 4);
    assert_eq!(fs.read(At::inode(f)).unwrap(), b"data");
    assert_eq!(fs.read_link(At::inode(s)).unwrap(), Path::new("f"));
    fs.set_permissions(At::inode(f), cairn::Permissions::from_mode(0o4755))
        .unwrap();
    fs.hard_link(At::inode(f), at(d, "g")).unwrap();
    assert_eq!(fs.metadata("/d/g").unwrap().nlink(), 2);
    // Calls that create or remove a name refuse it.
    for e in [
        fs.remove_file(At::inode(f)).unwrap_err(),
        fs.create_dir(At::inode(d)).unwrap_err(),
        fs.rename(At::inode(f), at(d, "x")).unwrap_err(),
        fs.symlink("f", At::inode(d)).unwrap_err(),
    ] {
        assert_eq!(cairn_area::errno_of(&e), libc::ENOENT, "{e}");
    }
    // chown (the tests run as root): the owner, the group, and the setuid bit goes.
    fs.set_owner(At::inode(f), Some(1234), Some(5678)).unwrap();
    let m = fs.metadata("/d/f").unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    assert_eq!(m.permissions().mode() & 0o7777, 0o755);
    fs.set_owner("/d/f", None, Some(42)).unwrap();
    assert_eq!(fs.metadata("/d/f").unwrap().uid(), 1234);
    assert_eq!(fs.metadata("/d/f").unwrap().gid(), 42);
    // lchown changes the symlink, chown its target.
    fs.set_symlink_owner("/d/s", Some(7), None).unwrap();
    assert_eq!(fs.symlink_metadata("/d/s").unwrap().uid(), 7);
    assert_eq!(fs.metadata("/d/s").unwrap().uid(), 1234);
    drop(fs);
    // It is durable like everything else: after a daemon restart.
    store.stop();
    let m = store.fs().metadata("/d/g").unwrap();
    assert_eq!((m.uid(), m.gid(), m.nlink()), (1234, 42, 2));
}

#[test]
fn rename_noreplace_and_exchange() {
    let store = TestStore::new();
    let fs = store.fs();
    fs.create_dir_all("/p/sub").unwrap();
    fs.create_dir("/q").unwrap();
    fs.write("/p/f", b"F").unwrap();
    fs.write("/q/g", b"G").unwrap();
    let errno = |e: std::io::Error| cairn_area::errno_of(&e);
    // NOREPLACE: refused onto an existing name, done onto a new one.
    assert_eq!(
        errno(fs.rename_noreplace("/p/f", "/q/g").unwrap_err()),
        libc::EEXIST
    );
    fs.rename_noreplace("/p/f", "/q/f2").unwrap();
    assert_eq!(fs.read("/q/f2").unwrap(), b"F");
    // EXCHANGE of two files in different directories.
    fs.write("/p/f", b"F").unwrap();
    fs.rename_exchange("/p/f", "/q/g").unwrap();
    assert_eq!(fs.read("/p/f").unwrap(), b"G");
    assert_eq!(fs.read("/q/g").unwrap(), b"F");
    // EXCHANGE of a file and a directory across parents: link counts and `..` follow.
    let (p_links, q_links) = (
        fs.metadata("/p").unwrap().nlink(),
        fs.metadata("/q").unwrap().nlink(),
    );
    fs.rename_exchange("/p/sub", "/q/g").unwrap();
    assert!(fs.metadata("/q/g").unwrap().is_dir());
    assert!(fs.metadata("/p/sub").unwrap().is_file());
    assert_eq!(fs.metadata("/p").unwrap().nlink(), p_links - 1);
    assert_eq!(fs.metadata("/q").unwrap().nlink(), q_links + 1);
    fs.write("/q/g/inside", b"i").unwrap();
    assert_eq!(fs.read("/q/g/../g/inside").unwrap(), b"i");
    assert_eq!(fs.read("/q/g/../f2").unwrap(), b"F");
    // Refused: a missing entry, a directory into its own subtree, both flags.
    assert_eq!(
        errno(fs.rename_exchange("/p/f", "/q/none").unwrap_err()),
        libc::ENOENT
    );
    fs.create_dir("/q/g/deeper").unwrap();
    assert_eq!(
        errno(fs.rename_exchange("/q/g", "/q/g/deeper").unwrap_err()),
        libc::EINVAL
    );
    // Durable and consistent after a daemon restart (the daemon checked link counts).
    drop(fs);
    store.stop();
    let fs = store.fs();
    assert_eq!(fs.read("/q/g/inside").unwrap(), b"i");
    assert_eq!(fs.read("/p/sub").unwrap(), b"F");
    assert_eq!(fs.metadata("/p").unwrap().nlink(), p_links - 1);
}
