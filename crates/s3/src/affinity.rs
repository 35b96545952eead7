//! Connection affinity for CPU classes (paper 002's microstores): a plain HTTP connection whose first
//! request addresses a bulk microstore's bucket is served whole on the bulk class's runtime
//! (`mosaic_store::bulk_runtime`), so that its socket IO, its bodies' hashing and its S3 logic run at the
//! bulk nice. Served from the accepting runtime instead, each request, and each body chunk a request reads,
//! crossed between runtimes: measured as thousands of extra context switches a second on two cores shared
//! by two tenants, the throughput tenant's bytes 4-11% under the monolith's
//! (docs/bench/2026-12-07-bulk-runtime.md). A later request on the connection for a bucket of another
//! class still runs in its own class (`mosaic_store::run_in_class` hands it back home), and the connection
//! is closed after its answer (`server.rs`): a client that shares one pool of connections among buckets
//! then opens a new one, placed by its next request, instead of the latency class's socket IO running at
//! the bulk nice from then on. A connection placed here that later carries bulk requests keeps them on
//! their own runtime, a hop per request as before.
//!
//! The bucket is read from the first request's head with a peek (nothing is consumed: hyper reads the
//! request as sent). A head that is not complete in the first peek, or one past `HEAD_PEEK_BYTES_MAX`,
//! keeps the connection where it is: the choice is a hint, never a condition of correctness. TLS
//! connections stay too (the head is encrypted until the handshake, and the stream cannot move then).

use std::time::Duration;
use tokio::net::TcpStream;

/// Most bytes of a connection's first request peeked to find its bucket.
pub(crate) const HEAD_PEEK_BYTES_MAX: usize = 16 * 1024;

/// Most headers parsed from the peeked head; a head with more keeps its connection where it is.
const HEAD_PEEK_HEADERS_MAX: usize = 128;

/// Where a new connection is served.
pub(crate) enum Placement {
    /// On the accepting runtime.
    Here,
    /// Whole on the bulk class's runtime.
    Bulk(tokio::runtime::Handle),
    /// Nowhere: the client sent nothing within the header read timeout or before the server stopped, or
    /// the socket failed.
    Closed,
}

/// Where the connection `stream` is served, from its first request's bucket. Waits for the client's first
/// bytes (at most `wait`, and not once `stopping` is true) only when some microstore is in the bulk class.
pub(crate) async fn place(
    domain: Option<&crate::host::DomainHost>,
    microstores: Option<&mosaic_microstore::Microstores>,
    stream: &TcpStream,
    wait: Duration,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Placement {
    let Some(microstores) = microstores else { return Placement::Here };
    if !mosaic_store::any_bulk() {
        return Placement::Here;
    }
    let mut head = vec![0u8; HEAD_PEEK_BYTES_MAX];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(wait, stream.peek(&mut head)) => match peeked {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Placement::Closed,
            Ok(Ok(n)) => n,
        },
        // The server stops (or is gone): a connection that sent nothing yet is closed, as hyper would.
        _ = stopping.wait_for(|stop| *stop) => return Placement::Closed,
    };
    debug_assert!(peeked <= HEAD_PEEK_BYTES_MAX);
    let bucket = bucket_of_head(domain, &head[..peeked]);
    match mosaic_store::bulk_runtime(microstores.share_of_bucket(bucket.as_deref())) {
        Some(runtime) => Placement::Bulk(runtime),
        None => Placement::Here,
    }
}

/// The bucket a complete request head names (None: no bucket, a head not complete, or not HTTP).
pub fn bucket_of_head(domain: Option<&crate::host::DomainHost>, head: &[u8]) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; HEAD_PEEK_HEADERS_MAX];
    let mut request = httparse::Request::new(&mut headers);
    if !request.parse(head).ok()?.is_complete() {
        return None;
    }
    let target = request.path?;
    let path = target.split('?').next().unwrap_or(target);
    let host = request
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))
        .and_then(|h| std::str::from_utf8(h.value).ok());
    crate::host::bucket_of_request(domain, host, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_is_read_from_a_complete_head_only() {
        let put = b"PUT /large/obj-1?x-id=PutObject HTTP/1.1\r\nHost: 127.0.0.1:9000\r\nContent-Length: 5\r\n\r\nhello";
        assert_eq!(bucket_of_head(None, put).as_deref(), Some("large"));
        assert_eq!(bucket_of_head(None, b"GET /?list-type=2 HTTP/1.1\r\nHost: a\r\n\r\n"), None, "no bucket");
        assert_eq!(bucket_of_head(None, b"GET /b HTTP/1.1\r\nHost: a\r\n").as_deref(), None, "not complete");
        assert_eq!(bucket_of_head(None, b"GET /b HTTP/1.1\r\n"), None, "the request line alone");
        assert_eq!(bucket_of_head(None, b"\x16\x03\x01\x02\x00\x01"), None, "a TLS hello");
        assert_eq!(bucket_of_head(None, b""), None);
        let domain = crate::host::DomainHost::new("s3.example.com").unwrap();
        let virtual_host = b"GET /key HTTP/1.1\r\nhost: photos.s3.example.com\r\n\r\n";
        assert_eq!(bucket_of_head(Some(&domain), virtual_host).as_deref(), Some("photos"));
        let path_style = b"GET /photos/key HTTP/1.1\r\nHost: s3.example.com\r\n\r\n";
        assert_eq!(bucket_of_head(Some(&domain), path_style).as_deref(), Some("photos"));
    }

    /// At and past the header bound: a head with more headers than are parsed names no bucket.
    #[test]
    fn a_head_past_the_header_bound_names_no_bucket() {
        let head = |headers: usize| {
            let mut h = String::from("PUT /large/k HTTP/1.1\r\nHost: a\r\n");
            for i in 1..headers {
                h.push_str(&format!("x-amz-meta-{i}: v\r\n"));
            }
            h.push_str("\r\n");
            h
        };
        assert_eq!(bucket_of_head(None, head(HEAD_PEEK_HEADERS_MAX).as_bytes()).as_deref(), Some("large"));
        assert_eq!(bucket_of_head(None, head(HEAD_PEEK_HEADERS_MAX + 1).as_bytes()), None);
    }

    /// At and past the peek's byte bound: a head that fits is read, a longer one (seen cut at the bound)
    /// names no bucket.
    #[test]
    fn a_head_past_the_peek_bound_names_no_bucket() {
        let head = |bytes: usize| {
            let start = "PUT /large/k HTTP/1.1\r\nHost: a\r\nx-amz-meta-pad: ";
            let pad = bytes - start.len() - "\r\n\r\n".len();
            format!("{start}{}\r\n\r\n", "v".repeat(pad))
        };
        let fits = head(HEAD_PEEK_BYTES_MAX);
        assert_eq!(fits.len(), HEAD_PEEK_BYTES_MAX);
        assert_eq!(bucket_of_head(None, fits.as_bytes()).as_deref(), Some("large"));
        let longer = head(HEAD_PEEK_BYTES_MAX + 1);
        assert_eq!(bucket_of_head(None, &longer.as_bytes()[..HEAD_PEEK_BYTES_MAX]), None);
    }
}
