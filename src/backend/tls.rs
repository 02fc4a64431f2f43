//! TLS settings and errors that PostgreSQL and MySQL share: the [`Mode`] a connection asks
//! for, decoding URL parameters, what a failed handshake means for the user, and reading
//! certificate files.
//!
//! Each database reads its own URL parameters and builds its own client configuration next to
//! its driver: [`crate::backend::postgres`]'s `tls.rs` (`sslmode`, `sslrootcert`, …, and the
//! rustls configuration of `tokio-postgres`) and [`crate::backend::mysql`]'s `tls.rs`
//! (`ssl-mode`, `ssl-ca`, …, handed to the driver's rustls support). Both import this module;
//! it imports neither.
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

pub(crate) fn bad(setting: &'static str, reason: impl Into<String>) -> Error {
    Error::setting(setting, reason)
}

/// `%XX` escapes decoded (and `+` as a space when `plus_is_space`, as in a URL's query);
/// anything else is kept as it is.
pub(crate) fn percent_decode(
    text: &str,
    plus_is_space: bool,
    setting: &'static str,
) -> Result<String, Error> {
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

/// Hints name these parameters.
#[cfg(any(feature = "postgres-tls", feature = "mysql-tls"))]
pub(crate) struct Words {
    pub verify_ca: &'static str,
    pub require: &'static str,
    pub ca: &'static str,
    pub client: &'static str,
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
