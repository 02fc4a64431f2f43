//! PostgreSQL's TLS: the URL's settings, the rustls configuration of every connection, and
//! what a refused connection says about TLS. The settings and messages both databases share
//! are in [`crate::backend::tls`].
//!
//! # Settings
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
//! # Errors
//!
//! [`tls_problem`] reads a failed first connection: a rustls error (explained by the shared
//! [`crate::backend::tls::explain`] with this database's parameter names), a server that
//! does not offer TLS, or a `pg_hba.conf` that admits the user only with (or without) TLS.

#[cfg(feature = "postgres-tls")]
use crate::backend::tls::Words;
use crate::backend::tls::{bad, percent_decode, Mode};
use crate::error::Error;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::Config;

/// What encrypts connections: one rustls configuration per registry with feature
/// `postgres-tls`, nothing without.
#[cfg(feature = "postgres-tls")]
pub(super) type Tls = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "postgres-tls"))]
pub(super) type Tls = tokio_postgres::NoTls;

/// The TLS parameters of a PostgreSQL URL.
#[cfg_attr(not(feature = "postgres-tls"), allow(dead_code))]
#[derive(Clone, Debug)]
pub(super) struct PgTls {
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
    pub(super) fn trust(&self) -> String {
        match &self.root_cert {
            Some(path) => format!("the CA certificates in sslrootcert {path}"),
            None => {
                "the built-in Mozilla roots (webpki-roots), used without sslrootcert".to_string()
            }
        }
    }
}

#[cfg(feature = "postgres-tls")]
const PG_WORDS: Words = Words {
    verify_ca: "sslmode=verify-ca",
    require: "sslmode=require",
    ca: "sslrootcert",
    client: "sslcert and sslkey",
};

/// Splits the TLS parameters off a PostgreSQL connection string (URL or `key=value` form):
/// the string without them, for `tokio-postgres`, and their values. A string that does not
/// parse is returned whole, for `tokio-postgres` to report.
pub(super) fn split_postgres(url: &str) -> Result<(String, PgTls), Error> {
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
fn is_pg_tls_key(key: &str) -> bool {
    (key.starts_with("ssl") && key != "sslnegotiation") || key == "requiressl"
}

/// The pairs of a `key=value` connection string, each with its text as written; `None` when it
/// does not parse (as `tokio-postgres` parses it: values may be quoted with `'`, and `\`
/// escapes the next character).
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

/// The connector of a registry's connections, and `config`'s `sslmode` as `tokio-postgres`
/// knows it (the connector does the verification); a mode that needs TLS in a build without it
/// is refused.
pub(super) fn connector(settings: &PgTls, config: &mut Config) -> Result<Tls, Error> {
    // The mode as tokio-postgres knows it; the connector does the verification.
    config.ssl_mode(match settings.mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        _ => SslMode::Require,
    });
    // Unix sockets never use TLS (libpq ignores sslmode for them).
    #[cfg(unix)]
    if !config.get_hosts().is_empty()
        && config.get_hostaddrs().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|host| matches!(host, Host::Unix(_)))
    {
        config.ssl_mode(SslMode::Disable);
    }
    #[cfg(feature = "postgres-tls")]
    let tls = with_rustls::rustls_connector(settings)?;
    #[cfg(not(feature = "postgres-tls"))]
    let tls = match settings.mode {
        mode if mode.requires_tls() && config.get_ssl_mode() != SslMode::Disable => {
            let name = match mode {
                Mode::Require => "require",
                Mode::VerifyCa => "verify-ca",
                _ => "verify-full",
            };
            return Err(crate::backend::tls::feature_missing(
                "sslmode",
                name,
                "postgres-tls",
            ));
        }
        _ => tokio_postgres::NoTls,
    };
    Ok(tls)
}

/// What a failed connection attempt says about TLS, if its cause is TLS: the certificate, the
/// handshake, a server without TLS, or a `pg_hba.conf` that admits this user only over TLS.
pub(super) fn tls_problem(
    error: &tokio_postgres::Error,
    config: &Config,
    settings: &PgTls,
) -> Option<(crate::TlsProblem, String)> {
    use crate::TlsProblem;
    #[cfg(feature = "postgres-tls")]
    if let Some(cause) = crate::backend::tls::find_rustls(error) {
        let host = config
            .get_hosts()
            .iter()
            .find_map(|host| match host {
                Host::Tcp(name) => Some(name.as_str()),
                #[cfg(unix)]
                Host::Unix(_) => None,
            })
            .unwrap_or("");
        return Some(crate::backend::tls::explain(
            cause,
            host,
            &settings.trust(),
            &PG_WORDS,
        ));
    }
    let _ = (config, settings);
    let text = error.to_string();
    if text.contains("server does not support TLS") {
        return Some((
            TlsProblem::NotOffered,
            "the URL's sslmode requires TLS but the server does not offer it: turn ssl on in \
             the server, or lower sslmode to prefer or disable"
                .to_string(),
        ));
    }
    let db = error.as_db_error()?;
    let message = db.message();
    if db.code().code() != "28000" {
        return None;
    }
    // pg_hba.conf's verdict names the encryption of the refused connection.
    if message.contains("no encryption") || message.ends_with("SSL off") {
        let fix = if cfg!(feature = "postgres-tls") {
            "connect with sslmode=verify-full (and sslrootcert naming the server's CA), or \
             sslmode=require to encrypt without verifying"
        } else {
            "this build of leasehold has no TLS: enable its feature `postgres-tls` and connect \
             with sslmode=verify-full"
        };
        return Some((
            TlsProblem::Required,
            format!(
                "the server admits this user only over TLS and the connection was not \
                 encrypted ({message}): {fix}"
            ),
        ));
    }
    if message.contains("client certificate") || message.contains("certificate authentication") {
        return Some((
            TlsProblem::Handshake,
            format!(
                "the server wants a client certificate for this user ({message}): set sslcert \
                 and sslkey to a certificate signed by a CA the server trusts (ssl_ca_file), \
                 whose common name is the user name"
            ),
        ));
    }
    None
}

/// The rustls client configuration of PostgreSQL connections.
#[cfg(feature = "postgres-tls")]
mod with_rustls {
    use super::PgTls;
    use crate::backend::tls::{bad, load_certificates, Mode};
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
    pub(super) fn rustls_connector(tls: &PgTls) -> Result<MakeRustlsConnect, Error> {
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
}
