//! Running the plugin servers that have a start command (Kong's `process.lua`): each started
//! with `exec <start_cmd>` through the shell, its output (stdout and stderr) logged line by line
//! as `[name:pid] line`, started again when it exits (at most once a second), never again when
//! the command is not found (exit status 127). A server without a start command is managed
//! outside the gateway.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use turnpike_config::conf::PluginServerConf;

/// One supervised server.
pub struct Supervised {
    name: String,
    command: String,
    child: Mutex<Option<Child>>,
    stopping: AtomicBool,
    /// Starts so far: instances started on an earlier run of the server are gone.
    pub generation: AtomicU64,
}

impl Supervised {
    /// Asks the server to end (SIGTERM) and keeps it from being started again.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(child) = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
    }
}

/// Starts the server's supervising thread, when it has a start command.
pub fn supervise(server: &PluginServerConf) -> Option<Arc<Supervised>> {
    let command = server.start_command.clone()?;
    let s = Arc::new(Supervised {
        name: server.name.clone(),
        command,
        child: Mutex::new(None),
        stopping: AtomicBool::new(false),
        generation: AtomicU64::new(0),
    });
    let run = s.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("pluginserver-{}", server.name))
        .spawn(move || run_forever(&run));
    if let Err(e) = spawned {
        tracing::error!(
            "[pluginserver] cannot start a thread for '{}': {e}",
            server.name
        );
    }
    Some(s)
}

fn run_forever(s: &Supervised) {
    let mut next_spawn = Instant::now();
    while !s.stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now < next_spawn {
            std::thread::sleep(next_spawn - now);
        }
        next_spawn = Instant::now() + Duration::from_secs(1);
        tracing::info!(
            "[pluginserver] starting pluginserver process for {}",
            s.name
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("exec {}", s.command))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl in the child before exec: the server gets SIGTERM when this thread (which
        // lives as long as the node) ends, so no server outlives its gateway.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("[pluginserver] cannot start '{}': {e}", s.name);
                continue;
            }
        };
        let pid = child.id();
        s.generation.fetch_add(1, Ordering::SeqCst);
        tracing::info!("[pluginserver] started, pid {pid}");
        let readers: Vec<_> = [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|out| {
            let prefix = format!("[{}:{pid}] ", s.name);
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if !line.is_empty() {
                        tracing::info!("{prefix}{line}");
                    }
                }
            })
        })
        .collect();
        *s.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        for r in readers {
            let _ = r.join();
        }
        let status = s
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .map(|mut c| c.wait());
        match status {
            Some(Ok(st)) if st.code() == Some(127) => {
                tracing::error!(
                    "[pluginserver] external pluginserver \"{}\" start command \"{}\" exited with \"command not found\"",
                    s.name,
                    s.command
                );
                break;
            }
            Some(Ok(st)) => {
                tracing::info!("external pluginserver '{}' terminated: {st}", s.name)
            }
            Some(Err(e)) => tracing::info!("external pluginserver '{}' terminated: {e}", s.name),
            None => {}
        }
    }
    tracing::info!(
        "[pluginserver] exiting: pluginserver '{}' not respawned.",
        s.name
    );
}
