//! Heap buffers aligned for O_DIRECT: what a body is staged from, at every level (a drive writes them
//! without a bounce copy). The device asserts alignment on every IO: ext4 silently accepts a
//! misaligned buffer on some paths, so tests on a file would not notice a bug that a block device rejects.

use std::alloc::{Layout, alloc, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// Alignment of every IO buffer and offset, in bytes.
pub const IO_ALIGN_BYTES: usize = 4096;

/// A zero-initialised buffer whose address and length are multiples of [`IO_ALIGN_BYTES`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len_bytes` (rounded up to the alignment) of zeroed memory.
    pub fn zeroed(len_bytes: usize) -> Self {
        let len_bytes = len_bytes.div_ceil(IO_ALIGN_BYTES).max(1) * IO_ALIGN_BYTES;
        let layout = Layout::from_size_align(len_bytes, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len_bytes }
    }

    /// A buffer holding a copy of `data`, zero-padded to the alignment. Skips zeroing the part that is
    /// overwritten at once (the write path copies every large write through here).
    pub fn copy_of(data: &[u8]) -> Self {
        let len_bytes = data.len().div_ceil(IO_ALIGN_BYTES).max(1) * IO_ALIGN_BYTES;
        let layout = Layout::from_size_align(len_bytes, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: the allocation holds len_bytes >= data.len() bytes; every byte is initialised below
        // before the buffer is used: data first, then the zero padding.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len());
            std::ptr::write_bytes(ptr.as_ptr().add(data.len()), 0, len_bytes - data.len());
        }
        AlignedBuf { ptr, len_bytes }
    }

    /// A buffer of `len_bytes` (rounded up to the alignment) whose bytes `fill` writes, without zeroing
    /// them first (a large read costs a memset otherwise). The buffer exists only if `fill` succeeds.
    ///
    /// # Safety
    /// When `fill` returns Ok it must have written every byte of the slice it was given.
    pub unsafe fn filled_with<E>(
        len_bytes: usize,
        fill: impl FnOnce(&mut [std::mem::MaybeUninit<u8>]) -> Result<(), E>,
    ) -> Result<Self, E> {
        let len_bytes = len_bytes.div_ceil(IO_ALIGN_BYTES).max(1) * IO_ALIGN_BYTES;
        let layout = Layout::from_size_align(len_bytes, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // From here the allocation is owned: dropped (freed) on every path. Its bytes count as initialised
        // only once `fill` succeeded, per the caller's promise.
        let buf = AlignedBuf { ptr, len_bytes };
        // SAFETY: the allocation holds len_bytes bytes; MaybeUninit makes no claim about their contents.
        let uninit =
            unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<std::mem::MaybeUninit<u8>>(), len_bytes) };
        fill(uninit)?;
        Ok(buf)
    }

    pub fn len(&self) -> usize {
        self.len_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len_bytes initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len_bytes bytes and we hold &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len_bytes", &self.len_bytes).finish()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len_bytes, IO_ALIGN_BYTES).expect("valid layout");
        // SAFETY: allocated in `zeroed` with the same layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Asserts that an IO's buffer address, length and device offset are all aligned.
pub fn assert_io_aligned(buf: &[u8], offset_bytes: u64) {
    assert_eq!(buf.as_ptr() as usize % IO_ALIGN_BYTES, 0, "IO buffer address is not aligned");
    assert_eq!(buf.len() % IO_ALIGN_BYTES, 0, "IO length is not aligned");
    assert_eq!(offset_bytes % IO_ALIGN_BYTES as u64, 0, "IO offset is not aligned");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_rounded_up_and_initialised() {
        let b = AlignedBuf::zeroed(1);
        assert_eq!((b.len(), b.as_slice().as_ptr() as usize % IO_ALIGN_BYTES), (IO_ALIGN_BYTES, 0));
        assert!(b.as_slice().iter().all(|x| *x == 0));
        let c = AlignedBuf::copy_of(&[7; 5000]);
        assert_eq!(c.len(), 2 * IO_ALIGN_BYTES);
        assert!(c.as_slice()[..5000].iter().all(|x| *x == 7) && c.as_slice()[5000..].iter().all(|x| *x == 0));
        assert_io_aligned(c.as_slice(), 8192);
    }
}
