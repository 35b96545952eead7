//! Erasure codes behind a small trait. Every object records the id of the code its shards were made with,
//! so the format can change code without misreading what is stored. Codes work position by position
//! (byte i of a parity shard depends only on byte i of the data shards, in 64-byte groups), so a range of
//! an object is encoded or rebuilt from the same range of its shards.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// The id of a code, as stored with each object.
pub type CodecId = u8;
/// No parity: k data shards only (sets of one drive, or parity 0).
pub const CODEC_NONE: CodecId = 0;
/// Reed-Solomon over GF(2^16) (reed-solomon-simd, FFT-based): any k of the k+m shards rebuild the rest.
/// Written until GF(2^8) became the default, and on CPUs that cannot run the GF(2^8) code; always read.
pub const CODEC_REED_SOLOMON: CodecId = 1;
/// Reed-Solomon over GF(2^8) with a systematic Vandermonde-derived matrix (reed-solomon-erasure, AVX2):
/// for the small sets of this store (k + m <= 16) a rebuild is k multiply-adds per lost byte, several times
/// cheaper than the FFT code's fixed transform (docs/bench/2026-12-02-gf8.md).
pub const CODEC_REED_SOLOMON_GF8: CodecId = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(pub String);

impl std::fmt::Display for CodecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub trait Codec: Send + Sync {
    fn id(&self) -> CodecId;
    fn data_shards(&self) -> usize;
    fn parity_shards(&self) -> usize;
    /// Computes the parity of `data` (k shards of one length, a multiple of 64) into `parity` (m buffers of
    /// that length).
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError>;
    /// Rebuilds every missing shard of `shards` (k + m slots, at least k present, one length) in place.
    fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError>;
    /// Rebuilds the missing data shards only (a read needs no parity); parity slots may stay empty.
    fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        self.reconstruct(shards)
    }
    /// Rebuilds shard `want` into `out` from the shards present in `shards` (k + m slots, at least k present
    /// besides `want`, each `out`'s length), borrowing them: what heal needs to rebuild one drive. Every
    /// byte of `out` is written, whatever it held before (heal reuses its buffers).
    fn rebuild_one(&self, shards: &[Option<&[u8]>], want: usize, out: &mut [u8]) -> Result<(), CodecError> {
        if let Some(Some(have)) = shards.get(want) {
            out.copy_from_slice(have);
            return Ok(());
        }
        rebuild_by_reconstructing(self, shards, want, out)
    }
}

/// `Codec::rebuild_one` the general way: owned copies of the shards (without `want`), `reconstruct`, and
/// the rebuilt one copied out.
fn rebuild_by_reconstructing<C: Codec + ?Sized>(
    codec: &C,
    shards: &[Option<&[u8]>],
    want: usize,
    out: &mut [u8],
) -> Result<(), CodecError> {
    let mut owned: Vec<Option<Vec<u8>>> =
        shards.iter().enumerate().map(|(i, s)| s.filter(|_| i != want).map(<[u8]>::to_vec)).collect();
    codec.reconstruct(&mut owned)?;
    let rebuilt = owned.get(want).and_then(Option::as_deref);
    out.copy_from_slice(rebuilt.ok_or_else(|| CodecError(format!("shard {want} was not rebuilt")))?);
    Ok(())
}

/// Whether `present` of `n` shards are enough to rebuild from (`k` are needed).
fn enough_shards(present: usize, n: usize, k: usize) -> Result<(), CodecError> {
    if present < k {
        return Err(CodecError(format!("{present} of {n} shards, {k} needed")));
    }
    Ok(())
}

/// Gives a coder back to its pool, which keeps at most `IDLE_CODERS_MAX`.
fn give_back<T>(pool: &Mutex<Vec<T>>, coder: T) {
    let mut idle = pool.lock();
    if idle.len() < IDLE_CODERS_MAX {
        idle.push(coder);
    }
}

/// Codes kept built, one per (id, k, m): a code holds its matrices and idle coders, which would otherwise be
/// made again for every chunk of every object. Sets have at most 16 drives, so this many is never reached in
/// practice; past it a code is built for the call and dropped.
const CODES_KEPT_MAX: usize = 64;

/// Built codes by (id, k, m).
type KeptCodes = Mutex<HashMap<(CodecId, usize, usize), Arc<dyn Codec>>>;

fn kept_codes() -> &'static KeptCodes {
    static CODES: OnceLock<KeptCodes> = OnceLock::new();
    CODES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The code `id` for `k` data and `m` parity shards, built once and kept.
fn kept(id: CodecId, k: usize, m: usize, build: impl FnOnce() -> Arc<dyn Codec>) -> Arc<dyn Codec> {
    kept_in(kept_codes(), id, k, m, build)
}

/// `kept` in the map `codes`, which holds at most `CODES_KEPT_MAX`.
fn kept_in(
    codes: &KeptCodes,
    id: CodecId,
    k: usize,
    m: usize,
    build: impl FnOnce() -> Arc<dyn Codec>,
) -> Arc<dyn Codec> {
    let mut codes = codes.lock();
    if let Some(c) = codes.get(&(id, k, m)) {
        return c.clone();
    }
    let code = build();
    debug_assert!(code.id() == id && code.data_shards() == k && code.parity_shards() == m);
    if codes.len() < CODES_KEPT_MAX {
        codes.insert((id, k, m), code.clone());
    }
    debug_assert!(codes.len() <= CODES_KEPT_MAX);
    code
}

/// Whether this CPU runs the GF(2^8) code: its SIMD kernels are built for x86-64 Haswell (AVX2, BMI, FMA),
/// and running them elsewhere would be an illegal instruction, not an error.
pub fn gf8_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static SUPPORTED: OnceLock<bool> = OnceLock::new();
        *SUPPORTED.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("bmi1")
                && std::arch::is_x86_feature_detected!("bmi2")
                && std::arch::is_x86_feature_detected!("lzcnt")
                && std::arch::is_x86_feature_detected!("movbe")
                && std::arch::is_x86_feature_detected!("f16c")
                && std::arch::is_x86_feature_detected!("popcnt")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// The code new objects of `k` data and `m` parity shards are written with.
pub fn codec_for(k: usize, m: usize) -> Arc<dyn Codec> {
    let id = match m {
        0 => CODEC_NONE,
        _ if gf8_supported() && k + m <= GF8_SHARDS_MAX => CODEC_REED_SOLOMON_GF8,
        _ => CODEC_REED_SOLOMON,
    };
    codec_by_id(id, k, m).expect("the default code of a valid geometry is known")
}

/// The code of a stored object, from its id; None for an id this build does not know or this CPU cannot run.
pub fn codec_by_id(id: CodecId, k: usize, m: usize) -> Option<Arc<dyn Codec>> {
    match id {
        CODEC_NONE if m == 0 => Some(kept(id, k, m, || Arc::new(NoParity { k }))),
        CODEC_REED_SOLOMON if m > 0 => Some(kept(id, k, m, || Arc::new(ReedSolomon::new(k, m)))),
        CODEC_REED_SOLOMON_GF8 if m > 0 && k + m <= GF8_SHARDS_MAX && gf8_supported() => {
            Some(kept(id, k, m, || Arc::new(ReedSolomonGf8::new(k, m))))
        }
        _ => None,
    }
}

struct NoParity {
    k: usize,
}

impl Codec for NoParity {
    fn id(&self) -> CodecId {
        CODEC_NONE
    }
    fn data_shards(&self) -> usize {
        self.k
    }
    fn parity_shards(&self) -> usize {
        0
    }
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        debug_assert!(data.len() == self.k && parity.is_empty());
        Ok(())
    }
    fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        match shards.iter().position(Option::is_none) {
            None => Ok(()),
            Some(i) => Err(CodecError(format!("shard {i} is missing and there is no parity"))),
        }
    }
}

/// Reed-Solomon with encoders and decoders kept for reuse: building one allocates its working space, which
/// for megabyte shards costs more than the coding.
struct ReedSolomon {
    k: usize,
    m: usize,
    encoders: Mutex<Vec<ReedSolomonEncoder>>,
    decoders: Mutex<Vec<ReedSolomonDecoder>>,
}

/// Bytes of a rebuilt shard made at a time from all its sources (`ReedSolomonGf8::rebuild_one`): small
/// enough that the chunk stays in a core's L1/L2 cache across the k multiply-adds.
const REBUILD_CHUNK_BYTES: usize = 16 << 10;

/// Coders kept per code (each holds working space of about (k + m) shards).
const IDLE_CODERS_MAX: usize = 2;

impl ReedSolomon {
    fn new(k: usize, m: usize) -> Self {
        assert!(k >= 1 && m >= 1 && k + m <= 256, "a Reed-Solomon code of {k}+{m}");
        ReedSolomon { k, m, encoders: Mutex::new(Vec::new()), decoders: Mutex::new(Vec::new()) }
    }

    fn encoder(&self, shard_bytes: usize) -> Result<ReedSolomonEncoder, CodecError> {
        let err = |e: reed_solomon_simd::Error| CodecError(format!("Reed-Solomon {}+{}: {e}", self.k, self.m));
        match self.encoders.lock().pop() {
            Some(mut e) => {
                e.reset(self.k, self.m, shard_bytes).map_err(err)?;
                Ok(e)
            }
            None => ReedSolomonEncoder::new(self.k, self.m, shard_bytes).map_err(err),
        }
    }

    fn decoder(&self, shard_bytes: usize) -> Result<ReedSolomonDecoder, CodecError> {
        let err = |e: reed_solomon_simd::Error| CodecError(format!("Reed-Solomon {}+{}: {e}", self.k, self.m));
        match self.decoders.lock().pop() {
            Some(mut d) => {
                d.reset(self.k, self.m, shard_bytes).map_err(err)?;
                Ok(d)
            }
            None => ReedSolomonDecoder::new(self.k, self.m, shard_bytes).map_err(err),
        }
    }
}

impl Codec for ReedSolomon {
    fn id(&self) -> CodecId {
        CODEC_REED_SOLOMON
    }
    fn data_shards(&self) -> usize {
        self.k
    }
    fn parity_shards(&self) -> usize {
        self.m
    }

    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        assert!(
            data.len() == self.k && parity.len() == self.m,
            "{} data and {} parity shards",
            data.len(),
            parity.len()
        );
        let len = data[0].len();
        assert!(data.iter().all(|d| d.len() == len) && parity.iter().all(|p| p.len() == len), "shards of one length");
        let err = |e: reed_solomon_simd::Error| CodecError(format!("Reed-Solomon encode: {e}"));
        let mut enc = self.encoder(len)?;
        for d in data {
            enc.add_original_shard(d).map_err(err)?;
        }
        {
            let result = enc.encode().map_err(err)?;
            for (out, recovery) in parity.iter_mut().zip(result.recovery_iter()) {
                out.copy_from_slice(recovery);
            }
        }
        give_back(&self.encoders, enc);
        Ok(())
    }

    fn rebuild_one(&self, shards: &[Option<&[u8]>], want: usize, out: &mut [u8]) -> Result<(), CodecError> {
        assert!(shards.len() == self.k + self.m && want < shards.len(), "one slot per shard");
        let present = shards.iter().enumerate().filter(|(i, s)| *i != want && s.is_some()).count();
        enough_shards(present, self.k + self.m, self.k)?;
        assert!(shards.iter().flatten().all(|s| s.len() == out.len()), "shards of one length");
        let err = |e: reed_solomon_simd::Error| CodecError(format!("Reed-Solomon: {e}"));
        let data_whole = shards[..self.k].iter().all(Option::is_some);
        if want < self.k {
            // A data shard: decoded from any k others.
            let mut dec = self.decoder(out.len())?;
            for (i, s) in shards.iter().enumerate().filter(|(i, _)| *i != want) {
                match s {
                    Some(d) if i < self.k => dec.add_original_shard(i, d).map_err(err)?,
                    Some(d) => dec.add_recovery_shard(i - self.k, d).map_err(err)?,
                    None => {}
                }
            }
            {
                let result = dec.decode().map_err(err)?;
                let restored = result
                    .restored_original(want)
                    .ok_or_else(|| CodecError(format!("shard {want} was not restored")))?;
                out.copy_from_slice(restored);
            }
            give_back(&self.decoders, dec);
            Ok(())
        } else if data_whole {
            // A parity shard with every data shard at hand: encoded again, only it kept.
            let mut enc = self.encoder(out.len())?;
            for d in shards[..self.k].iter().flatten() {
                enc.add_original_shard(d).map_err(err)?;
            }
            {
                let result = enc.encode().map_err(err)?;
                let recovery = result
                    .recovery(want - self.k)
                    .ok_or_else(|| CodecError(format!("shard {want} was not encoded")))?;
                out.copy_from_slice(recovery);
            }
            give_back(&self.encoders, enc);
            Ok(())
        } else {
            // A parity shard and a data shard missing: the general path.
            rebuild_by_reconstructing(self, shards, want, out)
        }
    }

    fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        assert_eq!(shards.len(), self.k + self.m, "one slot per shard");
        let present = shards.iter().filter(|s| s.is_some()).count();
        enough_shards(present, self.k + self.m, self.k)?;
        if shards.iter().all(Option::is_some) {
            return Ok(());
        }
        let len = shards.iter().flatten().next().map(Vec::len).unwrap_or(0);
        let err = |e: reed_solomon_simd::Error| CodecError(format!("Reed-Solomon decode: {e}"));
        let missing_data: Vec<usize> = (0..self.k).filter(|i| shards[*i].is_none()).collect();
        if !missing_data.is_empty() {
            let mut dec = self.decoder(len)?;
            for (i, s) in shards.iter().enumerate() {
                match s {
                    Some(d) if i < self.k => dec.add_original_shard(i, d).map_err(err)?,
                    Some(d) => dec.add_recovery_shard(i - self.k, d).map_err(err)?,
                    None => {}
                }
            }
            {
                let result = dec.decode().map_err(err)?;
                for i in &missing_data {
                    let restored = result
                        .restored_original(*i)
                        .ok_or_else(|| CodecError(format!("shard {i} was not restored")))?;
                    shards[*i] = Some(restored.to_vec());
                }
            }
            give_back(&self.decoders, dec);
        }
        // Missing parity is encoded again from the (now whole) data.
        if shards[self.k..].iter().any(Option::is_none) {
            let data: Vec<&[u8]> = shards[..self.k].iter().map(|s| s.as_deref().expect("data is whole")).collect();
            let mut parity: Vec<Vec<u8>> = vec![vec![0u8; len]; self.m];
            let mut refs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            self.encode(&data, &mut refs)?;
            for (slot, p) in shards[self.k..].iter_mut().zip(parity) {
                if slot.is_none() {
                    *slot = Some(p);
                }
            }
        }
        debug_assert!(shards.iter().all(Option::is_some));
        Ok(())
    }
}

/// The most shards a GF(2^8) code has (the field's size).
const GF8_SHARDS_MAX: usize = 256;

/// Reed-Solomon over GF(2^8) (reed-solomon-erasure with its SIMD kernels). It needs no working space: the
/// code is its encoding matrix, and the inverted matrices of recent loss patterns are cached inside.
struct ReedSolomonGf8 {
    rs: reed_solomon_erasure::galois_8::ReedSolomon,
}

impl ReedSolomonGf8 {
    fn new(k: usize, m: usize) -> Self {
        assert!(k >= 1 && m >= 1 && k + m <= GF8_SHARDS_MAX, "a GF(2^8) Reed-Solomon code of {k}+{m}");
        let rs = reed_solomon_erasure::galois_8::ReedSolomon::new(k, m).expect("a valid GF(2^8) geometry");
        ReedSolomonGf8 { rs }
    }

    fn err(&self, what: &str, e: reed_solomon_erasure::Error) -> CodecError {
        CodecError(format!(
            "Reed-Solomon GF(2^8) {}+{} {what}: {e:?}",
            self.rs.data_shard_count(),
            self.rs.parity_shard_count()
        ))
    }

    /// Enough shards present, of one length: checked before the library sees them.
    fn check_present(&self, shards: &[Option<Vec<u8>>]) -> Result<(), CodecError> {
        let (k, n) = (self.rs.data_shard_count(), self.rs.total_shard_count());
        assert_eq!(shards.len(), n, "one slot per shard");
        let present = shards.iter().filter(|s| s.is_some()).count();
        enough_shards(present, n, k)?;
        let len = shards.iter().flatten().next().map(Vec::len).unwrap_or(0);
        assert!(shards.iter().flatten().all(|s| s.len() == len), "shards of one length");
        Ok(())
    }
}

impl Codec for ReedSolomonGf8 {
    fn id(&self) -> CodecId {
        CODEC_REED_SOLOMON_GF8
    }
    fn data_shards(&self) -> usize {
        self.rs.data_shard_count()
    }
    fn parity_shards(&self) -> usize {
        self.rs.parity_shard_count()
    }

    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), CodecError> {
        assert!(
            data.len() == self.data_shards() && parity.len() == self.parity_shards(),
            "{} data and {} parity shards",
            data.len(),
            parity.len()
        );
        let len = data[0].len();
        assert!(data.iter().all(|d| d.len() == len) && parity.iter().all(|p| p.len() == len), "shards of one length");
        self.rs.encode_sep(data, parity).map_err(|e| self.err("encode", e))
    }

    fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        self.check_present(shards)?;
        self.rs.reconstruct(shards).map_err(|e| self.err("rebuild", e))?;
        debug_assert!(shards.iter().all(Option::is_some));
        Ok(())
    }

    fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        self.check_present(shards)?;
        self.rs.reconstruct_data(shards).map_err(|e| self.err("rebuild", e))?;
        debug_assert!(shards[..self.data_shards()].iter().all(Option::is_some));
        Ok(())
    }

    fn rebuild_one(&self, shards: &[Option<&[u8]>], want: usize, out: &mut [u8]) -> Result<(), CodecError> {
        let (k, n) = (self.data_shards(), self.rs.total_shard_count());
        assert!(shards.len() == n && want < n, "one slot per shard");
        if let Some(Some(have)) = shards.get(want) {
            out.copy_from_slice(have);
            return Ok(());
        }
        let present = shards.iter().enumerate().filter(|(i, s)| *i != want && s.is_some()).count();
        enough_shards(present, n, k)?;
        assert!(shards.iter().flatten().all(|s| s.len() == out.len()), "shards of one length");
        // The code is linear and works byte by byte, so the wanted shard is a sum of k of the others, each
        // times a coefficient: learnt by rebuilding one-byte shards (a unit vector for each of the k), then
        // applied to the borrowed reads with the library's SIMD multiply, straight into `out` (no copies).
        let sources: Vec<usize> = (0..n).filter(|i| *i != want && shards[*i].is_some()).take(k).collect();
        let coefficients = self.coefficients(&sources, want)?;
        let inputs: Vec<&[u8]> = sources.iter().map(|j| shards[*j].expect("a source is present")).collect();
        debug_assert!(!inputs.is_empty() && inputs.len() == coefficients.len(), "k >= 1 sources");
        // Chunk by chunk, every source into the chunk: the chunk of `out` stays in the CPU's cache across
        // the k passes, instead of going to memory and back k times for a megabyte shard.
        for (chunk_at, chunk) in (0..).step_by(REBUILD_CHUNK_BYTES).zip(out.chunks_mut(REBUILD_CHUNK_BYTES)) {
            let end = chunk_at + chunk.len();
            for (i, (input, c)) in inputs.iter().zip(&coefficients).enumerate() {
                if i == 0 {
                    reed_solomon_erasure::galois_8::mul_slice(*c, &input[chunk_at..end], chunk);
                } else if *c != 0 {
                    reed_solomon_erasure::galois_8::mul_slice_xor(*c, &input[chunk_at..end], chunk);
                }
            }
        }
        Ok(())
    }
}

impl ReedSolomonGf8 {
    /// The coefficients that make shard `want` from the shards `sources` (k of them, `want` not among
    /// them): shard `want` = sum over j of coefficient j times shard `sources[j]`, byte by byte.
    fn coefficients(&self, sources: &[usize], want: usize) -> Result<Vec<u8>, CodecError> {
        let (k, n) = (self.data_shards(), self.rs.total_shard_count());
        assert!(sources.len() == k && !sources.contains(&want) && want < n, "k sources besides the one wanted");
        let mut out = Vec::with_capacity(k);
        for unit in sources {
            let mut slots: Vec<Option<Vec<u8>>> = vec![None; n];
            for j in sources {
                slots[*j] = Some(vec![u8::from(j == unit)]);
            }
            if want < k { self.rs.reconstruct_data(&mut slots) } else { self.rs.reconstruct(&mut slots) }
                .map_err(|e| self.err("rebuild", e))?;
            out.push(
                slots[want]
                    .as_ref()
                    .and_then(|s| s.first().copied())
                    .ok_or_else(|| CodecError(format!("shard {want} was not rebuilt")))?,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shards(k: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        // Not periodic within a shard (a multiplicative hash of the offset): a rebuild that takes a chunk
        // from the wrong offset cannot come out right by accident.
        let byte = |b: usize, i: usize| ((b as u32).wrapping_mul(0x9e37_79b1) >> 13) as u8 ^ (i as u8 ^ seed);
        (0..k).map(|i| (0..len).map(|b| byte(b, i)).collect()).collect()
    }

    /// Both parity codes of k+m: every property holds for each.
    fn parity_codes(k: usize, m: usize) -> Vec<Arc<dyn Codec>> {
        let ids =
            if gf8_supported() { vec![CODEC_REED_SOLOMON, CODEC_REED_SOLOMON_GF8] } else { vec![CODEC_REED_SOLOMON] };
        ids.into_iter().map(|id| codec_by_id(id, k, m).expect("a known code")).collect()
    }

    fn encoded(codec: &dyn Codec, data: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
        let len = data[0].len();
        let mut parity = vec![vec![0u8; len]; codec.parity_shards()];
        let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut prefs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(&refs, &mut prefs).unwrap();
        data.iter().cloned().chain(parity).map(Some).collect()
    }

    proptest! {
        /// Any m lost shards of a k+m code come back exactly.
        #[test]
        fn any_m_erasures_are_rebuilt(k in 1usize..9, m in 1usize..5, lost in proptest::collection::vec(0usize..12, 0..4), seed in any::<u8>()) {
            for codec in parity_codes(k, m) {
                let data = shards(k, 4096, seed);
                let whole = encoded(&*codec, &data);
                let mut damaged = whole.clone();
                let lost: std::collections::BTreeSet<usize> = lost.iter().map(|i| i % (k + m)).take(m).collect();
                for i in &lost {
                    damaged[*i] = None;
                }
                let mut data_only = damaged.clone();
                codec.reconstruct(&mut damaged).unwrap();
                prop_assert_eq!(&damaged, &whole);
                // A read's rebuild: the data comes back exactly; parity, if rebuilt at all, is right.
                codec.reconstruct_data(&mut data_only).unwrap();
                prop_assert_eq!(&data_only[..k], &whole[..k]);
                for (got, want) in data_only[k..].iter().zip(&whole[k..]) {
                    prop_assert!(got.is_none() || got == want);
                }
            }
        }
    }

    proptest! {
        /// One shard rebuilt from borrowed others (heal's way) is the shard, whichever it is and whichever
        /// others are lost (at most m - 1 besides it), the same coders reused run after run, into a buffer
        /// that held other bytes; shards of several rebuild chunks and a partial one (`REBUILD_CHUNK_BYTES`).
        #[test]
        fn one_shard_is_rebuilt_from_the_others(k in 1usize..9, m in 1usize..5, want in 0usize..12, lost in proptest::collection::vec(0usize..12, 0..4), seed in any::<u8>(), units in 1usize..12) {
            let want = want % (k + m);
            let len = units * 4096;
            for (codec, round) in parity_codes(k, m).into_iter().flat_map(|c| [(c.clone(), 0u8), (c, 1u8)]) {
                let whole = encoded(&*codec, &shards(k, len, seed ^ round));
                let lost: std::collections::BTreeSet<usize> =
                    lost.iter().map(|i| i % (k + m)).filter(|i| *i != want).take(m - 1).collect();
                let refs: Vec<Option<&[u8]>> = whole
                    .iter()
                    .enumerate()
                    .map(|(i, s)| if i == want || lost.contains(&i) { None } else { s.as_deref() })
                    .collect();
                // Stale bytes in `out`, as in a buffer heal reuses: every byte must be overwritten.
                let mut out = vec![seed.wrapping_add(0x5a) | 1; len];
                codec.rebuild_one(&refs, want, &mut out).unwrap();
                prop_assert_eq!(Some(&out), whole[want].as_ref());
            }
        }
    }

    /// New objects get the GF(2^8) code where the CPU runs it, and each code's parity is its own: an
    /// object is decoded with the code its id names, never the other.
    #[test]
    fn new_objects_use_gf8_and_codes_are_not_interchangeable() {
        let expect = if gf8_supported() { CODEC_REED_SOLOMON_GF8 } else { CODEC_REED_SOLOMON };
        assert_eq!(codec_for(4, 2).id(), expect);
        assert_eq!(codec_for(1, 0).id(), CODEC_NONE);
        assert!(Arc::ptr_eq(&codec_for(4, 2), &codec_for(4, 2)), "a code is built once and kept");
        if gf8_supported() {
            let data = shards(4, 4096, 7);
            let (a, b) = (encoded(&*parity_codes(4, 2)[0], &data), encoded(&*parity_codes(4, 2)[1], &data));
            assert_ne!(a[4], b[4], "the two codes' parity differs");
        }
        assert!(codec_by_id(CODEC_REED_SOLOMON_GF8, 200, 57).is_none(), "past the field's 256 shards");
        assert!(codec_by_id(CODEC_REED_SOLOMON_GF8, 4, 0).is_none());
    }

    /// At most CODES_KEPT_MAX codes are kept; past that a code is built for its call, and works.
    #[test]
    fn codes_kept_are_bounded() {
        let codes = KeptCodes::default();
        let geometries = (1..=CODES_KEPT_MAX + 8).map(|k| (k, 1 + k % 3));
        for (k, m) in geometries.clone() {
            let code = kept_in(&codes, CODEC_REED_SOLOMON, k, m, || Arc::new(ReedSolomon::new(k, m)));
            let again = kept_in(&codes, CODEC_REED_SOLOMON, k, m, || Arc::new(ReedSolomon::new(k, m)));
            assert_eq!(Arc::ptr_eq(&code, &again), k <= CODES_KEPT_MAX, "{k}+{m}");
            let whole = encoded(&*code, &shards(k, 64, k as u8));
            let mut lost = whole.clone();
            lost[0] = None;
            code.reconstruct(&mut lost).unwrap();
            assert_eq!(lost, whole);
        }
        assert_eq!(codes.lock().len(), CODES_KEPT_MAX);
    }

    #[test]
    fn one_shard_is_not_rebuilt_from_fewer_than_k() {
        for codec in parity_codes(4, 2) {
            one_shard_is_not_rebuilt_from_fewer_than_k_with(&*codec);
        }
    }

    fn one_shard_is_not_rebuilt_from_fewer_than_k_with(codec: &dyn Codec) {
        let whole = encoded(codec, &shards(4, 128, 0));
        let refs: Vec<Option<&[u8]>> =
            whole.iter().enumerate().map(|(i, s)| if [0, 3, 5].contains(&i) { None } else { s.as_deref() }).collect();
        let mut out = vec![0u8; 128];
        for want in [0, 5] {
            assert!(codec.rebuild_one(&refs, want, &mut out).unwrap_err().0.contains("3 of 6 shards, 4 needed"));
        }
        let none = codec_for(2, 0);
        assert!(none.rebuild_one(&[Some(&[1u8; 64][..]), None], 1, &mut [0u8; 64]).is_err());
        let mut copied = [0u8; 64];
        none.rebuild_one(&[Some(&[1u8; 64][..]), Some(&[2u8; 64][..])], 1, &mut copied).unwrap();
        assert_eq!(copied, [2u8; 64]);
    }

    /// Coding is position by position: the parity of concatenated stripes is the concatenation of their
    /// parities, so ranges of shards are encoded and rebuilt on their own.
    #[test]
    fn coding_is_position_wise_in_64_byte_groups() {
        for codec in parity_codes(4, 2) {
            let (a, b) = (shards(4, 4096, 1), shards(4, 4096, 2));
            let joined: Vec<Vec<u8>> = a.iter().zip(&b).map(|(x, y)| [x.as_slice(), y.as_slice()].concat()).collect();
            let (pa, pb, pj) = (encoded(&*codec, &a), encoded(&*codec, &b), encoded(&*codec, &joined));
            for i in 4..6 {
                let cat = [pa[i].as_ref().unwrap().as_slice(), pb[i].as_ref().unwrap().as_slice()].concat();
                assert_eq!(pj[i].as_ref().unwrap(), &cat);
            }
        }
    }

    #[test]
    fn too_many_losses_and_unknown_codes_are_errors() {
        let codec = codec_for(4, 2);
        let mut s = encoded(&*codec, &shards(4, 128, 0));
        for i in [0, 3, 5] {
            s[i] = None;
        }
        assert!(codec.reconstruct(&mut s).unwrap_err().0.contains("3 of 6 shards, 4 needed"));
        let none = codec_for(2, 0);
        assert_eq!(none.id(), CODEC_NONE);
        let mut s = vec![Some(vec![1u8; 64]), None];
        assert!(none.reconstruct(&mut s).is_err());
        assert!(codec_by_id(9, 4, 2).is_none() && codec_by_id(CODEC_NONE, 4, 2).is_none());
        assert_eq!(codec_by_id(CODEC_REED_SOLOMON, 4, 2).unwrap().parity_shards(), 2);
    }
}
