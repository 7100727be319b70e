//! post-function (Kong's serverless plugin, PRIORITY -1000): the operator's Lua code, run last
//! in each phase; the same plugin as pre-function under another name and priority.

pub mod schema;

use crate::pre_function::ServerlessSpec;

pub static POST_FUNCTION: ServerlessSpec = ServerlessSpec::new("post-function", -1000);
