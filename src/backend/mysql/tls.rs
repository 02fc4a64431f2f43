//! MySQL's and MariaDB's TLS: the URL's settings, the driver's TLS options built from them,
//! and what a refused connection says about TLS. The settings and messages both databases
//! share are in [`crate::backend::tls`].
//!
//! # Settings
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
//! [`tls_problem`] reads a failed first connection: a rustls error (explained by the shared
//! [`crate::backend::tls::explain`] with this database's parameter names), a server that
//! does not offer TLS, or an account that requires TLS met on a connection without it.

#[cfg(feature = "mysql-tls")]
use crate::backend::tls::Words;
use crate::backend::tls::{bad, percent_decode, Mode};
use crate::error::Error;
use mysql::{Opts, OptsBuilder, SslOpts};

/// The TLS parameters of a MySQL URL.
#[derive(Clone, Debug)]
pub(super) struct MysqlTls {
    /// `ssl-mode` or `require_ssl`; `None` when neither is given.
    pub mode: Option<Mode>,
    /// `ssl-ca`.
    pub ca: Option<String>,
    /// `ssl-cert` and `ssl-key`.
    pub identity: Option<(String, String)>,
    /// Whether the URL sets the driver's `prefer_socket` itself.
    pub prefer_socket_given: bool,
}

impl MysqlTls {
    /// The mode the connections use: as given; else `VERIFY_CA` with a CA file, `PREFERRED`
    /// without.
    pub(super) fn effective_mode(&self) -> Mode {
        self.mode.unwrap_or(if self.ca.is_some() {
            Mode::VerifyCa
        } else {
            Mode::Prefer
        })
    }

    /// The CAs a verified connection trusts, for messages.
    #[cfg(feature = "mysql-tls")]
    pub(super) fn trust(&self) -> String {
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
pub(super) fn split_mysql(url: &str) -> Result<(String, MysqlTls), Error> {
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

#[cfg(feature = "mysql-tls")]
const MYSQL_WORDS: Words = Words {
    verify_ca: "ssl-mode=VERIFY_CA",
    require: "ssl-mode=REQUIRED",
    ca: "ssl-ca",
    client: "ssl-cert and ssl-key",
};

/// What a failed connection attempt says about TLS, if its cause is TLS: the certificate, the
/// handshake, a server without TLS, or (found by trying again with TLS) an account that
/// requires TLS refused on a connection without it.
pub(super) fn tls_problem(
    error: &mysql::Error,
    opts: &Opts,
    settings: &MysqlTls,
) -> Option<(crate::TlsProblem, String)> {
    use crate::TlsProblem;
    if let mysql::Error::DriverError(mysql::DriverError::TlsNotSupported) = error {
        return Some((
            TlsProblem::NotOffered,
            "the URL's ssl-mode requires TLS but the server does not offer it: configure \
             ssl_cert and ssl_key in the server, or lower ssl-mode to PREFERRED or DISABLED"
                .to_string(),
        ));
    }
    #[cfg(feature = "mysql-tls")]
    {
        let cause = match error {
            mysql::Error::IoError(io) => crate::backend::tls::find_rustls(io),
            mysql::Error::CodecError(codec) => crate::backend::tls::find_rustls(codec),
            mysql::Error::TlsError(tls) => crate::backend::tls::find_rustls(tls),
            _ => None,
        };
        if let Some(cause) = cause {
            return Some(crate::backend::tls::explain(
                cause,
                &opts.get_ip_or_hostname(),
                &settings.trust(),
                &MYSQL_WORDS,
            ));
        }
        // MySQL answers an account that requires TLS, met without it, as it answers a wrong
        // password: find out which by trying once with TLS.
        let refused = match error {
            mysql::Error::MySqlError(e) if e.code == 1045 => Some(&e.message),
            _ => None,
        };
        if let Some(message) =
            refused.filter(|_| opts.get_ssl_opts().is_none() && opts.get_socket().is_none())
        {
            let encrypted = OptsBuilder::from_opts(opts.clone())
                .ssl_opts(SslOpts::default().with_danger_accept_invalid_certs(true))
                .prefer_socket(false);
            if mysql::Conn::new(encrypted).is_ok() {
                return Some((
                    TlsProblem::Required,
                    format!(
                        "the server admits this account only over TLS (REQUIRE SSL) and the \
                         URL turned TLS off ({message}): connect with ssl-mode=VERIFY_IDENTITY \
                         and ssl-ca naming the server's CA, or ssl-mode=REQUIRED to encrypt \
                         without verifying"
                    ),
                ));
            }
        }
    }
    let _ = (opts, settings);
    None
}

/// `opts` with the URL's TLS settings applied (see the module docs), and whether a server that
/// does not offer TLS may be connected to without it.
pub(super) fn with_tls(opts: Opts, settings: &MysqlTls) -> crate::Result<(Opts, bool)> {
    // Without a mode of ours, the driver's own TLS parameters (root_cert_path, …) decide.
    if settings.mode.is_none() && settings.ca.is_none() && opts.get_ssl_opts().is_some() {
        return Ok((opts, false));
    }
    let mode = settings.effective_mode();
    let builder = OptsBuilder::from_opts(opts);
    #[cfg(not(feature = "mysql-tls"))]
    {
        if mode.requires_tls() {
            let name = match mode {
                Mode::Require => "REQUIRED",
                Mode::VerifyCa => "VERIFY_CA",
                _ => "VERIFY_IDENTITY",
            };
            return Err(crate::backend::tls::feature_missing(
                "ssl-mode",
                name,
                "mysql-tls",
            ));
        }
        // PREFERRED in a build without TLS: without.
        Ok((builder.ssl_opts(None::<SslOpts>).into(), false))
    }
    #[cfg(feature = "mysql-tls")]
    {
        use crate::backend::tls::load_certificates;
        use std::path::PathBuf;
        if mode == Mode::Disable {
            return Ok((builder.ssl_opts(None::<SslOpts>).into(), false));
        }
        let mut ssl = match mode {
            Mode::Prefer | Mode::Require => {
                SslOpts::default().with_danger_accept_invalid_certs(true)
            }
            Mode::VerifyCa => SslOpts::default().with_danger_skip_domain_validation(true),
            Mode::VerifyFull | Mode::Disable => SslOpts::default(),
        };
        if let Some(ca) = &settings.ca {
            // Read now: the driver reads it at every connection, and a bad file would only
            // show as failed connections.
            load_certificates("ssl-ca", ca)?;
            if matches!(mode, Mode::VerifyCa | Mode::VerifyFull) {
                ssl = ssl.with_root_cert_path(Some(PathBuf::from(ca)));
            }
        }
        if let Some((cert, key)) = &settings.identity {
            load_certificates("ssl-cert", cert)?;
            std::fs::File::open(key)
                .map_err(|e| Error::setting("ssl-key", format!("cannot read {key}: {e}")))?;
            ssl = ssl.with_client_identity(Some(mysql::ClientIdentity::new(
                PathBuf::from(cert),
                PathBuf::from(key),
            )));
        }
        let mut builder = builder.ssl_opts(ssl);
        // A verified or required TLS connection does not turn into a Unix-socket one.
        if mode.requires_tls() && !settings.prefer_socket_given {
            builder = builder.prefer_socket(false);
        }
        Ok((builder.into(), mode == Mode::Prefer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
