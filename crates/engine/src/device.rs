//! Data devices: where object blocks live. One trait, three backends: a regular file and a raw block
//! device (both O_DIRECT), and a simulated in-memory device that can crash, for the crash tests. A regular
//! file is either preallocated whole or thin: it holds what is stored and grows in preallocated steps
//! (`grow_to`) up to its capacity.
//!
//! The engine never overwrites a block referenced by durable metadata (copy-on-write), so a device only
//! needs plain positional reads and writes plus a flush that makes every completed write durable.

pub use crate::mapped::CachedMapping;
pub use crate::uring::IoEngine;
use mosaic_store::{IO_ALIGN_BYTES, assert_io_aligned};
use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A block device as the engine sees it. Offsets and lengths are multiples of [`IO_ALIGN_BYTES`] and
/// buffers are aligned; implementations assert it.
pub trait Device: Send + Sync + 'static {
    /// Bytes the device holds now: every IO lies below this.
    fn size_bytes(&self) -> u64;
    /// The most the device can grow to (a block device: its size).
    fn capacity_bytes(&self) -> u64 {
        self.size_bytes()
    }
    /// Grows the device to hold `size_bytes` (at most its capacity); the new bytes read as zeros. A device
    /// that cannot grow refuses anything larger than it is.
    fn grow_to(&self, size_bytes: u64) -> io::Result<()> {
        if size_bytes <= self.size_bytes() {
            return Ok(());
        }
        Err(io::Error::new(io::ErrorKind::Unsupported, "this device cannot grow"))
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()>;
    /// Reads through the kernel's page cache where the device has one, so hot data comes from memory that
    /// the kernel reclaims under pressure (and that is not the process's). The default reads directly.
    fn read_cached_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.read_at(buf, offset_bytes)
    }
    /// `read_cached_at` into memory that is not initialised yet: on Ok every byte of `buf` was written.
    /// The default zeroes `buf` first; a file device reads into it directly (no memset of large reads).
    fn read_cached_at_uninit(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        for b in buf.iter_mut() {
            b.write(0);
        }
        // SAFETY: every byte was just initialised; MaybeUninit<u8> has u8's layout.
        let init = unsafe { &mut *(buf as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
        self.read_cached_at(init, offset_bytes)
    }
    /// `read_cached_at_uninit` only if it completes from memory: an error of kind `WouldBlock` when any
    /// byte would have to wait for the device (then `buf` holds nothing of use). Lets a small read be
    /// answered on the caller's thread, without a hop to a blocking thread. The default never tries.
    fn read_cached_at_uninit_nowait(
        &self,
        _buf: &mut [std::mem::MaybeUninit<u8>],
        _offset_bytes: u64,
    ) -> io::Result<()> {
        Err(io::ErrorKind::WouldBlock.into())
    }
    /// `read_cached_at_uninit` of consecutive bytes from `offset_bytes` into `pieces`, in order (one
    /// vectored read on a file). `resident`: the caller holds the range pinned in the page cache
    /// (`map_cached`), so the read is a copy from memory and needs no turn at the device. The default reads
    /// the range (whole blocks) into one aligned buffer and copies it into the pieces.
    fn read_cached_vectored(
        &self,
        pieces: &mut [&mut [std::mem::MaybeUninit<u8>]],
        offset_bytes: u64,
        resident: bool,
    ) -> io::Result<()> {
        let _ = resident;
        // A device without a page cache reads directly, into aligned memory; the pieces need not be.
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let mut buf = mosaic_store::AlignedBuf::zeroed(total);
        self.read_cached_at(&mut buf.as_mut_slice()[..total], offset_bytes)?;
        let done = mosaic_store::copy_into_pieces(&buf.as_slice()[..total], pieces);
        debug_assert_eq!(done, total);
        Ok(())
    }
    /// `[offset_bytes, offset_bytes + len_bytes)` pinned in the kernel's page cache (read into it first if
    /// it is not there) and mapped: a large cached read without a copy (see `mapped.rs`). None when the
    /// device has no page cache to map or the range cannot be pinned now; the caller then reads with
    /// `read_cached_at*`, which names any failure. The default maps nothing.
    fn map_cached(&self, _offset_bytes: u64, _len_bytes: usize) -> Option<CachedMapping> {
        None
    }
    /// Drops cached pages of a range, so the next cached read comes from the device.
    fn forget_cached(&self, _offset_bytes: u64, _len_bytes: u64) {}
    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()>;
    /// Makes every write that completed before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Tells the device that a range holds no live data (TRIM). Advisory.
    fn discard(&self, _offset_bytes: u64, _len_bytes: u64) -> io::Result<()> {
        Ok(())
    }
    fn kind(&self) -> &'static str;
    /// How reads and writes reach the device ("io_uring", "pread", "memory").
    fn io_path(&self) -> &'static str {
        "memory"
    }
}

/// Iovecs given to one `preadv` (the kernel's IOV_MAX).
const PREADV_IOVECS_MAX: usize = 1024;

/// A regular file used with O_DIRECT, preallocated with fallocate (whole, or in growth steps) so that block
/// writes never allocate file-system extents on the data path.
pub struct FileDevice {
    file: File,
    /// The same file opened without O_DIRECT, read-only, for `read_cached_at`. Coherent with the direct
    /// writes: the kernel invalidates cached pages of a range a direct write or a hole punch covers, and a
    /// block is only written while no reader can reach it (copy-on-write, deferred reuse).
    cached: File,
    /// Mappings of `cached` for large reads in place (`map_cached`).
    map: crate::mapped::FileMap,
    /// Bytes preallocated now; a regular file grows (never shrinks) through `grow_to`.
    size_bytes: AtomicU64,
    kind: &'static str,
    /// Direct reads and writes go through this ring when io_uring is in use, else pread/pwrite.
    ring: Option<crate::uring::Ring>,
}

impl FileDevice {
    /// Creates (or grows) `path` to `size_bytes` and opens it (io_uring where the kernel allows it).
    pub fn create(path: &Path, size_bytes: u64) -> io::Result<Self> {
        Self::create_with(path, size_bytes, IoEngine::Auto)
    }

    /// Creates (or grows) `path` to `size_bytes`, preallocated, and opens it.
    pub fn create_with(path: &Path, size_bytes: u64, io_engine: IoEngine) -> io::Result<Self> {
        if !size_bytes.is_multiple_of(IO_ALIGN_BYTES as u64) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the device size must be a multiple of 4 KiB"));
        }
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        preallocate(&file, size_bytes)?;
        file.sync_all()?;
        drop(file);
        Self::open_with(path, io_engine)
    }

    /// Opens an existing file or block device with O_DIRECT (io_uring where the kernel allows it).
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_with(path, IoEngine::Auto)
    }

    pub fn open_with(path: &Path, io_engine: IoEngine) -> io::Result<Self> {
        let file = open_direct(path)?;
        let meta = file.metadata()?;
        use std::os::unix::fs::FileTypeExt;
        let (size_bytes, kind) = if meta.file_type().is_block_device() {
            (block_device_size(&file)?, "block")
        } else {
            (meta.len(), "file")
        };
        let size_bytes = size_bytes - size_bytes % IO_ALIGN_BYTES as u64;
        let cached = File::open(path)?;
        // The engine reads exactly the blocks it needs (and keeps its own reads in flight): kernel
        // read-ahead would only pull in neighbouring blocks of other objects.
        advise(&cached, 0, 0, libc::POSIX_FADV_RANDOM)?;
        let ring = match io_engine {
            IoEngine::Pread => None,
            IoEngine::IoUring => Some(crate::uring::Ring::new(kind)?),
            IoEngine::Auto => match crate::uring::Ring::new(kind) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring is unavailable; the device uses pread/pwrite");
                    None
                }
            },
        };
        let map = crate::mapped::FileMap::new(cached.as_raw_fd());
        Ok(FileDevice { file, cached, map, size_bytes: AtomicU64::new(size_bytes), kind, ring })
    }

    fn size(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// Direct IO through the ring (looping over short transfers) or pread/pwrite.
    fn direct_read(&self, mut buf: &mut [u8], mut offset_bytes: u64) -> io::Result<()> {
        let Some(ring) = &self.ring else {
            return self.file.read_exact_at(buf, offset_bytes);
        };
        while !buf.is_empty() {
            match ring.read(self.file.as_raw_fd(), buf, offset_bytes)? {
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the device")),
                n => {
                    buf = &mut buf[n..];
                    offset_bytes += n as u64;
                }
            }
        }
        Ok(())
    }

    fn direct_write(&self, mut buf: &[u8], mut offset_bytes: u64) -> io::Result<()> {
        let Some(ring) = &self.ring else {
            return self.file.write_all_at(buf, offset_bytes);
        };
        while !buf.is_empty() {
            match ring.write(self.file.as_raw_fd(), buf, offset_bytes)? {
                0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "the device took no bytes")),
                n => {
                    buf = &buf[n..];
                    offset_bytes += n as u64;
                }
            }
        }
        Ok(())
    }
}

fn open_direct(path: &Path) -> io::Result<File> {
    let direct = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path);
    match direct {
        Ok(f) => Ok(f),
        // tmpfs and some overlay file systems refuse O_DIRECT; buffered IO plus fdatasync is still durable.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(path = %path.display(), "O_DIRECT unsupported here; using buffered IO");
            OpenOptions::new().read(true).write(true).open(path)
        }
        Err(e) => Err(e),
    }
}

fn advise(file: &File, offset_bytes: u64, len_bytes: u64, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscall on an owned fd.
    let rc =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset_bytes as libc::off_t, len_bytes as libc::off_t, advice) };
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}

fn preallocate(file: &File, size_bytes: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an owned fd.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return file.set_len(size_bytes);
    }
    Err(err)
}

fn block_device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::End(0))
}

/// The largest file a regular file device may grow to (the kernel's file offset limit, rounded down).
const FILE_CAPACITY_BYTES: u64 = (i64::MAX as u64) / IO_ALIGN_BYTES as u64 * IO_ALIGN_BYTES as u64;

impl Device for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size()
    }

    fn capacity_bytes(&self) -> u64 {
        if self.kind == "file" { FILE_CAPACITY_BYTES } else { self.size() }
    }

    fn grow_to(&self, size_bytes: u64) -> io::Result<()> {
        if size_bytes <= self.size() {
            return Ok(());
        }
        if self.kind != "file" || !size_bytes.is_multiple_of(IO_ALIGN_BYTES as u64) {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "only a regular file grows, in whole blocks"));
        }
        preallocate(&self.file, size_bytes)?;
        // The new size is durable with the next flush (fdatasync keeps what is needed to read the data
        // written there), which comes before any metadata that references the new blocks.
        self.size_bytes.fetch_max(size_bytes, Ordering::AcqRel);
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        assert_io_aligned(buf, offset_bytes);
        check_bounds(offset_bytes, buf.len(), self.size())?;
        self.direct_read(buf, offset_bytes)
    }

    fn read_cached_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_bounds(offset_bytes, buf.len(), self.size())?;
        self.cached.read_exact_at(buf, offset_bytes)
    }

    fn read_cached_at_uninit(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        check_bounds(offset_bytes, buf.len(), self.size())?;
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: pread writes at most rest.len() bytes into memory we own exclusively; it never reads it.
            let n = unsafe {
                libc::pread(
                    self.cached.as_raw_fd(),
                    rest.as_mut_ptr().cast::<libc::c_void>(),
                    rest.len(),
                    (offset_bytes + done as u64) as libc::off_t,
                )
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the data file")),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    fn read_cached_vectored(
        &self,
        pieces: &mut [&mut [std::mem::MaybeUninit<u8>]],
        offset_bytes: u64,
        _resident: bool,
    ) -> io::Result<()> {
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        check_bounds(offset_bytes, total, self.size())?;
        let mut iovs: Vec<libc::iovec> =
            pieces.iter_mut().map(|p| libc::iovec { iov_base: p.as_mut_ptr().cast(), iov_len: p.len() }).collect();
        let (mut first, mut done) = (0usize, 0usize);
        while done < total {
            let batch = &iovs[first..iovs.len().min(first + PREADV_IOVECS_MAX)];
            // SAFETY: every iovec names memory of `pieces`, which we borrow exclusively; preadv writes at
            // most the iovecs' lengths into it and never reads it.
            let n = unsafe {
                libc::preadv(
                    self.cached.as_raw_fd(),
                    batch.as_ptr(),
                    batch.len() as libc::c_int,
                    (offset_bytes + done as u64) as libc::off_t,
                )
            };
            let mut n = match n {
                n if n > 0 => n as usize,
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the data file")),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
            };
            done += n;
            // Past the iovecs the read filled; a partly filled one continues where it stopped.
            while n > 0 {
                let iov = &mut iovs[first];
                let step = n.min(iov.iov_len);
                // SAFETY: advances within the same piece (step <= its remaining length).
                iov.iov_base = unsafe { iov.iov_base.cast::<u8>().add(step).cast() };
                iov.iov_len -= step;
                n -= step;
                if iov.iov_len == 0 {
                    first += 1;
                }
            }
        }
        Ok(())
    }

    fn read_cached_at_uninit_nowait(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        check_bounds(offset_bytes, buf.len(), self.size())?;
        let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast::<libc::c_void>(), iov_len: buf.len() };
        // SAFETY: preadv2 writes at most buf.len() bytes into memory we own exclusively; it never reads it.
        // RWF_NOWAIT: the kernel answers EAGAIN (or a short read) instead of waiting for the device.
        let n =
            unsafe { libc::preadv2(self.cached.as_raw_fd(), &iov, 1, offset_bytes as libc::off_t, libc::RWF_NOWAIT) };
        match n {
            n if n >= 0 && n as usize == buf.len() => Ok(()),
            // Part of the range is not in memory: the rest would wait, so the caller reads it all later.
            n if n >= 0 => Err(io::ErrorKind::WouldBlock.into()),
            _ => {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // Not supported by this file system or kernel: the same as not resident.
                    Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) | Some(libc::EINTR) => {
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                    _ => Err(e),
                }
            }
        }
    }

    fn map_cached(&self, offset_bytes: u64, len_bytes: usize) -> Option<CachedMapping> {
        check_bounds(offset_bytes, len_bytes, self.size()).ok()?;
        self.map.pin(offset_bytes, len_bytes)
    }

    fn forget_cached(&self, offset_bytes: u64, len_bytes: u64) {
        // Advisory: a failure leaves the pages cached, and the caller reads directly anyway.
        let _ = advise(&self.cached, offset_bytes, len_bytes, libc::POSIX_FADV_DONTNEED);
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        assert_io_aligned(buf, offset_bytes);
        check_bounds(offset_bytes, buf.len(), self.size())?;
        self.direct_write(buf, offset_bytes)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        if self.kind != "file" {
            return Ok(());
        }
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: plain syscall on an owned fd. Punching a hole frees the file system's blocks; the range
        // reads back as zeros and holds no live data.
        let rc = unsafe {
            libc::fallocate(self.file.as_raw_fd(), mode, offset_bytes as libc::off_t, len_bytes as libc::off_t)
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err);
            }
        }
        Ok(())
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    fn io_path(&self) -> &'static str {
        if self.ring.is_some() { "io_uring" } else { "pread" }
    }
}

fn check_bounds(offset_bytes: u64, len_bytes: usize, size_bytes: u64) -> io::Result<()> {
    match offset_bytes.checked_add(len_bytes as u64) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "IO past the end of the device")),
    }
}

/// What a simulated crash does to writes issued after the last flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unflushed write is lost.
    DropUnflushed,
    /// Unflushed writes are lost except a prefix (in 512-byte sectors) of one of them, chosen by the seed.
    TearOne { seed: u64 },
}

struct SimState {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<(u64, usize)>,
    /// Armed crash: after this many more writes or flushes the device loses power.
    crash_countdown: Option<(u64, CrashMode)>,
}

/// An in-memory device that remembers which writes were flushed, so a test can crash it.
#[derive(Clone)]
pub struct SimDevice {
    state: Arc<Mutex<SimState>>,
    failing: Arc<AtomicBool>,
    /// What the device holds now (`grow_to` raises it up to the capacity).
    size_bytes: Arc<AtomicU64>,
    capacity_bytes: u64,
}

impl SimDevice {
    pub fn new(size_bytes: u64) -> Self {
        Self::thin(size_bytes, size_bytes)
    }

    /// A device that holds `size_bytes` and may grow to `capacity_bytes`, like a thin drive file.
    pub fn thin(size_bytes: u64, capacity_bytes: u64) -> Self {
        assert!(size_bytes.is_multiple_of(IO_ALIGN_BYTES as u64) && size_bytes <= capacity_bytes);
        assert!(capacity_bytes.is_multiple_of(IO_ALIGN_BYTES as u64));
        // Two zeroed allocations, not one cloned: the allocator's fresh zero pages stay unbacked until
        // written, so a device costs the memory of what is written to it (a clone wrote every byte).
        SimDevice {
            state: Arc::new(Mutex::new(SimState {
                durable: vec![0u8; capacity_bytes as usize],
                current: vec![0u8; capacity_bytes as usize],
                pending: Vec::new(),
                crash_countdown: None,
            })),
            failing: Arc::new(AtomicBool::new(false)),
            size_bytes: Arc::new(AtomicU64::new(size_bytes)),
            capacity_bytes,
        }
    }

    /// Simulates power loss: the device's content becomes what was durable, per `mode`.
    pub fn crash(&self, mode: CrashMode) {
        let mut s = self.state.lock();
        Self::crash_locked(&mut s, mode);
    }

    /// Arms a power loss after `ios` more writes or flushes: that IO and every later one fail (as a
    /// dead device would) until `revive`, and the content is what was durable at that moment.
    pub fn arm_crash(&self, ios: u64, mode: CrashMode) {
        self.state.lock().crash_countdown = Some((ios, mode));
    }

    /// Power is back: IO succeeds again on the crashed image.
    pub fn revive(&self) {
        let mut s = self.state.lock();
        s.crash_countdown = None;
        self.failing.store(false, Ordering::SeqCst);
    }

    /// Starts one write or flush: fails if the device is dead, or dies now (an armed crash that this IO
    /// fires). Checked under the state's lock, so an IO never passes the check and then lands on an image
    /// that another IO's crash has just rolled back: a flush that did would report durable what was lost.
    fn begin_io(&self, s: &mut SimState) -> io::Result<()> {
        self.check_failing()?;
        if self.tick(s) {
            return Err(io::Error::other("simulated power loss"));
        }
        Ok(())
    }

    /// Counts one IO against an armed crash; true if the device is (now) dead.
    fn tick(&self, s: &mut SimState) -> bool {
        if let Some((left, mode)) = s.crash_countdown {
            if left == 0 {
                s.crash_countdown = None;
                Self::crash_locked(s, mode);
                self.failing.store(true, Ordering::SeqCst);
                return true;
            }
            s.crash_countdown = Some((left - 1, mode));
        }
        false
    }

    /// The device's content becomes what was durable: every unflushed write is undone (only the ranges
    /// written since the last flush are touched), except, with `TearOne`, a prefix of one of them.
    fn crash_locked(s: &mut SimState, mode: CrashMode) {
        let torn = match mode {
            CrashMode::TearOne { seed } if !s.pending.is_empty() => {
                let (off, len) = s.pending[(seed as usize) % s.pending.len()];
                let keep = (seed as usize / 7) % (len / 512 + 1) * 512;
                Some((off as usize, s.current[off as usize..off as usize + keep].to_vec()))
            }
            _ => None,
        };
        let SimState { durable, current, pending, .. } = &mut *s;
        for &(off, len) in pending.iter() {
            let off = off as usize;
            current[off..off + len].copy_from_slice(&durable[off..off + len]);
        }
        if let Some((off, bytes)) = torn {
            current[off..off + bytes.len()].copy_from_slice(&bytes);
            durable[off..off + bytes.len()].copy_from_slice(&bytes);
        }
        pending.clear();
        debug_assert!(current == durable, "after a crash the device holds what was durable");
    }

    /// Makes every later IO fail with EIO (or succeed again). Under the state's lock, so no write or flush
    /// that checked before is still on its way.
    pub fn set_failing(&self, failing: bool) {
        let _s = self.state.lock();
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Flips one byte in place, durably: for corruption tests.
    pub fn corrupt_byte(&self, offset_bytes: u64) {
        let mut s = self.state.lock();
        let i = offset_bytes as usize;
        s.current[i] ^= 0xA5;
        s.durable[i] ^= 0xA5;
    }

    fn check_failing(&self) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(io::Error::other("simulated device failure"));
        }
        Ok(())
    }
}

impl Device for SimDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    /// The simulated device is memory: every read completes without waiting.
    fn read_cached_at_uninit_nowait(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        self.read_cached_at_uninit(buf, offset_bytes)
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn grow_to(&self, size_bytes: u64) -> io::Result<()> {
        self.check_failing()?;
        if size_bytes > self.capacity_bytes {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.size_bytes.fetch_max(size_bytes, Ordering::AcqRel);
        Ok(())
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        assert_io_aligned(buf, offset_bytes);
        check_bounds(offset_bytes, buf.len(), self.size_bytes())?;
        self.check_failing()?;
        let s = self.state.lock();
        let off = offset_bytes as usize;
        buf.copy_from_slice(&s.current[off..off + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        assert_io_aligned(buf, offset_bytes);
        check_bounds(offset_bytes, buf.len(), self.size_bytes())?;
        let mut s = self.state.lock();
        self.begin_io(&mut s)?;
        let off = offset_bytes as usize;
        s.current[off..off + buf.len()].copy_from_slice(buf);
        s.pending.push((offset_bytes, buf.len()));
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        self.begin_io(&mut s)?;
        let SimState { durable, current, pending, .. } = &mut *s;
        for &(off, len) in pending.iter() {
            let off = off as usize;
            durable[off..off + len].copy_from_slice(&current[off..off + len]);
        }
        pending.clear();
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "sim"
    }
}

/// Writes held by a [`VolatileCacheDevice`] before they are destaged without a flush.
const VOLATILE_CACHE_MAX_BYTES: usize = 256 << 20;

/// A device with a volatile write cache, like a disk with write-back caching and no power-loss protection:
/// writes are held in memory until `flush` writes them through and makes them durable. Killing the process
/// loses every write since the last flush, exactly what a power cut does to such a disk; the server runs on
/// it with `--simulate-power-loss` for the process-level power-loss test. Past its bound the cache destages
/// early (a real disk may also write back early), which never weakens what a flush promises.
pub struct VolatileCacheDevice {
    inner: Arc<dyn Device>,
    /// Block-aligned offset -> the block's newest unflushed contents. One lock keeps reads, writes and the
    /// destaging of a flush from interleaving.
    pending: Mutex<std::collections::BTreeMap<u64, Box<[u8]>>>,
}

impl VolatileCacheDevice {
    pub fn new(inner: Arc<dyn Device>) -> Self {
        VolatileCacheDevice { inner, pending: Mutex::new(std::collections::BTreeMap::new()) }
    }

    /// Writes every pending block to the inner device (contiguous blocks in one write).
    fn destage(&self, pending: &mut std::collections::BTreeMap<u64, Box<[u8]>>) -> io::Result<()> {
        let blocks = std::mem::take(pending);
        let mut run: Vec<(u64, Box<[u8]>)> = Vec::new();
        let write_run = |run: &mut Vec<(u64, Box<[u8]>)>| -> io::Result<()> {
            let Some(start) = run.first().map(|(o, _)| *o) else { return Ok(()) };
            let mut buf = mosaic_store::AlignedBuf::zeroed(run.len() * IO_ALIGN_BYTES);
            for (i, (_, b)) in run.iter().enumerate() {
                buf.as_mut_slice()[i * IO_ALIGN_BYTES..(i + 1) * IO_ALIGN_BYTES].copy_from_slice(b);
            }
            run.clear();
            self.inner.write_at(buf.as_slice(), start)
        };
        for (off, b) in blocks {
            let contiguous = run.last().is_some_and(|(o, _)| o + IO_ALIGN_BYTES as u64 == off);
            if !contiguous || run.len() * IO_ALIGN_BYTES >= 4 << 20 {
                write_run(&mut run)?;
            }
            run.push((off, b));
        }
        write_run(&mut run)
    }
}

impl Device for VolatileCacheDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn grow_to(&self, size_bytes: u64) -> io::Result<()> {
        self.inner.grow_to(size_bytes)
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        assert_io_aligned(buf, offset_bytes);
        let pending = self.pending.lock();
        self.inner.read_at(buf, offset_bytes)?;
        let end = offset_bytes + buf.len() as u64;
        for (off, b) in pending.range(offset_bytes..end) {
            let at = (off - offset_bytes) as usize;
            buf[at..at + IO_ALIGN_BYTES].copy_from_slice(b);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        assert_io_aligned(buf, offset_bytes);
        let mut pending = self.pending.lock();
        for (i, chunk) in buf.chunks(IO_ALIGN_BYTES).enumerate() {
            pending.insert(offset_bytes + (i * IO_ALIGN_BYTES) as u64, chunk.into());
        }
        if pending.len() * IO_ALIGN_BYTES > VOLATILE_CACHE_MAX_BYTES {
            self.destage(&mut pending)?;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut pending = self.pending.lock();
        self.destage(&mut pending)?;
        self.inner.flush()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        // Pending writes to the range stay: a discard is advisory and must not lose a later write.
        self.inner.discard(offset_bytes, len_bytes)
    }

    fn kind(&self) -> &'static str {
        "file with a simulated volatile write cache"
    }
}

/// A fault that a `FaultyDevice` injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceFault {
    /// IO works.
    None = 0,
    /// Every IO fails with EIO, as a dead disk.
    Fail = 1,
    /// Reads work; writes and flushes fail with EROFS, as a disk that turned read-only.
    ReadOnly = 2,
}

/// A handle that sets the fault of a `FaultyDevice` while it runs.
#[derive(Clone, Default)]
pub struct FaultSwitch(Arc<std::sync::atomic::AtomicU8>);

impl FaultSwitch {
    pub fn set(&self, fault: DeviceFault) {
        self.0.store(fault as u8, Ordering::SeqCst);
    }

    pub fn get(&self) -> DeviceFault {
        match self.0.load(Ordering::SeqCst) {
            1 => DeviceFault::Fail,
            2 => DeviceFault::ReadOnly,
            _ => DeviceFault::None,
        }
    }
}

/// A device whose IO can be made to fail while it runs (fault tests of whole processes, through the
/// server's hidden `--fault-injection`).
pub struct FaultyDevice {
    inner: Arc<dyn Device>,
    switch: FaultSwitch,
}

impl FaultyDevice {
    pub fn new(inner: Arc<dyn Device>, switch: FaultSwitch) -> Self {
        FaultyDevice { inner, switch }
    }

    fn check_read(&self) -> io::Result<()> {
        match self.switch.get() {
            DeviceFault::Fail => Err(io::Error::from_raw_os_error(libc::EIO)),
            _ => Ok(()),
        }
    }

    fn check_write(&self) -> io::Result<()> {
        match self.switch.get() {
            DeviceFault::None => Ok(()),
            DeviceFault::Fail => Err(io::Error::from_raw_os_error(libc::EIO)),
            DeviceFault::ReadOnly => Err(io::Error::from_raw_os_error(libc::EROFS)),
        }
    }
}

impl Device for FaultyDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn grow_to(&self, size_bytes: u64) -> io::Result<()> {
        self.check_write()?;
        self.inner.grow_to(size_bytes)
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.check_read()?;
        self.inner.read_at(buf, offset_bytes)
    }

    fn read_cached_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.check_read()?;
        self.inner.read_cached_at(buf, offset_bytes)
    }

    fn read_cached_at_uninit(&self, buf: &mut [std::mem::MaybeUninit<u8>], offset_bytes: u64) -> io::Result<()> {
        self.check_read()?;
        self.inner.read_cached_at_uninit(buf, offset_bytes)
    }

    fn map_cached(&self, offset_bytes: u64, len_bytes: usize) -> Option<CachedMapping> {
        // A failing device maps nothing: the read that follows fails as the device does.
        self.check_read().ok()?;
        self.inner.map_cached(offset_bytes, len_bytes)
    }

    fn forget_cached(&self, offset_bytes: u64, len_bytes: u64) {
        self.inner.forget_cached(offset_bytes, len_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64) -> io::Result<()> {
        self.check_write()?;
        self.inner.write_at(buf, offset_bytes)
    }

    fn flush(&self) -> io::Result<()> {
        self.check_write()?;
        self.inner.flush()
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check_write()?;
        self.inner.discard(offset_bytes, len_bytes)
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn io_path(&self) -> &'static str {
        self.inner.io_path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_store::AlignedBuf;

    fn read(d: &dyn Device, offset: u64) -> Vec<u8> {
        let mut buf = AlignedBuf::zeroed(2 * IO_ALIGN_BYTES);
        d.read_at(buf.as_mut_slice(), offset).unwrap();
        buf.as_slice().to_vec()
    }

    fn nowait(d: &dyn Device, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); len];
        d.read_cached_at_uninit_nowait(&mut buf, offset)?;
        // SAFETY: Ok means every byte was written.
        Ok(buf.into_iter().map(|b| unsafe { b.assume_init() }).collect())
    }

    /// A read that must not wait returns the file's bytes when the kernel's page cache holds them, and
    /// WouldBlock (never other bytes) when it does not; past the end it is an error like any read.
    #[test]
    fn a_nowait_read_gives_the_cached_bytes_or_would_block() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 * IO_ALIGN_BYTES as u64;
        let d = FileDevice::create(&dir.path().join("dev"), size).unwrap();
        let want = vec![0x5a; 4 * IO_ALIGN_BYTES];
        d.write_at(AlignedBuf::copy_of(&want).as_slice(), 0).unwrap();
        d.flush().unwrap();
        d.forget_cached(0, size);
        match nowait(&d, 0, want.len()) {
            Ok(got) => assert_eq!(got, want, "resident or not, the bytes are the file's"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
        }
        let mut cached = vec![0u8; want.len()];
        d.read_cached_at(&mut cached, 0).unwrap();
        assert_eq!(cached, want);
        // The pages were just read through the page cache: this file system answers from memory.
        assert_eq!(nowait(&d, 0, want.len()).unwrap(), want);
        assert_eq!(nowait(&d, IO_ALIGN_BYTES as u64 + 7, 100).unwrap(), want[..100]);
        assert_eq!(nowait(&d, size - 10, 20).unwrap_err().kind(), io::ErrorKind::InvalidInput, "past the end");
        // A device without a page cache never claims to read without waiting.
        let plain = VolatileCacheDevice::new(Arc::new(d));
        assert_eq!(nowait(&plain, 0, 16).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    }

    /// A flush racing with the IO that fires an armed power loss fails, whichever of the two comes first: it
    /// never reports success over the crashed image. (It once could: a flush that passed the failure check
    /// just before another IO crashed the device went on to succeed, and a drive acknowledged a commit
    /// whose staged shard the crash had dropped.)
    #[test]
    fn a_flush_racing_the_io_that_crashes_the_device_fails() {
        for _ in 0..2_000 {
            let d = SimDevice::new(4 * IO_ALIGN_BYTES as u64);
            d.write_at(AlignedBuf::copy_of(&[0xaa; IO_ALIGN_BYTES]).as_slice(), 0).unwrap();
            d.arm_crash(0, CrashMode::DropUnflushed);
            let start = Arc::new(std::sync::Barrier::new(2));
            let other = std::thread::spawn({
                let (d, start) = (d.clone(), start.clone());
                move || {
                    let b = AlignedBuf::copy_of(&[0xbb; IO_ALIGN_BYTES]);
                    start.wait();
                    d.write_at(b.as_slice(), IO_ALIGN_BYTES as u64)
                }
            });
            start.wait();
            let flushed = d.flush();
            assert!(other.join().unwrap().is_err(), "an IO after the crash fails");
            assert!(flushed.is_err(), "the flush crashed the device or came after the crash");
            d.revive();
            assert!(read(&d, 0).iter().all(|&x| x == 0), "the crash dropped every unflushed write");
        }
    }

    #[test]
    fn volatile_cache_loses_exactly_the_unflushed_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let size = 64 * IO_ALIGN_BYTES as u64;
        let a = AlignedBuf::copy_of(&vec![0xaa; 2 * IO_ALIGN_BYTES]);
        let b = AlignedBuf::copy_of(&vec![0xbb; IO_ALIGN_BYTES]);
        {
            let d = VolatileCacheDevice::new(Arc::new(FileDevice::create(&path, size).unwrap()));
            d.write_at(a.as_slice(), 0).unwrap();
            d.flush().unwrap();
            d.write_at(b.as_slice(), IO_ALIGN_BYTES as u64).unwrap();
            // Reads see the newest data, flushed or not.
            let got = read(&d, 0);
            assert!(got[..IO_ALIGN_BYTES].iter().all(|&x| x == 0xaa));
            assert!(got[IO_ALIGN_BYTES..].iter().all(|&x| x == 0xbb));
            // Dropped without a flush: the power goes out.
        }
        let d = FileDevice::open(&path).unwrap();
        let got = read(&d, 0);
        assert!(got.iter().all(|&x| x == 0xaa), "the unflushed write must be lost, the flushed one kept");
        drop(d);
        let d = VolatileCacheDevice::new(Arc::new(FileDevice::open(&path).unwrap()));
        d.write_at(b.as_slice(), IO_ALIGN_BYTES as u64).unwrap();
        d.flush().unwrap();
        drop(d);
        let got = read(&FileDevice::open(&path).unwrap(), 0);
        assert!(got[IO_ALIGN_BYTES..].iter().all(|&x| x == 0xbb), "a flushed write is durable");
    }
}
