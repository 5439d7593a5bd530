//! The handle table, as one owned type: per inode, how many `File` handles of this
//! client are open, and what the last close must do — tell the daemon it may free an
//! inode it pinned for us (`Unpin`: the file was unlinked while open here or in another
//! process, or it is an unnamed file), forget that an unnamed file (`O_TMPFILE`) may
//! still get a name.
//!
//! Invariants (checked builds, after each change): a linkable unnamed file is open; a
//! pinned inode is open, except for the moment an unnamed file is being created (pinned
//! first, then opened, in one operation).

use crate::overlay::InoMap;
use std::collections::HashSet;

/// The handle table (see the module documentation).
#[derive(Default)]
pub(crate) struct Handles {
    /// Open `File` handles per inode.
    open: InoMap<u32>,
    /// Unnamed files (`O_TMPFILE`) that may still be given a name.
    tmpfiles: HashSet<u64>,
    /// Inodes the daemon pinned for us (we had them open when we or another process
    /// removed their last name, or we made them unnamed): the last close sends `Unpin`.
    pinned: HashSet<u64>,
}

/// What the last close of an inode has to do: send `Unpin` if the daemon pins it for
/// us (then [`Handles::unpinned`]), and finally [`Handles::closed`], so that a close run
/// again after a retry finds what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastClose {
    /// Send `Unpin`.
    pub pinned: bool,
}

impl Handles {
    fn check(&self) {
        debug_assert!(
            self.tmpfiles.iter().all(|i| self.open.contains_key(i)),
            "an unnamed file that is not open"
        );
    }

    /// A handle of `ino` was opened.
    pub(crate) fn opened(&mut self, ino: u64) {
        *self.open.entry(ino).or_insert(0) += 1;
        self.check();
    }

    /// An unnamed file was created and opened once; `linkable`: it may get a name later.
    /// (The daemon pinned it first: [`Handles::pin`].)
    pub(crate) fn opened_unnamed(&mut self, ino: u64, linkable: bool) {
        if linkable {
            self.tmpfiles.insert(ino);
        }
        self.opened(ino);
    }

    /// Whether a handle of `ino` is open.
    pub(crate) fn is_open(&self, ino: u64) -> bool {
        self.open.contains_key(&ino)
    }

    /// Whether `ino` is an unnamed file that may still get a name.
    pub(crate) fn is_linkable_unnamed(&self, ino: u64) -> bool {
        self.tmpfiles.contains(&ino)
    }

    /// `ino` got a name (it is no longer an unnamed file).
    pub(crate) fn named(&mut self, ino: u64) {
        self.tmpfiles.remove(&ino);
    }

    /// The daemon pinned `ino` for us.
    pub(crate) fn pin(&mut self, ino: u64) {
        self.pinned.insert(ino);
    }

    /// Whether the daemon pinned `ino` for us.
    pub(crate) fn is_pinned(&self, ino: u64) -> bool {
        self.pinned.contains(&ino)
    }

    /// Every inode the daemon pinned for us (told to a restarted daemon).
    pub(crate) fn pinned(&self) -> impl Iterator<Item = u64> + '_ {
        self.pinned.iter().copied()
    }

    /// The daemon no longer pins `ino` for us (we told it, or the pin failed).
    pub(crate) fn unpinned(&mut self, ino: u64) {
        self.pinned.remove(&ino);
    }

    /// A handle of `ino` is being closed: `None` if others stay open (the count went
    /// down) or none was (nothing to do); else what the last close must do before
    /// [`Handles::closed`]. Called again after a retry, it answers the same for what is
    /// left: the count goes down only when it is not the last.
    pub(crate) fn closing(&mut self, ino: u64) -> Option<LastClose> {
        let n = self.open.get_mut(&ino)?;
        if *n > 1 {
            *n -= 1;
            return None;
        }
        Some(LastClose {
            pinned: self.pinned.contains(&ino),
        })
    }

    /// The last handle of `ino` is closed.
    pub(crate) fn closed(&mut self, ino: u64) {
        self.open.remove(&ino);
        self.tmpfiles.remove(&ino);
        self.check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_close_of_a_pinned_file_unpins_it() {
        let mut h = Handles::default();
        h.opened(7);
        h.opened(7);
        assert!(h.is_open(7) && !h.is_open(8));
        h.pin(7);
        assert_eq!(h.closing(7), None, "one handle left");
        let last = LastClose { pinned: true };
        assert_eq!(h.closing(7), Some(last));
        assert_eq!(h.closing(7), Some(last), "a retried close sees the same");
        h.unpinned(7);
        assert_eq!(h.closing(7), Some(LastClose { pinned: false }));
        h.closed(7);
        assert!(!h.is_open(7));
        assert_eq!(h.closing(7), None, "closed: nothing to do");
    }

    #[test]
    fn an_unnamed_file_stays_linkable_until_named_or_closed() {
        let mut h = Handles::default();
        h.pin(3);
        h.opened_unnamed(3, true);
        assert!(h.is_linkable_unnamed(3));
        h.named(3);
        assert!(!h.is_linkable_unnamed(3));
        h.opened_unnamed(4, true);
        assert!(h.closing(4).is_some());
        h.closed(4);
        assert!(!h.is_linkable_unnamed(4));
    }
}
