//! oauth2: its entity only so far (the handler, tokens and codes are the authentication
//! wave's, issue #24): Kong's `oauth2_credentials` are stored, synced by decK and exported
//! like every credential.

pub mod daos;
