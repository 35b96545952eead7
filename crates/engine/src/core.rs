//! The drive's shared state below planning and reading: the metadata database, block IO, the metadata and
//! page caches, the commit epochs that snapshots pin, and the prioritized-work gate (qos). Readers hold
//! an `Arc<Core>` and nothing else; the commit pipeline owns the write-side state (allocator, queues) on
//! top of it.

use crate::blockio::BlockIo;
use crate::meta_cache::MetaCache;
use crate::page_cache::PageCache;
use crate::qos::HighPriorityWork;
use parking_lot::Mutex;
use rocksdb::DB;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Core {
    pub(crate) db: Arc<DB>,
    pub(crate) io: BlockIo,
    /// Names, onodes and attributes, newest committed values (meta_cache.rs).
    pub(crate) meta_cache: MetaCache,
    /// Clean, dirty and fragment pages of recently written blocks (page_cache.rs).
    pub(crate) page_cache: PageCache,
    pub(crate) epochs: Epochs,
    /// Prioritized requests in flight; background work waits for them (bounded).
    pub(crate) qos: Arc<HighPriorityWork>,
}

/// A reader's epoch held by bytes it served in place (a locked page-cache mapping handed to the caller):
/// blocks freed after the epoch are neither reused nor discarded while the bytes live, even once the
/// reader itself is gone.
pub(crate) struct EpochPin {
    core: Arc<Core>,
    epoch: u64,
}

impl Core {
    /// Pins `epoch`, which a live reader of this core holds, once more until the pin drops.
    pub(crate) fn pin_again(self: &Arc<Self>, epoch: u64) -> EpochPin {
        self.epochs.pin_again(epoch);
        EpochPin { core: self.clone(), epoch }
    }
}

impl Drop for EpochPin {
    fn drop(&mut self) {
        self.core.epochs.unpin(self.epoch);
    }
}

/// Commit epochs: the epoch is incremented after every durable group, and every reader pins the epoch it
/// started in, so that blocks freed by later groups are reused only once no reader can still see them.
#[derive(Default)]
pub(crate) struct Epochs {
    published: AtomicU64,
    /// Active readers by the epoch they started in.
    pinned: Mutex<BTreeMap<u64, usize>>,
}

impl Epochs {
    pub(crate) fn starting_at(epoch: u64) -> Self {
        Epochs { published: AtomicU64::new(epoch), pinned: Mutex::new(BTreeMap::new()) }
    }

    /// The newest durable epoch.
    pub(crate) fn published(&self) -> u64 {
        self.published.load(Ordering::SeqCst)
    }

    /// Publishes the next epoch (after its group is durable) and returns it.
    pub(crate) fn publish_next(&self) -> u64 {
        let before = self.published.fetch_add(1, Ordering::SeqCst);
        let after = before.checked_add(1).expect("epochs do not wrap");
        assert!(after > before, "epochs only increase");
        after
    }

    /// Pins the current epoch for a new reader. `read_first` runs just before the published epoch is read,
    /// under the pin lock (the metadata cache's installed epoch must be read first: see meta_cache.rs).
    pub(crate) fn pin<T>(&self, read_first: impl FnOnce() -> T) -> (u64, T) {
        let mut pinned = self.pinned.lock();
        let first = read_first();
        let epoch = self.published();
        *pinned.entry(epoch).or_insert(0) += 1;
        (epoch, first)
    }

    /// One more pin of an epoch a live reader holds (bytes it served in place outlive it: `EpochPin`).
    pub(crate) fn pin_again(&self, epoch: u64) {
        let mut pinned = self.pinned.lock();
        let count = pinned.get_mut(&epoch).expect("only a pinned epoch is pinned again");
        assert!(*count > 0, "a pinned epoch has readers ({epoch})");
        *count += 1;
    }

    pub(crate) fn unpin(&self, epoch: u64) {
        let mut pinned = self.pinned.lock();
        let count = pinned.get_mut(&epoch).expect("a reader unpins the epoch it pinned");
        assert!(*count > 0, "reader count underflow at epoch {epoch}");
        *count -= 1;
        if *count == 0 {
            pinned.remove(&epoch);
        }
    }

    /// The oldest epoch a live reader still sees, if any.
    pub(crate) fn oldest_pinned(&self) -> Option<u64> {
        self.pinned.lock().keys().next().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_increase_and_pins_are_counted() {
        let e = Epochs::starting_at(1);
        let (a, _) = e.pin(|| ());
        let (b, _) = e.pin(|| ());
        assert_eq!((a, b, e.oldest_pinned()), (1, 1, Some(1)));
        assert_eq!(e.publish_next(), 2);
        let (c, seen) = e.pin(|| "first");
        assert_eq!((c, seen), (2, "first"));
        e.unpin(1);
        assert_eq!(e.oldest_pinned(), Some(1), "one reader of epoch 1 is left");
        e.unpin(1);
        assert_eq!(e.oldest_pinned(), Some(2));
        e.unpin(2);
        assert_eq!(e.oldest_pinned(), None);
    }

    #[test]
    fn an_epoch_pinned_again_is_held_until_every_pin_drops() {
        let e = Epochs::starting_at(3);
        let (a, _) = e.pin(|| ());
        e.pin_again(a);
        e.unpin(a);
        assert_eq!(e.oldest_pinned(), Some(3), "the second pin holds it");
        e.unpin(a);
        assert_eq!(e.oldest_pinned(), None);
    }

    #[test]
    #[should_panic(expected = "only a pinned epoch")]
    fn pinning_again_an_epoch_no_reader_holds_is_a_bug() {
        Epochs::starting_at(1).pin_again(1);
    }

    #[test]
    #[should_panic(expected = "unpins the epoch it pinned")]
    fn unpinning_twice_is_a_bug() {
        let e = Epochs::starting_at(1);
        let (a, _) = e.pin(|| ());
        e.unpin(a);
        e.unpin(a);
    }
}
