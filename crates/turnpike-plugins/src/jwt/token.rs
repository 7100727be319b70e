//! JSON Web Tokens as Kong's `jwt_parser.lua` reads them: three base64url parts (padding
//! optional), a JSON header naming a known `alg`, JSON claims, and a signature checked with a
//! key parsed once, when the credential is loaded.

use aws_lc_rs::signature;
use base64::Engine;
use ring::hmac;
use serde_json::{Map, Value};

/// The algorithms Kong 3.9's jwt plugin accepts (`jwt_secrets.algorithm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
    ES512,
    PS256,
    PS384,
    PS512,
    EdDSA,
}

pub const ALG_NAMES: &[&str] = &[
    "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256",
    "PS384", "PS512", "EdDSA",
];

impl Alg {
    pub fn parse(name: &str) -> Option<Alg> {
        use Alg::*;
        Some(match name {
            "HS256" => HS256,
            "HS384" => HS384,
            "HS512" => HS512,
            "RS256" => RS256,
            "RS384" => RS384,
            "RS512" => RS512,
            "ES256" => ES256,
            "ES384" => ES384,
            "ES512" => ES512,
            "PS256" => PS256,
            "PS384" => PS384,
            "PS512" => PS512,
            "EdDSA" => EdDSA,
            _ => return None,
        })
    }

    pub fn is_hmac(self) -> bool {
        matches!(self, Alg::HS256 | Alg::HS384 | Alg::HS512)
    }

    fn public(self) -> &'static dyn signature::VerificationAlgorithm {
        use Alg::*;
        match self {
            RS256 => &signature::RSA_PKCS1_2048_8192_SHA256,
            RS384 => &signature::RSA_PKCS1_2048_8192_SHA384,
            RS512 => &signature::RSA_PKCS1_2048_8192_SHA512,
            // JOSE signatures are r || s, fixed width (RFC 7518 §3.4).
            ES256 => &signature::ECDSA_P256_SHA256_FIXED,
            ES384 => &signature::ECDSA_P384_SHA384_FIXED,
            ES512 => &signature::ECDSA_P521_SHA512_FIXED,
            PS256 => &signature::RSA_PSS_2048_8192_SHA256,
            PS384 => &signature::RSA_PSS_2048_8192_SHA384,
            PS512 => &signature::RSA_PSS_2048_8192_SHA512,
            EdDSA => &signature::ED25519,
            HS256 | HS384 | HS512 => unreachable!("HMAC has no public key"),
        }
    }
}

/// A verification key, ready to use. An HMAC key holds the hash states after the key's inner
/// and outer pads, so a check hashes only the token. ring's (assembly SHA-2) over aws-lc's
/// (a 1.2 KB key whose per-call set-up cost more than the hash) and RustCrypto's (portable
/// SHA-2 on CPUs without SHA extensions): 10.6k instructions per request of the instruction
/// gate's jwt case went to hashing with either.
pub enum Key {
    Hmac(hmac::Key),
    Public(signature::ParsedPublicKey),
}

impl Key {
    /// An HMAC key from the secret's bytes.
    pub fn hmac(alg: Alg, secret: &[u8]) -> Key {
        let a = match alg {
            Alg::HS384 => hmac::HMAC_SHA384,
            Alg::HS512 => hmac::HMAC_SHA512,
            _ => hmac::HMAC_SHA256,
        };
        Key::Hmac(hmac::Key::new(a, secret))
    }

    /// A public key from PEM (`PUBLIC KEY`, or `RSA PUBLIC KEY` for RSA) for `alg`.
    pub fn public(alg: Alg, pem: &str) -> Result<Key, String> {
        let der = pem_body(pem).ok_or("invalid key")?;
        signature::ParsedPublicKey::new(alg.public(), der)
            .map(Key::Public)
            .map_err(|_| "invalid key".to_string())
    }

    pub fn verify(&self, input: &[u8], sig: &[u8]) -> bool {
        match self {
            Key::Hmac(k) => hmac::verify(k, input, sig).is_ok(),
            Key::Public(k) => k.verify_sig(input, sig).is_ok(),
        }
    }
}

/// The DER inside a PEM block (the first one).
fn pem_body(pem: &str) -> Option<Vec<u8>> {
    let begin = pem.find("-----BEGIN ")?;
    let rest = &pem[begin..];
    let body_start = rest.find('\n')? + 1;
    let end = rest.find("-----END ")?;
    let body: String = rest
        .get(body_start..end)?
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

/// Kong's base64 decoding of token parts: url-safe alphabet, padding added when missing.
pub fn b64url(input: &str) -> Option<Vec<u8>> {
    let trimmed = input.trim_end_matches('=');
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(trimmed)
        .ok()
}

/// Kong's `secret_is_base64`: the standard alphabet (and url-safe characters), padding
/// optional.
pub fn b64_secret(input: &str) -> Option<Vec<u8>> {
    let s: String = input
        .trim_end_matches('=')
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(s)
        .ok()
}

/// A decoded token.
pub struct Token {
    pub header: Map<String, Value>,
    pub claims: Map<String, Value>,
    pub alg: Alg,
    /// The length of `header.claims`, the token's prefix the signature covers.
    pub signed_len: usize,
    pub signature: Vec<u8>,
}

impl Token {
    /// The part of `token` (the text this was decoded from) the signature covers.
    pub fn signing_input<'t>(&self, token: &'t str) -> &'t [u8] {
        &token.as_bytes()[..self.signed_len]
    }
}

/// Decodes a token; the error is Kong's text after "Bad token; ".
pub fn decode(token: &str) -> Result<Token, &'static str> {
    // Kong splits into at most three parts: the third keeps any further dots.
    let mut parts = token.splitn(3, '.');
    let (h, c, s) = (
        parts.next().unwrap_or(""),
        parts.next().ok_or("invalid JSON")?,
        parts.next().unwrap_or(""),
    );
    let json = |part: &str| -> Option<Map<String, Value>> {
        match serde_json::from_slice(&b64url(part)?) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        }
    };
    let header = json(h).ok_or("invalid JSON")?;
    let claims = json(c).ok_or("invalid JSON")?;
    let signature = b64url(s).ok_or("invalid JSON")?;
    let alg = header
        .get("alg")
        .and_then(|a| a.as_str())
        .and_then(Alg::parse)
        .ok_or("invalid alg")?;
    Ok(Token {
        header,
        claims,
        alg,
        signed_len: h.len() + 1 + c.len(),
        signature,
    })
}

/// Kong's registered-claim checks: `(claim, message)` for each failure.
pub fn verify_claims(
    claims: &Map<String, Value>,
    which: &[String],
    now: f64,
) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    for name in which {
        let v = claims.get(name.as_str());
        let Some(n) = v.and_then(|v| v.as_f64()) else {
            errs.push((name.clone(), "must be a number".into()));
            continue;
        };
        match name.as_str() {
            "nbf" if n > now => errs.push((name.clone(), "token not valid yet".into())),
            "exp" if n <= now => errs.push((name.clone(), "token expired".into())),
            _ => {}
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    fn hs256(claims: &str, secret: &[u8]) -> String {
        let input = format!(
            "{}.{}",
            b64(br#"{"alg":"HS256","typ":"JWT"}"#),
            b64(claims.as_bytes())
        );
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), input.as_bytes());
        format!("{input}.{}", b64(tag.as_ref()))
    }

    #[test]
    fn decodes_and_verifies_an_hmac_token() {
        let t = hs256(r#"{"iss":"k1","exp":2000000000}"#, b"s3cret");
        let d = decode(&t).unwrap();
        assert_eq!(d.alg, Alg::HS256);
        assert_eq!(d.claims["iss"], "k1");
        assert!(Key::hmac(Alg::HS256, b"s3cret").verify(d.signing_input(&t), &d.signature));
        assert!(!Key::hmac(Alg::HS256, b"other").verify(d.signing_input(&t), &d.signature));
        // Padding is accepted, as Kong pads before decoding.
        let padded = t.replacen('.', "==.", 1);
        assert!(decode(&padded).is_ok());
    }

    #[test]
    fn bad_tokens_fail_as_kong_says() {
        assert_eq!(decode("abc").err(), Some("invalid JSON"));
        assert_eq!(decode("a.b.c").err(), Some("invalid JSON"));
        let h = b64(br#"{"alg":"none"}"#);
        let c = b64(br#"{}"#);
        assert_eq!(decode(&format!("{h}.{c}.")).err(), Some("invalid alg"));
        let arr = b64(b"[1]");
        assert_eq!(decode(&format!("{arr}.{c}.")).err(), Some("invalid JSON"));
    }

    #[test]
    fn registered_claims() {
        let claims: Map<String, Value> =
            serde_json::from_str(r#"{"exp": 100, "nbf": "x"}"#).unwrap();
        let e = verify_claims(&claims, &["exp".into(), "nbf".into()], 150.0);
        assert_eq!(
            e,
            vec![
                ("exp".to_string(), "token expired".to_string()),
                ("nbf".to_string(), "must be a number".to_string())
            ]
        );
        assert!(verify_claims(&claims, &["exp".into()], 99.0).is_empty());
    }

    #[test]
    fn secrets_in_base64() {
        assert_eq!(b64_secret("c2VjcmV0").unwrap(), b"secret");
        assert_eq!(b64_secret("c2VjcmV0==").unwrap(), b"secret");
        assert!(b64_secret("-----BEGIN PUBLIC KEY-----").is_none());
    }
}
