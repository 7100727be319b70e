//! What every authentication plugin shares about Kong's `anonymous` setting: the consumer it
//! names (looked up when the config is built), the logical OR it makes of several auth plugins,
//! and a failure that lets the anonymous consumer through instead of answering.

use std::sync::Arc;

use http::StatusCode;

use crate::{Access, AccessRequest, BuildContext, Exit, Identity};

/// A config's `anonymous`: unset, the consumer it names, or why that consumer is missing
/// (Kong answers 500 then).
pub struct Anonymous(Option<Result<Arc<Identity>, String>>);

impl Anonymous {
    pub fn new(ctx: &BuildContext<'_>, name: Option<&str>) -> Anonymous {
        Anonymous(name.map(|a| {
            ctx.consumer(a)
                .ok_or_else(|| format!("anonymous consumer {a} is configured but doesn't exist"))
        }))
    }

    /// With `anonymous` set, auth plugins form a logical OR: one that already found a real
    /// consumer settles it, and the others step aside.
    pub fn already_settled(&self, req: &AccessRequest<'_>) -> bool {
        self.0.is_some()
            && req
                .consumer
                .as_ref()
                .is_some_and(|c| c.credential_id().is_some())
    }

    /// A failed authentication: the anonymous consumer goes on, else the plugin's answer.
    pub fn fail(&self, req: &mut AccessRequest<'_>, answer: impl FnOnce() -> Exit) -> Access {
        match &self.0 {
            Some(Ok(who)) => {
                req.set_consumer(who.clone());
                Access::Continue
            }
            Some(Err(e)) => Access::Exit(Exit::message(StatusCode::INTERNAL_SERVER_ERROR, e)),
            None => Access::Exit(answer()),
        }
    }
}

/// Kong's answer when a credential store cannot be asked.
pub fn store_failed(plugin: &str, e: &str) -> Access {
    tracing::error!("{plugin}: credential look-up failed: {e}");
    Access::Exit(Exit::message(
        StatusCode::INTERNAL_SERVER_ERROR,
        "An unexpected error occurred",
    ))
}
