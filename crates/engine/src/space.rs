//! The drive's space: block allocation, and the growth of a thin data file. A new drive file holds only
//! what is stored (plus one step); when the allocator runs out, the file grows by a large preallocated
//! step (a quarter of its size, 64 MiB to 4 GiB) up to the drive's capacity, so a default server does not
//! reserve half the disk before its first object, and data writes still land in preallocated extents.

use crate::alloc::{Allocator, Extent, Placement};
use crate::blockio::BlockIo;
use crate::error::{EngineError, Result};
use crate::superblock::BLOCK_SIZE_BYTES;
use parking_lot::Mutex;
use std::sync::Arc;

/// Smallest growth step of a thin drive file.
pub(crate) const GROWTH_MIN_BYTES: u64 = 64 << 20;
/// Largest growth step (beyond what one allocation needs).
const GROWTH_MAX_BYTES: u64 = 4 << 30;

pub(crate) struct Space {
    pub(crate) alloc: Arc<Mutex<Allocator>>,
}

impl Space {
    pub(crate) fn new(alloc: Allocator) -> Self {
        Space { alloc: Arc::new(Mutex::new(alloc)) }
    }

    /// Takes `blocks` free blocks, growing the device first when it must and can.
    pub(crate) fn allocate(&self, io: &BlockIo, blocks: u64, placement: Placement) -> Result<Vec<Extent>> {
        let mut a = self.alloc.lock();
        if let Some(extents) = a.allocate(blocks, placement) {
            return Ok(extents);
        }
        let (limit, total) = (a.limit_blocks(), a.total_blocks());
        let needed = blocks - a.free_blocks();
        if limit + needed > total {
            return Err(EngineError::NoSpace { needed_blocks: blocks, free_blocks: a.free_blocks() });
        }
        let new_limit = growth_target(limit, total, needed);
        // Preallocating is quick (extents are reserved, not written), so the allocator's lock is held across
        // it: concurrent allocations wait for the growth instead of racing it.
        io.device().grow_to(new_limit * BLOCK_SIZE_BYTES).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOSPC) {
                EngineError::NoSpace { needed_blocks: blocks, free_blocks: a.free_blocks() }
            } else {
                EngineError::Io(e)
            }
        })?;
        a.grow(new_limit);
        tracing::info!(allocated_bytes = new_limit * BLOCK_SIZE_BYTES, "the drive file grew");
        Ok(a.allocate(blocks, placement).expect("the growth made room"))
    }

    /// Gives back blocks that no durable metadata and no reader references.
    pub(crate) fn release(&self, extents: impl IntoIterator<Item = Extent>) {
        let mut a = self.alloc.lock();
        for e in extents {
            a.release(e);
        }
    }
}

/// The block count to grow a device holding `limit` blocks (of at most `total`) to, so that `needed` more
/// blocks fit: a quarter more, within the step bounds, never past the capacity.
fn growth_target(limit: u64, total: u64, needed: u64) -> u64 {
    let bs = BLOCK_SIZE_BYTES;
    let step = (limit / 4).clamp(GROWTH_MIN_BYTES / bs, GROWTH_MAX_BYTES / bs).max(needed);
    let target = limit.saturating_add(step).min(total);
    debug_assert!(target >= limit + needed && target <= total);
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_steps_are_large_bounded_and_enough() {
        let mib = (1 << 20) / BLOCK_SIZE_BYTES;
        assert_eq!(growth_target(65 * mib, 1 << 30, 1), 129 * mib, "at least 64 MiB");
        assert_eq!(growth_target(4096 * mib, 1 << 30, 1), 5120 * mib, "a quarter");
        assert_eq!(growth_target(65536 * mib, 1 << 30, 1), 69632 * mib, "at most 4 GiB");
        assert_eq!(growth_target(65 * mib, 1 << 30, 2048 * mib), 2113 * mib, "what one allocation needs");
        assert_eq!(growth_target(65 * mib, 100 * mib, 1), 100 * mib, "never past the capacity");
    }
}
