//! correlation-id (PRIORITY 100001): gives every request an id in a header (keeping the one
//! the client sent), passes it upstream and, with `echo_downstream`, back to the client.

mod schema;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use serde_json::Value;

use crate::{Access, AccessRequest, Handler, PluginSpec};

pub struct CorrelationId;

#[derive(Clone, Copy)]
enum Generator {
    /// A random UUID per request.
    Uuid,
    /// Kong's default: one random UUID per instance, then `#1`, `#2`... (cheap and unique).
    UuidCounter,
    /// Where and when: client address, process, sequence number, time.
    Tracker,
}

struct Configured {
    header: HeaderName,
    generator: Generator,
    echo: bool,
    base: String,
    counter: AtomicU64,
}

impl PluginSpec for CorrelationId {
    fn name(&self) -> &'static str {
        "correlation-id"
    }
    fn priority(&self) -> i32 {
        100001
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        let name = config["header_name"].as_str().unwrap_or_default();
        if HeaderName::from_bytes(name.as_bytes()).is_err() {
            return vec![(
                "header_name".into(),
                format!("invalid header name: '{name}'"),
            )];
        }
        Vec::new()
    }
    fn build(
        &self,
        config: &Value,
        _ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let header = HeaderName::from_bytes(c.header_name.as_bytes()).map_err(|e| e.to_string())?;
        let generator = match c.generator.as_str() {
            "uuid" => Generator::Uuid,
            "tracker" => Generator::Tracker,
            _ => Generator::UuidCounter,
        };
        Ok(Arc::new(Configured {
            header,
            generator,
            echo: c.echo_downstream,
            base: uuid::Uuid::new_v4().to_string(),
            counter: AtomicU64::new(0),
        }))
    }
}

impl Configured {
    fn generate(&self, req: &AccessRequest<'_>) -> String {
        match self.generator {
            Generator::Uuid => uuid::Uuid::new_v4().to_string(),
            Generator::UuidCounter => {
                let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
                format!("{}#{n}", self.base)
            }
            Generator::Tracker => {
                let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                format!("{}-{}-{n}-{now:.3}", req.client_ip, std::process::id())
            }
        }
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let value = match req.headers.get(&self.header) {
            Some(v) => v.clone(),
            None => {
                let id = self.generate(req);
                let Ok(v) = HeaderValue::from_str(&id) else {
                    return Access::Continue;
                };
                req.headers.insert(self.header.clone(), v.clone());
                v
            }
        };
        if self.echo {
            req.response_headers.push((self.header.clone(), value));
        }
        Access::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::validate;
    use serde_json::json;

    fn run(
        config: Value,
        incoming: Option<&str>,
    ) -> (Option<String>, Vec<(HeaderName, HeaderValue)>) {
        let full = validate(schema::FIELDS, &config).unwrap();
        let h = CorrelationId
            .build(
                &full,
                &crate::BuildContext::new(&Default::default(), &crate::Runtime::new()),
            )
            .unwrap();
        let name =
            HeaderName::from_bytes(full["header_name"].as_str().unwrap().as_bytes()).unwrap();
        let mut t = crate::TestRequest::new();
        if let Some(v) = incoming {
            t.headers
                .insert(name.clone(), HeaderValue::from_str(v).unwrap());
        }
        assert!(matches!(t.run(h.as_ref()), Access::Continue));
        let sent = t
            .headers
            .get(&name)
            .map(|v| v.to_str().unwrap().to_string());
        (sent, t.response_headers)
    }

    #[test]
    fn generates_keeps_and_echoes() {
        let (id, echo) = run(json!({}), None);
        let id = id.unwrap();
        assert!(id.ends_with("#1") && id.len() == 38, "{id}");
        assert!(echo.is_empty());
        let (id, _) = run(json!({"generator": "uuid"}), None);
        assert_eq!(id.unwrap().len(), 36);
        let (id, echo) = run(
            json!({"echo_downstream": true, "header_name": "X-Trace"}),
            Some("abc"),
        );
        assert_eq!(id.as_deref(), Some("abc"));
        assert_eq!(echo[0].1, "abc");
    }
}
