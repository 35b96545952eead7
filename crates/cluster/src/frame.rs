//! The envelope of everything the cluster writes to disk or sends between nodes: a kind, a version, the
//! body's length and its CRC32C, then the body: JSON for the control plane (small, read by people too),
//! bincode for the object-drive protocol (bulk bytes).
//! A reader refuses a kind it did not ask for, a version it does not know, a short or long body and a
//! checksum that fails.
//!
//! `magic(4) kind(1) version(1) length_bytes(4, BE) crc32c(4, BE) body`
//!
//! A bincode body is `value_bytes(4, BE) value payload`: the payload is bulk bytes (a read's data, staged
//! units) that follow the value as they are, so they are never copied into or out of the encoding; the
//! frame's checksum covers them like the rest.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

const MAGIC: &[u8; 4] = b"MOSC";
const HEADER_BYTES: usize = 14;
/// Largest body a frame carries (a map of 2^20 placement groups of 16 drives fits).
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// What a frame holds; each kind has its own version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Map = 1,
    RaftEntry = 2,
    RaftVote = 3,
    RaftLogId = 4,
    Snapshot = 5,
    Rpc = 6,
    /// Object-drive commands and their answers (bincode).
    Drive = 7,
}

impl Kind {
    /// The version this build writes and the only one it reads.
    fn version(self) -> u8 {
        match self {
            // 2: drive requests carry the caller's fence (its map epochs and group placement).
            // 3: bulk bytes travel as the body's payload, after the value.
            // 4: drive requests carry the caller's capability.
            // 5: drive requests say whether a client waits for them (foreground work).
            // 6: drive requests name the IO share they run in (their microstore's).
            Kind::Drive => 6,
            _ => 1,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("not a Mosaic cluster frame")]
    Magic,
    #[error("a frame of kind {got} where kind {want} was expected")]
    Kind { got: u8, want: u8 },
    #[error("a frame of version {got} (kind {kind}); this build reads version {want}")]
    Version { kind: u8, got: u8, want: u8 },
    #[error("a frame of {got} bytes where its header says {want}")]
    Length { got: usize, want: usize },
    #[error("a frame body of {0} bytes is over the limit of {MAX_BODY_BYTES}")]
    TooLarge(usize),
    #[error("a frame fails its checksum")]
    Checksum,
    #[error("a frame body does not parse: {0}")]
    Body(String),
}

fn crc32c(body: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32
}

/// `value` in a frame of `kind`.
pub fn encode<T: Serialize>(kind: Kind, value: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(value).map_err(|e| FrameError::Body(e.to_string()))?;
    seal(kind, body)
}

/// bincode's settings for frames: a bound on what a body may claim to hold, so a hostile length cannot
/// make a reader allocate more than the frame itself.
fn bincode_options() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_limit(MAX_BODY_BYTES as u64)
}

/// Bytes of a bincode body's value length.
const VALUE_LEN_BYTES: usize = 4;

/// The head of a frame of `kind` whose body is `value` in bincode followed by `payload`: the frame is the
/// head, then the payload (sent after it as it is, not copied in).
pub fn encode_binary<T: Serialize>(kind: Kind, value: &T, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    use bincode::Options;
    // Written after room for the header and the value's length, which are filled in last.
    let mut head = vec![0u8; HEADER_BYTES + VALUE_LEN_BYTES];
    bincode_options().serialize_into(&mut head, value).map_err(|e| FrameError::Body(e.to_string()))?;
    let value_bytes = head.len() - HEADER_BYTES - VALUE_LEN_BYTES;
    let body_bytes = head.len() - HEADER_BYTES + payload.len();
    if body_bytes > MAX_BODY_BYTES {
        return Err(FrameError::TooLarge(body_bytes));
    }
    head[HEADER_BYTES..HEADER_BYTES + VALUE_LEN_BYTES].copy_from_slice(&(value_bytes as u32).to_be_bytes());
    let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    crc.update(&head[HEADER_BYTES..]);
    crc.update(payload);
    write_header(&mut head[..HEADER_BYTES], kind, body_bytes, crc.finalize() as u32);
    debug_assert_eq!(head.len() + payload.len(), HEADER_BYTES + body_bytes);
    Ok(head)
}

fn write_header(header: &mut [u8], kind: Kind, body_bytes: usize, crc: u32) {
    debug_assert_eq!(header.len(), HEADER_BYTES);
    header[..4].copy_from_slice(MAGIC);
    header[4] = kind as u8;
    header[5] = kind.version();
    header[6..10].copy_from_slice(&(body_bytes as u32).to_be_bytes());
    header[10..14].copy_from_slice(&crc.to_be_bytes());
}

/// The value and the payload of a frame of `kind` whose body is bincode, checked whole before it is
/// parsed; the payload is a slice of `raw` (not copied).
pub fn decode_binary<T: DeserializeOwned>(kind: Kind, raw: &Bytes) -> Result<(T, Bytes), FrameError> {
    use bincode::Options;
    let body = open(kind, raw)?;
    let Some((len, rest)) = body.split_first_chunk::<VALUE_LEN_BYTES>() else {
        return Err(FrameError::Body("a binary body shorter than its value's length".into()));
    };
    let value_bytes = u32::from_be_bytes(*len) as usize;
    if value_bytes > rest.len() {
        return Err(FrameError::Body(format!("a value of {value_bytes} bytes in a body of {}", rest.len())));
    }
    let value = bincode_options().deserialize(&rest[..value_bytes]).map_err(|e| FrameError::Body(e.to_string()))?;
    let payload_at = HEADER_BYTES + VALUE_LEN_BYTES + value_bytes;
    debug_assert!(payload_at <= raw.len());
    Ok((value, raw.slice(payload_at..)))
}

fn seal(kind: Kind, body: Vec<u8>) -> Result<Vec<u8>, FrameError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut out = vec![0u8; HEADER_BYTES];
    write_header(&mut out, kind, body.len(), crc32c(&body));
    out.extend_from_slice(&body);
    debug_assert_eq!(out.len(), HEADER_BYTES + body.len());
    Ok(out)
}

/// The value in a frame of `kind`, checked whole before it is parsed.
pub fn decode<T: DeserializeOwned>(kind: Kind, raw: &[u8]) -> Result<T, FrameError> {
    let body = open(kind, raw)?;
    serde_json::from_slice(body).map_err(|e| FrameError::Body(e.to_string()))
}

/// The body of a frame of `kind`, once its header and checksum hold.
fn open(kind: Kind, raw: &[u8]) -> Result<&[u8], FrameError> {
    let (length_bytes, crc) = read_header(kind, raw)?;
    let body = &raw[HEADER_BYTES..];
    if body.len() != length_bytes {
        return Err(FrameError::Length { got: body.len(), want: length_bytes });
    }
    if crc32c(body) != crc {
        return Err(FrameError::Checksum);
    }
    Ok(body)
}

/// The body's length and checksum in the header at the start of `raw`, once the header is one of
/// `kind` that this build reads.
fn read_header(kind: Kind, raw: &[u8]) -> Result<(usize, u32), FrameError> {
    let Some(h) = raw.first_chunk::<HEADER_BYTES>() else { return Err(FrameError::Magic) };
    if &h[..4] != MAGIC {
        return Err(FrameError::Magic);
    }
    if h[4] != kind as u8 {
        return Err(FrameError::Kind { got: h[4], want: kind as u8 });
    }
    if h[5] != kind.version() {
        return Err(FrameError::Version { kind: h[4], got: h[5], want: kind.version() });
    }
    let length_bytes = u32::from_be_bytes([h[6], h[7], h[8], h[9]]) as usize;
    if length_bytes > MAX_BODY_BYTES {
        return Err(FrameError::TooLarge(length_bytes));
    }
    Ok((length_bytes, u32::from_be_bytes([h[10], h[11], h[12], h[13]])))
}

/// A frame of `kind` with a bincode body, received in parts: the header and the value are kept, and the
/// payload is handed back part by part as it arrives, to be written where it goes rather than gathered
/// first. The checksum covers the payload too, so nothing handed back is to be trusted before `finish`
/// accepts the frame.
pub struct BinaryReceiver {
    kind: Kind,
    /// The header, the value's length and the value, as far as they came.
    head: Vec<u8>,
    /// The body's length and checksum, once the header came.
    header: Option<(usize, u32)>,
    /// Where the value ends in the frame, once its length came.
    value_end: Option<usize>,
    received_bytes: usize,
    crc: crc_fast::Digest,
}

impl BinaryReceiver {
    pub fn new(kind: Kind) -> Self {
        BinaryReceiver {
            kind,
            head: Vec::with_capacity(256),
            header: None,
            value_end: None,
            received_bytes: 0,
            crc: crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi),
        }
    }

    /// Takes the next part of the frame: the piece of it that is payload (empty while the header and
    /// the value are still coming). A part that runs past the frame's length is refused.
    pub fn feed<'a>(&mut self, part: &'a [u8]) -> Result<&'a [u8], FrameError> {
        let mut rest = part;
        let body_bytes = match self.header {
            Some((b, _)) => b,
            None => {
                if !self.take_head(&mut rest, HEADER_BYTES) {
                    return Ok(&[]);
                }
                let header = read_header(self.kind, &self.head)?;
                self.header = Some(header);
                header.0
            }
        };
        let frame_bytes = HEADER_BYTES + body_bytes;
        if self.received_bytes + rest.len() > frame_bytes {
            let got = self.received_bytes + rest.len() - HEADER_BYTES;
            return Err(FrameError::Length { got, want: body_bytes });
        }
        let value_end = match self.value_end {
            Some(end) => end,
            None => {
                if !self.take_head(&mut rest, HEADER_BYTES + VALUE_LEN_BYTES) {
                    return Ok(&[]);
                }
                let len: [u8; VALUE_LEN_BYTES] =
                    self.head[HEADER_BYTES..].try_into().map_err(|_| FrameError::Body("a value length".into()))?;
                let value_bytes = u32::from_be_bytes(len) as usize;
                if VALUE_LEN_BYTES + value_bytes > body_bytes {
                    return Err(FrameError::Body(format!("a value of {value_bytes} bytes in a body of {body_bytes}")));
                }
                let end = HEADER_BYTES + VALUE_LEN_BYTES + value_bytes;
                self.value_end = Some(end);
                end
            }
        };
        if !self.take_head(&mut rest, value_end) {
            return Ok(&[]);
        }
        self.crc.update(rest);
        self.received_bytes += rest.len();
        debug_assert!(self.received_bytes <= frame_bytes && self.head.len() == value_end);
        Ok(rest)
    }

    /// Once the whole frame came: its value, if the frame's length and checksum hold.
    pub fn finish<T: DeserializeOwned>(self) -> Result<T, FrameError> {
        use bincode::Options;
        let got = self.received_bytes.saturating_sub(HEADER_BYTES);
        let (Some((body_bytes, want_crc)), Some(value_end)) = (self.header, self.value_end) else {
            return match self.header {
                Some((want, _)) => Err(FrameError::Length { got, want }),
                None => Err(FrameError::Magic),
            };
        };
        if self.head.len() != value_end || got != body_bytes {
            return Err(FrameError::Length { got, want: body_bytes });
        }
        if self.crc.finalize() as u32 != want_crc {
            return Err(FrameError::Checksum);
        }
        let value = &self.head[HEADER_BYTES + VALUE_LEN_BYTES..value_end];
        bincode_options().deserialize(value).map_err(|e| FrameError::Body(e.to_string()))
    }

    /// Moves bytes of `rest` into the head until it is `upto` long: whether it is.
    fn take_head(&mut self, rest: &mut &[u8], upto: usize) -> bool {
        let n = upto.saturating_sub(self.head.len()).min(rest.len());
        let (taken, left) = rest.split_at(n);
        // The header is not part of what the checksum covers; the value's length and the value are.
        let body_from = HEADER_BYTES.saturating_sub(self.head.len()).min(n);
        self.crc.update(&taken[body_from..]);
        self.head.extend_from_slice(taken);
        self.received_bytes += n;
        *rest = left;
        self.head.len() == upto
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let raw = encode(Kind::Map, &vec![1u32, 2, 3]).unwrap();
        assert_eq!(decode::<Vec<u32>>(Kind::Map, &raw).unwrap(), vec![1, 2, 3]);
        assert_eq!(decode::<Vec<u32>>(Kind::Rpc, &raw), Err(FrameError::Kind { got: 1, want: 6 }));

        let mut newer = raw.clone();
        newer[5] = 2;
        assert!(matches!(decode::<Vec<u32>>(Kind::Map, &newer), Err(FrameError::Version { got: 2, .. })));

        let mut flipped = raw.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode::<Vec<u32>>(Kind::Map, &flipped), Err(FrameError::Checksum));

        assert!(matches!(decode::<Vec<u32>>(Kind::Map, &raw[..raw.len() - 1]), Err(FrameError::Length { .. })));
        assert_eq!(decode::<Vec<u32>>(Kind::Map, b"MOS"), Err(FrameError::Magic));
        assert_eq!(decode::<Vec<u32>>(Kind::Map, &[0u8; 20]), Err(FrameError::Magic));

        let mut huge = raw.clone();
        huge[6..10].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode::<Vec<u32>>(Kind::Map, &huge), Err(FrameError::TooLarge(_))));
    }

    /// A whole frame: its head, then its payload.
    fn binary(kind: Kind, value: &impl Serialize, payload: &[u8]) -> Bytes {
        let mut raw = encode_binary(kind, value, payload).unwrap();
        raw.extend_from_slice(payload);
        Bytes::from(raw)
    }

    #[test]
    fn binary_bodies_round_trip_and_are_bounded() {
        type V = (u64, serde_bytes::ByteBuf, Option<String>);
        let value = (7u64, serde_bytes::ByteBuf::from(vec![1u8; 1000]), Some("x".to_string()));
        let raw = binary(Kind::Drive, &value, b"");
        assert!(raw.len() < 1100, "bytes travel as bytes: {}", raw.len());
        assert_eq!(decode_binary::<V>(Kind::Drive, &raw).unwrap(), (value.clone(), Bytes::new()));
        assert!(decode_binary::<V>(Kind::Map, &raw).is_err());
        // A body that claims a huge vector is refused, not allocated.
        let lie = seal(Kind::Drive, vec![0, 0, 0, 5, 0xfc, 0xff, 0xff, 0xff, 0xff]).unwrap();
        assert!(matches!(decode_binary::<Vec<u8>>(Kind::Drive, &Bytes::from(lie)), Err(FrameError::Body(_))));
        // A value length past the body, or no room for one, is refused.
        for body in [vec![0, 0, 0, 9, 1], vec![0, 0, 1]] {
            let raw = Bytes::from(seal(Kind::Drive, body).unwrap());
            assert!(matches!(decode_binary::<u8>(Kind::Drive, &raw), Err(FrameError::Body(_))));
        }
    }

    /// The payload follows the value untouched, comes back as a slice of the frame, and is covered by the
    /// checksum; a frame of the previous version is refused by its version.
    #[test]
    fn payloads_travel_after_the_value() {
        let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let raw = binary(Kind::Drive, &("read", 5u64), &payload);
        let ((name, n), got) = decode_binary::<(String, u64)>(Kind::Drive, &raw).unwrap();
        assert_eq!((name.as_str(), n, &got[..]), ("read", 5, &payload[..]));
        assert_eq!(got.as_ptr(), raw[raw.len() - payload.len()..].as_ptr(), "a slice of the frame, not a copy");

        let mut flipped = raw.to_vec();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode_binary::<(String, u64)>(Kind::Drive, &Bytes::from(flipped)), Err(FrameError::Checksum));
        let mut older = raw.to_vec();
        older[5] = 5;
        let refused = decode_binary::<(String, u64)>(Kind::Drive, &Bytes::from(older));
        assert_eq!(refused, Err(FrameError::Version { kind: Kind::Drive as u8, got: 5, want: 6 }));
        assert!(matches!(
            encode_binary(Kind::Drive, &0u8, &vec![0u8; MAX_BODY_BYTES]),
            Err(FrameError::TooLarge(n)) if n > MAX_BODY_BYTES
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = decode::<Vec<u32>>(Kind::Map, &raw);
            let _ = decode_binary::<Vec<String>>(Kind::Drive, &Bytes::from(raw.clone()));
            let mut framed = seal(Kind::Drive, raw.clone()).unwrap();
            let _ = decode_binary::<(u64, Vec<Vec<u8>>, Option<String>)>(Kind::Drive, &Bytes::from(framed.clone()));
            // Received in parts, a frame is accepted exactly when it is accepted whole.
            let whole = decode_binary::<(u64, Vec<Vec<u8>>, Option<String>)>(Kind::Drive, &Bytes::from(framed.clone()));
            let mut parts = BinaryReceiver::new(Kind::Drive);
            let mut payload = Vec::new();
            let fed = framed.chunks(5).try_for_each(|part| parts.feed(part).map(|p| payload.extend_from_slice(p)));
            let streamed = fed.and_then(|()| parts.finish::<(u64, Vec<Vec<u8>>, Option<String>)>());
            assert_eq!(whole.is_ok(), streamed.is_ok());
            if let Ok((_, whole_payload)) = whole {
                assert_eq!(whole_payload.to_vec(), payload);
            }
            framed.truncate(14);
            let _ = decode_binary::<Vec<u8>>(Kind::Drive, &Bytes::from(framed));
        }
    }

    fn receive(kind: Kind, frame: &[u8], part_bytes: usize) -> Result<((u32, String), Vec<u8>), FrameError> {
        let mut r = BinaryReceiver::new(kind);
        let mut payload = Vec::new();
        for part in frame.chunks(part_bytes) {
            payload.extend_from_slice(r.feed(part)?);
        }
        Ok((r.finish()?, payload))
    }

    #[test]
    fn a_binary_frame_received_in_parts_is_the_frame_decoded_whole() {
        let value = (7u32, "seven".to_string());
        let payload: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut frame = encode_binary(Kind::Drive, &value, &payload).unwrap();
        frame.extend_from_slice(&payload);
        for part_bytes in [1, 2, 3, 13, 14, 15, 17, 18, 19, 100, 4096, frame.len()] {
            let (got, got_payload) = receive(Kind::Drive, &frame, part_bytes).unwrap();
            assert_eq!(got, value, "parts of {part_bytes}");
            assert_eq!(got_payload, payload, "parts of {part_bytes}");
        }
        let (whole, whole_payload) = decode_binary::<(u32, String)>(Kind::Drive, &Bytes::from(frame.clone())).unwrap();
        assert_eq!((whole, whole_payload.to_vec()), (value, payload));

        let mut flipped = frame.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(receive(Kind::Drive, &flipped, 100).err(), Some(FrameError::Checksum), "a payload bit");
        let mut flipped = frame.clone();
        flipped[HEADER_BYTES + VALUE_LEN_BYTES] ^= 1;
        assert_eq!(receive(Kind::Drive, &flipped, 7).err(), Some(FrameError::Checksum), "a value bit");
        assert!(matches!(receive(Kind::Drive, &frame[..frame.len() - 1], 64), Err(FrameError::Length { .. })));
        assert!(matches!(receive(Kind::Drive, &frame[..10], 64), Err(FrameError::Magic)), "no header yet");
        let mut longer = frame.clone();
        longer.push(0);
        assert!(matches!(receive(Kind::Drive, &longer, 64), Err(FrameError::Length { .. })));
        assert_eq!(receive(Kind::Rpc, &frame, 64).err(), Some(FrameError::Kind { got: 7, want: 6 }));
        let mut huge_value = frame.clone();
        huge_value[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(receive(Kind::Drive, &huge_value, 64), Err(FrameError::Body(_))));
    }
}
