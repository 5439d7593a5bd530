//! Extended attributes: the rules (names, namespaces, sizes, who may do what, as Linux's
//! VFS has them) and the records of the daemon's attribute journal (`DIR/xattrs`; layout
//! in `docs/FORMAT.md`, "Extended attributes"). Pure code, no I/O.

use crate::inode::{Attrs, Kind};
use crate::perm::{Cred, R, W};
use crate::{bad, crc, le, Result};

/// Longest attribute name, with its namespace prefix (`XATTR_NAME_MAX`).
pub const NAME_MAX: usize = 255;
/// Largest attribute value (`XATTR_SIZE_MAX`).
pub const VALUE_MAX: usize = 65536;
/// Most bytes of names and values one inode may hold (each name counts its length plus
/// one, as in a `listxattr` buffer): beyond it a set fails with `ENOSPC`.
pub const INODE_MAX: usize = 65536 + 4096;
/// Longest `listxattr` answer (`XATTR_LIST_MAX`): names, each with its NUL.
pub const LIST_MAX: usize = 65536;

/// `setxattr` flags.
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

/// The namespaces Cairn stores. `system.` (POSIX ACLs) and unknown prefixes are
/// `EOPNOTSUPP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    User,
    Trusted,
    Security,
}

/// What a caller does with an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `getxattr`.
    Get,
    /// `setxattr` or `removexattr`.
    Change,
}

/// The namespace of `name`, or the errno Linux gives: `ERANGE` for an empty or too long
/// name, `EOPNOTSUPP` for `system.` and unknown prefixes, `EINVAL` for a bare prefix.
pub fn namespace(name: &[u8]) -> std::result::Result<Namespace, i32> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(libc::ERANGE);
    }
    if name.contains(&0) {
        return Err(libc::EINVAL);
    }
    for (prefix, ns) in [
        (&b"user."[..], Namespace::User),
        (b"trusted.", Namespace::Trusted),
        (b"security.", Namespace::Security),
    ] {
        if let Some(rest) = name.strip_prefix(prefix) {
            return if rest.is_empty() {
                Err(libc::EINVAL)
            } else {
                Ok(ns)
            };
        }
    }
    Err(libc::EOPNOTSUPP)
}

/// Whether `cred` may get or change an attribute of namespace `ns` on an inode with
/// `a`; the errno otherwise. As Linux (`xattr_permission` and the capability checks):
/// `trusted.` is root's alone (others: `EPERM` to change, `ENODATA` to get); `user.`
/// exists only on regular files and directories, needs read or write permission, and
/// on a sticky directory only its owner changes it; `security.` is readable by all and
/// changed by root.
pub fn check(
    cred: &Cred,
    a: &Attrs,
    ns: Namespace,
    access: Access,
) -> std::result::Result<(), i32> {
    let change = access == Access::Change;
    let refused = if change { libc::EPERM } else { libc::ENODATA };
    match ns {
        Namespace::Trusted if !cred.is_root() => Err(refused),
        Namespace::Trusted => Ok(()),
        Namespace::Security if change && !cred.is_root() => Err(libc::EPERM),
        Namespace::Security => Ok(()),
        Namespace::User => {
            if !matches!(a.kind, Kind::File | Kind::Dir) {
                return Err(refused);
            }
            if change && a.kind == Kind::Dir && a.perm & 0o1000 != 0 && !cred.owns(a) {
                return Err(libc::EPERM);
            }
            if cred.may(a, if change { W } else { R }) {
                Ok(())
            } else {
                Err(libc::EACCES)
            }
        }
    }
}

/// Whether `cred` sees `name` in a `listxattr` answer (`trusted.` names: root only).
pub fn listed(cred: &Cred, name: &[u8]) -> bool {
    cred.is_root() || !name.starts_with(b"trusted.")
}

/// Bytes `name` and `value` count against [`INODE_MAX`].
pub fn cost(name: &[u8], value: &[u8]) -> usize {
    name.len() + 1 + value.len()
}

/// Magic at the start of the attribute journal.
pub const JOURNAL_MAGIC: [u8; 8] = *b"CAIRNXA1";
/// Bytes of the journal header: magic, version (u32), reserved (u32), the store's uuid.
pub const JOURNAL_HEADER: usize = 32;
/// Journal format version.
pub const JOURNAL_VERSION: u32 = 1;
/// Bytes before a record's body: body length (u32) and its crc32c (u32).
const PREFIX: usize = 8;
/// Bytes of a body before the name: ino, generation, op, name length, value length.
const BODY_FIXED: usize = 8 + 8 + 1 + 1 + 4;

/// The journal header of the store with superblock uuid `uuid`.
pub fn journal_header(uuid: &[u8; 16]) -> [u8; JOURNAL_HEADER] {
    let mut b = [0u8; JOURNAL_HEADER];
    b[..8].copy_from_slice(&JOURNAL_MAGIC);
    le::put_u32(&mut b, 8, JOURNAL_VERSION);
    b[16..32].copy_from_slice(uuid);
    b
}

/// Check a journal header; the uuid of the store it belongs to.
pub fn journal_uuid(b: &[u8]) -> Result<[u8; 16]> {
    if b.len() < JOURNAL_HEADER || b[..8] != JOURNAL_MAGIC {
        return bad("xattr journal: bad magic");
    }
    if le::u32(b, 8) != JOURNAL_VERSION {
        return bad("xattr journal: unsupported version");
    }
    Ok(b[16..32].try_into().unwrap())
}

/// One change in the journal, for the inode `ino` of generation `generation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRecord {
    pub ino: u64,
    pub generation: u64,
    pub name: Vec<u8>,
    /// `Some`: set to this value; `None`: removed.
    pub value: Option<Vec<u8>>,
}

/// Bytes of a record with a name of `name` bytes and a value of `value` bytes (0 for a
/// removal).
pub fn record_len(name: usize, value: usize) -> usize {
    PREFIX + BODY_FIXED + name + value
}

impl JournalRecord {
    /// The record as bytes: length, crc32c, body.
    pub fn encode(&self) -> Vec<u8> {
        let value = self.value.as_deref().unwrap_or(&[]);
        let len = record_len(self.name.len(), value.len());
        let body_len = len - PREFIX;
        let mut b = vec![0u8; len];
        le::put_u32(&mut b, 0, body_len as u32);
        let body = &mut b[PREFIX..];
        le::put_u64(body, 0, self.ino);
        le::put_u64(body, 8, self.generation);
        body[16] = if self.value.is_some() { 1 } else { 2 };
        body[17] = self.name.len() as u8;
        le::put_u32(body, 18, value.len() as u32);
        body[BODY_FIXED..BODY_FIXED + self.name.len()].copy_from_slice(&self.name);
        body[BODY_FIXED + self.name.len()..].copy_from_slice(value);
        let c = crc(&b[PREFIX..]);
        le::put_u32(&mut b, 4, c);
        b
    }

    /// Decode the record at the start of `b`: the record and its length in bytes, or
    /// `None` if `b` holds no whole valid record there (the end of the journal, or a
    /// write a crash tore).
    pub fn decode(b: &[u8]) -> Option<(JournalRecord, usize)> {
        if b.len() < PREFIX {
            return None;
        }
        let body_len = le::u32(b, 0) as usize;
        if !(BODY_FIXED..=BODY_FIXED + NAME_MAX + VALUE_MAX).contains(&body_len) {
            return None;
        }
        let body = b.get(PREFIX..PREFIX + body_len)?;
        if crc(body) != le::u32(b, 4) {
            return None;
        }
        let op = body[16];
        let name_len = body[17] as usize;
        let value_len = le::u32(body, 18) as usize;
        if BODY_FIXED + name_len + value_len != body_len || !(1..=2).contains(&op) {
            return None;
        }
        if op == 2 && value_len != 0 {
            return None;
        }
        let name = body[BODY_FIXED..BODY_FIXED + name_len].to_vec();
        namespace(&name).ok()?;
        let value = (op == 1).then(|| body[BODY_FIXED + name_len..].to_vec());
        Some((
            JournalRecord {
                ino: le::u64(body, 0),
                generation: le::u64(body, 8),
                name,
                value,
            },
            PREFIX + body_len,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(kind: Kind, perm: u32, uid: u32) -> Attrs {
        Attrs {
            kind,
            perm,
            uid,
            gid: uid,
            nlink: 1,
            ..Default::default()
        }
    }

    fn user(uid: u32) -> Cred {
        Cred {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[test]
    fn names_follow_linux() {
        assert_eq!(namespace(b"user.a"), Ok(Namespace::User));
        assert_eq!(namespace(b"trusted.x"), Ok(Namespace::Trusted));
        assert_eq!(namespace(b"security.selinux"), Ok(Namespace::Security));
        assert_eq!(namespace(b"user."), Err(libc::EINVAL));
        assert_eq!(namespace(b"system.posix_acl_access"), Err(libc::EOPNOTSUPP));
        assert_eq!(namespace(b"other.a"), Err(libc::EOPNOTSUPP));
        assert_eq!(namespace(b""), Err(libc::ERANGE));
        let long = [b'a'; 256];
        let mut n = b"user.".to_vec();
        n.extend_from_slice(&long[..250]);
        assert_eq!(namespace(&n), Ok(Namespace::User));
        n.push(b'a');
        assert_eq!(namespace(&n), Err(libc::ERANGE));
    }

    #[test]
    fn permissions_follow_linux() {
        let f = attrs(Kind::File, 0o644, 1000);
        let root = user(0);
        let (owner, other) = (user(1000), user(2000));
        let get = Access::Get;
        let change = Access::Change;
        assert_eq!(check(&owner, &f, Namespace::User, change), Ok(()));
        assert_eq!(check(&other, &f, Namespace::User, get), Ok(()));
        assert_eq!(
            check(&other, &f, Namespace::User, change),
            Err(libc::EACCES)
        );
        let secret = attrs(Kind::File, 0o600, 1000);
        assert_eq!(
            check(&other, &secret, Namespace::User, get),
            Err(libc::EACCES)
        );
        assert_eq!(
            check(&owner, &f, Namespace::Trusted, change),
            Err(libc::EPERM)
        );
        assert_eq!(
            check(&owner, &f, Namespace::Trusted, get),
            Err(libc::ENODATA)
        );
        assert_eq!(check(&root, &f, Namespace::Trusted, change), Ok(()));
        assert_eq!(check(&other, &f, Namespace::Security, get), Ok(()));
        assert_eq!(
            check(&owner, &f, Namespace::Security, change),
            Err(libc::EPERM)
        );
        let link = attrs(Kind::Symlink, 0o777, 1000);
        assert_eq!(
            check(&owner, &link, Namespace::User, change),
            Err(libc::EPERM)
        );
        assert_eq!(
            check(&owner, &link, Namespace::User, get),
            Err(libc::ENODATA)
        );
        assert_eq!(check(&root, &link, Namespace::Trusted, change), Ok(()));
        let sticky = attrs(Kind::Dir, 0o1777, 1000);
        assert_eq!(
            check(&other, &sticky, Namespace::User, change),
            Err(libc::EPERM)
        );
        assert_eq!(check(&owner, &sticky, Namespace::User, change), Ok(()));
        assert!(listed(&root, b"trusted.a") && !listed(&owner, b"trusted.a"));
        assert!(listed(&owner, b"user.a"));
    }

    #[test]
    fn journal_records_round_trip_and_torn_ones_are_refused() {
        assert_eq!(journal_uuid(&journal_header(&[7; 16])).unwrap(), [7; 16]);
        assert!(journal_uuid(&[0u8; 32]).is_err());
        let set = JournalRecord {
            ino: 42,
            generation: 3,
            name: b"user.mime".to_vec(),
            value: Some(b"text/plain".to_vec()),
        };
        let del = JournalRecord {
            value: None,
            ..set.clone()
        };
        let empty = JournalRecord {
            value: Some(vec![]),
            ..set.clone()
        };
        let mut all = Vec::new();
        for r in [&set, &del, &empty] {
            all.extend_from_slice(&r.encode());
        }
        let mut off = 0;
        for r in [&set, &del, &empty] {
            let (d, n) = JournalRecord::decode(&all[off..]).unwrap();
            assert_eq!(&d, r);
            off += n;
        }
        assert_eq!(off, all.len());
        assert!(JournalRecord::decode(&all[off..]).is_none());
        // Torn: every strict prefix of a record, and any flipped byte, is refused.
        let one = set.encode();
        for cut in 0..one.len() {
            assert!(JournalRecord::decode(&one[..cut]).is_none(), "cut {cut}");
        }
        for i in 0..one.len() {
            let mut b = one.clone();
            b[i] ^= 0x40;
            assert!(JournalRecord::decode(&b).is_none(), "flip {i}");
        }
    }
}
