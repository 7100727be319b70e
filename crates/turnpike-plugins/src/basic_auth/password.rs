//! Passwords at rest and their verification.
//!
//! Written through the Admin API (or imported into a database), a password is stored as an
//! argon2id PHC string (OWASP's parameters: 19 MiB, 2 passes): a leaked table does not give the
//! passwords away cheaply. Kong stores `sha1(password .. consumer id)` in hex; such hashes, from
//! a Kong database or a decK dump, are still verified, so consumers move over unchanged. A
//! declarative file (DB-less) holds the passwords in clear anyway; those are compared in
//! constant time.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use sha1::Digest;
use subtle::ConstantTimeEq;

/// A stored password, ready to verify.
pub enum Secret {
    /// An argon2 PHC string.
    Argon2(String),
    /// Kong's legacy hash: SHA-1 of the password followed by the consumer id.
    KongSha1 { digest: [u8; 20], salt: String },
    /// A password in clear (declarative files).
    Plain(Vec<u8>),
}

impl Secret {
    pub fn from_stored(stored: &str, consumer_id: &str) -> Secret {
        if stored.starts_with("$argon2") {
            return Secret::Argon2(stored.to_string());
        }
        if let Some(digest) = kong_sha1(stored) {
            return Secret::KongSha1 {
                digest,
                salt: consumer_id.to_string(),
            };
        }
        Secret::Plain(stored.as_bytes().to_vec())
    }

    /// Whether verifying costs real CPU time (and so goes to the blocking pool, bounded).
    pub fn is_slow(&self) -> bool {
        matches!(self, Secret::Argon2(_))
    }

    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            Secret::Argon2(phc) => PasswordHash::new(phc).is_ok_and(|h| {
                argon2::Argon2::default()
                    .verify_password(password, &h)
                    .is_ok()
            }),
            Secret::KongSha1 { digest, salt } => {
                let mut h = sha1::Sha1::new();
                h.update(password);
                h.update(salt.as_bytes());
                h.finalize().as_slice().ct_eq(digest).into()
            }
            Secret::Plain(p) => p.as_slice().ct_eq(password).into(),
        }
    }
}

/// Kong's stored form: 40 lowercase hex digits.
fn kong_sha1(s: &str) -> Option<[u8; 20]> {
    if s.len() != 40
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 20];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// Whether a stored password is already a hash this gateway verifies.
pub fn is_hashed(s: &str) -> bool {
    s.starts_with("$argon2") || kong_sha1(s).is_some()
}

/// Hashes a password for storage (argon2id, random salt).
pub fn hash(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    fill_random(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// A salt from a v4 UUID: 122 bits from the OS's CSPRNG (getrandom), more than argon2's
/// recommended 128-bit salt needs to be unique.
fn fill_random(out: &mut [u8; 16]) {
    out.copy_from_slice(uuid::Uuid::new_v4().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2_kong_sha1_and_plain() {
        let h = hash("s3cret").unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(is_hashed(&h));
        let s = Secret::from_stored(&h, "c");
        assert!(s.is_slow() && s.verify(b"s3cret") && !s.verify(b"s3cret "));
        // Kong: sha1("password" .. consumer id)
        let consumer = "f4c7a9d0-0000-4000-8000-000000000001";
        let mut d = sha1::Sha1::new();
        d.update(format!("pw{consumer}"));
        let stored = hex::encode(d.finalize());
        assert!(is_hashed(&stored));
        let s = Secret::from_stored(&stored, consumer);
        assert!(!s.is_slow() && s.verify(b"pw") && !s.verify(b"px"));
        let s = Secret::from_stored("plain", consumer);
        assert!(s.verify(b"plain") && !s.verify(b"plai") && !is_hashed("plain"));
    }
}
