//! The cluster's frames on arbitrary bytes: the map, Raft's changes and the object-drive protocol's
//! requests and replies. Never a panic; a map that decodes encodes back to itself; any change that
//! decodes is applied to a small map without a panic, and a refused one leaves the map as it was.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mosaic_cluster::frame::{self, Kind};
use mosaic_cluster::{Change, ClusterMap, FailureDomain};
use mosaic_remote::wire::{Reply, Request};

fn small_map() -> ClusterMap {
    let mut map = ClusterMap::empty();
    map.apply(&Change::Bootstrap {
        cluster_id: "fuzz".into(),
        data_shards: 2,
        parity_shards: 1,
        pg_count: 16,
        failure_domain: FailureDomain::Node,
    })
    .expect("bootstrap");
    for node in 0..4u64 {
        let add = Change::Batch(vec![
            Change::AddNode { node, address: format!("n{node}"), s3_address: format!("s{node}"), zone: "z".into() },
            Change::AddDrive { node, name: "d0".into(), weight: 100 },
        ]);
        map.apply(&add).expect("a node");
    }
    map
}

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = frame::decode::<ClusterMap>(Kind::Map, data) {
        let again = frame::encode(Kind::Map, &map).expect("a decoded map encodes");
        assert_eq!(frame::decode::<ClusterMap>(Kind::Map, &again).ok(), Some(map));
    }
    // Changes come framed from the Raft log; fuzz their bodies directly as well.
    let change = frame::decode::<Change>(Kind::RaftEntry, data).ok().or_else(|| serde_json::from_slice(data).ok());
    if let Some(change) = change {
        let mut map = small_map();
        let before = map.clone();
        if map.apply(&change).is_err() {
            assert_eq!(map, before);
        }
    }
    let raw = bytes::Bytes::copy_from_slice(data);
    if let Ok((_, payload)) = frame::decode_binary::<Request>(Kind::Drive, &raw) {
        assert!(payload.len() < raw.len());
    }
    let whole = frame::decode_binary::<Reply>(Kind::Drive, &raw);
    // Received in parts (a streamed answer), a frame is accepted exactly when it is accepted whole, with
    // the same payload.
    let mut parts = frame::BinaryReceiver::new(Kind::Drive);
    let mut payload = Vec::new();
    let fed = data.chunks(7).try_for_each(|part| parts.feed(part).map(|p| payload.extend_from_slice(p)));
    let streamed = fed.and_then(|()| parts.finish::<Reply>());
    assert_eq!(whole.is_ok(), streamed.is_ok());
    if let Ok((_, whole_payload)) = whole {
        assert_eq!(whole_payload, payload);
    }
});
