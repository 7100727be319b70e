//! file-log (PRIORITY 9): each request's log entry, as Kong serializes it, appended as one
//! JSON line to `path`. The request path only queues the line (bounded); a writer thread per
//! file appends them, so a slow disk never holds a request. Lines that do not fit in the queue
//! are dropped and counted (`dropped_lines`), and the drop is logged once per burst.

mod schema;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::log::LogEntry;
use crate::{Handler, PluginSpec};

pub struct FileLog;

/// file-log's part of the node's [`crate::Runtime`]: one writer per (path, reopen), shared by
/// every config naming the file, and the lines dropped because a writer was behind.
#[derive(Default)]
pub struct State {
    writers: Mutex<HashMap<(String, bool), Arc<Writer>>>,
    pub dropped: Arc<AtomicU64>,
}

/// Lines waiting for a file's writer.
const QUEUE: usize = 10_000;

/// A file's writer: its queue and what was dropped.
struct Writer {
    queue: SyncSender<String>,
    dropped: AtomicU64,
    /// The node's count over every file.
    total_dropped: Arc<AtomicU64>,
}

/// The writer of a file (see [`State`]).
fn writer(
    state: &State,
    spawner: &crate::spawner::Spawner,
    path: &str,
    reopen: bool,
) -> Result<Arc<Writer>, String> {
    let mut writers = state.writers.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(w) = writers.get(&(path.to_string(), reopen)) {
        return Ok(w.clone());
    }
    let (tx, rx) = sync_channel(QUEUE);
    let file = path.to_string();
    spawner
        .spawn("file-log", move || write_lines(&file, reopen, rx))
        .map_err(|e| format!("cannot start the file-log writer: {e}"))?;
    let w = Arc::new(Writer {
        queue: tx,
        dropped: AtomicU64::new(0),
        total_dropped: state.dropped.clone(),
    });
    writers.insert((path.to_string(), reopen), w.clone());
    Ok(w)
}

fn open(path: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The writer thread: appends what is queued, in batches; with `reopen`, the file is opened
/// again for every batch (a rotated file is followed).
fn write_lines(path: &str, reopen: bool, rx: Receiver<String>) {
    let mut file: Option<std::fs::File> = None;
    let mut failing = false;
    while let Ok(first) = rx.recv() {
        let mut batch = first;
        batch.push('\n');
        while let Ok(more) = rx.try_recv() {
            batch.push_str(&more);
            batch.push('\n');
            if batch.len() > 1 << 20 {
                break;
            }
        }
        if reopen || file.is_none() {
            file = match open(path) {
                Ok(f) => Some(f),
                Err(e) => {
                    if !failing {
                        tracing::error!("file-log: cannot open {path}: {e}");
                        failing = true;
                    }
                    None
                }
            };
        }
        if let Some(f) = file.as_mut() {
            match f.write_all(batch.as_bytes()) {
                Ok(()) => failing = false,
                Err(e) => {
                    if !failing {
                        tracing::error!("file-log: cannot write {path}: {e}");
                        failing = true;
                    }
                    file = None;
                }
            }
        }
    }
}

struct Configured {
    writer: Arc<Writer>,
    /// `custom_fields_by_lua`, when set.
    fields: Option<crate::lua::LogFields>,
}

impl PluginSpec for FileLog {
    fn name(&self) -> &'static str {
        "file-log"
    }
    fn priority(&self) -> i32 {
        9
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        let path = config["path"].as_str().unwrap_or_default();
        // Kong's rule for the path: no characters a shell would act on.
        if path.is_empty()
            || path
                .chars()
                .any(|c| !(c.is_alphanumeric() || "/\\._- ".contains(c)))
        {
            errs.push(("path".into(), "not a valid filename".into()));
        }
        errs
    }
    fn lua_checks(&self, config: &Value, lua: &Arc<crate::lua::Settings>) -> Vec<(String, String)> {
        crate::lua::check_log_fields("file-log", config, lua)
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        Ok(Arc::new(Configured {
            writer: writer(
                &ctx.runtime.file_log,
                &ctx.runtime.spawner,
                &c.path,
                c.reopen,
            )?,
            fields: crate::lua::LogFields::new(
                "file-log",
                c.custom_fields_by_lua.as_ref(),
                ctx.runtime.lua.settings(),
            ),
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::LOG
    }
    fn log_headers(&self) -> bool {
        true
    }
    fn log(&self, entry: &LogEntry<'_>) {
        self.write(crate::lua::log_text(entry, self.fields.as_ref()));
    }

    fn stream_log(&self, entry: &crate::log::StreamLogEntry<'_>) {
        self.write(crate::lua::stream_log_text(entry, self.fields.as_ref()));
    }
}

impl Configured {
    fn write(&self, line: String) {
        match self.writer.queue.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.writer.total_dropped.fetch_add(1, Ordering::Relaxed);
                let dropped = self.writer.dropped.fetch_add(1, Ordering::Relaxed);
                if dropped.is_multiple_of(10_000) {
                    tracing::warn!("file-log: the writer is behind; log lines dropped");
                }
            }
        }
    }
}
