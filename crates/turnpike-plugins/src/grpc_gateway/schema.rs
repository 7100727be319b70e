//! grpc-gateway's config (Kong `kong/plugins/grpc-gateway/schema.lua`).

use serde::Deserialize;

use crate::schema::{Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    /// The `.proto` file describing the service, with its `google.api.http` bindings.
    pub proto: Option<String>,
}

pub const FIELDS: &[Field] = &[Field::new("proto", Type::String)];
