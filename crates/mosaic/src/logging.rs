//! tracing setup: one line per event on stderr, as text or JSON.

use crate::config::LogFormat;
use tracing_subscriber::EnvFilter;

pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_new(effective_filter(level)).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The filter the server runs with for a configured `log_level`. s3s wraps each request's signature check
/// in spans at the info level, which an `info` filter enables: the fmt layer then formats and stores their
/// fields on every request (a few percent of a small GET's CPU) for spans that no event of ours is logged
/// in. So at plain `info` s3s logs from `warn` up (its errors and warnings still show); quieter levels
/// disable those spans already, and `debug`, `trace` or a filter that names targets are kept as given.
pub fn effective_filter(level: &str) -> String {
    if level.trim().eq_ignore_ascii_case("info") { format!("{level},s3s=warn") } else { level.to_string() }
}

#[cfg(test)]
mod tests {
    use super::effective_filter;

    #[test]
    fn s3s_spans_are_off_at_info_and_quieter_only() {
        assert_eq!(effective_filter("info"), "info,s3s=warn");
        assert_eq!(effective_filter("INFO"), "INFO,s3s=warn");
        assert_eq!(effective_filter("error"), "error", "quieter levels disable s3s's info spans already");
        assert_eq!(effective_filter("debug"), "debug", "debug keeps s3s's spans and events");
        assert_eq!(effective_filter("info,mosaic_engine=debug"), "info,mosaic_engine=debug", "a filter is kept");
        assert_eq!(effective_filter("info,s3s=info"), "info,s3s=info");
        for level in ["info", "warn", "debug", "info,mosaic_engine=debug"] {
            assert!(tracing_subscriber::EnvFilter::try_new(effective_filter(level)).is_ok(), "{level}");
        }
    }
}
