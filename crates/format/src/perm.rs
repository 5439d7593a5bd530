//! POSIX permission rules over inode attributes, shared by LibFS (checking its caller)
//! and the daemon (checking every logged operation against the client's credentials).

use crate::inode::{Attrs, Kind};

/// Access bits.
pub const R: u32 = 4;
pub const W: u32 = 2;
pub const X: u32 = 1;

/// The set-user-ID and set-group-ID bits: a write can clear nothing from a file without
/// them ([`privs_killed`]).
pub const SET_ID_BITS: u32 = 0o6000;

/// The setuid and setgid bits of a regular file with permission bits `perm` that a write
/// or truncate by an unprivileged process clears: setuid, and setgid when the file is
/// group-executable or the writer is not in its group (`in_group`). The one rule of
/// LibFS ([`Cred::privs_to_kill`]) and the mount.
pub fn privs_killed(perm: u32, in_group: bool) -> u32 {
    let mut kill = perm & 0o4000;
    if perm & 0o2000 != 0 && (perm & 0o010 != 0 || !in_group) {
        kill |= 0o2000;
    }
    kill
}

/// The credentials permission checks use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether access `want` (`R|W|X` bits) to a file with `a` is allowed (POSIX: the
    /// owner class, else the group class, else others; root may do anything except
    /// execute a non-directory without any `x` bit).
    pub fn may(&self, a: &Attrs, want: u32) -> bool {
        if self.is_root() {
            return want & X == 0 || a.kind == Kind::Dir || a.perm & 0o111 != 0;
        }
        let bits = if self.uid == a.uid {
            (a.perm >> 6) & 7
        } else if self.in_group(a.gid) {
            (a.perm >> 3) & 7
        } else {
            a.perm & 7
        };
        bits & want == want
    }

    /// The setuid and setgid bits a write or truncate by this client clears from a file
    /// with `a` (Linux's `file_remove_privs`): none for root; setuid; setgid when the
    /// file is group-executable or the writer is not in its group.
    pub fn privs_to_kill(&self, a: &Attrs) -> u32 {
        if self.is_root() || a.kind != Kind::File {
            return 0;
        }
        privs_killed(a.perm, self.in_group(a.gid))
    }

    /// Owner or root (chmod, utimes with explicit times).
    pub fn owns(&self, a: &Attrs) -> bool {
        self.is_root() || self.uid == a.uid
    }

    /// Owner, root, or allowed to write.
    pub fn owns_or_writes(&self, a: &Attrs) -> bool {
        self.owns(a) || self.may(a, W)
    }

    /// Sticky directories: only the owner of the entry or of the directory (or root) may
    /// remove or rename it.
    pub fn sticky_ok(&self, dir: &Attrs, victim: &Attrs) -> bool {
        dir.perm & 0o1000 == 0 || self.is_root() || self.uid == dir.uid || self.uid == victim.uid
    }
}

/// The current process's credentials as its file accesses are checked: the file system
/// uid and gid (the fourth fields of `Uid:` and `Gid:` in `/proc/<pid>/status`) and the
/// supplementary groups. `None` if the lines are missing.
pub fn cred_of_status(status: &str) -> Option<Cred> {
    let id = |key: &str| -> Option<u32> {
        let l = status.lines().find_map(|l| l.strip_prefix(key))?;
        l.split_whitespace().nth(3)?.parse().ok()
    };
    Some(Cred {
        uid: id("Uid:")?,
        gid: id("Gid:")?,
        groups: groups_of_status(status)?,
    })
}

/// The supplementary groups of a `/proc/<pid>/status` text (its `Groups:` line).
pub fn groups_of_status(status: &str) -> Option<Vec<u32>> {
    let g = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    Some(
        g.split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kind: Kind, perm: u32, uid: u32, gid: u32) -> Attrs {
        Attrs {
            kind,
            perm,
            uid,
            gid,
            nlink: 1,
            ..Default::default()
        }
    }

    #[test]
    fn permission_classes() {
        let me = Cred {
            uid: 1000,
            gid: 100,
            groups: vec![200],
        };
        let root = Cred {
            uid: 0,
            gid: 0,
            groups: vec![],
        };
        // Owner class wins even when it grants less than the group class.
        let f = attrs(Kind::File, 0o070, 1000, 100);
        assert!(!me.may(&f, R));
        let g = attrs(Kind::File, 0o640, 5, 200);
        assert!(me.may(&g, R) && !me.may(&g, W));
        let o = attrs(Kind::File, 0o604, 5, 6);
        assert!(me.may(&o, R) && !me.may(&o, W | R));
        assert!(root.may(&o, R | W));
        assert!(!root.may(&o, X));
        assert!(root.may(&attrs(Kind::Dir, 0, 5, 6), X));
        let sticky = attrs(Kind::Dir, 0o1777, 5, 6);
        assert!(!me.sticky_ok(&sticky, &o));
        assert!(me.sticky_ok(&sticky, &f));
        assert!(root.sticky_ok(&sticky, &o));
    }

    #[test]
    fn writes_clear_setuid_and_setgid_as_linux_does() {
        let user = Cred {
            uid: 1000,
            gid: 1000,
            groups: vec![7],
        };
        let root = Cred {
            uid: 0,
            gid: 0,
            groups: vec![],
        };
        // Setuid always; setgid when group-executable or not the writer's group.
        assert_eq!(user.privs_to_kill(&attrs(Kind::File, 0o6777, 0, 0)), 0o6000);
        assert_eq!(user.privs_to_kill(&attrs(Kind::File, 0o6767, 0, 0)), 0o6000);
        assert_eq!(user.privs_to_kill(&attrs(Kind::File, 0o6767, 0, 7)), 0o4000);
        assert_eq!(user.privs_to_kill(&attrs(Kind::File, 0o0777, 0, 0)), 0);
        // Root keeps them; directories keep them.
        assert_eq!(root.privs_to_kill(&attrs(Kind::File, 0o6777, 5, 5)), 0);
        assert_eq!(user.privs_to_kill(&attrs(Kind::Dir, 0o2777, 0, 0)), 0);
    }

    #[test]
    fn credentials_of_a_status_file() {
        let s = "Name:\tx\nUid:\t0\t1000\t0\t1001\nGid:\t5\t6\t7\t8\nGroups:\t4 24 27 \n";
        assert_eq!(
            cred_of_status(s),
            Some(Cred {
                uid: 1001,
                gid: 8,
                groups: vec![4, 24, 27]
            })
        );
        assert_eq!(cred_of_status("Uid:\t0\n"), None);
    }
}
