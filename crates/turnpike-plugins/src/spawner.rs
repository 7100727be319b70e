//! Where the plugins' background threads (log senders and writers) start from.
//!
//! A thread takes the CPU priority of the thread that starts it. Plugins are built by the
//! config builder, which runs at the control plane's lower priority; a log sender started from
//! there would fall behind the traffic it logs on a busy node, and its bounded queue would drop
//! entries. The node's [`Spawner`] is made at start-up by a thread at the proxy workers'
//! priority and starts every such thread from a thread of its own at that priority, whichever
//! thread asks.

use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};

struct Job {
    name: String,
    run: Box<dyn FnOnce() + Send>,
    started: SyncSender<std::io::Result<()>>,
}

/// Starts threads at the priority of the thread that made it (see the module). The default
/// one starts them from the thread that asks (tests, tools).
#[derive(Clone, Default)]
pub struct Spawner {
    jobs: Option<Sender<Job>>,
}

impl Spawner {
    /// A spawner whose threads get the calling thread's priority; its own thread (`spawner`)
    /// sleeps until asked, and ends with the last clone.
    pub fn new() -> Spawner {
        let (jobs, asked) = channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                for job in asked {
                    let started = std::thread::Builder::new()
                        .name(job.name)
                        .spawn(job.run)
                        .map(|_| ());
                    let _ = job.started.send(started);
                }
            });
        match spawned {
            Ok(_) => Spawner { jobs: Some(jobs) },
            Err(e) => {
                tracing::warn!("plugins: cannot start the spawner thread ({e}); threads start from their callers");
                Spawner::default()
            }
        }
    }

    /// Starts `run` on a thread named `name`.
    pub fn spawn(&self, name: &str, run: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let direct = |name: &str, run: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(run)
                .map(|_| ())
        };
        let Some(jobs) = &self.jobs else {
            return direct(name, Box::new(run));
        };
        let (started, result) = sync_channel(1);
        let job = Job {
            name: name.into(),
            run: Box::new(run),
            started,
        };
        match jobs.send(job) {
            Ok(()) => result
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("the spawner thread stopped"))),
            // Its thread is gone: start it from here rather than not at all.
            Err(std::sync::mpsc::SendError(job)) => direct(&job.name, job.run),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice() -> i32 {
        // SAFETY: getpriority takes plain integers; errno is not read (0 is a valid answer).
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::syscall(libc::SYS_gettid) as u32) }
    }

    /// Threads a lowered thread asks for keep the priority of the spawner's maker.
    #[test]
    fn threads_get_the_makers_priority_whoever_asks() {
        let spawner = Spawner::new();
        let maker = nice();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            // SAFETY: as above.
            unsafe {
                libc::setpriority(
                    libc::PRIO_PROCESS,
                    libc::syscall(libc::SYS_gettid) as u32,
                    maker + 5,
                )
            };
            let asker = nice();
            let (t, r) = channel();
            spawner
                .spawn("spawned", move || {
                    let name = std::thread::current().name().map(String::from);
                    let _ = t.send((nice(), name));
                })
                .unwrap();
            let (spawned, name) = r.recv().unwrap();
            let (d, dr) = channel();
            Spawner::default()
                .spawn("direct", move || {
                    let _ = d.send(nice());
                })
                .unwrap();
            let _ = tx.send((asker, spawned, name, dr.recv().unwrap()));
        })
        .join()
        .unwrap();
        let (asker, spawned, name, direct) = rx.recv().unwrap();
        assert_eq!(asker, (maker + 5).min(19));
        assert_eq!(
            spawned, maker,
            "the spawner's thread, not the asker's priority"
        );
        assert_eq!(name.as_deref(), Some("spawned"));
        assert_eq!(direct, asker, "the default spawner starts from the caller");
    }
}
