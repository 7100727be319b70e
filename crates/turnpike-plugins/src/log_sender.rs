//! What the network log plugins (tcp-log, udp-log) share: a bounded queue per destination and
//! a sender thread that owns the socket, so a request's log phase only queues its entry and a
//! slow or absent receiver never holds a request. Entries that do not fit are dropped and
//! counted, and the drop is logged once per burst. Destinations are shared by every config
//! naming the same one (node state, `crate::Runtime`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Entries waiting for a destination's sender.
const QUEUE: usize = 10_000;

/// One destination's queue.
pub struct Sender {
    queue: SyncSender<String>,
    dropped: AtomicU64,
    name: &'static str,
}

impl Sender {
    /// Queues `entry`; drops it (counted) when the sender is behind.
    pub fn send(&self, entry: String) {
        match self.queue.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed);
                if dropped.is_multiple_of(10_000) {
                    tracing::warn!("{}: the sender is behind; log entries dropped", self.name);
                }
            }
        }
    }
}

/// The node's senders, by destination key.
#[derive(Default)]
pub struct Senders(Mutex<HashMap<String, Arc<Sender>>>);

impl Senders {
    /// The sender for `key`, started with `run` (which receives entries until the node's
    /// configs stop naming the destination and the queue closes) when there is none yet.
    pub fn get(
        &self,
        spawner: &crate::spawner::Spawner,
        name: &'static str,
        key: String,
        run: impl FnOnce(Receiver<String>) + Send + 'static,
    ) -> Result<Arc<Sender>, String> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get(&key) {
            return Ok(s.clone());
        }
        let (tx, rx) = sync_channel(QUEUE);
        spawner
            .spawn(name, move || run(rx))
            .map_err(|e| format!("cannot start the {name} sender: {e}"))?;
        let s = Arc::new(Sender {
            queue: tx,
            dropped: AtomicU64::new(0),
            name,
        });
        m.insert(key, s.clone());
        Ok(s)
    }
}

/// A network log plugin's config as built: its destination's queue and its
/// `custom_fields_by_lua`. As a handler (tcp-log, udp-log), it queues each entry's text.
pub struct Entries {
    pub sender: Arc<Sender>,
    fields: Option<crate::lua::LogFields>,
}

impl Entries {
    pub fn new(
        plugin: &'static str,
        sender: Arc<Sender>,
        custom_fields: Option<&serde_json::Map<String, serde_json::Value>>,
        ctx: &crate::BuildContext<'_>,
    ) -> Entries {
        Entries {
            sender,
            fields: crate::lua::LogFields::new(plugin, custom_fields, ctx.runtime.lua.settings()),
        }
    }

    /// The entry as Kong serializes it, custom fields applied.
    pub fn text(&self, entry: &crate::log::LogEntry<'_>) -> String {
        crate::lua::log_text(entry, self.fields.as_ref())
    }
}

impl crate::Handler for Entries {
    fn phases(&self) -> crate::Phases {
        crate::Phases::LOG
    }
    fn log_headers(&self) -> bool {
        true
    }
    fn log(&self, entry: &crate::log::LogEntry<'_>) {
        self.sender.send(self.text(entry));
    }
    fn stream_log(&self, entry: &crate::log::StreamLogEntry<'_>) {
        self.sender
            .send(crate::lua::stream_log_text(entry, self.fields.as_ref()));
    }
}
