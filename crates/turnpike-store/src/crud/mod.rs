//! Entity reads and writes with Kong's Admin API semantics. Every write is one transaction that
//! first bumps the config version (which also serialises writers, so the foreign-key and
//! uniqueness checks below cannot race), validates, checks references and unique keys, writes
//! the row and its tags, and commits; nothing is half-applied. On PostgreSQL a plain new
//! entity (no tags, references by id) is the same write in one statement
//! (`Store::insert_at_once`), the table's constraints backing its checks, and such entities
//! written at the same time share a statement (`batch`).

pub(crate) mod batch;

use base64::Engine;
use serde_json::{json, Map, Value};
use sqlx::any::Any;
use sqlx::{Row, Transaction};

use crate::entity::{self, Checked};
use crate::schema::{quote, EntitySpec};
use crate::{now_secs, Backend, Store, StoreError, NOTIFY_CHANNEL};

pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const MAX_PAGE_SIZE: usize = 1000;

type Tx<'a> = Transaction<'a, Any>;

/// A write's transaction with the config version it makes (`begin_write` bumped it).
pub(crate) struct WriteTx {
    tx: Tx<'static>,
    version: i64,
    /// Its bump sends the NOTIFY (delivered at the commit).
    notifies: bool,
}

impl std::ops::Deref for WriteTx {
    type Target = Tx<'static>;
    fn deref(&self) -> &Tx<'static> {
        &self.tx
    }
}

impl std::ops::DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut Tx<'static> {
        &mut self.tx
    }
}

/// A list request: Kong's `size`, `offset` and `tags` options, plus the parent filter of a
/// nested collection (`/services/{s}/routes` lists routes whose `service_id` is s).
#[derive(Debug, Default, Clone)]
pub struct ListQuery {
    pub size: usize,
    pub offset: Option<String>,
    /// Tags and whether all must match (`a,b`) or any (`a/b`).
    pub tags: Vec<String>,
    pub tags_all: bool,
    pub parent: Option<(String, String)>,
    /// Other query arguments: those naming one of the entity's unique fields filter the list
    /// by it (`/consumers?custom_id=x`, as Kong; `/services?name=x`, as Kong Manager asks).
    pub filters: Vec<(String, String)>,
}

impl ListQuery {
    /// The filters that apply to `spec`: its unique fields.
    pub fn filters_for<'q>(
        &'q self,
        spec: &'q EntitySpec,
    ) -> impl Iterator<Item = (&'q str, &'q str)> + 'q {
        self.filters
            .iter()
            .filter(|(k, _)| spec.unique.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl ListQuery {
    /// Reads Kong's query options; errors are Kong's invalid size / invalid options errors.
    pub fn parse(query: &str) -> Result<ListQuery, StoreError> {
        let mut q = ListQuery {
            size: DEFAULT_PAGE_SIZE,
            ..Default::default()
        };
        for (k, v) in url_pairs(query) {
            match k.as_str() {
                "size" => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| StoreError::InvalidSize("size must be a number".into()))?;
                    if n < 1 || n as usize > MAX_PAGE_SIZE {
                        return Err(StoreError::InvalidSize(format!(
                            "size must be an integer between 1 and {MAX_PAGE_SIZE}"
                        )));
                    }
                    q.size = n as usize;
                }
                "offset" => q.offset = Some(v),
                "tags" => {
                    if v.is_empty() {
                        return Err(StoreError::InvalidOptions(
                            json!({"tags": "cannot be an empty string"}),
                        ));
                    }
                    let (sep, all) = if v.contains('/') {
                        ('/', false)
                    } else {
                        (',', true)
                    };
                    if v.contains('/') && v.contains(',') {
                        return Err(StoreError::InvalidOptions(
                            json!({"tags": "invalid filter: cannot mix ',' and '/'"}),
                        ));
                    }
                    q.tags = v.split(sep).map(|s| s.trim().to_string()).collect();
                    if q.tags.iter().any(|t| t.is_empty()) {
                        return Err(StoreError::InvalidOptions(
                            json!({"tags": "invalid filter: empty tag"}),
                        ));
                    }
                    q.tags_all = all;
                }
                _ => q.filters.push((k, v)),
            }
        }
        Ok(q)
    }
}

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    pub data: Vec<Value>,
    /// The opaque offset of the next page, `None` on the last page.
    pub offset: Option<String>,
}

/// Splits and percent-decodes a query string or form body.
pub fn url_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn encode_offset(id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
}

fn decode_offset(o: &str) -> Result<String, StoreError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(o)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| StoreError::InvalidOffset(o.to_string()))
}

/// Kong treats a key that parses as a UUID as an id, anything else as the endpoint key.
pub use crate::entity::is_uuid;

fn parse_entity(text: &str) -> Result<Map<String, Value>, StoreError> {
    parse_entity_expiring(text).map(|(m, _)| m)
}

/// A stored entity as it reads back, and whether its `ttl` has run out.
fn parse_entity_expiring(text: &str) -> Result<(Map<String, Value>, bool), StoreError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(mut m)) => {
            let expired = read_back(&mut m);
            Ok((m, expired))
        }
        _ => Err(StoreError::Database(
            "stored entity is not a JSON object".into(),
        )),
    }
}

use crate::entity::{EXPIRES_AT, EXPIRES_AT_MS};

/// A stored entity, unless its `ttl` has run out (Kong no longer shows or uses it).
fn parse_live(text: &str) -> Result<Option<Map<String, Value>>, StoreError> {
    let (m, expired) = parse_entity_expiring(text)?;
    Ok((!expired).then_some(m))
}

mod bulk;
mod export;
mod read;
mod write;

/// Whether an entity reached through a nested path belongs to the parent in that path.
fn belongs_to(entity: &Map<String, Value>, parent: &Option<(String, String)>) -> bool {
    match parent {
        None => true,
        Some((field, pid)) => {
            entity
                .get(field)
                .and_then(|p| p.get("id"))
                .and_then(|v| v.as_str())
                == Some(pid.as_str())
        }
    }
}

/// Notes, inside a write transaction, that this version touched a row.
async fn record_change(tx: &mut Tx<'_>, table: &str, id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO changes (version, entity_name, entity_id) SELECT value, $1, $2 FROM turnpike_meta WHERE name = 'config_version'",
    )
    .bind(table)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What changed between two config versions: each touched row, with its current entity
/// (`None`: deleted).
pub type Delta = Vec<(&'static str, String, Option<String>)>;

/// Each table's rows as stored: (table, entity JSON texts).
pub type RawExport = Vec<(&'static str, Vec<String>)>;

/// A stored entity as it reads back: one written with a `ttl` keeps when it expires, and reads
/// back with the whole seconds it has left, counted down on every read as Kong's are (Kong's
/// PostgreSQL strategy: `FLOOR(EXTRACT(EPOCH FROM (ttl - now)))`, so a `ttl` of 10 reads 9
/// as soon as any time has passed). Returns whether it has expired. Entities written before
/// the expiry was kept in milliseconds count whole seconds.
pub(crate) fn read_back(m: &mut Map<String, Value>) -> bool {
    let at_ms = m.remove(EXPIRES_AT_MS).and_then(|v| v.as_i64());
    let Some(at) = m.remove(EXPIRES_AT).and_then(|v| v.as_i64()) else {
        return false;
    };
    let left_ms = match at_ms {
        Some(ms) => ms - crate::now_millis(),
        None => (at - crate::now_secs()) * 1000,
    };
    m.insert("ttl".into(), json!((left_ms.div_euclid(1000)).max(0)));
    left_ms <= 0
}

/// [`assemble`] from the rows already joined into one document (the config sync's text).
pub fn assemble_document(text: &str) -> Result<Value, StoreError> {
    let mut doc: Value = serde_json::from_str(text)
        .map_err(|_| StoreError::Database("stored entity is not a JSON object".into()))?;
    let tables = doc.as_object_mut().into_iter().flat_map(|m| m.values_mut());
    for rows in tables.filter_map(Value::as_array_mut) {
        for row in rows {
            match row.as_object_mut() {
                Some(m) => {
                    read_back(m);
                }
                None => {
                    return Err(StoreError::Database(
                        "stored entity is not a JSON object".into(),
                    ))
                }
            }
        }
    }
    Ok(doc)
}

/// Builds the declarative config from raw rows.
pub fn assemble(raw: RawExport) -> Result<Value, StoreError> {
    let mut top = Map::new();
    top.insert("_format_version".into(), json!("3.0"));
    top.insert("_transform".into(), json!(false));
    for (table, texts) in raw {
        if texts.is_empty() {
            continue;
        }
        let mut list = Vec::with_capacity(texts.len());
        for t in &texts {
            list.push(Value::Object(parse_entity(t)?));
        }
        top.insert(table.into(), Value::Array(list));
    }
    Ok(Value::Object(top))
}

/// The field that, with the parent, makes an entity's cache key: an entity nested under that
/// parent can be addressed by it (`/upstreams/{u}/targets/{host:port}`,
/// `/consumers/{c}/acls/{group}`).
pub fn nested_key_field(spec: &EntitySpec, parent_field: &str) -> Option<&'static str> {
    match spec.cache_key {
        [p, field] if *p == parent_field => Some(field),
        _ => None,
    }
}

/// A look-up by a unique field in every form a value may be stored in (a key-auth key as
/// written or as its digest): `SELECT {columns} FROM {table} WHERE {field} IN (...)`, bound.
fn by_stored_key<'q>(
    store: &Store,
    sql: &'q mut String,
    columns: &str,
    table: &str,
    field: &str,
    value: &str,
) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
    let forms = store.plugins.stored_keys(table, value);
    let marks: Vec<String> = (1..=forms.len()).map(|i| format!("${i}")).collect();
    *sql = format!(
        "SELECT {columns} FROM {table} WHERE {} IN ({})",
        quote(field),
        marks.join(", ")
    );
    forms
        .into_iter()
        .fold(sqlx::query(sql.as_str()), |q, f| q.bind(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_options() {
        let q = ListQuery::parse("size=5&tags=a,b&offset=xyz").unwrap();
        assert_eq!((q.size, q.tags_all, q.tags.len()), (5, true, 2));
        let q = ListQuery::parse("tags=a%2Fb").unwrap();
        assert!(!q.tags_all);
        assert!(matches!(
            ListQuery::parse("size=abc"),
            Err(StoreError::InvalidSize(_))
        ));
        assert!(matches!(
            ListQuery::parse("size=1001"),
            Err(StoreError::InvalidSize(_))
        ));
        assert!(matches!(
            ListQuery::parse("tags="),
            Err(StoreError::InvalidOptions(_))
        ));
    }

    #[test]
    fn offsets_round_trip_and_reject_garbage() {
        let id = "6f1e9e2a-0000-4000-8000-000000000001";
        assert_eq!(decode_offset(&encode_offset(id)).unwrap(), id);
        assert!(decode_offset("%%%").is_err());
    }

    #[test]
    fn uuid_or_endpoint_key() {
        assert!(is_uuid("6f1e9e2a-0000-4000-8000-000000000001"));
        assert!(!is_uuid("my-service"));
    }
}
