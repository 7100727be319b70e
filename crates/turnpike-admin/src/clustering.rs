//! Kong's `kong/api/routes/clustering.lua`: a control plane's data planes
//! (`GET /clustering/data-planes`, a paginated collection, and the deprecated
//! `GET /clustering/status` map); 400 on any other node.

use super::*;

pub(crate) fn endpoint(node: &turnpike_cluster::Node, path: &str, query: &str) -> Resp {
    let turnpike_cluster::Node::ControlPlane(cp) = node else {
        return message(
            StatusCode::BAD_REQUEST,
            "this endpoint is only available when Kong is configured to run as Control Plane for the cluster",
        );
    };
    let records = cp.data_planes();
    if path == "/clustering/status" {
        let map: serde_json::Map<String, Value> = records
            .iter()
            .map(|r| {
                (
                    r.id.clone(),
                    json!({
                        "config_hash": r.config_hash,
                        "hostname": r.hostname,
                        "ip": r.ip,
                        "last_seen": r.last_seen,
                    }),
                )
            })
            .collect();
        let mut resp = json_response(StatusCode::OK, &Value::Object(map));
        resp.headers_mut()
            .insert("deprecation", http::HeaderValue::from_static("true"));
        return resp;
    }
    // A page of `size` (Kong's default 100, at most 1000) after the id named by `offset`.
    let (mut size, mut after) = (100usize, None::<String>);
    for (k, v) in query.split('&').filter_map(|p| p.split_once('=')) {
        match k {
            "size" => match v.parse::<usize>() {
                Ok(n) if (1..=1000).contains(&n) => size = n,
                _ => {
                    return json_response(
                        StatusCode::BAD_REQUEST,
                        &json!({"code": 9, "name": "invalid size", "message": "invalid size: must be a number between 1 and 1000" }),
                    )
                }
            },
            "offset" => after = Some(v.to_string()),
            _ => {}
        }
    }
    let start = match &after {
        Some(id) => records
            .iter()
            .position(|r| &r.id > id)
            .unwrap_or(records.len()),
        None => 0,
    };
    let page: Vec<Value> = records[start..]
        .iter()
        .take(size)
        .map(|r| r.to_json())
        .collect();
    let next = (start + size < records.len()).then(|| {
        let last = &records[start + size - 1].id;
        format!("/clustering/data-planes?offset={last}&size={size}")
    });
    let mut body = json!({ "data": page, "next": next });
    if let Some(n) = &next {
        body["offset"] = json!(n.split("offset=").nth(1).and_then(|s| s.split('&').next()));
    }
    json_response(StatusCode::OK, &body)
}
