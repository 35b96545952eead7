//! Erasure codes behind a small trait. Every object records the id of the code its shards were made with,
//! so the format can change code without misreading what is stored. Codes work position by position
//! (byte i of a parity shard depends only on byte i of the data shards, in 64-byte groups), so a range of
//! an object is encoded or rebuilt from the same range of its shards.

use parking_lot::Mutex;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// The id of a code, as stored with each object.
pub type CodecId = u8;
/// No parity: k data shards only (sets of one drive, or parity 0).
pub const CODEC_NONE: CodecId = 0;
/// Reed-Solomon over GF(2^16) (reed-solomon-simd): any k of the k+m shards rebuild the rest.
pub const CODEC_REED_SOLOMON: CodecId = 1;

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
    /// Rebuilds shard `want` into `out` from the shards present in `shards` (k + m slots, at least k present
    /// besides `want`, each `out`'s length), borrowing them: what heal needs to rebuild one drive.
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

/// Gives a coder back to its pool, which keeps at most `IDLE_CODERS_MAX`.
fn give_back<T>(pool: &Mutex<Vec<T>>, coder: T) {
    let mut idle = pool.lock();
    if idle.len() < IDLE_CODERS_MAX {
        idle.push(coder);
    }
}

/// The code for `k` data and `m` parity shards.
pub fn codec_for(k: usize, m: usize) -> Box<dyn Codec> {
    if m == 0 { Box::new(NoParity { k }) } else { Box::new(ReedSolomon::new(k, m)) }
}

/// The code of a stored object, from its id; None for an id this build does not know.
pub fn codec_by_id(id: CodecId, k: usize, m: usize) -> Option<Box<dyn Codec>> {
    match id {
        CODEC_NONE if m == 0 => Some(Box::new(NoParity { k })),
        CODEC_REED_SOLOMON if m > 0 => Some(Box::new(ReedSolomon::new(k, m))),
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
        if present < self.k {
            return Err(CodecError(format!("{present} of {} shards, {} needed", self.k + self.m, self.k)));
        }
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
        if present < self.k {
            return Err(CodecError(format!("{present} of {} shards, {} needed", self.k + self.m, self.k)));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shards(k: usize, len: usize, seed: u8) -> Vec<Vec<u8>> {
        (0..k).map(|i| (0..len).map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8 ^ seed)).collect()).collect()
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
            let codec = codec_for(k, m);
            let data = shards(k, 4096, seed);
            let whole = encoded(&*codec, &data);
            let mut damaged = whole.clone();
            let lost: std::collections::BTreeSet<usize> = lost.into_iter().map(|i| i % (k + m)).take(m).collect();
            for i in &lost {
                damaged[*i] = None;
            }
            codec.reconstruct(&mut damaged).unwrap();
            prop_assert_eq!(damaged, whole);
        }
    }

    proptest! {
        /// One shard rebuilt from borrowed others (heal's way) is the shard, whichever it is and whichever
        /// others are lost (at most m - 1 besides it), the same coders reused run after run.
        #[test]
        fn one_shard_is_rebuilt_from_the_others(k in 1usize..9, m in 1usize..5, want in 0usize..12, lost in proptest::collection::vec(0usize..12, 0..4), seed in any::<u8>()) {
            let codec = codec_for(k, m);
            let want = want % (k + m);
            for round in 0..2u8 {
                let whole = encoded(&*codec, &shards(k, 4096, seed ^ round));
                let lost: std::collections::BTreeSet<usize> =
                    lost.iter().map(|i| i % (k + m)).filter(|i| *i != want).take(m - 1).collect();
                let refs: Vec<Option<&[u8]>> = whole
                    .iter()
                    .enumerate()
                    .map(|(i, s)| if i == want || lost.contains(&i) { None } else { s.as_deref() })
                    .collect();
                let mut out = vec![0u8; 4096];
                codec.rebuild_one(&refs, want, &mut out).unwrap();
                prop_assert_eq!(Some(&out), whole[want].as_ref());
            }
        }
    }

    #[test]
    fn one_shard_is_not_rebuilt_from_fewer_than_k() {
        let codec = codec_for(4, 2);
        let whole = encoded(&*codec, &shards(4, 128, 0));
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
        let codec = codec_for(4, 2);
        let (a, b) = (shards(4, 4096, 1), shards(4, 4096, 2));
        let joined: Vec<Vec<u8>> = a.iter().zip(&b).map(|(x, y)| [x.as_slice(), y.as_slice()].concat()).collect();
        let (pa, pb, pj) = (encoded(&*codec, &a), encoded(&*codec, &b), encoded(&*codec, &joined));
        for i in 4..6 {
            let cat = [pa[i].as_ref().unwrap().as_slice(), pb[i].as_ref().unwrap().as_slice()].concat();
            assert_eq!(pj[i].as_ref().unwrap(), &cat);
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
