//! hmac-auth: its entity only so far (the handler is the authentication wave's, issue #24):
//! Kong's `hmacauth_credentials` are stored, synced by decK and exported like every
//! credential.

pub mod daos;
