//! io_uring for a device: callers put their reads and writes on one ring (under a short lock) and wait for
//! their own completion; a dedicated thread per device reaps completions and wakes the callers. Chosen at
//! start (`IoEngine`); where the kernel refuses io_uring (old kernels, seccomp in containers) the device
//! falls back to pread/pwrite on the caller's thread.
//!
//! A caller's buffer stays borrowed until its completion has been reaped: the caller blocks on it, so the
//! kernel never writes into or reads from memory that has been given back.

use io_uring::{IoUring, opcode, types};
use parking_lot::{Condvar, Mutex};
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

/// Submission queue entries of a ring.
const RING_ENTRIES: u32 = 256;
/// Requests in flight on one ring at most; callers past it wait. Below the ring's size, so a push never
/// finds the submission queue full and completions never overflow.
pub(crate) const IN_FLIGHT_MAX: usize = 128;
/// The reaper's wake-up at shutdown.
const SHUTDOWN_USER_DATA: u64 = 0;

/// How a file device issues reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoEngine {
    /// io_uring when the kernel allows it, else pread/pwrite.
    #[default]
    Auto,
    /// io_uring or fail to open.
    IoUring,
    /// pread/pwrite on the caller's thread.
    Pread,
}

/// One request's completion: the kernel's result, once reaped.
#[derive(Default)]
struct Completion {
    result: Mutex<Option<i32>>,
    done: Condvar,
}

pub(crate) struct Ring {
    ring: Arc<IoUring>,
    /// Serializes pushes to the submission queue (one `SubmissionQueue` at a time, as io_uring requires).
    submit_lock: Mutex<()>,
    in_flight: Mutex<usize>,
    slot_free: Condvar,
    stopping: Arc<AtomicBool>,
    reaper: Mutex<Option<JoinHandle<()>>>,
}

impl Ring {
    /// Creates a ring and its reaper thread, and proves the ring works with one no-op round trip.
    pub(crate) fn new(name: &str) -> io::Result<Ring> {
        let ring = Arc::new(IoUring::new(RING_ENTRIES)?);
        // Direct writes that the file system cannot start without blocking (ext4 converting unwritten
        // extents) go to the kernel's io-wq workers, by default at most one per CPU for file IO: on two
        // cores that allowed two writes in flight where sixteen callers wait (measured: 72% of fio
        // instead of ~95% with pread). Allow as many workers as requests in flight; older kernels
        // without this knob keep their default.
        if let Err(e) = ring.submitter().register_iowq_max_workers(&mut [IN_FLIGHT_MAX as u32, 0]) {
            tracing::debug!(error = %e, "io_uring worker limit unchanged");
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let (r, s) = (ring.clone(), stopping.clone());
        let reaper = std::thread::Builder::new().name(format!("mosaic-uring-{name}")).spawn(move || reap(&r, &s))?;
        let out = Ring {
            ring,
            submit_lock: Mutex::new(()),
            in_flight: Mutex::new(0),
            slot_free: Condvar::new(),
            stopping,
            reaper: Mutex::new(Some(reaper)),
        };
        out.run(opcode::Nop::new().build())?;
        Ok(out)
    }

    /// Reads into `buf` at `offset_bytes` of `fd`; returns the bytes read (possibly short).
    pub(crate) fn read(&self, fd: RawFd, buf: &mut [u8], offset_bytes: u64) -> io::Result<usize> {
        let len = u32::try_from(buf.len()).map_err(|_| io::Error::other("one read is at most 4 GiB"))?;
        // The class on the entry itself: the reaper's wait may submit it, on the reaper's thread.
        let ioprio = crate::ioprio::request_ioprio();
        let sqe = opcode::Read::new(types::Fd(fd), buf.as_mut_ptr(), len).offset(offset_bytes).ioprio(ioprio).build();
        // `buf` stays borrowed until `run` returns, which is after the completion.
        self.run(sqe).map(|n| n as usize)
    }

    /// Writes `buf` at `offset_bytes` of `fd`; returns the bytes written (possibly short).
    pub(crate) fn write(&self, fd: RawFd, buf: &[u8], offset_bytes: u64) -> io::Result<usize> {
        let len = u32::try_from(buf.len()).map_err(|_| io::Error::other("one write is at most 4 GiB"))?;
        let ioprio = crate::ioprio::request_ioprio();
        let sqe = opcode::Write::new(types::Fd(fd), buf.as_ptr(), len).offset(offset_bytes).ioprio(ioprio).build();
        self.run(sqe).map(|n| n as usize)
    }

    /// Submits one entry and waits for its completion.
    fn run(&self, sqe: io_uring::squeue::Entry) -> io::Result<u32> {
        {
            let mut n = self.in_flight.lock();
            while *n >= IN_FLIGHT_MAX {
                self.slot_free.wait(&mut n);
            }
            *n += 1;
        }
        let completion = Arc::new(Completion::default());
        let token = Arc::into_raw(completion.clone()) as u64;
        debug_assert_ne!(token, SHUTDOWN_USER_DATA);
        let pushed = self.push(sqe.user_data(token));
        if let Err(e) = pushed {
            // SAFETY: the entry never reached the kernel, so this is the only other owner of the token.
            drop(unsafe { Arc::from_raw(token as *const Completion) });
            self.release_slot();
            return Err(e);
        }
        let result = {
            let mut r = completion.result.lock();
            while r.is_none() {
                completion.done.wait(&mut r);
            }
            r.take().expect("set before the wake-up")
        };
        self.release_slot();
        if result < 0 { Err(io::Error::from_raw_os_error(-result)) } else { Ok(result as u32) }
    }

    fn push(&self, sqe: io_uring::squeue::Entry) -> io::Result<()> {
        let _guard = self.submit_lock.lock();
        {
            // SAFETY: `submit_lock` makes this the only submission queue handle; the entry's buffer is
            // kept alive by the caller until its completion.
            let mut sq = unsafe { self.ring.submission_shared() };
            // SAFETY: as above.
            unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
            sq.sync();
        }
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn release_slot(&self) {
        *self.in_flight.lock() -= 1;
        self.slot_free.notify_one();
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if self.push(opcode::Nop::new().build().user_data(SHUTDOWN_USER_DATA)).is_ok()
            && let Some(t) = self.reaper.lock().take()
        {
            let _ = t.join();
        }
    }
}

/// The reaper thread: waits for completions and hands each to its caller.
fn reap(ring: &IoUring, stopping: &AtomicBool) {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
            Err(e) => {
                // Callers would wait forever for completions that can no longer be reaped; a restart
                // recovers from the log, a hang would not.
                tracing::error!(error = %e, "io_uring wait failed; aborting");
                std::process::abort();
            }
        }
        // SAFETY: this thread is the only user of the completion queue.
        let cq = unsafe { ring.completion_shared() };
        for cqe in cq {
            let token = cqe.user_data();
            if token == SHUTDOWN_USER_DATA {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            // SAFETY: every other token is an `Arc<Completion>` leaked by `Ring::run` for this entry.
            let completion = unsafe { Arc::from_raw(token as *const Completion) };
            *completion.result.lock() = Some(cqe.result());
            completion.done.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mosaic_store::AlignedBuf;
    use std::os::fd::AsRawFd;

    #[test]
    fn writes_and_reads_round_trip_from_many_threads() {
        let Ok(ring) = Ring::new("test") else {
            // The kernel refuses io_uring here; the pread fallback is what runs, and it is tested elsewhere.
            return;
        };
        let ring = Arc::new(ring);
        let file = Arc::new(tempfile::tempfile().unwrap());
        file.set_len(64 * 4096).unwrap();
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let (ring, file) = (ring.clone(), file.clone());
                std::thread::spawn(move || {
                    for i in 0..8u64 {
                        let block = t as u64 * 8 + i;
                        let buf = AlignedBuf::copy_of(&[t ^ i as u8; 4096]);
                        assert_eq!(ring.write(file.as_raw_fd(), buf.as_slice(), block * 4096).unwrap(), 4096);
                        let mut back = AlignedBuf::zeroed(4096);
                        assert_eq!(ring.read(file.as_raw_fd(), back.as_mut_slice(), block * 4096).unwrap(), 4096);
                        assert_eq!(back.as_slice(), buf.as_slice());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Past the in-flight limit: more callers than IN_FLIGHT_MAX at once wait for a slot, none is lost.
        let many: Vec<_> = (0..IN_FLIGHT_MAX + 72)
            .map(|i| {
                let (ring, file) = (ring.clone(), file.clone());
                std::thread::spawn(move || {
                    let mut back = AlignedBuf::zeroed(4096);
                    ring.read(file.as_raw_fd(), back.as_mut_slice(), (i % 64) as u64 * 4096).unwrap()
                })
            })
            .collect();
        assert!(many.into_iter().all(|t| t.join().unwrap() == 4096));
        assert_eq!(*ring.in_flight.lock(), 0);
        // An error comes back as the errno: a read from a closed descriptor number.
        let mut buf = AlignedBuf::zeroed(4096);
        assert!(ring.read(-1, buf.as_mut_slice(), 0).is_err());
    }
}
