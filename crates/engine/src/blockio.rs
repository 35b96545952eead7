//! Block IO: whole blocks to and from the data device, with the IO counters, checksum-verified reads, and
//! the drive's health (a failed write or flush makes the drive read-only). Everything above reads data
//! through here, so no byte leaves the engine unverified; an erasure-coded shard read reuses it as it is.
//!
//! This layer knows the device and block-map runs (to verify their checksum units); it knows nothing of
//! transactions, snapshots or names.

use crate::device::{CachedMapping, Device};
use crate::error::{EngineError, Result};
use crate::keys::{BlockRun, ChecksumUnit, Nid};
use crate::stats::Counters;
use crate::superblock::BLOCK_SIZE_BYTES;
use crate::verified::VerifiedPins;
use mosaic_store::AlignedBuf;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Largest single device read or write (bounds the bounce buffer of an unaligned write).
const IO_CHUNK_BYTES: usize = 4 << 20;

pub(crate) struct BlockIo {
    device: Arc<dyn Device>,
    /// Blocks before this hold the superblock: never written through here.
    data_start_block: u64,
    counters: Arc<Counters>,
    /// Object reads go through the kernel's page cache (still verified, re-read directly on a mismatch).
    cached_reads: bool,
    /// Large reads kept verified and pinned (verified.rs).
    verified: VerifiedPins,
    failed: Mutex<Option<String>>,
}

impl BlockIo {
    pub(crate) fn new(
        device: Arc<dyn Device>,
        data_start_block: u64,
        counters: Arc<Counters>,
        cached_reads: bool,
        verified: VerifiedPins,
    ) -> Self {
        BlockIo { device, data_start_block, counters, cached_reads, verified, failed: Mutex::new(None) }
    }

    pub(crate) fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Marks the drive read-only; the first reason is kept.
    pub(crate) fn fail(&self, why: String) {
        let mut f = self.failed.lock();
        if f.is_none() {
            tracing::error!(reason = %why, "drive is now read-only");
            *f = Some(why);
        }
        self.verified.clear();
    }

    /// Blocks about to go back to the allocator (or whose cached copy is suspect): nothing of them is kept
    /// verified any more, so that no later read takes a kept copy of a block rewritten since.
    pub(crate) fn forget_verified(&self, first_physical: u64, blocks: u64) {
        self.verified.forget(first_physical, blocks);
    }

    /// Bytes kept verified now.
    pub(crate) fn verified_bytes(&self) -> u64 {
        self.verified.bytes()
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// Makes every write so far durable (a failure makes the drive read-only).
    pub(crate) fn flush(&self) -> Result<()> {
        if let Err(e) = self.device.flush() {
            self.fail(format!("device flush failed: {e}"));
            return Err(e.into());
        }
        self.counters.device_flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes whole blocks starting at physical block `start`.
    pub(crate) fn write_blocks(&self, start: u64, data: &[u8]) -> Result<()> {
        assert!(start >= self.data_start_block, "a write into the superblock area (block {start})");
        debug_assert!((data.len() as u64).is_multiple_of(BLOCK_SIZE_BYTES));
        // Pieces of at most 4 MiB, written straight from `data` when it is aligned (the S3 layer stages from
        // aligned buffers), else copied into an aligned buffer first.
        let aligned = (data.as_ptr() as usize).is_multiple_of(mosaic_store::IO_ALIGN_BYTES);
        let mut done = 0;
        while done < data.len() {
            let n = (data.len() - done).min(IO_CHUNK_BYTES);
            let copy = (!aligned).then(|| AlignedBuf::copy_of(&data[done..done + n]));
            let piece = copy.as_ref().map_or(&data[done..done + n], |b| &b.as_slice()[..n]);
            let off = start * BLOCK_SIZE_BYTES + done as u64;
            if let Err(e) = self.device.write_at(piece, off) {
                self.fail(format!("device write failed at byte {off}: {e}"));
                return Err(e.into());
            }
            self.counters.record_write(off, n as u64);
            done += n;
        }
        Ok(())
    }

    /// Reads whole blocks starting at physical block `start` into `out` (a multiple of the block size),
    /// directly from the device.
    pub(crate) fn read_blocks(&self, start: u64, out: &mut [u8]) -> Result<()> {
        debug_assert!((out.len() as u64).is_multiple_of(BLOCK_SIZE_BYTES));
        let mut buf = AlignedBuf::zeroed(IO_CHUNK_BYTES.min(out.len()));
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(IO_CHUNK_BYTES);
            let off = start * BLOCK_SIZE_BYTES + done as u64;
            self.device.read_at(&mut buf.as_mut_slice()[..n], off)?;
            self.counters.record_read(n as u64);
            out[done..done + n].copy_from_slice(&buf.as_slice()[..n]);
            done += n;
        }
        Ok(())
    }

    /// Reads `len_bytes` (whole blocks) straight into an aligned buffer: one device read, no bounce copy.
    /// `cached`: through the kernel's page cache.
    fn read_run(&self, start: u64, len_bytes: usize, cached: bool) -> Result<AlignedBuf> {
        debug_assert!(len_bytes > 0 && len_bytes.is_multiple_of(BLOCK_SIZE_BYTES as usize));
        if cached {
            return Ok(self.read_run_cached(start, len_bytes, true)?);
        }
        let mut buf = AlignedBuf::zeroed(len_bytes);
        self.device.read_at(buf.as_mut_slice(), start * BLOCK_SIZE_BYTES)?;
        self.counters.record_read(len_bytes as u64);
        Ok(buf)
    }

    /// Reads `len_bytes` (whole blocks) through the kernel's page cache into an aligned buffer; `wait`:
    /// false gives up with WouldBlock rather than wait for the device.
    fn read_run_cached(&self, start: u64, len_bytes: usize, wait: bool) -> std::io::Result<AlignedBuf> {
        let at = start * BLOCK_SIZE_BYTES;
        let fill = |b: &mut [std::mem::MaybeUninit<u8>]| match wait {
            true => self.device.read_cached_at_uninit(b, at),
            false => self.device.read_cached_at_uninit_nowait(b, at),
        };
        // SAFETY: both reads write every byte of the buffer when they return Ok.
        let buf = unsafe { AlignedBuf::filled_with(len_bytes, fill)? };
        self.counters.cached_bytes_read.fetch_add(len_bytes as u64, Ordering::Relaxed);
        Ok(buf)
    }

    /// Reads one checksum unit of `run` (which starts at logical block `start` of object `nid`) into `out`,
    /// directly from the device, and checks it.
    pub(crate) fn read_verified_unit(
        &self,
        nid: Nid,
        start: u64,
        run: &BlockRun,
        unit: ChecksumUnit,
        out: &mut [u8],
    ) -> Result<()> {
        debug_assert_eq!(out.len() as u64, unit.blocks * BLOCK_SIZE_BYTES);
        let physical = run.physical_start + unit.first;
        self.read_blocks(physical, out)?;
        if crate::checksum::crc32c(out) != unit.crc32c {
            self.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
            return Err(EngineError::Checksum { object: format!("nid {nid}"), block: start + unit.first, physical });
        }
        Ok(())
    }

    /// Reads logical block `lb` of `run` into `out` (one block), checked by its checksum unit.
    pub(crate) fn read_verified_block(
        &self,
        nid: Nid,
        start: u64,
        run: &BlockRun,
        lb: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = BLOCK_SIZE_BYTES as usize;
        let unit = run.unit_of(lb - start);
        let mut buf = vec![0u8; unit.blocks as usize * bs];
        self.read_verified_unit(nid, start, run, unit, &mut buf)?;
        let i = (lb - start - unit.first) as usize;
        out.copy_from_slice(&buf[i * bs..(i + 1) * bs]);
        Ok(())
    }

    /// Reads one checksum unit of a run from the device (never a cache) for a scrub; returns what is wrong
    /// with it, if anything.
    pub(crate) fn verify_unit(&self, start: u64, run: &BlockRun, unit: ChecksumUnit) -> Option<String> {
        let mut buf = vec![0u8; (unit.blocks * BLOCK_SIZE_BYTES) as usize];
        self.counters.blocks_scrubbed.fetch_add(unit.blocks, Ordering::Relaxed);
        let lblock = start + unit.first;
        let what = if unit.blocks == 1 {
            format!("block {lblock}")
        } else {
            format!("block {lblock} (a {}-block checksum unit)", unit.blocks)
        };
        match self.read_blocks(run.physical_start + unit.first, &mut buf) {
            Ok(()) if crate::checksum::crc32c(&buf) == unit.crc32c => None,
            Ok(()) => {
                self.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                Some(format!("checksum mismatch in {what}"))
            }
            Err(e) => Some(format!("read error in {what}: {e}")),
        }
    }

    /// Reads one segment (physically contiguous blocks, whole checksum units) of the object named `name` and
    /// checks every unit. A cached read that fails a checksum is dropped from the page cache and read again
    /// from the device, which is the truth: only a mismatch there is an error.
    /// `read_verified_segment` only if the kernel's page cache holds the whole segment and it passes its
    /// checksums: None when the read would wait for the device or the cached copy fails a checksum (the
    /// waiting read then rereads it directly and names the damage).
    pub(crate) fn read_verified_segment_nowait(&self, seg: &Segment) -> Result<Option<AlignedBuf>> {
        if !self.cached_reads {
            return Ok(None);
        }
        let buf = match self.read_run_cached(seg.first_physical, (seg.blocks * BLOCK_SIZE_BYTES) as usize, false) {
            Ok(buf) => buf,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(first_bad_unit(buf.as_slice(), &seg.units).is_none().then_some(buf))
    }

    /// `read_verified_segment` without a copy: the segment pinned in the kernel's page cache and mapped
    /// (`Device::map_cached`), every unit checked in place. None when the device maps nothing now (no
    /// budget, a read failure) or a unit fails its checksum: the caller then reads the segment with
    /// `read_verified_segment`, which rereads a damaged cached copy directly and names the damage.
    /// A segment kept verified from an earlier read is that pin again, without a checksum pass.
    pub(crate) fn map_verified_segment(&self, seg: &Segment) -> Option<Arc<CachedMapping>> {
        if !self.cached_reads {
            return None;
        }
        let len_bytes = seg.blocks * BLOCK_SIZE_BYTES;
        if let Some(kept) = self.verified.get(seg.first_physical, seg.blocks) {
            debug_assert_eq!(kept.as_slice().len() as u64, len_bytes);
            self.counters.cached_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
            self.counters.mapped_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
            self.counters.verified_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
            return Some(kept);
        }
        let map = self.device.map_cached(seg.first_physical * BLOCK_SIZE_BYTES, len_bytes as usize)?;
        debug_assert_eq!(map.as_slice().len() as u64, len_bytes);
        if first_bad_unit(map.as_slice(), &seg.units).is_some() {
            return None;
        }
        self.counters.cached_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
        self.counters.mapped_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
        let map = Arc::new(map);
        // Background work (heal, scans) reads whole drives once: it would only push out what clients read.
        if !mosaic_store::thread_is_background() {
            self.verified.insert(seg.first_physical, seg.blocks, map.clone());
        }
        Some(map)
    }

    /// `read_verified_segment` into `pieces` (which tile the segment's bytes in order), through the
    /// kernel's page cache and without a mapping: a segment kept verified is copied from its pinned pages
    /// without a checksum pass; any other is read into the pieces and every unit checked there (so the
    /// bytes checked are the bytes delivered), then pinned and kept verified when `keep` (a large read).
    /// Ok(false) when the device has no page cache or the cached copy fails a checksum: the caller then
    /// reads with `read_verified_segment`, which rereads a damaged copy directly and names the damage.
    pub(crate) fn read_verified_segment_into(
        &self,
        seg: &Segment,
        pieces: &mut [&mut [std::mem::MaybeUninit<u8>]],
        keep: bool,
    ) -> Result<bool> {
        let len_bytes = seg.blocks * BLOCK_SIZE_BYTES;
        debug_assert_eq!(pieces.iter().map(|p| p.len() as u64).sum::<u64>(), len_bytes);
        if !self.cached_reads {
            return Ok(false);
        }
        let at = seg.first_physical * BLOCK_SIZE_BYTES;
        if let Some(kept) = self.verified.get(seg.first_physical, seg.blocks) {
            // The pin (held to the end of the copy) keeps the very pages that were checked.
            self.device.read_cached_vectored(pieces, at, true)?;
            drop(kept);
            self.counters.cached_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
            self.counters.verified_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
            return Ok(true);
        }
        // Pinned first, so that what is checked below stays in the page cache as long as it is kept.
        // Background work (heal, scans) reads whole drives once: it would only push out what clients read.
        let keep = keep && !mosaic_store::thread_is_background();
        let pin = if keep { self.device.map_cached(at, len_bytes as usize) } else { None };
        self.device.read_cached_vectored(pieces, at, pin.is_some())?;
        self.counters.cached_bytes_read.fetch_add(len_bytes, Ordering::Relaxed);
        // SAFETY: the read returned Ok, so it wrote every byte of every piece.
        let filled: Vec<&[u8]> = pieces.iter().map(|p| unsafe { &*(&**p as *const [_] as *const [u8]) }).collect();
        if first_bad_unit_in_pieces(&filled, &seg.units).is_some() {
            return Ok(false);
        }
        if let Some(pin) = pin {
            self.verified.insert(seg.first_physical, seg.blocks, Arc::new(pin));
        }
        Ok(true)
    }

    pub(crate) fn read_verified_segment(&self, name: &[u8], seg: &Segment) -> Result<AlignedBuf> {
        let bs = BLOCK_SIZE_BYTES;
        let len_bytes = (seg.blocks * bs) as usize;
        if self.cached_reads {
            let buf = self.read_run(seg.first_physical, len_bytes, true)?;
            if first_bad_unit(buf.as_slice(), &seg.units).is_none() {
                return Ok(buf);
            }
            self.forget_verified(seg.first_physical, seg.blocks);
            self.device.forget_cached(seg.first_physical * bs, len_bytes as u64);
            self.counters.cache_rereads.fetch_add(1, Ordering::Relaxed);
        }
        let buf = self.read_run(seg.first_physical, len_bytes, false)?;
        if let Some(u) = first_bad_unit(buf.as_slice(), &seg.units) {
            self.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
            return Err(EngineError::Checksum {
                object: String::from_utf8_lossy(name).into_owned(),
                block: seg.first_lb + u.first,
                physical: seg.first_physical + u.first,
            });
        }
        Ok(buf)
    }
}

/// Largest single device read issued for a contiguous physical run.
const MAX_READ_RUN_BYTES: u64 = 4 << 20;

/// Physically contiguous blocks read with one device IO: whole checksum units (relative to the segment).
pub(crate) struct Segment {
    pub(crate) first_lb: u64,
    first_physical: u64,
    blocks: u64,
    units: Vec<ChecksumUnit>,
}

/// The device reads that cover logical blocks [lb0, lb1) of these runs: each run's blocks widened to whole
/// checksum units, and runs that continue one another logically and physically joined, up to
/// MAX_READ_RUN_BYTES per read.
pub(crate) fn read_segments(runs: &[(u64, BlockRun)], lb0: u64, lb1: u64) -> Vec<Segment> {
    let max_blocks = MAX_READ_RUN_BYTES / BLOCK_SIZE_BYTES;
    let mut out: Vec<Segment> = Vec::new();
    for (start, run) in runs {
        let (from, to) = (lb0.max(*start) - start, lb1.min(start + run.len_blocks()) - start);
        if from >= to {
            continue;
        }
        for unit in run.units(from, to) {
            let (lb, physical) = (start + unit.first, run.physical_start + unit.first);
            match out.last_mut() {
                Some(seg)
                    if seg.first_lb + seg.blocks == lb
                        && seg.first_physical + seg.blocks == physical
                        && seg.blocks + unit.blocks <= max_blocks =>
                {
                    seg.units.push(ChecksumUnit { first: seg.blocks, ..unit });
                    seg.blocks += unit.blocks;
                }
                _ => out.push(Segment {
                    first_lb: lb,
                    first_physical: physical,
                    blocks: unit.blocks,
                    units: vec![ChecksumUnit { first: 0, ..unit }],
                }),
            }
        }
    }
    out
}

impl Segment {
    /// Blocks the segment reads.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }
}

/// `first_bad_unit` over a segment's bytes given as consecutive pieces of any lengths.
fn first_bad_unit_in_pieces(pieces: &[&[u8]], units: &[ChecksumUnit]) -> Option<ChecksumUnit> {
    if let [whole] = pieces {
        return first_bad_unit(whole, units);
    }
    let bs = BLOCK_SIZE_BYTES as usize;
    let (mut piece, mut at) = (0usize, 0usize);
    for u in units {
        debug_assert_eq!(
            pieces[..piece].iter().map(|p| p.len()).sum::<usize>() + at,
            u.first as usize * bs,
            "units tile the segment"
        );
        let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        let mut need = u.blocks as usize * bs;
        while need > 0 {
            let Some(p) = pieces.get(piece) else { return Some(*u) };
            let n = need.min(p.len() - at);
            digest.update(&p[at..at + n]);
            (need, at) = (need - n, at + n);
            if at == p.len() {
                (piece, at) = (piece + 1, 0);
            }
        }
        if digest.finalize() as u32 != u.crc32c {
            return Some(*u);
        }
    }
    None
}

/// The first checksum unit of a segment whose contents do not match.
fn first_bad_unit(buf: &[u8], units: &[ChecksumUnit]) -> Option<ChecksumUnit> {
    let bs = BLOCK_SIZE_BYTES as usize;
    units.iter().copied().find(|u| {
        let bytes = &buf[u.first as usize * bs..(u.first + u.blocks) as usize * bs];
        crate::checksum::crc32c(bytes) != u.crc32c
    })
}
