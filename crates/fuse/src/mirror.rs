//! The mount's record of the record locks it took for its lock owners, with their pids.
//!
//! The mount takes each owner's locks as OFD locks of a handle of its own (the kernel
//! sees one process, the mount, so POSIX locks could not tell its owners apart), and the
//! kernel reports -1 as the holder of an OFD lock; `F_GETLK` through the mount answers
//! with the pid recorded here when a lock of another of its owners conflicts. Only what
//! the kernel granted is recorded. Pure.

use cairn::{LockInfo, LockType};
use std::collections::HashMap;

/// The largest file offset (Linux's `OFFSET_MAX`); a lock with `len` 0 ends here.
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// One lock of `owner` over the inclusive byte range `[start, end]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    owner: u64,
    typ: LockType,
    start: u64,
    end: u64,
    pid: u32,
}

/// The locks taken through the mount, per inode.
#[derive(Debug, Default)]
pub struct Mirror {
    inodes: HashMap<u64, Vec<Held>>,
}

fn conflicts(a: LockType, b: LockType) -> bool {
    a == LockType::Write || b == LockType::Write
}

impl Mirror {
    /// The conflicting lock of another owner with the lowest start, as `F_GETLK`
    /// reports it, if any.
    pub fn test(
        &self,
        ino: u64,
        owner: u64,
        typ: LockType,
        start: u64,
        end: u64,
    ) -> Option<LockInfo> {
        let l = self
            .inodes
            .get(&ino)?
            .iter()
            .filter(|l| {
                l.owner != owner && l.start <= end && start <= l.end && conflicts(l.typ, typ)
            })
            .min_by_key(|l| (l.start, l.end))?;
        Some(LockInfo {
            typ: l.typ,
            start: l.start,
            len: if l.end == OFFSET_MAX {
                0
            } else {
                l.end - l.start + 1
            },
            pid: l.pid as i32,
        })
    }

    /// The kernel gave `owner` a `typ` lock over `[start, end]` (`None`: unlocked it):
    /// it replaces what the owner held there (upgrade, downgrade, split) and merges with
    /// its adjacent locks of the same type.
    pub fn set(
        &mut self,
        ino: u64,
        owner: u64,
        pid: u32,
        typ: Option<LockType>,
        start: u64,
        end: u64,
    ) {
        assert!(start <= end && end <= OFFSET_MAX, "a checked range");
        let all = self.inodes.entry(ino).or_default();
        let mut kept: Vec<Held> = Vec::new();
        all.retain(|l| {
            if l.owner != owner {
                return true;
            }
            if l.end < start || l.start > end {
                kept.push(*l);
            } else {
                if l.start < start {
                    kept.push(Held {
                        end: start - 1,
                        ..*l
                    });
                }
                if l.end > end {
                    kept.push(Held {
                        start: end + 1,
                        ..*l
                    });
                }
            }
            false
        });
        if let Some(typ) = typ {
            kept.push(Held {
                owner,
                typ,
                start,
                end,
                pid,
            });
        }
        kept.sort_by_key(|l| l.start);
        for l in kept {
            match all.last_mut() {
                // The owner's locks are disjoint: only adjacency is left to merge.
                Some(m)
                    if m.owner == owner
                        && m.typ == l.typ
                        && m.end.checked_add(1) == Some(l.start) =>
                {
                    m.end = l.end;
                    m.pid = pid;
                }
                _ => all.push(l),
            }
        }
        if all.is_empty() {
            self.inodes.remove(&ino);
        }
    }

    /// `owner` closed a descriptor of `ino`: its locks there are gone.
    pub fn release(&mut self, owner: u64, ino: u64) {
        if let Some(all) = self.inodes.get_mut(&ino) {
            all.retain(|l| l.owner != owner);
            if all.is_empty() {
                self.inodes.remove(&ino);
            }
        }
    }

    /// `owner`'s locks on `ino`, sorted by start.
    #[cfg(test)]
    fn of(&self, ino: u64, owner: u64) -> Vec<Held> {
        let mut v: Vec<Held> = self
            .inodes
            .get(&ino)
            .map_or(&[][..], |a| a)
            .iter()
            .filter(|l| l.owner == owner)
            .copied()
            .collect();
        v.sort_by_key(|l| l.start);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use LockType::{Read, Write};

    #[test]
    fn split_merge_and_release() {
        let mut m = Mirror::default();
        m.set(7, 1, 10, Some(Write), 0, 99);
        m.set(7, 1, 10, Some(Read), 40, 59);
        let types: Vec<_> = m.of(7, 1).iter().map(|l| (l.typ, l.start, l.end)).collect();
        assert_eq!(types, [(Write, 0, 39), (Read, 40, 59), (Write, 60, 99)]);
        m.set(7, 1, 10, Some(Write), 40, 59);
        assert_eq!(m.of(7, 1).len(), 1, "merged again: {:?}", m.of(7, 1));
        let c = m.test(7, 2, Read, 50, 50).unwrap();
        assert_eq!((c.typ, c.start, c.len, c.pid), (Write, 0, 100, 10));
        assert!(
            m.test(7, 1, Write, 0, 0).is_none(),
            "an owner never conflicts with itself"
        );
        m.release(1, 7);
        assert!(m.test(7, 2, Write, 0, OFFSET_MAX).is_none());
        assert!(m.inodes.is_empty());
    }

    /// Bytes 0..N-1; the last stands for everything from N-1 to the end.
    const N: usize = 24;

    fn covers(start: u64, end: u64, b: usize) -> bool {
        if b == N - 1 {
            end == OFFSET_MAX
        } else {
            start <= b as u64 && b as u64 <= end
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// Granted locks (the model only grants what does not conflict, as the kernel
        /// does) and releases: the mirror's byte ownership equals the model's, each
        /// owner's locks stay disjoint and merged, and `test` names the conflict with the
        /// lowest start.
        #[test]
        fn mirror_matches_byte_model(ops in proptest::collection::vec(
            (0u64..4, 0u8..4, 0u64..20, 0u64..5), 1..60)) {
            let range = |start: u64, len: u64| (start, if len == 0 { OFFSET_MAX } else { start + len - 1 });
            let mut model = [[None::<LockType>; N]; 4];
            let mut m = Mirror::default();
            for (owner, op, start, len) in ops {
                let typ = match op { 0 => None, 1 => Some(Read), 2 => Some(Write), _ => {
                    m.release(owner, 7);
                    model[owner as usize] = [None; N];
                    continue;
                } };
                let (s, e) = range(start, len);
                let conflict = |ty: LockType| (0..N).find(|&b| covers(s, e, b)
                    && (0..4).any(|x| x != owner as usize
                        && model[x][b].is_some_and(|h| conflicts(h, ty))));
                if let Some(ty) = typ {
                    let first = conflict(ty);
                    let got = m.test(7, owner, ty, s, e);
                    prop_assert_eq!(got.is_some(), first.is_some());
                    if let (Some(g), Some(b)) = (got, first) {
                        prop_assert!(g.start <= b as u64);
                    }
                    if first.is_some() {
                        continue; // the kernel would not have granted it
                    }
                }
                m.set(7, owner, 1, typ, s, e);
                for (b, slot) in model[owner as usize].iter_mut().enumerate() {
                    if covers(s, e, b) {
                        *slot = typ;
                    }
                }
                for o in 0..4u64 {
                    let mine = m.of(7, o);
                    let mut got = [None::<LockType>; N];
                    for w in mine.windows(2) {
                        prop_assert!(w[0].end < w[1].start);
                        prop_assert!(!(w[0].typ == w[1].typ && w[0].end + 1 == w[1].start));
                    }
                    for l in &mine {
                        for (b, g) in got.iter_mut().enumerate() {
                            if covers(l.start, l.end, b) {
                                *g = Some(l.typ);
                            }
                        }
                    }
                    prop_assert_eq!(got, model[o as usize]);
                }
            }
        }
    }
}
