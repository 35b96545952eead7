//! Body integrity: Content-MD5 and the x-amz-checksum-* family, computed while the body streams and
//! verified before the write commits, whether the expected value came in a header or in an aws-chunked
//! trailer (s3s verifies chunk signatures but not trailing checksums).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures::StreamExt;
use md5::Digest as _;
use mosaic_layer::{ByteStream, Finisher, LayerError, LayerResult, PutBody};
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Algo {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

impl Algo {
    pub const ALL: [Algo; 5] = [Algo::Crc32, Algo::Crc32c, Algo::Crc64Nvme, Algo::Sha1, Algo::Sha256];

    /// The name S3 uses in x-amz-checksum-algorithm and in stored metadata.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Crc32 => "CRC32",
            Algo::Crc32c => "CRC32C",
            Algo::Crc64Nvme => "CRC64NVME",
            Algo::Sha1 => "SHA1",
            Algo::Sha256 => "SHA256",
        }
    }

    pub fn header(self) -> &'static str {
        match self {
            Algo::Crc32 => "x-amz-checksum-crc32",
            Algo::Crc32c => "x-amz-checksum-crc32c",
            Algo::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algo::Sha1 => "x-amz-checksum-sha1",
            Algo::Sha256 => "x-amz-checksum-sha256",
        }
    }

    pub fn parse(s: &str) -> Option<Algo> {
        Algo::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s) || a.header().eq_ignore_ascii_case(s))
    }

    /// The CRC of a CRC algorithm (those whose checksums of parts combine into the whole's).
    pub fn crc(self) -> Option<crc_fast::CrcAlgorithm> {
        use crc_fast::CrcAlgorithm as C;
        match self {
            Algo::Crc32 => Some(C::Crc32IsoHdlc),
            Algo::Crc32c => Some(C::Crc32Iscsi),
            Algo::Crc64Nvme => Some(C::Crc64Nvme),
            Algo::Sha1 | Algo::Sha256 => None,
        }
    }

    pub fn digest_len(self) -> usize {
        match self {
            Algo::Crc32 | Algo::Crc32c => 4,
            Algo::Crc64Nvme => 8,
            Algo::Sha1 => 20,
            Algo::Sha256 => 32,
        }
    }
}

enum Hasher {
    Crc(crc_fast::Digest, usize),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn new(a: Algo) -> Self {
        use crc_fast::CrcAlgorithm as C;
        match a {
            Algo::Crc32 => Hasher::Crc(crc_fast::Digest::new(C::Crc32IsoHdlc), 4),
            Algo::Crc32c => Hasher::Crc(crc_fast::Digest::new(C::Crc32Iscsi), 4),
            Algo::Crc64Nvme => Hasher::Crc(crc_fast::Digest::new(C::Crc64Nvme), 8),
            Algo::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            Algo::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Crc(d, _) => d.update(b),
            Hasher::Sha1(h) => h.update(b),
            Hasher::Sha256(h) => h.update(b),
        }
    }

    fn finish(self) -> Vec<u8> {
        match self {
            Hasher::Crc(d, 4) => (d.finalize() as u32).to_be_bytes().to_vec(),
            Hasher::Crc(d, _) => d.finalize().to_be_bytes().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
        }
    }
}

/// One checksum of a whole buffer, base64 as S3 sends it.
pub fn checksum_b64(a: Algo, data: &[u8]) -> String {
    let mut h = Hasher::new(a);
    h.update(data);
    B64.encode(h.finish())
}

/// What the request promises about its body.
#[derive(Default)]
pub struct Expectations {
    pub content_md5: Option<String>,
    /// Checksums given in headers, base64.
    pub headers: Vec<(Algo, String)>,
    /// Algorithm whose value arrives in the trailer.
    pub trailer: Option<Algo>,
    /// Algorithm the client asked for without giving a value (we compute and store it).
    pub requested: Option<Algo>,
    pub trailing: Option<s3s::TrailingHeaders>,
    pub content_length: Option<u64>,
}

impl Expectations {
    /// Parses and checks the shape of the values (base64 of the right length) before any data is read.
    pub fn validate(&self) -> LayerResult<Option<[u8; 16]>> {
        for (a, v) in &self.headers {
            match B64.decode(v) {
                Ok(raw) if raw.len() == a.digest_len() => {}
                // S3 answers a value that cannot be the algorithm's digest as one that does not match.
                _ => {
                    return Err(LayerError::BadDigest(format!("{} is not a valid {} value", a.header(), a.name())));
                }
            }
        }
        match &self.content_md5 {
            None => Ok(None),
            Some(v) => match B64.decode(v) {
                Ok(raw) if raw.len() == 16 => Ok(Some(raw.try_into().expect("16 bytes"))),
                _ => Err(LayerError::InvalidArgument("InvalidDigest: Content-MD5 is not base64 of 16 bytes".into())),
            },
        }
    }
}

struct State {
    md5: Option<md5::Md5>,
    hashers: Vec<(Algo, Hasher)>,
    received: u64,
}

/// Wraps a request body so that every configured digest is computed as it streams; the finisher verifies
/// them and returns the checksums to store.
pub fn verified_body(stream: ByteStream, exp: Expectations) -> LayerResult<PutBody> {
    let md5_expected = exp.validate()?;
    let mut algos: Vec<Algo> = exp.headers.iter().map(|(a, _)| *a).collect();
    algos.extend(exp.trailer);
    algos.extend(exp.requested);
    algos.sort();
    algos.dedup();
    let state = Arc::new(Mutex::new(State {
        md5: md5_expected.map(|_| md5::Md5::new()),
        hashers: algos.iter().map(|a| (*a, Hasher::new(*a))).collect(),
        received: 0,
    }));
    let s2 = state.clone();
    let limit = exp.content_length;
    let stream = stream.map(move |chunk: Result<Bytes, LayerError>| {
        let chunk = chunk?;
        let mut st = s2.lock();
        st.received += chunk.len() as u64;
        if let Some(l) = limit
            && st.received > l
        {
            return Err(LayerError::IncompleteBody("the body is longer than Content-Length".into()));
        }
        if let Some(m) = st.md5.as_mut() {
            m.update(&chunk);
        }
        for (_, h) in st.hashers.iter_mut() {
            h.update(&chunk);
        }
        Ok(chunk)
    });
    let finish: Finisher = Box::new(move || {
        let st = std::mem::replace(&mut *state.lock(), State { md5: None, hashers: Vec::new(), received: 0 });
        if let Some(l) = exp.content_length
            && st.received != l
        {
            return Err(LayerError::IncompleteBody(format!("received {} of {l} bytes", st.received)));
        }
        if let (Some(m), Some(want)) = (st.md5, md5_expected)
            && m.finalize().as_slice() != want
        {
            return Err(LayerError::BadDigest("the Content-MD5 you specified did not match what was received".into()));
        }
        let trailer_value = match (exp.trailer, &exp.trailing) {
            (Some(a), Some(t)) => {
                let v = t.read(|h| h.get(a.header()).and_then(|v| v.to_str().ok()).map(str::to_string)).flatten();
                match v {
                    Some(v) => Some((a, v)),
                    None => return Err(LayerError::InvalidArgument(format!("the trailer {} is missing", a.header()))),
                }
            }
            _ => None,
        };
        let mut stored = Vec::new();
        for (a, h) in st.hashers {
            let got = B64.encode(h.finish());
            let expected = exp.headers.iter().find(|(x, _)| *x == a).map(|(_, v)| v.clone());
            let expected = expected.or_else(|| trailer_value.as_ref().filter(|(x, _)| *x == a).map(|(_, v)| v.clone()));
            if let Some(want) = expected
                && want != got
            {
                return Err(LayerError::BadDigest(format!(
                    "the {} you specified did not match the calculated checksum",
                    a.header()
                )));
            }
            stored.push((a.name().to_string(), got));
        }
        if !stored.is_empty() {
            stored.push(("TYPE".to_string(), "FULL_OBJECT".to_string()));
        }
        Ok(stored)
    });
    Ok(PutBody { stream: Box::pin(stream), finish: Some(finish) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // Values from the AWS documentation examples and the CRC catalogue ("123456789").
        assert_eq!(checksum_b64(Algo::Crc32, b"123456789"), B64.encode(0xCBF4_3926u32.to_be_bytes()));
        assert_eq!(checksum_b64(Algo::Crc32c, b"123456789"), B64.encode(0xE306_9283u32.to_be_bytes()));
        assert_eq!(checksum_b64(Algo::Crc64Nvme, b"123456789"), B64.encode(0xAE8B_1486_0A79_9888u64.to_be_bytes()));
        assert_eq!(checksum_b64(Algo::Sha256, b""), "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=");
    }

    fn run(data: &'static [u8], exp: Expectations) -> LayerResult<Vec<(String, String)>> {
        let stream: ByteStream = Box::pin(futures::stream::iter(vec![Ok(Bytes::from_static(data))]));
        let body = verified_body(stream, exp)?;
        let collected: Vec<_> = futures::executor::block_on(body.stream.collect::<Vec<_>>());
        for c in collected {
            c?;
        }
        (body.finish.unwrap())()
    }

    #[test]
    fn header_checksums_are_verified() {
        let good = checksum_b64(Algo::Crc32, b"hello");
        let out = run(b"hello", Expectations { headers: vec![(Algo::Crc32, good.clone())], ..Default::default() });
        assert_eq!(out.unwrap()[0], ("CRC32".to_string(), good));
        let bad = checksum_b64(Algo::Crc32, b"hellO");
        assert!(matches!(
            run(b"hello", Expectations { headers: vec![(Algo::Crc32, bad)], ..Default::default() }),
            Err(LayerError::BadDigest(_))
        ));
    }

    #[test]
    fn content_md5_and_length() {
        let md5 = B64.encode(md5::Md5::digest(b"hello"));
        assert!(run(b"hello", Expectations { content_md5: Some(md5.clone()), ..Default::default() }).is_ok());
        let wrong = B64.encode(md5::Md5::digest(b"x"));
        assert!(matches!(
            run(b"hello", Expectations { content_md5: Some(wrong), ..Default::default() }),
            Err(LayerError::BadDigest(_))
        ));
        assert!(run(b"hello", Expectations { content_md5: Some("zz".into()), ..Default::default() }).is_err());
        assert!(matches!(
            run(b"hello", Expectations { content_length: Some(4), ..Default::default() }),
            Err(LayerError::IncompleteBody(_))
        ));
        assert!(matches!(
            run(b"hello", Expectations { content_length: Some(6), ..Default::default() }),
            Err(LayerError::IncompleteBody(_))
        ));
    }
}
