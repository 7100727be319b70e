//! The access log (`proxy_access_log = PATH [combined|json]`, off by default: a line per request
//! costs throughput). Each worker formats its lines into its own buffer and appends the buffer
//! to the file when it passes 32 KiB and at least once a second (as nginx's `buffer=` and
//! `flush=`), so the request path does no system call for its line.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use http::{HeaderMap, Method, Uri, Version};

/// Written when a worker's buffer passes this.
const FLUSH_AT: usize = 32 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// nginx's `combined`.
    Combined,
    /// One JSON object per line.
    Json,
}

/// Where the access log goes, shared by the workers (opened once, O_APPEND).
#[derive(Debug)]
pub struct AccessLog {
    pub path: PathBuf,
    pub format: Format,
    file: File,
}

impl AccessLog {
    /// Parses `proxy_access_log` (`off` is `None`); a relative path is under `prefix`.
    pub fn open(value: Option<&str>, prefix: &Path) -> Result<Option<Arc<AccessLog>>, String> {
        let Some(v) = value else { return Ok(None) };
        let mut parts = v.split_whitespace();
        let Some(path) = parts.next() else {
            return Ok(None);
        };
        if path == "off" {
            return Ok(None);
        }
        let format = match parts.next() {
            None | Some("combined") => Format::Combined,
            Some("json") => Format::Json,
            Some(other) => {
                return Err(format!(
                    "proxy_access_log: unknown format '{other}' (combined or json)"
                ))
            }
        };
        let path = if Path::new(path).is_absolute() {
            PathBuf::from(path)
        } else {
            prefix.join(path)
        };
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("proxy_access_log: cannot open {}: {e}", path.display()))?;
        Ok(Some(Arc::new(AccessLog { path, format, file })))
    }
}

/// What a line says of a request, gathered when its response starts.
pub struct AccessRecord {
    pub start: Instant,
    pub time: SystemTime,
    pub client_ip: IpAddr,
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub status: u16,
    pub referer: Option<http::HeaderValue>,
    pub user_agent: Option<http::HeaderValue>,
    pub request_id: http::HeaderValue,
}

impl AccessRecord {
    pub fn new<B>(
        start: Instant,
        client_ip: IpAddr,
        req: &http::Request<B>,
        request_id: &http::HeaderValue,
    ) -> AccessRecord {
        let h: &HeaderMap = req.headers();
        AccessRecord {
            start,
            time: SystemTime::now(),
            client_ip,
            method: req.method().clone(),
            uri: req.uri().clone(),
            version: req.version(),
            status: 0,
            referer: h.get(http::header::REFERER).cloned(),
            user_agent: h.get(http::header::USER_AGENT).cloned(),
            request_id: request_id.clone(),
        }
    }
}

/// A worker's side of the access log.
pub struct Writer {
    log: Arc<AccessLog>,
    buf: RefCell<Vec<u8>>,
}

/// nginx's `$time_local` in UTC: `22/Nov/2026:03:38:00 +0000`.
fn time_local(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = turnpike_plugins::clock::civil_from_days(secs.div_euclid(86400));
    let s = secs.rem_euclid(86400);
    format!(
        "{d:02}/{}/{y}:{:02}:{:02}:{:02} +0000",
        MONTHS[(m - 1) as usize],
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

fn text(v: &Option<http::HeaderValue>) -> String {
    v.as_ref().map_or("-".into(), |v| {
        String::from_utf8_lossy(v.as_bytes()).into_owned()
    })
}

impl Writer {
    pub fn new(log: Arc<AccessLog>) -> Writer {
        Writer {
            log,
            buf: RefCell::new(Vec::with_capacity(FLUSH_AT * 2)),
        }
    }

    /// Adds the line of a finished request.
    pub fn record(&self, r: &AccessRecord, body_bytes: u64) {
        let request = format!(
            "{} {} {:?}",
            r.method,
            r.uri.path_and_query().map_or("/", |p| p.as_str()),
            r.version
        );
        let mut buf = self.buf.borrow_mut();
        match self.log.format {
            Format::Combined => {
                let escaped = request.replace('"', "\\x22");
                let _ = writeln!(
                    buf,
                    "{} - - [{}] \"{escaped}\" {} {body_bytes} \"{}\" \"{}\"",
                    r.client_ip,
                    time_local(r.time),
                    r.status,
                    text(&r.referer).replace('"', "\\x22"),
                    text(&r.user_agent).replace('"', "\\x22"),
                );
            }
            Format::Json => {
                let line = serde_json::json!({
                    "time": time_local(r.time),
                    "client_ip": r.client_ip.to_string(),
                    "request": request,
                    "status": r.status,
                    "body_bytes_sent": body_bytes,
                    "request_time": r.start.elapsed().as_secs_f64(),
                    "referer": text(&r.referer),
                    "user_agent": text(&r.user_agent),
                    "request_id": String::from_utf8_lossy(r.request_id.as_bytes()),
                });
                let _ = writeln!(buf, "{line}");
            }
        }
        if buf.len() >= FLUSH_AT {
            drop(buf);
            self.flush();
        }
    }

    /// Appends what is buffered to the file.
    pub fn flush(&self) {
        let mut buf = self.buf.borrow_mut();
        if buf.is_empty() {
            return;
        }
        if let Err(e) = (&self.log.file).write_all(&buf) {
            tracing::error!("access log {}: {e}", self.log.path.display());
        }
        buf.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_local_is_nginxs() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_318_680);
        assert_eq!(time_local(t), "22/Nov/2026:03:38:00 +0000");
        assert_eq!(
            time_local(SystemTime::UNIX_EPOCH),
            "01/Jan/1970:00:00:00 +0000"
        );
    }
}
