//! ip-restriction (PRIORITY 990): lets requests through by client IP. A `deny` match is
//! refused; with an `allow` list, anything not on it is refused too.

mod schema;

use std::net::IpAddr;
use std::sync::Arc;

use http::StatusCode;
use serde_json::Value;
use turnpike_config::conf::{cidr_contains, parse_cidr};

use crate::{Access, AccessRequest, Exit, Handler, PluginSpec};

pub struct IpRestriction;

/// Kong's message when none is configured.
const DEFAULT_MESSAGE: &str = "Your IP address is not allowed";

struct Configured {
    allow: Option<Vec<(IpAddr, u8)>>,
    deny: Vec<(IpAddr, u8)>,
    status: StatusCode,
    message: String,
}

fn ranges(list: Option<&[String]>) -> Option<Vec<(IpAddr, u8)>> {
    let a = list.filter(|a| !a.is_empty())?;
    Some(a.iter().filter_map(|v| parse_cidr(v)).collect())
}

impl PluginSpec for IpRestriction {
    fn name(&self) -> &'static str {
        "ip-restriction"
    }
    fn priority(&self) -> i32 {
        990
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(
        &self,
        config: &Value,
        _ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let status = StatusCode::from_u16(c.status.unwrap_or(403)).map_err(|e| e.to_string())?;
        Ok(Arc::new(Configured {
            allow: ranges(c.allow.as_deref()),
            deny: ranges(c.deny.as_deref()).unwrap_or_default(),
            status,
            message: c.message.unwrap_or_else(|| DEFAULT_MESSAGE.to_string()),
        }))
    }
}

impl Configured {
    fn denied(&self, ip: IpAddr) -> bool {
        let in_list = |list: &[(IpAddr, u8)]| list.iter().any(|(n, l)| cidr_contains(*n, *l, ip));
        in_list(&self.deny) || self.allow.as_ref().is_some_and(|a| !in_list(a))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        if self.denied(req.client_ip) {
            Access::Exit(Exit::message(self.status, &self.message))
        } else {
            Access::Continue
        }
    }

    /// Kong's `preread`: the same lists, for a stream session.
    fn preread(&self, session: &crate::StreamSession) -> Result<(), crate::StreamExit> {
        if self.denied(session.client_ip) {
            return Err(crate::StreamExit {
                status: self.status.as_u16(),
                message: self.message.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::validate;
    use serde_json::json;

    fn check(config: Value, ip: &str) -> Option<u16> {
        let full = validate(schema::FIELDS, &config).unwrap();
        assert!(
            schema::entity_checks(&full).is_empty(),
            "{:?}",
            schema::entity_checks(&full)
        );
        let h = IpRestriction
            .build(
                &full,
                &crate::BuildContext::new(&Default::default(), &crate::Runtime::new()),
            )
            .unwrap();
        let mut t = crate::TestRequest::new();
        t.client_ip = ip.parse().unwrap();
        match t.run(h.as_ref()) {
            Access::Continue => None,
            Access::Exit(e) => Some(e.status.as_u16()),
            Access::Wait(_) => unreachable!("TestRequest::run waits"),
        }
    }

    #[test]
    fn allow_and_deny_lists() {
        let cfg = json!({"allow": ["10.0.0.0/8", "2001:db8::/32"]});
        assert_eq!(check(cfg.clone(), "10.1.2.3"), None);
        assert_eq!(check(cfg.clone(), "::ffff:10.1.2.3"), None);
        assert_eq!(check(cfg.clone(), "2001:db8::1"), None);
        assert_eq!(check(cfg, "192.168.0.1"), Some(403));
        let cfg = json!({"deny": ["192.168.0.1"], "status": 401});
        assert_eq!(check(cfg.clone(), "192.168.0.1"), Some(401));
        assert_eq!(check(cfg, "192.168.0.2"), None);
        // Deny wins over allow.
        let cfg = json!({"allow": ["10.0.0.0/8"], "deny": ["10.0.0.1"]});
        assert_eq!(check(cfg, "10.0.0.1"), Some(403));
    }

    #[test]
    fn bad_configs() {
        let full = validate(schema::FIELDS, &json!({})).unwrap();
        assert!(!schema::entity_checks(&full).is_empty());
        let full = validate(schema::FIELDS, &json!({"allow": ["10.0.0.0/33", "nope"]})).unwrap();
        assert_eq!(schema::entity_checks(&full).len(), 2);
    }
}
