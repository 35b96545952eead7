//! A buffer that several reads fill at once, each through its own lane of interleaved pieces: an erasure
//! set reads its k data shards straight into their places in the object's bytes (shard j's units are the
//! pieces j, j + k, j + 2k, ... of the stripes), so that the shards need no join copy afterwards
//! ([`Snapshot::read_into`](crate::Snapshot::read_into)).
//!
//! Lanes are owned (a read may run on another thread, and outlive a cancelled request: its lane keeps the
//! memory alive until it is done), disjoint by construction, and not `Clone`, so no two writers ever reach
//! the same byte. The buffer's bytes are handed back only when every lane is gone and every lane said
//! that it wrote all its pieces; until then they may be uninitialised and nothing reads them.

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Lanes of one buffer: at most this many (a set has at most 16 drives).
pub const STRIPED_LANES_MAX: usize = 64;

/// The bytes of `lanes * pieces` pieces of `piece_bytes` each, piece i in lane `i % lanes`.
pub struct StripedBuffer {
    shared: Arc<Shared>,
}

/// One lane of a [`StripedBuffer`]: the pieces `lane`, `lane + lanes`, ... in order.
pub struct StripeLane {
    shared: Arc<Shared>,
    lane: usize,
}

struct Shared {
    /// The allocation, reached only through `ptr` until every lane is gone (capacity `capacity_bytes`).
    vec: std::cell::UnsafeCell<Vec<u8>>,
    ptr: *mut u8,
    lanes: usize,
    piece_bytes: usize,
    pieces_per_lane: usize,
    /// Lanes whose every piece was written (`StripeLane::set_filled`).
    filled: AtomicUsize,
}

// SAFETY: the allocation is written only through lanes, whose pieces are disjoint, and read only by the
// buffer once it is the last owner (`into_vec`); `ptr` is never freed while an owner lives.
unsafe impl Send for Shared {}
// SAFETY: as above: shared access hands out no overlapping mutable memory.
unsafe impl Sync for Shared {}

impl StripedBuffer {
    /// A buffer of `lanes * pieces_per_lane` pieces of `piece_bytes`, with room for `spare_bytes` more
    /// at its end (appended once it is whole, without reallocating), and its lanes.
    pub fn new(
        lanes: usize,
        piece_bytes: usize,
        pieces_per_lane: usize,
        spare_bytes: usize,
    ) -> (StripedBuffer, Vec<StripeLane>) {
        assert!((1..=STRIPED_LANES_MAX).contains(&lanes) && piece_bytes > 0, "a striped buffer's shape");
        let len = lanes.checked_mul(piece_bytes).and_then(|b| b.checked_mul(pieces_per_lane)).expect("size");
        let mut vec = Vec::with_capacity(len.checked_add(spare_bytes).expect("size"));
        let ptr = vec.as_mut_ptr();
        let shared = Arc::new(Shared {
            vec: std::cell::UnsafeCell::new(vec),
            ptr,
            lanes,
            piece_bytes,
            pieces_per_lane,
            filled: AtomicUsize::new(0),
        });
        let lanes = (0..lanes).map(|lane| StripeLane { shared: shared.clone(), lane }).collect();
        (StripedBuffer { shared }, lanes)
    }

    /// The whole buffer's length in bytes.
    pub fn len_bytes(&self) -> usize {
        self.shared.lanes * self.shared.piece_bytes * self.shared.pieces_per_lane
    }

    /// The bytes, once every lane is dropped and every lane was filled; otherwise None (the buffer is
    /// dropped: a lane that failed left it partly unwritten).
    pub fn into_vec(self) -> Option<Vec<u8>> {
        let len = self.len_bytes();
        let shared = Arc::try_unwrap(self.shared).ok()?;
        if shared.filled.load(Ordering::Acquire) != shared.lanes {
            return None;
        }
        let mut vec = shared.vec.into_inner();
        debug_assert!(vec.capacity() >= len && vec.as_mut_ptr() == shared.ptr);
        // SAFETY: every lane wrote every one of its pieces (`set_filled`), and the lanes' pieces tile
        // [0, len) exactly, so the first `len` bytes are initialised.
        unsafe { vec.set_len(len) };
        Some(vec)
    }
}

impl StripeLane {
    /// Bytes this lane holds: what a read into it fills.
    pub fn len_bytes(&self) -> usize {
        self.shared.piece_bytes * self.shared.pieces_per_lane
    }

    /// The lane's pieces, in order, to be written (they may hold uninitialised memory).
    pub fn pieces_mut(&mut self) -> Vec<&mut [MaybeUninit<u8>]> {
        let s = &*self.shared;
        let stride = s.lanes * s.piece_bytes;
        (0..s.pieces_per_lane)
            .map(|i| {
                let at = i * stride + self.lane * s.piece_bytes;
                // SAFETY: [at, at + piece_bytes) lies within the allocation's capacity; it belongs to this
                // lane alone (pieces of lane l start at l * piece_bytes modulo the stride), and `&mut self`
                // keeps this lane from handing it out twice at once.
                unsafe { std::slice::from_raw_parts_mut(s.ptr.add(at).cast::<MaybeUninit<u8>>(), s.piece_bytes) }
            })
            .collect()
    }

    /// Marks every piece of the lane written.
    ///
    /// # Safety
    /// Every byte of every piece of `pieces_mut` must have been written.
    pub unsafe fn set_filled(self) {
        self.shared.filled.fetch_add(1, Ordering::Release);
    }

    /// Fills the lane from `bytes` (its length or shorter) and marks it filled when they cover it: the
    /// bytes written. What a store without a scattered read does after an ordinary one.
    pub fn fill_from(mut self, bytes: &[u8]) -> usize {
        let done = copy_into_pieces(bytes, &mut self.pieces_mut());
        if done == self.len_bytes() {
            // SAFETY: every piece was just written whole.
            unsafe { self.set_filled() };
        }
        done
    }
}

/// Copies `bytes` into `pieces` in order, as far as both reach: the bytes copied (the prefix of the
/// pieces they cover is initialised after it).
pub fn copy_into_pieces(bytes: &[u8], pieces: &mut [&mut [MaybeUninit<u8>]]) -> usize {
    copy_into_pieces_at(bytes, pieces, 0)
}

/// Copies `bytes` into `pieces` from byte `at` of the pieces (their lengths added in order), as far as
/// both reach: the bytes copied. A read that arrives in parts writes each after the last.
pub fn copy_into_pieces_at(bytes: &[u8], pieces: &mut [&mut [MaybeUninit<u8>]], at: usize) -> usize {
    let mut skip = at;
    let mut done = 0;
    for piece in pieces.iter_mut() {
        if skip >= piece.len() {
            skip -= piece.len();
            continue;
        }
        let n = (piece.len() - skip).min(bytes.len() - done);
        // SAFETY: u8 and MaybeUninit<u8> share a layout; `bytes` is a shared borrow, so it cannot be the
        // pieces' memory, which is borrowed exclusively; `skip + n` is within the piece.
        unsafe { std::ptr::copy_nonoverlapping(bytes[done..].as_ptr(), piece.as_mut_ptr().cast::<u8>().add(skip), n) };
        done += n;
        skip = 0;
        if done == bytes.len() {
            break;
        }
    }
    debug_assert!(done <= bytes.len());
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_interleave_their_pieces_and_the_buffer_comes_back_whole() {
        let (buf, lanes) = StripedBuffer::new(3, 4, 2, 8);
        assert_eq!(buf.len_bytes(), 24);
        for (l, lane) in lanes.into_iter().enumerate() {
            let src: Vec<u8> = (0..8).map(|i| (l * 10 + i) as u8).collect();
            assert_eq!(lane.fill_from(&src), 8);
        }
        let v = buf.into_vec().unwrap();
        let want: Vec<u8> = [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 4, 5, 6, 7, 14, 15, 16, 17, 24, 25, 26, 27]
            .into_iter()
            .collect();
        assert_eq!(v, want);
        assert!(v.capacity() >= 32, "the spare room is there");
    }

    #[test]
    fn a_lane_short_of_its_bytes_or_still_held_withholds_the_buffer() {
        let (buf, mut lanes) = StripedBuffer::new(2, 4, 1, 0);
        assert_eq!(lanes.pop().unwrap().fill_from(&[1, 2]), 2, "a short fill");
        assert_eq!(lanes.pop().unwrap().fill_from(&[1, 2, 3, 4]), 4);
        assert!(buf.into_vec().is_none(), "one lane was not filled");
        let (buf, lanes) = StripedBuffer::new(1, 4, 1, 0);
        assert!(buf.into_vec().is_none(), "a lane is still held");
        drop(lanes);
    }

    #[test]
    fn parts_copied_at_their_offsets_fill_the_pieces_as_one_copy_does() {
        // Every split of 10 bytes into two parts, over pieces of 3, 4 and 3 bytes (and past their end).
        let src: Vec<u8> = (1..=12).collect();
        for cut in 0..=12 {
            let mut store = [MaybeUninit::new(0u8); 10];
            let (a, rest) = store.split_at_mut(3);
            let (b, c) = rest.split_at_mut(4);
            let mut pieces: Vec<&mut [MaybeUninit<u8>]> = vec![a, b, c];
            let first = copy_into_pieces_at(&src[..cut], &mut pieces, 0);
            assert_eq!(first, cut.min(10));
            let second = copy_into_pieces_at(&src[cut..], &mut pieces, first);
            assert_eq!(first + second, 10, "cut {cut}: the pieces take 10 bytes in all");
            let got: Vec<u8> = store.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert_eq!(got, src[..10], "cut {cut}");
        }
    }
}
