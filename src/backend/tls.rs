//! TLS: the settings read from a connection URL, the client configuration built from them, and
//! what a failed handshake means for the user.
//!
//! # PostgreSQL
//!
//! The URL's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `sslsni`,
//! `ssl_min_protocol_version`, `ssl_max_protocol_version` and the old `requiressl` are read
//! here, as libpq reads them, in both URL (`?sslmode=…`) and `key=value` form, and taken out
//! of the string before `tokio-postgres` parses the rest (it knows only `disable`, `prefer` and
//! `require`, and rejects the others). `sslcompression` is accepted and ignored (libpq ignores
//! it too); any other `ssl…` parameter (`sslpassword`, `sslcrl`, `sslcertmode`, …) is refused
//! by name. With feature `postgres-tls` every connection (pools and the release listener) goes
//! through one rustls client configuration with the `ring` provider:
//!
//! | `sslmode` | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | no | – |
//! | `prefer` (default) | if the server offers TLS; a TLS attempt that fails is made again without | no |
//! | `require` | yes | no; with `sslrootcert`, like `verify-ca` (as libpq) |
//! | `verify-ca` | yes | chain up to a trusted CA |
//! | `verify-full` | yes | chain, and the host name of the URL (not `hostaddr`) |
//!
//! Trusted CAs: the certificates in the PEM file `sslrootcert`; without it (or with
//! `sslrootcert=system`), Mozilla's root set compiled in from the `webpki-roots` crate — the
//! system's store and libpq's `~/.postgresql/root.crt` are not read. `sslcert`/`sslkey` (PEM
//! files; the key unencrypted, PKCS#8, PKCS#1 or SEC1) are sent when the server asks for a
//! client certificate; libpq's default `~/.postgresql/postgresql.crt` is not read. Unix-socket
//! hosts never use TLS, as in libpq.
//!
//! Without feature `postgres-tls`, `disable` and `prefer` connect without TLS and the other
//! modes are refused at `build()` with a message naming the feature.
//!
//! # MySQL and MariaDB
//!
//! The URL's `ssl-mode` (also spelt `ssl_mode`, `sslmode`; values as MySQL's client:
//! `DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`, any case, `-` or `_`;
//! PostgreSQL's names work too), `require_ssl` (`true` means `VERIFY_IDENTITY`, as in
//! `mysql_async`), `ssl-ca`, `ssl-cert` and `ssl-key` are read here and handed to the driver's
//! rustls support (feature `mysql-tls`):
//!
//! | `ssl-mode` | encrypted | certificate checked |
//! |---|---|---|
//! | `DISABLED` | no | – |
//! | `PREFERRED` (default without `ssl-ca`) | if the server offers TLS | no |
//! | `REQUIRED` | yes | no (MySQL's meaning, even with `ssl-ca`) |
//! | `VERIFY_CA` (default with `ssl-ca`) | yes | chain up to a trusted CA |
//! | `VERIFY_IDENTITY` | yes | chain, and the host name of the URL |
//!
//! Trusted CAs: Mozilla's roots from `webpki-roots` (the driver always includes them) plus the
//! certificates in `ssl-ca`. The driver's own parameters (`root_cert_path`,
//! `danger_accept_invalid_certs`, …) still work when `ssl-mode` is not given. A connection to
//! a loopback address with a mode that requires TLS does not switch to the server's Unix
//! socket (the driver's `prefer_socket`) unless the URL asks for it.
//!
//! # Errors
//!
//! The first connection, opened by `build()`, turns a TLS failure into
//! [`Error::Tls`] with its [`TlsProblem`] and a hint naming the URL
//! parameter to change; such failures are not retried. Settings that cannot work (an unknown
//! mode, a missing or unreadable file, a mode that needs TLS in a build without it) are
//! [`Error::InvalidSetting`] before any connection is tried.

use crate::error::{DatabaseError, Error, TlsProblem};

/// How much TLS a connection uses and what it verifies (libpq's `sslmode`, MySQL's
/// `ssl-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    /// Whether the mode refuses a connection without TLS.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn requires_tls(self) -> bool {
        !matches!(self, Mode::Disable | Mode::Prefer)
    }
}

/// A connect failure caused by TLS, carried as the source of the failure until
/// [`surface`] turns it into [`Error::Tls`].
#[derive(Debug, thiserror::Error)]
#[error("{hint}")]
pub(crate) struct TlsFailure {
    pub problem: TlsProblem,
    pub hint: String,
    #[source]
    pub source: Option<DatabaseError>,
}

impl TlsFailure {
    pub(crate) fn new(
        problem: TlsProblem,
        hint: String,
        source: impl Into<DatabaseError>,
    ) -> TlsFailure {
        TlsFailure {
            problem,
            hint,
            source: Some(source.into()),
        }
    }
}

/// The error of a first connection, as [`Error::Tls`] when its cause is a [`TlsFailure`].
pub(crate) fn surface(error: Error, server: &str) -> Error {
    match error {
        Error::Database {
            operation,
            hint,
            source,
        } => match source.downcast::<TlsFailure>() {
            Ok(failure) => Error::Tls {
                problem: failure.problem,
                server: server.to_string(),
                hint: failure.hint,
                source: failure.source,
            },
            Err(source) => Error::Database {
                operation,
                hint,
                source,
            },
        },
        other => other,
    }
}

fn bad(setting: &'static str, reason: impl Into<String>) -> Error {
    Error::setting(setting, reason)
}

/// `%XX` escapes decoded (and `+` as a space when `plus_is_space`, as in a URL's query);
/// anything else is kept as it is.
fn percent_decode(text: &str, plus_is_space: bool, setting: &'static str) -> Result<String, Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| {
            bytes
                .get(at)
                .and_then(|b| char::from(*b).to_digit(16))
                .map(|d| d as u8)
        };
        match bytes[i] {
            b'%' => match (hex(i + 1), hex(i + 2)) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| bad(setting, "the value is not UTF-8 once decoded"))
}

/// The TLS parameters of a PostgreSQL URL.
#[cfg(feature = "postgres")]
#[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
#[derive(Clone, Debug)]
pub(crate) struct PgTls {
    /// `sslmode`, or `requiressl=1` (`require`); libpq's default is `prefer`.
    pub mode: Mode,
    /// `sslrootcert`, unless `system` (the built-in roots).
    pub root_cert: Option<String>,
    /// `sslcert` and `sslkey`.
    pub identity: Option<(String, String)>,
    /// `sslsni` (default on).
    pub sni: bool,
    /// `ssl_min_protocol_version` and `ssl_max_protocol_version`: 12 or 13 (TLS 1.2, 1.3).
    pub versions: (u8, u8),
}

#[cfg(feature = "postgres-tls")]
impl PgTls {
    /// The CAs a verified connection trusts, for messages.
    pub(crate) fn trust(&self) -> String {
        match &self.root_cert {
            Some(path) => format!("the CA certificates in sslrootcert {path}"),
            None => {
                "the built-in Mozilla roots (webpki-roots), used without sslrootcert".to_string()
            }
        }
    }
}

/// Hints name these parameters.
#[cfg(any(feature = "postgres-tls", feature = "mysql-tls"))]
pub(crate) struct Words {
    pub verify_ca: &'static str,
    pub require: &'static str,
    pub ca: &'static str,
    pub client: &'static str,
}

#[cfg(feature = "postgres-tls")]
pub(crate) const PG_WORDS: Words = Words {
    verify_ca: "sslmode=verify-ca",
    require: "sslmode=require",
    ca: "sslrootcert",
    client: "sslcert and sslkey",
};

#[cfg(feature = "mysql-tls")]
pub(crate) const MYSQL_WORDS: Words = Words {
    verify_ca: "ssl-mode=VERIFY_CA",
    require: "ssl-mode=REQUIRED",
    ca: "ssl-ca",
    client: "ssl-cert and ssl-key",
};

/// Splits the TLS parameters off a PostgreSQL connection string (URL or `key=value` form):
/// the string without them, for `tokio-postgres`, and their values. A string that does not
/// parse is returned whole, for `tokio-postgres` to report.
#[cfg(feature = "postgres")]
pub(crate) fn split_postgres(url: &str) -> Result<(String, PgTls), Error> {
    let (rest, params) = if let Some((prefix, rest)) = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|prefix| url.strip_prefix(prefix).map(|rest| (*prefix, rest)))
    {
        // As tokio-postgres reads it: credentials up to the first `@`, then host and path up
        // to the first `?`, then `key=value` pairs joined by `&`.
        let from = rest.find('@').unwrap_or(0);
        match rest[from..].find('?') {
            None => (url.to_string(), Vec::new()),
            Some(at) => {
                let (head, query) = rest.split_at(from + at);
                let mut kept = Vec::new();
                let mut taken = Vec::new();
                for pair in query[1..].split('&').filter(|pair| !pair.is_empty()) {
                    let Some((key, value)) = pair.split_once('=') else {
                        kept.push(pair);
                        continue;
                    };
                    let key = percent_decode(key, false, "url")?;
                    if is_pg_tls_key(&key) {
                        taken.push((key, percent_decode(value, false, "url")?));
                    } else {
                        kept.push(pair);
                    }
                }
                let mut rebuilt = format!("{prefix}{head}");
                if !kept.is_empty() {
                    rebuilt.push('?');
                    rebuilt.push_str(&kept.join("&"));
                }
                (rebuilt, taken)
            }
        }
    } else {
        match key_value_pairs(url) {
            None => (url.to_string(), Vec::new()),
            Some(pairs) => {
                let mut kept = Vec::new();
                let mut taken = Vec::new();
                for (raw, key, value) in pairs {
                    if is_pg_tls_key(key) {
                        taken.push((key.to_string(), value));
                    } else {
                        kept.push(raw);
                    }
                }
                (kept.join(" "), taken)
            }
        }
    };
    Ok((rest, pg_tls(params)?))
}

/// The parameters read here; `sslnegotiation` stays for `tokio-postgres`.
#[cfg(feature = "postgres")]
fn is_pg_tls_key(key: &str) -> bool {
    (key.starts_with("ssl") && key != "sslnegotiation") || key == "requiressl"
}

/// The pairs of a `key=value` connection string, each with its text as written; `None` when it
/// does not parse (as `tokio-postgres` parses it: values may be quoted with `'`, and `\`
/// escapes the next character).
#[cfg(feature = "postgres")]
fn key_value_pairs(text: &str) -> Option<Vec<(&str, &str, String)>> {
    let bytes = text.as_bytes();
    let mut pairs = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i == bytes.len() {
            return Some(pairs);
        }
        let start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() && bytes[i] != b'=' {
            i += 1;
        }
        let key = &text[start..i];
        i = skip_ws(i);
        if bytes.get(i) != Some(&b'=') {
            return None;
        }
        i = skip_ws(i + 1);
        let mut value = Vec::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i)? {
                    b'\'' => break,
                    b'\\' => {
                        value.push(*bytes.get(i + 1)?);
                        i += 2;
                    }
                    other => {
                        value.push(*other);
                        i += 1;
                    }
                }
            }
            i += 1;
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                if bytes[i] == b'\\' {
                    i += 1;
                    if let Some(next) = bytes.get(i) {
                        value.push(*next);
                    }
                } else {
                    value.push(bytes[i]);
                }
                i += 1;
            }
            if value.is_empty() {
                return None;
            }
        }
        let value = String::from_utf8(value).ok()?;
        pairs.push((&text[start..i.min(text.len())], key, value));
    }
}

/// Reads the TLS parameters taken off a PostgreSQL URL (the last of a repeated key wins).
#[cfg(feature = "postgres")]
fn pg_tls(params: Vec<(String, String)>) -> Result<PgTls, Error> {
    let mut mode = None;
    let mut require_ssl = false;
    let mut root_cert = None;
    let mut cert = None;
    let mut key = None;
    let mut sni = true;
    let mut versions = (12, 13);
    let version = |setting: &'static str, value: &str| match value {
        // rustls speaks TLS 1.2 and 1.3 only: an older minimum allows nothing more.
        "TLSv1" | "TLSv1.1" | "TLSv1.2" => Ok(12),
        "TLSv1.3" => Ok(13),
        "" if setting == "ssl_max_protocol_version" => Ok(13),
        _ => Err(bad(
            setting,
            format!("{value:?} is not one of TLSv1, TLSv1.1, TLSv1.2, TLSv1.3"),
        )),
    };
    for (name, value) in params {
        match name.as_str() {
            "sslmode" => {
                mode = Some(match value.as_str() {
                    "disable" => Mode::Disable,
                    // libpq's allow tries without TLS first, then with; prefer the other way.
                    "allow" | "prefer" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    _ => {
                        return Err(bad(
                            "sslmode",
                            format!(
                                "{value:?} is not one of disable, prefer, require, verify-ca, \
                                 verify-full"
                            ),
                        ))
                    }
                })
            }
            "requiressl" => require_ssl = value == "1",
            "sslrootcert" => root_cert = (value != "system").then_some(value),
            "sslcert" => cert = Some(value),
            "sslkey" => key = Some(value),
            "sslsni" => sni = value != "0",
            "sslcompression" => {}
            "ssl_min_protocol_version" => versions.0 = version("ssl_min_protocol_version", &value)?,
            "ssl_max_protocol_version" => versions.1 = version("ssl_max_protocol_version", &value)?,
            other => {
                return Err(bad(
                    "url",
                    format!(
                        "the libpq parameter {other} is not supported by leasehold (supported: \
                         sslmode, sslrootcert, sslcert, sslkey, sslsni, \
                         ssl_min_protocol_version, ssl_max_protocol_version){}",
                        if other == "sslpassword" {
                            "; decrypt the key instead (openssl pkey -in KEY -out PLAIN_KEY)"
                        } else {
                            ""
                        }
                    ),
                ))
            }
        }
    }
    if versions.0 > versions.1 {
        return Err(bad(
            "ssl_min_protocol_version",
            "it is above ssl_max_protocol_version",
        ));
    }
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => return Err(bad("sslkey", "sslcert is given without sslkey")),
        (None, Some(_)) => return Err(bad("sslcert", "sslkey is given without sslcert")),
    };
    let mode = mode.unwrap_or(if require_ssl {
        Mode::Require
    } else {
        Mode::Prefer
    });
    Ok(PgTls {
        mode,
        root_cert,
        identity,
        sni,
        versions,
    })
}

/// The TLS parameters of a MySQL URL.
#[cfg(feature = "mysql")]
#[derive(Clone, Debug)]
pub(crate) struct MysqlTls {
    /// `ssl-mode` or `require_ssl`; `None` when neither is given.
    pub mode: Option<Mode>,
    /// `ssl-ca`.
    pub ca: Option<String>,
    /// `ssl-cert` and `ssl-key`.
    pub identity: Option<(String, String)>,
    /// Whether the URL sets the driver's `prefer_socket` itself.
    pub prefer_socket_given: bool,
}

#[cfg(feature = "mysql")]
impl MysqlTls {
    /// The mode the connections use: as given; else `VERIFY_CA` with a CA file, `PREFERRED`
    /// without.
    pub(crate) fn effective_mode(&self) -> Mode {
        self.mode.unwrap_or(if self.ca.is_some() {
            Mode::VerifyCa
        } else {
            Mode::Prefer
        })
    }

    /// The CAs a verified connection trusts, for messages.
    #[cfg(feature = "mysql-tls")]
    pub(crate) fn trust(&self) -> String {
        match &self.ca {
            Some(path) => format!(
                "the CA certificates in ssl-ca {path} and the built-in Mozilla roots \
                 (webpki-roots)"
            ),
            None => "the built-in Mozilla roots (webpki-roots), used without ssl-ca".to_string(),
        }
    }
}

/// Splits the TLS parameters off a MySQL URL: the URL without them, for the driver, and their
/// values.
#[cfg(feature = "mysql")]
pub(crate) fn split_mysql(url: &str) -> Result<(String, MysqlTls), Error> {
    let mut tls = MysqlTls {
        mode: None,
        ca: None,
        identity: None,
        prefer_socket_given: false,
    };
    let Some(at) = url.find('?') else {
        return Ok((url.to_string(), tls));
    };
    let (head, rest) = url.split_at(at);
    let (query, fragment) = match rest.find('#') {
        Some(hash) => rest.split_at(hash),
        None => (rest, ""),
    };
    let mut kept = Vec::new();
    let mut ssl_mode = None;
    let mut require_ssl = None;
    let mut cert = None;
    let mut key = None;
    for pair in query[1..].split('&').filter(|pair| !pair.is_empty()) {
        let (raw_key, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = percent_decode(raw_key, true, "url")?
            .to_ascii_lowercase()
            .replace('-', "_");
        let value = || percent_decode(raw_value, true, "url");
        match name.as_str() {
            "ssl_mode" | "sslmode" => ssl_mode = Some(mysql_mode(&value()?)?),
            "require_ssl" => {
                require_ssl = Some(match value()?.to_ascii_lowercase().as_str() {
                    "true" | "1" => Mode::VerifyFull,
                    "false" | "0" => Mode::Disable,
                    other => {
                        return Err(bad(
                            "require_ssl",
                            format!("{other:?} is not true or false"),
                        ))
                    }
                })
            }
            "ssl_ca" => tls.ca = Some(value()?),
            "ssl_cert" => cert = Some(value()?),
            "ssl_key" => key = Some(value()?),
            _ => {
                tls.prefer_socket_given |= raw_key == "prefer_socket";
                kept.push(pair);
            }
        }
    }
    tls.mode = match (ssl_mode, require_ssl) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad(
                "ssl-mode",
                "the URL gives both ssl-mode and require_ssl, and they disagree: keep ssl-mode",
            ))
        }
        (mode, other) => mode.or(other),
    };
    tls.identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) => return Err(bad("ssl-key", "ssl-cert is given without ssl-key")),
        (None, Some(_)) => return Err(bad("ssl-cert", "ssl-key is given without ssl-cert")),
    };
    let mut rebuilt = head.to_string();
    if !kept.is_empty() {
        rebuilt.push('?');
        rebuilt.push_str(&kept.join("&"));
    }
    rebuilt.push_str(fragment);
    Ok((rebuilt, tls))
}

#[cfg(feature = "mysql")]
fn mysql_mode(value: &str) -> Result<Mode, Error> {
    Ok(
        match value.to_ascii_uppercase().replace('-', "_").as_str() {
            "DISABLED" | "DISABLE" => Mode::Disable,
            "PREFERRED" | "PREFER" => Mode::Prefer,
            "REQUIRED" | "REQUIRE" => Mode::Require,
            "VERIFY_CA" => Mode::VerifyCa,
            "VERIFY_IDENTITY" | "VERIFY_FULL" => Mode::VerifyFull,
            _ => {
                return Err(bad(
                    "ssl-mode",
                    format!(
                        "{value:?} is not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, \
                         VERIFY_IDENTITY"
                    ),
                ))
            }
        },
    )
}

/// The message for a mode that needs TLS in a build without it.
#[cfg(any(
    all(feature = "postgres", not(feature = "postgres-tls")),
    all(feature = "mysql", not(feature = "mysql-tls"))
))]
pub(crate) fn feature_missing(setting: &'static str, mode: &str, feature: &str) -> Error {
    bad(
        setting,
        format!(
            "{setting}={mode} needs TLS, which this build of leasehold lacks: enable its \
             feature `{feature}`"
        ),
    )
}

#[cfg(any(feature = "postgres-tls", feature = "mysql-tls"))]
pub(crate) use with_rustls::*;

/// What needs rustls itself.
#[cfg(any(feature = "postgres-tls", feature = "mysql-tls"))]
mod with_rustls {
    use super::{bad, Words};
    use crate::error::{Error, TlsProblem};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    use rustls::CertificateError;

    /// The rustls error somewhere in `error`'s chain of sources (looking inside I/O errors,
    /// whose `source()` skips the error they wrap).
    pub(crate) fn find_rustls<'a>(
        error: &'a (dyn std::error::Error + 'static),
    ) -> Option<&'a rustls::Error> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(found) = error.downcast_ref::<rustls::Error>() {
                return Some(found);
            }
            if let Some(inner) = error
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                if let Some(found) = find_rustls(inner) {
                    return Some(found);
                }
            }
            current = error.source();
        }
        None
    }

    /// What a failed handshake means and what to change; `host` is the name the URL connects
    /// to, `trust` says which CAs were trusted.
    pub(crate) fn explain(
        error: &rustls::Error,
        host: &str,
        trust: &str,
        words: &Words,
    ) -> (TlsProblem, String) {
        let Words {
            verify_ca,
            require,
            ca,
            client,
        } = words;
        match error {
            rustls::Error::InvalidCertificate(certificate) => match certificate {
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    let names = match certificate {
                        CertificateError::NotValidForNameContext { presented, .. } => {
                            // rustls spells them `DnsName("db.example")`, `IpAddress(…)`.
                            let bare = presented.iter().map(|name| {
                                name.split_once("(\"")
                                    .and_then(|(_, rest)| rest.strip_suffix("\")"))
                                    .unwrap_or(name)
                            });
                            format!(" (it names {})", bare.collect::<Vec<_>>().join(", "))
                        }
                        _ => String::new(),
                    };
                    (
                        TlsProblem::HostName,
                        format!(
                            "the server's certificate is signed by a trusted CA but is not \
                             valid for the host name {host:?}{names}: connect to a name the \
                             certificate lists, or use {verify_ca} to check only the CA"
                        ),
                    )
                }
                CertificateError::UnknownIssuer => (
                    TlsProblem::UnknownIssuer,
                    format!(
                        "the server's certificate is not signed by a CA this client trusts \
                         ({trust}): set {ca} to the file of the CA that signed it (or use \
                         {require} to encrypt without verifying the server)"
                    ),
                ),
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => (
                    TlsProblem::InvalidCertificate,
                    format!(
                        "the server's certificate is outside its validity period ({error}): \
                         renew it, or check the clocks of both machines"
                    ),
                ),
                _ => (
                    TlsProblem::InvalidCertificate,
                    format!("the server's certificate was rejected: {error}"),
                ),
            },
            rustls::Error::AlertReceived(alert) => (
                TlsProblem::Handshake,
                format!(
                    "the server ended the TLS handshake ({alert:?}): if it asks for a client \
                     certificate, set {client} to one it trusts; otherwise compare the TLS \
                     versions and ciphers it allows (this client: TLS 1.2 and 1.3)"
                ),
            ),
            other => (
                TlsProblem::Handshake,
                format!("the TLS handshake failed: {other}"),
            ),
        }
    }

    /// The certificates of a PEM file (a DER file is taken as one certificate).
    pub(crate) fn load_certificates(
        setting: &'static str,
        path: &str,
    ) -> Result<Vec<CertificateDer<'static>>, Error> {
        let data =
            std::fs::read(path).map_err(|e| bad(setting, format!("cannot read {path}: {e}")))?;
        let certificates = CertificateDer::pem_slice_iter(&data)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                bad(
                    setting,
                    format!("{path} is not a PEM certificate file: {e}"),
                )
            })?;
        if !certificates.is_empty() {
            return Ok(certificates);
        }
        if data.first() == Some(&0x30) {
            return Ok(vec![CertificateDer::from(data)]);
        }
        Err(bad(
            setting,
            format!("{path} holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)"),
        ))
    }
}

#[cfg(feature = "postgres-tls")]
pub(crate) use postgres_rustls::connector;

/// The rustls client configuration of PostgreSQL connections.
#[cfg(feature = "postgres-tls")]
mod postgres_rustls {
    use super::{bad, load_certificates, Mode, PgTls};
    use crate::error::Error;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
    use rustls::{SignatureScheme, SupportedProtocolVersion};
    use std::sync::Arc;
    use tokio_postgres_rustls::MakeRustlsConnect;

    /// The connector every connection of one registry uses (see the module docs for what each
    /// mode checks).
    pub(crate) fn connector(tls: &PgTls) -> Result<MakeRustlsConnect, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: Vec<&'static SupportedProtocolVersion> =
            [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
                .into_iter()
                .filter(|(v, _)| (tls.versions.0..=tls.versions.1).contains(v))
                .map(|(_, version)| version)
                .collect();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| bad("ssl_min_protocol_version", e.to_string()))?;
        let verify_chain = match tls.mode {
            Mode::VerifyCa | Mode::VerifyFull => true,
            // libpq: require with a CA file is verify-ca.
            Mode::Require => tls.root_cert.is_some(),
            Mode::Disable | Mode::Prefer => false,
        };
        let verifier: Arc<dyn ServerCertVerifier> = if verify_chain {
            let mut roots = RootCertStore::empty();
            match &tls.root_cert {
                Some(path) => {
                    for certificate in load_certificates("sslrootcert", path)? {
                        roots.add(certificate).map_err(|e| {
                            bad("sslrootcert", format!("{path} holds an unusable CA: {e}"))
                        })?;
                    }
                }
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            let full = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad("sslrootcert", e.to_string()))?;
            if tls.mode == Mode::VerifyFull {
                full
            } else {
                Arc::new(ChainOnly(full))
            }
        } else {
            Arc::new(Unverified(provider))
        };
        let builder = builder
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &tls.identity {
            Some((cert, key_path)) => {
                let chain = load_certificates("sslcert", cert)?;
                let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
                    bad(
                        "sslkey",
                        format!(
                            "cannot read a private key from {key_path} ({e}): it must be an \
                             unencrypted PEM key (PKCS#8, PKCS#1 or SEC1)"
                        ),
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("sslkey", format!("{key_path} does not fit {cert}: {e}")))?
            }
            None => builder.with_no_client_auth(),
        };
        config.enable_sni = tls.sni;
        Ok(MakeRustlsConnect::new(config))
    }

    /// `verify-ca`: the chain up to a trusted CA, whatever names the certificate holds.
    #[derive(Debug)]
    struct ChainOnly(Arc<WebPkiServerVerifier>);

    impl ServerCertVerifier for ChainOnly {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            // The name is checked after the chain: a name error means the chain passed.
            match self.0.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }

    /// `prefer` and `require` (without a CA file): encrypted, the certificate not checked (the
    /// handshake's signatures still are, against the certificate presented).
    #[derive(Debug)]
    struct Unverified(Arc<CryptoProvider>);

    impl ServerCertVerifier for Unverified {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_url_parameters_are_split_off() {
        let (rest, tls) = split_postgres(
            "postgres://u:p%40ss@db.example:5432/test?application_name=x&sslmode=verify-full\
             &sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u:p%40ss@db.example:5432/test?application_name=x&connect_timeout=3"
        );
        assert_eq!(tls.mode, Mode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some("/etc/ca.pem"));

        let (rest, tls) = split_postgres("postgresql://h/db?sslmode=verify-ca").unwrap();
        assert_eq!(rest, "postgresql://h/db");
        assert_eq!(tls.mode, Mode::VerifyCa);

        let (rest, tls) = split_postgres("postgres://h/db").unwrap();
        assert_eq!(rest, "postgres://h/db");
        assert_eq!(tls.mode, Mode::Prefer);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_key_value_parameters_are_split_off() {
        let (rest, tls) = split_postgres(
            "host=localhost sslmode = verify-full user=u sslcert='/a b/c.crt' sslkey=/k\\ ey \
             password='it\\'s'",
        )
        .unwrap();
        assert_eq!(rest, "host=localhost user=u password='it\\'s'");
        assert_eq!(tls.mode, Mode::VerifyFull);
        assert_eq!(
            tls.identity,
            Some(("/a b/c.crt".to_string(), "/k ey".to_string()))
        );
        // A string tokio-postgres cannot parse is left whole, for it to report.
        let (rest, _) = split_postgres("host=h sslmode").unwrap();
        assert_eq!(rest, "host=h sslmode");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_unsupported_and_bad_values_are_named() {
        let e = split_postgres("postgres://h/db?sslmode=verify").unwrap_err();
        assert!(e.to_string().contains("sslmode"), "{e}");
        let e = split_postgres("host=h sslpassword=x").unwrap_err();
        assert!(e.to_string().contains("sslpassword"), "{e}");
        let e = split_postgres("host=h sslcert=/c").unwrap_err();
        assert!(e.to_string().contains("sslkey"), "{e}");
        let (_, tls) = split_postgres("host=h requiressl=1").unwrap();
        assert_eq!(tls.mode, Mode::Require);
        let (rest, _) = split_postgres("host=h sslnegotiation=postgres").unwrap();
        assert_eq!(rest, "host=h sslnegotiation=postgres");
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_url_parameters_are_split_off() {
        let (rest, tls) = split_mysql(
            "mysql://u@h:3306/test?ssl-mode=verify_identity&stmt_cache_size=8&ssl-ca=%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "mysql://u@h:3306/test?stmt_cache_size=8");
        assert_eq!(tls.mode, Some(Mode::VerifyFull));
        assert_eq!(tls.ca.as_deref(), Some("/ca.pem"));

        let (_, tls) = split_mysql("mysql://h/test?ssl_ca=/ca.pem").unwrap();
        assert_eq!(tls.effective_mode(), Mode::VerifyCa);
        let (_, tls) = split_mysql("mysql://h/test?require_ssl=true").unwrap();
        assert_eq!(tls.effective_mode(), Mode::VerifyFull);
        let (_, tls) = split_mysql("mysql://h/test?prefer_socket=false").unwrap();
        assert!(tls.prefer_socket_given);
        assert_eq!(tls.effective_mode(), Mode::Prefer);
        let e = split_mysql("mysql://h/test?sslMode=sometimes").unwrap_err();
        assert!(e.to_string().contains("ssl-mode"), "{e}");
    }
}
