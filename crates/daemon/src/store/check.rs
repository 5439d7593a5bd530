//! Checks of what a digest just published, run in checked builds (`debug_assertions`:
//! the test suite's `ci` profile) after every digest: a broken invariant stops the
//! daemon at once (fail-stop, `util::install_fail_stop`) instead of being built upon.

use crate::store::shared::Shared;
use crate::store::{dirhash, recovery};
use cairn_format::inode::{Inode, Kind};
use cairn_format::map::{entry_block, entry_tier};

/// Inode `ino` as just published: its block count is what its map (and a directory's
/// buckets) hold, each of those blocks is allocated in its tier, and a directory holds
/// as many entries as it says.
pub(crate) fn published_inode(sh: &Shared, ino: u64, inode: &Inode) -> Result<(), String> {
    let owned = recovery::owned_blocks(sh, inode).map_err(|e| format!("inode {ino}: {e}"))?;
    if owned.len() as u64 != inode.blocks {
        return Err(format!(
            "inode {ino}: block count {} but its map holds {}",
            inode.blocks,
            owned.len()
        ));
    }
    for &b in &owned {
        let used = match entry_tier(b) {
            0 => sh.blocks.is_used(b),
            t => sh.tier(t).is_some_and(|ta| ta.is_used(entry_block(b))),
        };
        if !used {
            return Err(format!("inode {ino}: its block {b:#x} is free"));
        }
    }
    if inode.attrs.kind == Kind::Dir {
        let n = dirhash::entries(sh, inode, &mut |_| {})
            .map_err(|e| format!("directory {ino}: {e}"))?
            .len() as u64;
        if n != inode.dir_entries {
            return Err(format!(
                "directory {ino}: entry count {} but it holds {n}",
                inode.dir_entries
            ));
        }
    }
    Ok(())
}

/// The NVM block allocator: its free count is what its bitmap says.
pub(crate) fn allocation(sh: &Shared) -> Result<(), String> {
    let (free, bitmap_free) = sh.blocks.counts();
    if free != bitmap_free {
        return Err(format!(
            "the block allocator counts {free} free blocks, its bitmap {bitmap_free}"
        ));
    }
    Ok(())
}
