//! How a failed statement is classified, so that the shared retry loop knows whether to retry on
//! the same connection, on a new one, or not at all.

use crate::error::DatabaseError;

/// How the shared retry loop treats a failed statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// Worth retrying on the same connection: busy, deadlock victim, serialization failure.
    Transient,
    /// The connection is unusable (reset, server gone): discard it and retry on a new one.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Broken,
    /// Retrying cannot help: syntax, missing table, permissions.
    Fatal,
}

/// A backend's error, already classified, with a hint for the user.
#[derive(Debug)]
pub(crate) struct Failure {
    pub kind: FailureKind,
    pub hint: String,
    pub source: DatabaseError,
}

impl Failure {
    pub fn new(
        kind: FailureKind,
        hint: impl Into<String>,
        source: impl Into<DatabaseError>,
    ) -> Self {
        Failure {
            kind,
            hint: hint.into(),
            source: source.into(),
        }
    }
}

/// What the fail point `backend::renew_sent` returns when told to `return`: a transient failure.
#[cfg(feature = "failpoints")]
pub(crate) fn injected_failure() -> Failure {
    Failure::new(
        FailureKind::Transient,
        "injected by a fail point",
        "fail point backend::renew_sent",
    )
}
