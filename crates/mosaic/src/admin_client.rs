//! `mosaic admin`: talks to the admin port with the root credentials.

use crate::admin_auth;
use crate::datadir::Credentials;
use std::path::Path;
use std::time::Duration;

pub struct Client {
    base: String,
    creds: Credentials,
    http: reqwest::blocking::Client,
}

impl Client {
    /// `address`: HOST:PORT (plain HTTP, or HTTPS when `ca_cert` is given) or a URL with its scheme.
    /// `ca_cert`: a PEM file of the certificates (a CA or the server's own) that HTTPS trusts.
    pub fn new(address: &str, creds: Credentials, ca_cert: Option<&Path>) -> Result<Self, String> {
        let base = if address.starts_with("http://") || address.starts_with("https://") {
            address.to_string()
        } else if ca_cert.is_some() {
            format!("https://{address}")
        } else {
            format!("http://{address}")
        };
        let mut http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(3600))
            .connect_timeout(Duration::from_secs(5));
        if let Some(path) = ca_cert {
            for cert in trusted_certificates(path)? {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http.build().map_err(|e| e.to_string())?;
        Ok(Client { base: base.trim_end_matches('/').to_string(), creds, http })
    }

    pub fn call(&self, method: &str, path: &str) -> Result<serde_json::Value, String> {
        let t = admin_auth::now_s();
        let sig = admin_auth::sign(&self.creds.secret_key, method, path, t);
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.http.get(&url),
            "POST" => self.http.post(&url),
            "DELETE" => self.http.delete(&url),
            other => return Err(format!("unsupported method {other}")),
        };
        let resp = req
            .header(admin_auth::HEADER_KEY, &self.creds.access_key)
            .header(admin_auth::HEADER_DATE, t.to_string())
            .header(admin_auth::HEADER_SIGNATURE, sig)
            .send()
            .map_err(|e| format!("cannot reach the admin port at {}: {e}", self.base))?;
        let status = resp.status();
        let body: serde_json::Value =
            resp.json().map_err(|e| format!("the admin port answered {status} with a body that is not JSON: {e}"))?;
        if !status.is_success() {
            let why = body.get("error").and_then(|e| e.as_str()).unwrap_or("unknown error");
            return Err(format!("admin request failed ({status}): {why}"));
        }
        Ok(body)
    }
}

/// Largest CA file read.
const MAX_CA_FILE_BYTES: u64 = 1 << 20;

pub(crate) fn trusted_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let size = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?.len();
    if size > MAX_CA_FILE_BYTES {
        return Err(format!("{}: larger than {MAX_CA_FILE_BYTES} bytes", path.display()));
    }
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("{}: not PEM certificates ({e})", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no CERTIFICATE in PEM", path.display()));
    }
    Ok(certs)
}

/// Credentials for the admin client: the environment, else the data directory's credentials file.
pub fn credentials(data_dir: &Path) -> Result<Credentials, String> {
    match (std::env::var("MOSAIC_ACCESS_KEY").ok(), std::env::var("MOSAIC_SECRET_KEY").ok()) {
        (Some(a), Some(s)) => return Ok(Credentials { access_key: a, secret_key: s }),
        (None, None) => {}
        _ => return Err("set both MOSAIC_ACCESS_KEY and MOSAIC_SECRET_KEY, or neither".into()),
    }
    if !data_dir.join("credentials").exists() {
        return Err(format!(
            "no credentials: set MOSAIC_ACCESS_KEY and MOSAIC_SECRET_KEY, or point --data at the server's data \
             directory ({} has no credentials file)",
            data_dir.display()
        ));
    }
    crate::datadir::root_credentials(data_dir, None).map(|(c, _)| c)
}
