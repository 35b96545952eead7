//! Large cached reads without a copy: a range of the data file held in the kernel's page cache and read
//! (verified, then sent) through a read-only mapping of the file, instead of copied into a buffer first.
//!
//! Two things make this safe. A plain mapping turns a device error during a page-in into SIGBUS, which
//! would crash the process on a failed drive; and a page evicted between the checksum and the send would
//! be read again from the device, so the bytes sent would not be the bytes verified. So before anyone
//! touches the mapping, the range is spliced into a pipe (`splice` from the file): that reads whatever is
//! not cached with the kernel's ordinary reads (a failure is an error returned, never a signal) and the
//! pipe holds a reference to every page, which keeps them in the page cache until the pipe closes. While
//! the range is pinned, touching the mapping can at most map a page that is there (a minor fault): no
//! device IO, no signal, and the same bytes every time. (`mlock` would pin them too, but moving pages on
//! and off the unevictable list cost more than the copy it saves, measured.)
//!
//! The engine pins only blocks that no writer touches while the pin lives (copy-on-write, and frees of
//! blocks a reader can see deferred: the pin holds its reader's epoch), so the pages do not change under
//! it. Mappings are windows of `WINDOW_BYTES`, made once per window and kept (at most `WINDOWS_MAX` per
//! file), so a read costs no mmap or munmap. Pinned ranges are bounded process-wide in bytes and in count
//! (each holds a pipe's read end, one descriptor); past either bound, where the kernel refuses (a pipe larger than
//! `pipe-max-size` for a user without CAP_SYS_RESOURCE, no descriptors left), or for a range that crosses
//! a window's edge, reads copy as before.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes pinned at once across every device of the process: at most this, and a quarter of the memory.
pub const PINNED_MAX_BYTES: u64 = 16 << 30;
/// Ranges pinned at once (each holds a pipe's read end, one descriptor): at most this, and a quarter of
/// the process's descriptor limit.
pub const PINNED_MAX_RANGES: u64 = 8192;
/// A file is mapped in windows of this size, each made when first read.
const WINDOW_BYTES: u64 = 1 << 30;
/// Windows kept mapped per file (address space, not memory: pages are the page cache's).
const WINDOWS_MAX: usize = 256;

static BUDGET: Budget = Budget::new(0, 0);

/// Bytes pinned now (metrics and tests).
pub fn pinned_bytes() -> u64 {
    BUDGET.bytes.load(Ordering::Relaxed)
}

/// The read-only mappings of one file (a device's page-cache descriptor), by window.
pub(crate) struct FileMap {
    /// Borrowed: the device owns the file and drops this map first.
    fd: RawFd,
    windows: Mutex<HashMap<u64, Arc<Window>>>,
    budget: &'static Budget,
}

/// One window of a file, mapped read-only; unmapped when the last range read through it is dropped.
struct Window {
    base: NonNull<u8>,
}

// SAFETY: read-only memory of a file mapping owned by this value; reading it from any thread is sound.
unsafe impl Send for Window {}
// SAFETY: as above; nothing writes through it.
unsafe impl Sync for Window {}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the window mapped in `FileMap::window`, once.
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), WINDOW_BYTES as usize) };
        debug_assert_eq!(rc, 0, "munmap of our own window");
    }
}

/// A range of a file pinned in the page cache and readable through a mapping, until dropped.
pub struct CachedMapping {
    window: Arc<Window>,
    /// Where the range starts in its window.
    at: usize,
    len: usize,
    /// The read end of the pipe whose buffers hold the range's pages (the write end is closed once full).
    _pipe: OwnedFd,
    _reserved: Reservation,
}

impl CachedMapping {
    /// Takes the range's pages out of this process's page tables, when the pin is dropped. On a shared
    /// mapping of a file, `MADV_DONTNEED` drops the mappings only: the pages stay in the page cache (and a
    /// read after it, as in the tests, maps them again by a minor fault: no device IO, the same bytes).
    /// Without it every page a large read touched stays mapped as long as its window and counts in the
    /// process's resident memory (`RssFile`), so that memory would grow with the data read, not with the
    /// pins. A pin kept verified keeps its pages mapped while it is kept: unmapping after every read of it
    /// cost a sixth of a 4+2 set's 64 MiB GET throughput (measured 2026-12-02), in page-table work.
    fn unmap_pages(&self) {
        let page = system_page_bytes();
        let start = self.at / page * page;
        let end = (self.at + self.len).div_ceil(page) * page;
        debug_assert!(end <= WINDOW_BYTES as usize, "a range lies in its window");
        // SAFETY: [start, end) lies in this window's mapping, which `self.window` keeps mapped; the advice
        // changes no byte of the file and nothing reads the range once its pin is gone.
        let rc =
            unsafe { libc::madvise(self.window.base.as_ptr().add(start).cast(), end - start, libc::MADV_DONTNEED) };
        debug_assert_eq!(rc, 0, "madvise of our own window");
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [at, at + len) lies in the window's mapping (checked when made), which lives as long as
        // `window`; its pages are pinned in the page cache by `_pipe`, so reading them needs no device IO
        // and cannot fault with SIGBUS.
        unsafe { std::slice::from_raw_parts(self.window.base.as_ptr().add(self.at), self.len) }
    }
}

impl AsRef<[u8]> for CachedMapping {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl FileMap {
    /// The mappings of `fd`, which must stay open as long as this map and the ranges it pins live (the
    /// caller owns it; a window's mapping keeps its own reference to the file).
    pub(crate) fn new(fd: RawFd) -> FileMap {
        Self::with_budget(fd, &BUDGET)
    }

    fn with_budget(fd: RawFd, budget: &'static Budget) -> FileMap {
        FileMap { fd, windows: Mutex::new(HashMap::new()), budget }
    }

    /// `[offset_bytes, offset_bytes + len)` pinned in the page cache (read there first if it is not) and
    /// mapped. None when it crosses a window, a bound is reached, the kernel refuses, or a page cannot be
    /// read: the caller reads through `pread` then, which names any failure. Never a signal. The range
    /// must lie within the file.
    pub(crate) fn pin(&self, offset_bytes: u64, len: usize) -> Option<CachedMapping> {
        let end = offset_bytes.checked_add(len as u64)?;
        if len == 0 || offset_bytes / WINDOW_BYTES != (end - 1) / WINDOW_BYTES {
            return None;
        }
        let reserved = self.budget.reserve(len as u64)?;
        let (pipe, pipe_in) = pipe_holding(len)?;
        splice_into(self.fd, offset_bytes, &pipe_in, len)?;
        drop(pipe_in);
        let index = offset_bytes / WINDOW_BYTES;
        let window = self.window(index)?;
        let at = (offset_bytes - index * WINDOW_BYTES) as usize;
        debug_assert!(at + len <= WINDOW_BYTES as usize);
        Some(CachedMapping { window, at, len, _pipe: pipe, _reserved: reserved })
    }

    /// The window `index`, mapped when first asked for.
    fn window(&self, index: u64) -> Option<Arc<Window>> {
        let mut windows = self.windows.lock();
        if let Some(w) = windows.get(&index) {
            return Some(w.clone());
        }
        if windows.len() >= WINDOWS_MAX {
            // Forget another window; ranges read through it keep it mapped until they drop.
            let other = windows.keys().copied().next()?;
            windows.remove(&other);
        }
        let at = index.checked_mul(WINDOW_BYTES)?;
        // SAFETY: a fresh read-only shared mapping of a file we hold open; the kernel picks the address.
        // Mapping past the end of the file is allowed; the engine reads only below it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                WINDOW_BYTES as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                self.fd,
                at as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let window = Arc::new(Window { base: NonNull::new(ptr.cast::<u8>())? });
        windows.insert(index, window.clone());
        debug_assert!(windows.len() <= WINDOWS_MAX);
        Some(window)
    }
}

impl Drop for CachedMapping {
    fn drop(&mut self) {
        self.unmap_pages();
    }
}

/// The page size, read once.
fn system_page_bytes() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf only reads a system constant.
    *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1))
}

/// A pipe (read end, write end) that holds at least `len` bytes.
fn pipe_holding(len: usize) -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    // SAFETY: both descriptors were just made by pipe2 and are owned by nobody else.
    let pipe = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let want = libc::c_int::try_from(len.max(4096)).ok()?;
    // SAFETY: plain fcntl on a descriptor we own.
    let got = unsafe { libc::fcntl(pipe.1.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
    (got >= want).then_some(pipe)
}

/// Splices `[offset_bytes, offset_bytes + len)` of `fd` into the pipe whole (the pipe then references its
/// pages); None on any failure or a file that ends first.
fn splice_into(fd: RawFd, offset_bytes: u64, pipe_in: &OwnedFd, len: usize) -> Option<()> {
    let mut off = libc::loff_t::try_from(offset_bytes).ok()?;
    let mut done = 0usize;
    while done < len {
        // SAFETY: splice from a file we hold open at our own offset variable into a pipe we own.
        let n = unsafe { libc::splice(fd, &mut off, pipe_in.as_raw_fd(), std::ptr::null_mut(), len - done, 0) };
        match n {
            n if n > 0 => done += n as usize,
            0 => return None,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => continue,
            _ => return None,
        }
    }
    debug_assert_eq!(done, len);
    Some(())
}

/// What may be pinned at once: bytes and ranges.
struct Budget {
    bytes: AtomicU64,
    ranges: AtomicU64,
    max_bytes: u64,
    max_ranges: u64,
}

/// A share of a budget, given back when dropped.
struct Reservation {
    budget: &'static Budget,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let bytes = self.budget.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        let ranges = self.budget.ranges.fetch_sub(1, Ordering::AcqRel);
        assert!(bytes >= self.bytes && ranges >= 1, "a pin's budget was given back twice");
    }
}

impl Budget {
    /// Bounds of 0 are the process's: read from the machine (`machine_bounds`) once.
    const fn new(max_bytes: u64, max_ranges: u64) -> Self {
        Budget { bytes: AtomicU64::new(0), ranges: AtomicU64::new(0), max_bytes, max_ranges }
    }

    fn bounds(&self) -> (u64, u64) {
        if self.max_bytes > 0 {
            return (self.max_bytes, self.max_ranges);
        }
        static MACHINE: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
        *MACHINE.get_or_init(machine_bounds)
    }

    /// One range of `bytes`, or None when that would pass either bound.
    fn reserve(&'static self, bytes: u64) -> Option<Reservation> {
        let (max_bytes, max_ranges) = self.bounds();
        take(&self.ranges, 1, max_ranges)?;
        if take(&self.bytes, bytes, max_bytes).is_none() {
            self.ranges.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Reservation { budget: self, bytes })
    }
}

/// The process-wide bounds: a quarter of the memory and of the descriptor limit, at most the constants.
fn machine_bounds() -> (u64, u64) {
    // SAFETY: sysinfo and getrlimit write into the structs we pass.
    let (mut info, mut files): (libc::sysinfo, libc::rlimit) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: as above.
    let memory = if unsafe { libc::sysinfo(&mut info) } == 0 { info.totalram * u64::from(info.mem_unit) } else { 0 };
    // SAFETY: as above.
    let descriptors = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) } == 0 { files.rlim_cur } else { 0 };
    (PINNED_MAX_BYTES.min(memory / 4), PINNED_MAX_RANGES.min(descriptors / 4))
}

/// Adds `n` to `counter` unless that passes `max`.
fn take(counter: &AtomicU64, n: u64, max: u64) -> Option<()> {
    let mut now = counter.load(Ordering::Relaxed);
    loop {
        let after = now.checked_add(n).filter(|a| *a <= max)?;
        match counter.compare_exchange_weak(now, after, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Some(()),
            Err(seen) => now = seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> (tempfile::TempDir, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path).unwrap().write_all(bytes).unwrap();
        (dir, std::fs::File::open(&path).unwrap())
    }

    fn used(b: &Budget) -> (u64, u64) {
        (b.bytes.load(Ordering::Relaxed), b.ranges.load(Ordering::Relaxed))
    }

    /// A pinned range shows the file's bytes, aligned or not, cached before or not, and gives its budget
    /// back when dropped.
    #[test]
    fn a_pinned_range_shows_the_file_and_returns_its_budget() {
        static B: Budget = Budget::new(1 << 20, 8);
        let data: Vec<u8> = (0..64 * 4096u32).map(|i| (i % 251) as u8).collect();
        let (_dir, f) = file_of(&data);
        f.sync_all().unwrap();
        // SAFETY: plain syscall on an owned fd: drops the file's clean pages, so the pin reads them.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        let map = FileMap::with_budget(f.as_raw_fd(), &B);
        let mut held = Vec::new();
        for (at, len) in [(0usize, 4096usize), (4096, 16 * 4096), (8192 + 512, 5000), (0, data.len())] {
            let m = map.pin(at as u64, len).expect("a range of the file is pinned");
            assert_eq!(m.as_slice(), &data[at..at + len]);
            held.push(m);
        }
        assert_eq!(used(&B).1, 4);
        drop(held);
        assert_eq!(used(&B), (0, 0), "every pin's budget is back");
        assert_eq!(map.windows.lock().len(), 1, "one window serves the file");
    }

    /// A range past the end of the file cannot be read: the splice ends short and nothing is pinned (a
    /// plain access there would be SIGBUS); an empty range pins nothing.
    #[test]
    fn a_range_past_the_end_is_refused_never_a_signal() {
        static B: Budget = Budget::new(1 << 20, 8);
        let (_dir, f) = file_of(&[7u8; 4096]);
        let map = FileMap::with_budget(f.as_raw_fd(), &B);
        assert!(map.pin(0, 3 * 4096).is_none());
        assert!(map.pin(8192, 4096).is_none());
        assert!(map.pin(0, 0).is_none());
        assert_eq!(used(&B), (0, 0));
    }

    /// A range across a window's edge is not pinned (the caller copies it).
    #[test]
    fn a_range_across_windows_is_refused() {
        static B: Budget = Budget::new(1 << 20, 8);
        let (_dir, f) = file_of(&[1u8; 4096]);
        let map = FileMap::with_budget(f.as_raw_fd(), &B);
        assert!(map.pin(WINDOW_BYTES - 4096, 8192).is_none());
        assert!(map.pin(u64::MAX - 10, 100).is_none());
        assert_eq!(used(&B), (0, 0));
    }

    /// Both bounds hold: at either, a further pin is refused; below them one is made again.
    #[test]
    fn the_budget_is_never_passed() {
        static BYTES: Budget = Budget::new(8 * 4096, 100);
        static RANGES: Budget = Budget::new(1 << 20, 2);
        let data = vec![3u8; 16 * 4096];
        let (_dir, f) = file_of(&data);
        let by_bytes = FileMap::with_budget(f.as_raw_fd(), &BYTES);
        let whole = by_bytes.pin(0, 8 * 4096).unwrap();
        assert_eq!(used(&BYTES), (8 * 4096, 1));
        assert!(by_bytes.pin(0, 4096).is_none(), "at the byte bound nothing more");
        drop(whole);
        assert!(by_bytes.pin(4096, 8 * 4096).is_some(), "room again");
        let by_count = FileMap::with_budget(f.as_raw_fd(), &RANGES);
        let (a, b) = (by_count.pin(0, 4096).unwrap(), by_count.pin(4096, 4096).unwrap());
        assert!(by_count.pin(8192, 4096).is_none(), "at the range bound nothing more");
        drop((a, b));
        assert_eq!(used(&RANGES), (0, 0));
    }

    /// Whether each page under `s` is in this process's page tables (bit 63 of its `/proc/self/pagemap`
    /// entry).
    fn pages_mapped(s: &[u8]) -> Vec<bool> {
        use std::os::unix::fs::FileExt;
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let page = system_page_bytes();
        let first = s.as_ptr() as usize / page;
        (first..(s.as_ptr() as usize + s.len()).div_ceil(page))
            .map(|virtual_page| {
                let mut entry = [0u8; 8];
                pagemap.read_exact_at(&mut entry, (virtual_page * 8) as u64).unwrap();
                u64::from_le_bytes(entry) >> 63 == 1
            })
            .collect()
    }

    /// A range read through its mapping leaves no page mapped once it is unmapped or dropped (so the
    /// process's resident memory does not grow with what large reads touched), and reads the same after an
    /// unmap: the pinned pages fault back in.
    #[test]
    fn unmapped_pages_leave_the_page_tables_and_read_the_same() {
        static B: Budget = Budget::new(1 << 20, 8);
        let data: Vec<u8> = (0..16 * 4096u32).map(|i| (i * 13 % 241) as u8).collect();
        let (_dir, f) = file_of(&data);
        let map = FileMap::with_budget(f.as_raw_fd(), &B);
        let m = map.pin(0, data.len()).unwrap();
        assert_eq!(m.as_slice(), &data[..]);
        assert!(pages_mapped(m.as_slice()).iter().all(|p| *p), "read pages are mapped");
        m.unmap_pages();
        assert!(pages_mapped(m.as_slice()).iter().all(|p| !p), "unmapped");
        assert_eq!(m.as_slice(), &data[..], "the same bytes after an unmap");
        let (at, len) = (m.as_slice().as_ptr(), m.as_slice().len());
        drop(m);
        // SAFETY: the window stays mapped (the map keeps it); only its page-table entries are looked at.
        let gone = unsafe { std::slice::from_raw_parts(at, len) };
        assert!(pages_mapped(gone).iter().all(|p| !p), "a dropped pin leaves nothing mapped");
    }

    /// The pin holds the pages: advice to drop the file's cached pages leaves a pinned range resident,
    /// and it reads the same.
    #[test]
    fn pinned_pages_stay_cached() {
        static B: Budget = Budget::new(1 << 20, 8);
        let data: Vec<u8> = (0..32 * 4096u32).map(|i| (i * 7 % 253) as u8).collect();
        let (_dir, f) = file_of(&data);
        f.sync_all().unwrap();
        let map = FileMap::with_budget(f.as_raw_fd(), &B);
        let m = map.pin(0, data.len()).unwrap();
        // SAFETY: plain syscall on an owned fd.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        let mut resident = vec![0u8; data.len() / 4096];
        let p = m.as_slice().as_ptr();
        // SAFETY: mincore of our own window's pages (page-aligned start) into one byte per page.
        let rc = unsafe { libc::mincore(p as *mut libc::c_void, data.len(), resident.as_mut_ptr()) };
        assert_eq!(rc, 0);
        assert!(resident.iter().all(|r| r & 1 == 1), "pinned pages stay in the page cache");
        assert_eq!(m.as_slice(), &data[..]);
    }
}
