//! Turnpike's configuration: the node's kong.conf-style properties ([`conf`]) and Kong's
//! declarative entity configuration ([`declarative`]).

pub mod atc;
pub mod conf;
pub mod declarative;
pub mod entity;
mod kong_properties;
pub mod number;
pub mod schema;

pub use conf::Conf;
pub use declarative::{Config, DeclarativeError, NoPlugins, PluginRegistry};
