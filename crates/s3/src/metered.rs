//! A request as its microstore sees it: admitted into the bucket's workers, it holds one until its answer
//! has been sent (a streamed GET body holds it to the last byte, or until the client goes away), then is
//! counted in the bucket's workload window and its microstore's round.

use mosaic_microstore::pacer::Pacer;
use mosaic_microstore::workers::Admission;
use mosaic_microstore::{Microstores, OpKind, Sample};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

pub(crate) struct Metered {
    microstores: Arc<Microstores>,
    admission: Admission,
    bucket: Option<String>,
    op: OpKind,
    size_bytes: u64,
    started: Instant,
    /// Set when its microstore's bandwidth was capped at admission.
    pacer: Option<Arc<Pacer>>,
}

/// The kind a coarse operation name counts as.
fn kind(op: &str) -> OpKind {
    match op {
        "GetObject" => OpKind::Get,
        "PutObject" | "UploadPart" => OpKind::Put,
        "DeleteObject" | "DeleteObjects" => OpKind::Delete,
        _ => OpKind::Other,
    }
}

/// The object bytes a PUT carries (the decoded length of an aws-chunked body).
pub(crate) fn put_size(headers: &http::HeaderMap) -> u64 {
    // Names made once: a lookup by `&str` parses and validates the name on every call.
    static DECODED: http::HeaderName = http::HeaderName::from_static("x-amz-decoded-content-length");
    let number = |name: &http::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    number(&DECODED).or_else(|| number(&http::header::CONTENT_LENGTH)).unwrap_or(0)
}

impl Metered {
    pub(crate) fn new(
        microstores: Arc<Microstores>,
        admission: Admission,
        bucket: Option<String>,
        op: &str,
        put_bytes: u64,
        started: Instant,
    ) -> Metered {
        let op = kind(op);
        let size_bytes = if op == OpKind::Put { put_bytes } else { 0 };
        let pacer = admission.pacer();
        Metered { microstores, admission, bucket, op, size_bytes, started, pacer }
    }

    /// The IO share its drive work runs in.
    pub(crate) fn io_share(&self) -> mosaic_store::ShareId {
        self.admission.io_share()
    }

    /// A PUT's body paced to its microstore's bandwidth cap, if it has one.
    pub(crate) fn pace_request(&self, req: http::Request<s3s::Body>) -> http::Request<s3s::Body> {
        match (&self.pacer, self.op) {
            (Some(p), OpKind::Put) => {
                let p = p.clone();
                req.map(|inner| s3s::Body::http_body(Followed::new(inner, Some(p), None)))
            }
            _ => req,
        }
    }

    /// Follows the answer: counted now when its body is in memory, else when the body is done.
    pub(crate) fn follow(mut self, op: &str, resp: http::Response<s3s::Body>) -> http::Response<s3s::Body> {
        if op == "DeleteBucket"
            && resp.status().is_success()
            && let Some(b) = &self.bucket
            && let Err(e) = self.microstores.bucket_deleted(b)
        {
            tracing::warn!(bucket = b, error = %e, "a deleted bucket's microstore assignment was not removed");
        }
        if self.op == OpKind::Get {
            if !resp.status().is_success() {
                // A failed GET moved no object; it counts in the rate, not in the sizes.
                self.op = OpKind::Other;
            } else {
                let len = resp.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
                self.size_bytes = len.unwrap_or(0);
            }
        }
        if resp.body().bytes().is_some() {
            drop(self);
            return resp;
        }
        let (parts, body) = resp.into_parts();
        let pacer = if self.op == OpKind::Get { self.pacer.clone() } else { None };
        let share = self.io_share();
        let followed = Followed::new(body, pacer, Some(self)).in_io_share(share);
        http::Response::from_parts(parts, s3s::Body::http_body(followed))
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        let latency_us = self.started.elapsed().as_micros() as u64;
        self.admission.finish(self.size_bytes, latency_us);
        if let Some(b) = &self.bucket {
            self.microstores.record(b, Sample { op: self.op, size_bytes: self.size_bytes, latency_us });
        }
    }
}

/// A streamed body as its microstore follows it: paced when its microstore's bandwidth is capped (after
/// each chunk it waits, if the pacer says so, before the next), holding its request's worker (a
/// response's `Metered`) until it is done or dropped, and read in its microstore's IO share (a GET body
/// reads its drives as it is polled). One wrapper for all, so a capped GET is boxed once.
struct Followed {
    inner: s3s::Body,
    io_share: mosaic_store::ShareId,
    pacer: Option<Arc<Pacer>>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    _metered: Option<Metered>,
}

impl Followed {
    fn new(inner: s3s::Body, pacer: Option<Arc<Pacer>>, metered: Option<Metered>) -> Followed {
        Followed { inner, io_share: mosaic_store::UNSHARED, pacer, sleep: None, _metered: metered }
    }

    fn in_io_share(mut self, share: mosaic_store::ShareId) -> Followed {
        self.io_share = share;
        self
    }
}

impl http_body::Body for Followed {
    type Data = bytes::Bytes;
    type Error = s3s::StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Some(sleep) = self.sleep.as_mut() {
            std::task::ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
        }
        let share = self.io_share;
        let inner = Pin::new(&mut self.inner);
        let frame = std::task::ready!(mosaic_store::with_io_share_sync(share, || inner.poll_frame(cx)));
        if let (Some(Ok(f)), Some(pacer)) = (&frame, &self.pacer)
            && let Some(data) = f.data_ref()
            && let Some(wait) = pacer.schedule(data.len() as u64, tokio::time::Instant::now().into_std())
        {
            self.sleep = Some(Box::pin(tokio::time::sleep(wait)));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body of `chunks` chunks of `chunk_bytes`, paced at `rate`: how long (tokio's clock) it takes to read.
    async fn read_paced(chunks: usize, chunk_bytes: usize, rate: u64) -> std::time::Duration {
        let pacer = Arc::new(Pacer::default());
        pacer.set_rate(Some(rate));
        let stream = futures::stream::iter(
            (0..chunks).map(move |_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; chunk_bytes]))),
        );
        let inner = s3s::Body::http_body(http_body_util::StreamBody::new(futures::StreamExt::map(stream, |r| {
            r.map(http_body::Frame::data)
        })));
        let started = tokio::time::Instant::now();
        let body = Followed::new(inner, Some(pacer), None);
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all.len(), chunks * chunk_bytes);
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_body_moves_at_its_rate_after_the_burst() {
        // 8 MiB at 16 MiB/s: 500 ms, less the 50 ms burst.
        let took = read_paced(128, 64 << 10, 16 << 20).await;
        assert!(took >= std::time::Duration::from_millis(440), "{took:?}");
        assert!(took <= std::time::Duration::from_millis(520), "{took:?}");
    }
}
