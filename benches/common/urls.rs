//! Server URLs for the benches that connect to PostgreSQL or MySQL.

/// The environment variable `name`, or `default`.
pub fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// `url` with TLS turned off by `parameter`, unless the URL already says something about TLS:
/// the raw-driver baselines connect without TLS, so the registry must too for the ratios to
/// compare like with like (with the TLS features, the registry's default is to encrypt when
/// the server offers it).
pub fn without_tls(url: &str, parameter: &str) -> String {
    if url.contains("ssl") {
        return url.to_string();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{parameter}")
}
