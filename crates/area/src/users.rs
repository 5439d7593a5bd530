//! Who a uid is by the user and group databases (`/etc/passwd`, `/etc/group`): for the
//! checks that must know what a process that is not connected could do (a client the
//! daemon recovers after a restart, the owner of a file).

use cairn_format::inode::Attrs;
use cairn_format::perm::{Cred, W};

/// The supplementary groups of `uid` in `/etc/group` (none if it has no name).
pub fn groups_of_user(uid: u32) -> Vec<u32> {
    let Some((name, _)) = passwd_entry(uid) else {
        return Vec::new();
    };
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    group
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 || !f[3].split(',').any(|m| m == name) {
                return None;
            }
            f[2].parse().ok()
        })
        .collect()
}

/// The credentials of `uid` as a login would have them: its primary group from
/// `/etc/passwd` (`u32::MAX`, no group, if it has no entry) and its supplementary groups.
pub fn cred_of_user(uid: u32) -> Cred {
    Cred {
        uid,
        gid: passwd_entry(uid).map_or(u32::MAX, |(_, g)| g),
        groups: if uid == 0 {
            Vec::new()
        } else {
            groups_of_user(uid)
        },
    }
}

/// The name and primary group of `uid` in `/etc/passwd`.
fn passwd_entry(uid: u32) -> Option<(String, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[2].parse::<u32>() == Ok(uid))
            .then(|| (f[0].to_string(), f[3].parse().unwrap_or(u32::MAX)))
    })
}

/// Where a SpaceJMP stage file lies and whose it is: the owners of its directory and of
/// the store (`StoreConfig::owner`), its own owner and permission bits.
#[derive(Debug, Clone, Copy)]
pub struct StageFile {
    pub dir_owner: u32,
    pub store_owner: u32,
    pub owner: u32,
    pub perm: u32,
}

/// Whether a stage file may stand for what a writer of segment `seg` wrote (its bytes
/// become the segment's at the next settle). The stage directory is shared and sticky:
/// if root or the store's owner made it, nobody else may remove or rename a stage file
/// in it, and a writer never writes into a file that is not its own, root's or the
/// segment owner's, so any stage file there is a writer's; if another user made it,
/// that user may replace any of them, and one is trusted only if its owner is root or
/// may write `seg` by the group database. Either way it must be writable by no class
/// `seg` is not. `Err` says why not.
pub fn stage_trusted(f: StageFile, seg: &Attrs) -> Result<(), String> {
    let dir_trusted = f.dir_owner == 0 || f.dir_owner == f.store_owner;
    if !dir_trusted && f.owner != 0 && !cred_of_user(f.owner).may(seg, W) {
        return Err(format!(
            "it is uid {}'s, who may not write the segment (uid {}, gid {}, mode {:o}), in a \
             stage directory uid {} made",
            f.owner, seg.uid, seg.gid, seg.perm, f.dir_owner
        ));
    }
    let wider = f.perm & 0o022 & !seg.perm;
    if wider != 0 {
        return Err(format!(
            "its mode {:o} lets more users write it than may write the segment (mode {:o})",
            f.perm, seg.perm
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_format::inode::Kind;

    fn seg(uid: u32, gid: u32, perm: u32) -> Attrs {
        Attrs {
            kind: Kind::File,
            perm,
            uid,
            gid,
            ..Default::default()
        }
    }

    fn file(dir_owner: u32, owner: u32, perm: u32) -> StageFile {
        StageFile {
            dir_owner,
            store_owner: 1000,
            owner,
            perm,
        }
    }

    #[test]
    fn a_stage_file_is_trusted_in_the_owners_directory_or_from_a_writer() {
        let seg644 = seg(1000, 1000, 0o644);
        // In a directory of root or the store's owner: any stage file of a safe mode.
        assert!(stage_trusted(file(0, 4_000_000, 0o644), &seg644).is_ok());
        assert!(stage_trusted(file(1000, 4_000_000, 0o644), &seg644).is_ok());
        // In another user's: root's and the segment owner's; nobody else where only
        // the owner may write.
        assert!(stage_trusted(file(4_000_001, 0, 0o640), &seg644).is_ok());
        assert!(stage_trusted(file(4_000_001, 1000, 0o644), &seg644).is_ok());
        let e = stage_trusted(file(4_000_001, 4_000_000, 0o644), &seg644).unwrap_err();
        assert!(
            e.contains("may not write") && e.contains("uid 4000001 made"),
            "{e}"
        );
        // Anyone, where anyone may write.
        let seg666 = seg(1000, 1000, 0o666);
        assert!(stage_trusted(file(4_000_001, 4_000_000, 0o666), &seg666).is_ok());
        // Never writable by a class the segment is not.
        let e = stage_trusted(file(0, 1000, 0o666), &seg644).unwrap_err();
        assert!(e.contains("lets more users write it"), "{e}");
    }
}
