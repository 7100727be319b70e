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
    always_use_authenticated: bool,
}

impl PluginSpec for Acl {
    fn name(&self) -> &'static str {
        "acl"
    }
    fn priority(&self) -> i32 {
        950
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
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
            always_use_authenticated: c.always_use_authenticated_groups,
        }))
    }
}

impl Configured {
    /// Kong's `get_to_be_blocked`: whether `groups` are refused.
    fn blocked(&self, groups: &[String]) -> bool {
        let in_list = groups.iter().any(|g| self.list.contains(g));
        in_list != self.allow
    }

    fn refuse() -> Access {
        Access::Exit(Exit::message(
            StatusCode::FORBIDDEN,
            "You cannot consume this service",
        ))
    }

    /// The request's authenticated groups decide (Kong's `X-Authenticated-Groups`).
    fn by_authenticated(&self, req: &mut AccessRequest<'_>, groups: &[String]) -> Access {
        if self.blocked(groups) {
            return Self::refuse();
        }
        if !self.hide_header {
            if let Ok(v) = HeaderValue::from_str(&groups.join(", ")) {
                req.headers.insert(crate::X_AUTHENTICATED_GROUPS.clone(), v);
            }
        }
        Access::Continue
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    /// Kong's acl handler: the consumer's `acls` groups decide, unless the request came without
    /// a credential (anonymous) or `always_use_authenticated_groups` is set and it carries
    /// authenticated groups (a session's, or Lua code's `authenticated_groups`).
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let Some(who) = req.consumer.clone() else {
            return match crate::authenticated_groups(req.ctx) {
                Some(g) => self.by_authenticated(req, &g),
                None => Access::Exit(Exit::message(StatusCode::UNAUTHORIZED, "Unauthorized")),
            };
        };
        let credential = who.credential_id().is_some();
        if !credential || self.always_use_authenticated {
            if let Some(g) = crate::authenticated_groups(req.ctx) {
                return self.by_authenticated(req, &g);
            }
        }
        let Some((groups, header)) = self.groups.get(who.consumer_id()) else {
            if self.allow {
                return if credential {
                    Self::refuse()
                } else {
                    Access::Exit(Exit::message(StatusCode::UNAUTHORIZED, "Unauthorized"))
                };
            }
            req.headers.remove(&X_CONSUMER_GROUPS);
            return Access::Continue;
        };
        if self.blocked(groups) {
            return Self::refuse();
        }
        match header.clone().filter(|_| !self.hide_header) {
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
