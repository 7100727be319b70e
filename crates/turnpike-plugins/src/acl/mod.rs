//! acl (PRIORITY 950): lets an authenticated consumer through by the groups its `acls`
//! credentials give it. Runs after the authentication plugins (higher PRIORITY), so it sees the
//! consumer they found (or the anonymous one).

pub mod daos;
mod schema;

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::{Access, AccessRequest, BuildContext, Exit, Handler, PluginSpec};

pub struct Acl;

static X_CONSUMER_GROUPS: HeaderName = HeaderName::from_static("x-consumer-groups");

/// Consumer id → its groups, and the X-Consumer-Groups value built once.
pub type GroupIndex = HashMap<String, (Vec<String>, Option<HeaderValue>)>;

struct Configured {
    groups: Arc<GroupIndex>,
    /// `true`: `list` is an allow list; `false`: a deny list.
    allow: bool,
    list: Vec<String>,
    hide_header: bool,
}

impl PluginSpec for Acl {
    fn name(&self) -> &'static str {
        "acl"
    }
    fn priority(&self) -> i32 {
        950
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let allow = c.allow.unwrap_or_default();
        let (allow_mode, list) = if allow.is_empty() {
            (false, c.deny.unwrap_or_default())
        } else {
            (true, allow)
        };
        Ok(Arc::new(Configured {
            groups: ctx.shared(daos::groups),
            allow: allow_mode,
            list,
            hide_header: c.hide_groups_header,
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let Some(who) = req.consumer.clone() else {
            return Access::Exit(Exit::message(StatusCode::UNAUTHORIZED, "Unauthorized"));
        };
        let (groups, header) = match self.groups.get(who.consumer_id()) {
            Some((g, h)) => (g.as_slice(), h.clone()),
            None => (&[][..], None),
        };
        let in_list = groups.iter().any(|g| self.list.contains(g));
        if in_list != self.allow {
            return Access::Exit(Exit::message(
                StatusCode::FORBIDDEN,
                "You cannot consume this service",
            ));
        }
        match header.filter(|_| !self.hide_header) {
            Some(v) => {
                req.headers.insert(X_CONSUMER_GROUPS.clone(), v);
            }
            None => {
                req.headers.remove(&X_CONSUMER_GROUPS);
            }
        }
        Access::Continue
    }
}
