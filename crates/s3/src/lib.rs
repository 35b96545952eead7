//! The S3 frontend (DESIGN.md section 4): s3s does the protocol (routing, XML, SigV4 in headers, presigned
//! URLs and aws-chunked bodies); this crate maps S3 operations onto the [`mosaic_layer::ObjectLayer`] trait,
//! verifies Content-MD5 and x-amz-checksum-* (including aws-chunked trailers), and serves HTTP.
//!
//! It knows nothing of drives, blocks or placement: everything below the ObjectLayer is opaque here.

pub mod access;
mod acl;
mod affinity;
mod checksum;
mod cors;
mod errors;
mod host;
mod lifecycle;
mod lock;
mod metered;
mod multipart;
mod policy;
mod post;
mod server;
mod service;
mod sse;
pub mod tls;
mod token;

pub use checksum::{Algo, checksum_b64};
pub use host::validate_domain;
pub use server::{HttpLimits, Service, build_service, build_service_with_keys, serve};
pub use service::MosaicS3;

/// The request parsing glue Mosaic owns (beside s3s), for the fuzz targets in `fuzz/`. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::access::copy_source;
    pub use crate::acl::from_headers as acl_from_headers;
    pub use crate::affinity::bucket_of_head;
    pub use crate::checksum::{Algo, Expectations, checksum_b64, verified_body};
    pub use crate::cors::wildcard_matches as cors_wildcard_matches;
    pub use crate::host::DomainHost;
    pub use crate::multipart::composite_checksum;
    pub use crate::policy::Policy;
    pub use crate::token::{decode as decode_token, encode as encode_token};
}
