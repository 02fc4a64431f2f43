//! From a user's key to the `LOCK_KEY` column, exactly as Spring Integration does it.
//!
//! Spring's `JdbcLockRegistry` stores the key itself when it is a UUID in canonical
//! 8-4-4-4-12 form (lower-cased, as Java prints it), and `UUID.nameUUIDFromBytes(key.getBytes(
//! UTF_8))` otherwise: the MD5 of the bytes with the version set to 3 and the IETF variant.
//! (Spring before 6.x also took Java's lenient forms such as `1-2-3-4-5` as UUIDs; current
//! Spring hashes them, and so does this crate.) Doing the same here means a Rust
//! service and a Spring service that name a lock alike exclude each other on one table.

use crate::error::{Error, Result};
use md5::{Digest, Md5};
use uuid::Uuid;

/// The longest key accepted, in UTF-8 bytes. Keys are hashed, so the limit only bounds the
/// memory a handle and its cache entry use; it is generous for names and paths.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a user's key: any UTF-8 string of 1 to [`MAX_KEY_BYTES`] bytes, NUL included.
pub(crate) fn validate_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidKey {
            reason: "the key is empty; use a non-empty name such as \"nightly-report\"".into(),
        });
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidKey {
            reason: format!(
                "the key is {} bytes long; the limit is {MAX_KEY_BYTES} bytes (hash long keys \
                 yourself if you need them)",
                key.len()
            ),
        });
    }
    Ok(())
}

/// The `LOCK_KEY` value Spring Integration stores for `key`, as a lower-case UUID string.
///
/// ```
/// assert_eq!(leasehold::lock_key_for("foo"), "acbd18db-4cc2-385c-adef-654fccc4a4d8");
/// ```
pub fn lock_key_for(key: &str) -> String {
    canonical_uuid(key)
        .unwrap_or_else(|| name_uuid_from_bytes(key.as_bytes()))
        .hyphenated()
        .to_string()
}

/// Java's `UUID.nameUUIDFromBytes`: MD5, then version 3 and the IETF variant.
fn name_uuid_from_bytes(bytes: &[u8]) -> Uuid {
    let digest: [u8; 16] = Md5::digest(bytes).into();
    uuid::Builder::from_md5_bytes(digest).into_uuid()
}

/// The key as a UUID when it is written in the canonical 8-4-4-4-12 hexadecimal form (either
/// case), the only form Spring Integration (since 6.x) takes as a UUID rather than hashing.
fn canonical_uuid(text: &str) -> Option<Uuid> {
    let bytes = text.as_bytes();
    let canonical = bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    canonical.then(|| Uuid::parse_str(text).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by Java 17's `UUID.fromString`/`UUID.nameUUIDFromBytes`, chosen as
    /// Spring Integration's `UUIDConverter` chooses (canonical form only).
    const JAVA_VECTORS: &[(&str, &str)] = &[
        ("foo", "acbd18db-4cc2-385c-adef-654fccc4a4d8"),
        ("", "d41d8cd9-8f00-3204-a980-0998ecf8427e"),
        ("ключ", "c3657b66-c60a-3072-92aa-e11f07b04ae7"),
        ("日本語🔒", "7b1638b9-0495-35e8-8328-efca7b9a2858"),
        ("a\0b", "70350f60-27bc-3371-bf6b-76473084309b"),
        ("1-2-3-4-5", "601bcbd1-2379-33a0-bbcb-ad773954109d"),
        (
            "ACBD18DB-4CC2-385C-ADEF-654FCCC4A4D8",
            "acbd18db-4cc2-385c-adef-654fccc4a4d8",
        ),
        ("-1-2-3-4-5", "fabc4ac1-bc32-390f-93da-884bbb495929"),
        ("+a-b-c-d-e", "3b4e17ad-c53d-3507-87b0-1262bf70772b"),
        (
            "12345678123456781-2-3-4-5",
            "89636bcd-ba3b-383f-afb2-8adff4f30083",
        ),
    ];

    #[test]
    fn lock_keys_match_java() {
        for (key, expected) in JAVA_VECTORS {
            assert_eq!(lock_key_for(key), *expected, "key {key:?}");
        }
    }

    #[test]
    fn empty_and_oversized_keys_are_rejected() {
        assert!(matches!(validate_key(""), Err(Error::InvalidKey { .. })));
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(validate_key(&long), Err(Error::InvalidKey { .. })));
        assert!(validate_key(&"k".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(validate_key("a\0b").is_ok());
    }
}
