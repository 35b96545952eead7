//! Server-side encryption headers: what a write asks for (SSE-S3, SSE-KMS, SSE-C), the customer key a
//! read brings, and the headers a response echoes. The encryption itself is the layer's.

use mosaic_layer::{BucketEncryption, CustomerKey, SseMeta, SseMode, SseRequest};
use s3s::dto::{
    ServerSideEncryption, ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration, ServerSideEncryptionRule,
};
use s3s::{S3Result, s3_error};

/// SSE-C headers as a request carries them (algorithm, base64 key, base64 key MD5).
pub(crate) struct CustomerHeaders<'a> {
    pub(crate) algorithm: Option<&'a str>,
    pub(crate) key: Option<&'a str>,
    pub(crate) key_md5: Option<&'a str>,
}

macro_rules! customer_headers {
    ($i:expr) => {
        crate::sse::CustomerHeaders {
            algorithm: $i.sse_customer_algorithm.as_deref(),
            key: $i.sse_customer_key.as_deref(),
            key_md5: $i.sse_customer_key_md5.as_deref(),
        }
    };
}
pub(crate) use customer_headers;

macro_rules! copy_source_customer_headers {
    ($i:expr) => {
        crate::sse::CustomerHeaders {
            algorithm: $i.copy_source_sse_customer_algorithm.as_deref(),
            key: $i.copy_source_sse_customer_key.as_deref(),
            key_md5: $i.copy_source_sse_customer_key_md5.as_deref(),
        }
    };
}
pub(crate) use copy_source_customer_headers;

/// The customer key of a request (None without SSE-C headers); refused over plain HTTP unless allowed.
pub(crate) fn customer_key(h: &CustomerHeaders<'_>, over_http_allowed: bool) -> S3Result<Option<CustomerKey>> {
    let key = CustomerKey::from_headers(h.algorithm, h.key, h.key_md5).map_err(crate::errors::to_s3)?;
    if key.is_some() && !over_http_allowed {
        return Err(s3_error!(
            InvalidRequest,
            "Requests specifying Server Side Encryption with Customer provided keys must be made over a secure connection."
        ));
    }
    Ok(key)
}

/// The encryption a write asks for: `x-amz-server-side-encryption` (AES256, or aws:kms with a key id) or
/// SSE-C, not both; None asks for none (the bucket's default then applies).
pub(crate) fn write_request(
    sse: Option<&ServerSideEncryption>,
    kms_key_id: Option<&str>,
    customer: Option<CustomerKey>,
) -> S3Result<Option<SseRequest>> {
    let req = match (sse.map(|s| s.as_str()), customer) {
        (Some(_), Some(_)) => {
            return Err(s3_error!(
                InvalidArgument,
                "Server Side Encryption with Customer provided key is incompatible with the encryption method specified"
            ));
        }
        (None, Some(c)) => SseRequest::Customer(c),
        (Some("AES256"), None) => {
            if kms_key_id.is_some() {
                return Err(s3_error!(
                    InvalidArgument,
                    "x-amz-server-side-encryption-aws-kms-key-id is only valid with aws:kms"
                ));
            }
            SseRequest::S3
        }
        (Some("aws:kms"), None) => {
            let Some(id) = kms_key_id.filter(|id| !id.is_empty()) else {
                return Err(s3_error!(
                    InvalidArgument,
                    "aws:kms needs x-amz-server-side-encryption-aws-kms-key-id: this server has no default KMS key"
                ));
            };
            SseRequest::Kms { key_id: id.to_string() }
        }
        (Some(other), None) => {
            return Err(s3_error!(InvalidArgument, "The encryption method {other:?} is not supported"));
        }
        (None, None) => {
            if kms_key_id.is_some() {
                return Err(s3_error!(
                    InvalidArgument,
                    "x-amz-server-side-encryption-aws-kms-key-id needs x-amz-server-side-encryption: aws:kms"
                ));
            }
            return Ok(None);
        }
    };
    Ok(Some(req))
}

/// GET and HEAD take no `x-amz-server-side-encryption` (an object's encryption is its own): 400, as S3.
pub(crate) fn refuse_on_read(headers: &http::HeaderMap) -> S3Result<()> {
    if headers.contains_key("x-amz-server-side-encryption")
        || headers.contains_key("x-amz-server-side-encryption-aws-kms-key-id")
    {
        return Err(s3_error!(
            InvalidArgument,
            "x-amz-server-side-encryption is not valid on reads; an object is read with the encryption it was stored with"
        ));
    }
    Ok(())
}

/// The encryption headers a response about an object echoes.
#[derive(Default)]
pub(crate) struct Echo {
    pub(crate) sse: Option<ServerSideEncryption>,
    pub(crate) kms_key_id: Option<String>,
    pub(crate) customer_algorithm: Option<String>,
    pub(crate) customer_key_md5: Option<String>,
}

/// The SSE-C headers of an echo, for responses whose DTO has no fields for them.
pub(crate) fn customer_echo_headers(e: &Echo) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    let pairs = [
        ("x-amz-server-side-encryption-customer-algorithm", &e.customer_algorithm),
        ("x-amz-server-side-encryption-customer-key-md5", &e.customer_key_md5),
    ];
    for (name, value) in pairs {
        if let Some(v) = value.as_deref().and_then(|v| http::HeaderValue::from_str(v).ok()) {
            h.insert(name, v);
        }
    }
    h
}

pub(crate) fn echo(meta: Option<&SseMeta>) -> Echo {
    let Some(m) = meta else { return Echo::default() };
    match m.mode {
        SseMode::S3 => Echo { sse: Some(ServerSideEncryption::from("AES256".to_string())), ..Default::default() },
        SseMode::Kms => Echo {
            sse: Some(ServerSideEncryption::from("aws:kms".to_string())),
            kms_key_id: m.kms_key_id.clone(),
            ..Default::default()
        },
        SseMode::Customer => Echo {
            customer_algorithm: Some("AES256".into()),
            customer_key_md5: m.customer_key_md5.clone(),
            ..Default::default()
        },
    }
}

/// A bucket's default encryption from PutBucketEncryption: one rule, AES256 or aws:kms.
pub(crate) fn bucket_encryption_from_dto(c: ServerSideEncryptionConfiguration) -> S3Result<BucketEncryption> {
    let [rule] = <[ServerSideEncryptionRule; 1]>::try_from(c.rules)
        .map_err(|_| s3_error!(MalformedXML, "a bucket encryption configuration has exactly one rule"))?;
    let by_default = rule
        .apply_server_side_encryption_by_default
        .ok_or_else(|| s3_error!(MalformedXML, "the rule needs ApplyServerSideEncryptionByDefault"))?;
    let mode = match by_default.sse_algorithm.as_str() {
        "AES256" => SseMode::S3,
        "aws:kms" => SseMode::Kms,
        other => return Err(s3_error!(InvalidArgument, "The encryption method {other:?} is not supported")),
    };
    let e = BucketEncryption {
        mode,
        kms_key_id: by_default.kms_master_key_id,
        bucket_key_enabled: rule.bucket_key_enabled.unwrap_or(false),
    };
    if e.mode == SseMode::Kms && e.kms_key_id.is_none() {
        return Err(s3_error!(InvalidArgument, "aws:kms needs KMSMasterKeyID: this server has no default KMS key"));
    }
    e.validate().map_err(crate::errors::to_s3)?;
    Ok(e)
}

pub(crate) fn bucket_encryption_to_dto(e: &BucketEncryption) -> ServerSideEncryptionConfiguration {
    let algorithm = if e.mode == SseMode::Kms { "aws:kms" } else { "AES256" };
    ServerSideEncryptionConfiguration {
        rules: vec![ServerSideEncryptionRule {
            apply_server_side_encryption_by_default: Some(ServerSideEncryptionByDefault {
                sse_algorithm: ServerSideEncryption::from(algorithm.to_string()),
                kms_master_key_id: e.kms_key_id.clone(),
            }),
            bucket_key_enabled: Some(e.bucket_key_enabled),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "pO3upElrwuEXSoFwCfnZPdSsmt/xWeFa0N9KgDijwVs=";
    const MD5: &str = "DWygnHRtgiJ77HCm+1rvHw==";

    fn sse(s: &str) -> ServerSideEncryption {
        ServerSideEncryption::from(s.to_string())
    }

    fn customer() -> Option<CustomerKey> {
        CustomerKey::from_headers(Some("AES256"), Some(KEY), Some(MD5)).unwrap()
    }

    #[test]
    fn write_requests_and_conflicts() {
        assert_eq!(write_request(None, None, None).unwrap(), None);
        assert_eq!(write_request(Some(&sse("AES256")), None, None).unwrap(), Some(SseRequest::S3));
        assert_eq!(
            write_request(Some(&sse("aws:kms")), Some("k"), None).unwrap(),
            Some(SseRequest::Kms { key_id: "k".into() })
        );
        assert!(matches!(write_request(None, None, customer()).unwrap(), Some(SseRequest::Customer(_))));
        let code = |r: S3Result<Option<SseRequest>>| r.unwrap_err().code().as_str().to_string();
        assert_eq!(code(write_request(Some(&sse("aws:kms")), Some("k"), customer())), "InvalidArgument");
        assert_eq!(code(write_request(Some(&sse("AES256")), Some("k"), None)), "InvalidArgument");
        assert_eq!(code(write_request(Some(&sse("aes:kms")), None, None)), "InvalidArgument");
        assert_eq!(code(write_request(Some(&sse("aws:kms")), None, None)), "InvalidArgument");
        assert_eq!(code(write_request(None, Some("k"), None)), "InvalidArgument");
    }

    #[test]
    fn customer_keys_need_tls_unless_allowed() {
        let h = CustomerHeaders { algorithm: Some("AES256"), key: Some(KEY), key_md5: Some(MD5) };
        assert!(customer_key(&h, true).unwrap().is_some());
        assert_eq!(customer_key(&h, false).unwrap_err().code().as_str(), "InvalidRequest");
        let none = CustomerHeaders { algorithm: None, key: None, key_md5: None };
        assert!(customer_key(&none, false).unwrap().is_none());
    }
}
