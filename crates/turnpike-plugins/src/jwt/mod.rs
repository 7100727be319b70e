//! jwt: its entity only so far (the handler is the authentication wave's, issue #24): Kong's
//! `jwt_secrets` are stored, synced by decK and exported like every credential.

pub mod daos;
