//! The authorization endpoint (`/oauth2/authorize`): the authorization code and implicit
//! grants, as Kong's `access.lua` answers them (its checks in its order, its error bodies),
//! and the redirect URIs it answers with.

use std::collections::BTreeMap;

use http::StatusCode;
use serde_json::{Map, Value};

use super::*;

pub(super) async fn authorize(
    call: &Call,
    s: &Settings,
    clients: &Clients,
    store: &crate::credentials::Store,
) -> Result<Exit, String> {
    let p = &call.params;
    let mut r = Response::new();
    let state = p.get("state").cloned();
    let mut redirect_uri: Option<String> = None;
    let mut implicit = false;
    if let Some(e) = call.https_error {
        r.error("access_denied", e);
    } else if s.provision_key.as_deref() != str_param(p, "provision_key") {
        r.error("invalid_provision_key", "Invalid provision_key");
    } else if str_param(p, "authenticated_userid").is_none_or(|u| u.trim().is_empty()) {
        r.error(
            "invalid_authenticated_userid",
            "Missing authenticated_userid parameter",
        );
    } else {
        let response_type = str_param(p, "response_type");
        let code_flow = response_type == Some("code") && s.enable_authorization_code;
        if !(code_flow || (s.enable_implicit_grant && response_type == Some("token"))) {
            r.error("unsupported_response_type", "Invalid response_type");
        }
        let scopes = match scope(p, s) {
            Ok(sc) => sc,
            Err(e) => {
                r.params = e;
                None
            }
        };
        let client = str_param(p, "client_id")
            .filter(|c| !c.is_empty())
            .and_then(|c| clients.0.get(c))
            .cloned();
        match &client {
            None => r.error("invalid_client", "Invalid client authentication"),
            Some(c) => {
                let asked =
                    str_param(p, "redirect_uri").or(c.redirect_uris.first().map(|u| u.as_str()));
                match asked {
                    Some(u) if c.redirect_uris.iter().any(|a| a == u) => {
                        redirect_uri = Some(u.to_string())
                    }
                    _ => {
                        r.error(
                            "invalid_request",
                            "Invalid redirect_uri that does not match with any redirect_uri created with the application",
                        );
                        redirect_uri = c.redirect_uris.first().cloned();
                    }
                }
            }
        }
        let mut challenge = None;
        match code_challenge(p) {
            Err(e) => r.error("invalid_request", &e),
            Ok(None) if client.as_ref().is_some_and(|c| requires_pkce(s, c, false)) => r.error(
                "invalid_request",
                "code_challenge is required for public clients",
            ),
            Ok(c) => challenge = c,
        }
        if !r.failed() {
            let client = client.expect("checked above");
            let own_service = if s.global_credentials {
                None
            } else {
                call.service_id.as_deref()
            };
            if response_type == Some("code") {
                let mut e = Map::new();
                if let Some(sid) = own_service {
                    e.insert("service".into(), serde_json::json!({ "id": sid }));
                }
                e.insert("credential".into(), serde_json::json!({ "id": client.id }));
                e.insert(
                    "authenticated_userid".into(),
                    Value::from(str_param(p, "authenticated_userid").unwrap_or("")),
                );
                if let Some(sc) = &scopes {
                    e.insert("scope".into(), Value::from(sc.as_str()));
                }
                if let Some(c) = &challenge {
                    e.insert("challenge".into(), Value::from(c.as_str()));
                    e.insert("challenge_method".into(), Value::from("S256"));
                }
                e.insert("code".into(), Value::from(random_string()));
                e.insert("ttl".into(), Value::from(300));
                let saved = store
                    .write(Write::Insert {
                        table: daos::CODES,
                        entity: e,
                    })
                    .await?
                    .ok_or("the store answered no code")?;
                r.params = Map::new();
                r.params.insert(
                    "code".into(),
                    saved.get("code").cloned().unwrap_or(Value::Null),
                );
            } else {
                r.params = generate_token(
                    s,
                    store,
                    call.service_id.as_deref(),
                    Grant {
                        client: &client,
                        userid: str_param(p, "authenticated_userid"),
                        scope: scopes.as_deref(),
                    },
                    true,
                    None,
                )
                .await?;
                implicit = true;
            }
        }
    }
    if let Some(st) = state {
        r.params.insert("state".into(), st);
    }
    let status = if r.failed() {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::OK
    };
    let body = match redirect_uri {
        Some(u) => {
            let mut m = Map::new();
            m.insert(
                "redirect_uri".into(),
                Value::from(with_params(&u, &r.params, implicit)),
            );
            m
        }
        None => r.params,
    };
    Ok(answer(status, &body, false))
}

/// `uri` with `params` merged into its query (or, for the implicit grant, its fragment), as
/// Kong's `encode_args` writes them: sorted by name.
pub(super) fn with_params(uri: &str, params: &Map<String, Value>, fragment: bool) -> String {
    let (before_fragment, old_fragment) = match uri.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (uri, None),
    };
    let (base, old_query) = match before_fragment.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (before_fragment, None),
    };
    let existing = if fragment { old_fragment } else { old_query };
    let mut args: BTreeMap<String, String> = crate::form::pairs(existing.unwrap_or("")).collect();
    for (k, v) in params {
        let v = match v {
            Value::String(s) => s.clone(),
            Value::Null => continue,
            other => other.to_string(),
        };
        args.insert(k.clone(), v);
    }
    let encoded: Vec<String> = args
        .iter()
        .map(|(k, v)| format!("{}={}", crate::form::escape(k), crate::form::escape(v)))
        .collect();
    let encoded = encoded.join("&");
    let mut out = base.to_string();
    if fragment {
        if let Some(q) = old_query {
            out.push('?');
            out.push_str(q);
        }
        out.push('#');
        out.push_str(&encoded);
    } else {
        out.push('?');
        out.push_str(&encoded);
        if let Some(f) = old_fragment {
            out.push('#');
            out.push_str(f);
        }
    }
    out
}
