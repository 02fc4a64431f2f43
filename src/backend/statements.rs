//! The statements a registry runs and their parameters: the three lease statements (defaults
//! or the user's replacements, checked at build), the parameters every statement binds, the
//! batch renewal's first parameter, and what a connection keeps per statement text.

use super::{Backend, Path, SqlStore};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::time::Instant;

/// The three statements a registry runs, with its table name spliced in (see
/// [`LockRegistry::statements`](crate::LockRegistry::statements)): the backend's defaults, or
/// the replacements given to the builder ([`CustomSql`](crate::CustomSql)) — start
/// from the defaults when writing a replacement.
///
/// Every statement takes the same parameters (`$1` on PostgreSQL, `?1` on SQLite; MySQL names
/// them `:lock_key`, `:region`, `:client_id`, `:ttl_micros`, `:token`), so a replacement binds
/// the same way on every database; it may leave some out:
///
/// | # | value | type |
/// |---|-------|------|
/// | 1 | `LOCK_KEY` (the key's UUID, see [`lock_key_for`](crate::lock_key_for)) | text |
/// | 2 | `REGION` | text |
/// | 3 | `CLIENT_ID` of this registry | text |
/// | 4 | time-to-live in microseconds (release: the row's reservation for pollers, zero except for a release that ends a turn, which sets `CREATED_DATE` to now + the reservation; see [`Tuning`](crate::Tuning)) | integer |
/// | 5 | fencing token of the lease | integer |
/// | 6 | the lock's name (acquire only; stored in `LOCK_NAME` where the table has it) | text |
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Statements {
    /// Takes the lock if it is free or expired; returns the fencing token, or no row.
    pub acquire: String,
    /// Extends a held lease; one affected row means renewed.
    pub renew: String,
    /// Frees a held lease; one affected row means released.
    pub release: String,
}

/// User replacements for some of the [`Statements`]; `None` keeps the backend's default.
#[derive(Debug, Clone, Default)]
pub(crate) struct CustomQueries {
    pub acquire: Option<String>,
    pub renew: Option<String>,
    pub release: Option<String>,
}

/// The parameters of every statement (see the module docs for their numbers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params<'a> {
    pub lock_key: &'a str,
    pub region: &'a str,
    pub client_id: &'a str,
    pub ttl_micros: i64,
    pub token: i64,
    /// The lock's name (the user's key), parameter 6; empty for all but acquire.
    pub name: &'a str,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Params<'static> {
    /// Every parameter empty or zero: the start of a statement that binds one or two of them.
    pub(crate) const EMPTY: Params<'static> = Params {
        lock_key: "",
        region: "",
        client_id: "",
        ttl_micros: 0,
        token: 0,
        name: "",
    };
}

/// [`Params`] owned, so that an attempt can run on a statement thread.
#[derive(Debug, Clone)]
pub(crate) struct OwnedParams {
    /// Shared with the caller where it holds the key as an `Arc` (the lock's acquire and
    /// release): no allocation per statement.
    pub(super) lock_key: Arc<str>,
    pub(super) region: Arc<str>,
    pub(super) client_id: Arc<str>,
    pub(super) ttl_micros: i64,
    pub(super) token: i64,
    pub(super) name: Arc<str>,
}

impl OwnedParams {
    pub(super) fn borrowed(&self) -> Params<'_> {
        Params {
            lock_key: &self.lock_key,
            region: &self.region,
            client_id: &self.client_id,
            ttl_micros: self.ttl_micros,
            token: self.token,
            name: &self.name,
        }
    }
}

/// What one connection keeps per statement text it has run (a prepared statement, a rewrite),
/// found again by that text.
///
/// A connection only ever runs a handful of texts — the three lease statements or their
/// replacements, and the clock query — so a scan that compares lengths first and then bytes
/// beats hashing a text of several hundred bytes on every call.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) struct PerStatement<T> {
    entries: Vec<(Box<str>, T)>,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<T> PerStatement<T> {
    pub fn new() -> Self {
        PerStatement {
            entries: Vec::new(),
        }
    }

    /// What was kept for `sql`.
    pub fn get(&self, sql: &str) -> Option<&T> {
        self.entries
            .iter()
            .find(|(text, _)| &**text == sql)
            .map(|(_, kept)| kept)
    }

    /// What was kept for `sql`, to change.
    #[cfg(feature = "mysql")]
    pub fn get_mut(&mut self, sql: &str) -> Option<&mut T> {
        self.entries
            .iter_mut()
            .find(|(text, _)| &**text == sql)
            .map(|(_, kept)| kept)
    }

    /// Keeps `value` for `sql`, which must not be kept yet; returns it.
    pub fn insert(&mut self, sql: &str, value: T) -> &T {
        debug_assert!(self.get(sql).is_none(), "kept twice: {sql}");
        self.entries.push((sql.into(), value));
        &self.entries.last().expect("just pushed").1
    }
}

/// `[[LOCK_KEY, token], …]`, the first parameter of a batch renewal. Keys are `LOCK_KEY`s (UUID
/// text), but are escaped anyway.
pub(crate) fn pairs_json<'a>(pairs: impl Iterator<Item = (&'a str, i64)>) -> String {
    let mut json = String::from("[");
    for (index, (key, token)) in pairs.enumerate() {
        if index > 0 {
            json.push(',');
        }
        json.push_str("[\"");
        for c in key.chars() {
            match c {
                '"' => json.push_str("\\\""),
                '\\' => json.push_str("\\\\"),
                c if (c as u32) < 0x20 => json.push_str(&format!("\\u{:04x}", c as u32)),
                c => json.push(c),
            }
        }
        json.push_str(&format!("\",{token}]"));
    }
    json.push(']');
    json
}

impl<B: Backend> SqlStore<B> {
    /// Checks the user's replacement statements against the database: parameters used, and
    /// acquire's result shape.
    pub(super) fn check_custom(&self, custom: &CustomQueries, deadline: Instant) -> Result<()> {
        // Renew and release count affected (or returned) rows, so only acquire's result shape
        // is fixed: the fencing token first (a second column, if any, is read past).
        let checks = [
            ("acquire", &custom.acquire, Some(1..=2usize)),
            ("renew", &custom.renew, None),
            ("release", &custom.release, None),
        ];
        for (statement, sql, result_columns) in checks {
            let Some(sql) = sql else { continue };
            let sql = sql.clone();
            let described = self.run(
                Path::Main,
                "check custom statement",
                deadline,
                move |conn| Ok(B::describe(conn, &sql)),
            )?;
            let (params, columns) = described.map_err(|f| Error::InvalidStatement {
                statement,
                reason: f.source.to_string(),
            })?;
            if params > 6
                || result_columns
                    .as_ref()
                    .is_some_and(|expected| !expected.contains(&columns))
            {
                return Err(Error::InvalidStatement {
                    statement,
                    reason: format!(
                        "it takes {params} parameters and returns {columns} columns; use \
                         parameters 1-6 as documented{}",
                        if statement == "acquire" {
                            " and return the fencing token as the first column (a second \
                             column, if any, is ignored)"
                        } else {
                            ""
                        }
                    ),
                });
            }
        }
        Ok(())
    }
}

#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use super::PerStatement;

    #[test]
    fn per_statement_finds_each_text_and_only_it() {
        let mut kept = PerStatement::new();
        assert!(kept.get("SELECT 1").is_none());
        assert_eq!(*kept.insert("SELECT 1", 1), 1);
        // Same length, different bytes; a prefix; a longer text.
        assert_eq!(*kept.insert("SELECT 2", 2), 2);
        assert_eq!(*kept.insert("SELECT 1 + 1", 3), 3);
        assert_eq!(kept.get("SELECT 1"), Some(&1));
        assert_eq!(kept.get("SELECT 2"), Some(&2));
        assert_eq!(kept.get("SELECT 1 + 1"), Some(&3));
        assert!(kept.get("SELECT ").is_none());
        assert!(kept.get("select 1").is_none());
    }
}
