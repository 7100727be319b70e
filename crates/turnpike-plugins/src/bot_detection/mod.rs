//! bot-detection (PRIORITY 2500): refuses requests whose User-Agent is a known bot (Kong's
//! `rules.lua`) or matches `deny`, unless it matches `allow` (Kong 3's names for `whitelist`
//! and `blacklist`, which are read too): 403 `Forbidden`; two User-Agent headers are a 400.
//! The rules are compiled into one `RegexSet` per snapshot and each config's lists into its
//! own, when the config is built.

mod rules;

use std::sync::Arc;

use http::StatusCode;
use regex::RegexSet;
use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};
use crate::{Access, AccessRequest, Exit, Handler, PluginSpec};

pub struct BotDetection;

#[derive(Deserialize)]
struct Config {
    allow: Vec<String>,
    deny: Vec<String>,
}

const FIELDS: &[Field] = &[
    Field::new("allow", Type::StringArray).default(Default::EmptyArray),
    Field::new("deny", Type::StringArray).default(Default::EmptyArray),
];

/// Kong's bot rules, compiled once per snapshot (`BuildContext::shared`).
struct Bots(RegexSet);

fn bots(_: &crate::BuildContext<'_>) -> Bots {
    Bots(RegexSet::new(rules::BOTS).expect("Kong's bot rules compile"))
}

struct Configured {
    allow: RegexSet,
    deny: RegexSet,
    bots: Arc<Bots>,
}

impl PluginSpec for BotDetection {
    fn name(&self) -> &'static str {
        "bot-detection"
    }
    fn priority(&self) -> i32 {
        2500
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn fields(&self) -> &'static [Field] {
        FIELDS
    }
    fn shorthands(&self, config: &mut Value) {
        if let Some(m) = config.as_object_mut() {
            for (old, new) in [("whitelist", "allow"), ("blacklist", "deny")] {
                if let Some(v) = m.remove(old) {
                    m.entry(new).or_insert(v);
                }
            }
        }
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        for list in ["allow", "deny"] {
            for (i, r) in config[list].as_array().into_iter().flatten().enumerate() {
                let r = r.as_str().unwrap_or_default();
                if regex::Regex::new(r).is_err() {
                    errs.push((format!("{list}.{}", i + 1), format!("invalid regex: '{r}'")));
                }
            }
        }
        errs
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: Config = crate::typed(config)?;
        Ok(Arc::new(Configured {
            allow: RegexSet::new(&c.allow).map_err(|e| e.to_string())?,
            deny: RegexSet::new(&c.deny).map_err(|e| e.to_string())?,
            bots: ctx.shared(bots),
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let mut agents = req.headers.get_all(http::header::USER_AGENT).iter();
        let Some(agent) = agents.next() else {
            return Access::Continue;
        };
        if agents.next().is_some() {
            return Access::Exit(Exit::message(
                StatusCode::BAD_REQUEST,
                "Only one User-Agent header allowed",
            ));
        }
        let agent = String::from_utf8_lossy(agent.as_bytes());
        let agent = agent.trim();
        if self.allow.is_match(agent) {
            return Access::Continue;
        }
        if self.deny.is_match(agent) || self.bots.0.is_match(agent) {
            return Access::Exit(Exit::message(StatusCode::FORBIDDEN, "Forbidden"));
        }
        Access::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kong_rules_find_bots_not_browsers() {
        let set = RegexSet::new(rules::BOTS).unwrap();
        for bot in [
            "Googlebot/2.1 (+http://www.google.com/bot.html)",
            "facebookexternalhit/1.1",
            "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
            "Python-urllib/3.11",
            "Apache-HttpClient/4.5.13 (Java/17)",
        ] {
            assert!(set.is_match(bot), "{bot}");
        }
        for browser in [
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
            "curl/8.5.0",
        ] {
            assert!(!set.is_match(browser), "{browser}");
        }
    }
}
