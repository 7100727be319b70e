//! A real PostgreSQL for tests: `initdb` + `postgres` from the system's packages, in a temp dir,
//! on a free port. Stopped on drop; can be stopped and restarted on the same data and port to
//! simulate an outage.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Postgres {
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    child: Option<Child>,
    /// (uid, gid) to run as: PostgreSQL refuses to run as root.
    owner: Option<(u32, u32)>,
}

/// The directory holding `initdb` and `postgres` (Debian keeps them out of PATH).
fn pg_bin() -> PathBuf {
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        if let Some(v) = versions
            .into_iter()
            .rev()
            .find(|p| p.join("initdb").exists())
        {
            return v;
        }
    }
    PathBuf::from("/usr/bin")
}

fn id_of(user: &str) -> Option<(u32, u32)> {
    let out = Command::new("id").arg(user).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let num = |key: &str| -> Option<u32> {
        let s = text.split(key).nth(1)?;
        s.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    Some((num("uid=")?, num("gid=")?))
}

impl Postgres {
    pub fn start() -> Postgres {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let owner = if unsafe { libc::geteuid() } == 0 {
            Some(
                id_of("postgres")
                    .or_else(|| id_of("nobody"))
                    .expect("a non-root user for postgres"),
            )
        } else {
            None
        };
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
        }
        let mut pg = Postgres {
            port: super::free_port(),
            dir,
            bin: pg_bin(),
            child: None,
            owner,
        };
        let out = pg
            .command("initdb")
            .args([
                "-D",
                pg.data().to_str().unwrap(),
                "-U",
                "kong",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .expect("initdb (install the postgresql package)");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.resume();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, name: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(self.bin.join(name));
        c.stdout(Stdio::null()).env_remove("PGDATA");
        if let Some((uid, gid)) = self.owner {
            c.uid(uid).gid(gid);
        }
        c
    }

    /// Starts (again) the server on the same data and port.
    pub fn resume(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .unwrap();
        if let Some((uid, gid)) = self.owner {
            for f in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
                let _ = std::os::unix::fs::chown(f.path(), Some(uid), Some(gid));
            }
        }
        let child = self
            .command("postgres")
            .args([
                "-D",
                self.data().to_str().unwrap(),
                "-p",
                &self.port.to_string(),
                "-k",
                self.dir.path().to_str().unwrap(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ])
            .stderr(log)
            .spawn()
            .expect("start postgres");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                // Accepting TCP is not yet accepting queries; give start-up a moment.
                std::thread::sleep(Duration::from_millis(300));
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("postgres did not start");
    }

    /// Stops the server (fast shutdown: clients are disconnected at once).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill with a valid pid and signal.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
            let _ = c.wait();
        }
    }

    /// TURNPIKE_* settings that point a gateway or a CLI command at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("TURNPIKE_DATABASE", "postgres".into()),
            ("TURNPIKE_PG_HOST", "127.0.0.1".into()),
            ("TURNPIKE_PG_PORT", self.port.to_string()),
            ("TURNPIKE_PG_USER", "kong".into()),
            ("TURNPIKE_PG_DATABASE", "postgres".into()),
            ("TURNPIKE_PG_TIMEOUT", "2000".into()),
        ]
    }

    /// One statement through `psql`: its rows, unaligned, `|` between columns.
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "kong", "-d", "postgres", "-qAt", "-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A `psql` session reading statements from its stdin as they are written (a transaction
    /// held open across other clients' requests).
    pub fn session(&self) -> std::process::Child {
        Command::new(self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args([
                "-U",
                "kong",
                "-d",
                "postgres",
                "-qAt",
                "-v",
                "ON_ERROR_STOP=1",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP relay in front of PostgreSQL that counts, per connection's `application_name`, the
/// `Sync` messages clients send: one per round trip a client waits on (a query's
/// Bind/Execute/Sync, or a bare Sync to check a connection).
pub struct SyncTap {
    pub port: u16,
    counts: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

impl SyncTap {
    /// Starts relaying to `pg` on a free port, on the calling runtime.
    pub async fn start(pg: &Postgres) -> SyncTap {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let (server, shared) = (pg.port, counts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = tokio::net::TcpStream::connect(("127.0.0.1", server)).await
                else {
                    continue;
                };
                let counts = shared.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut ur, mut uw) = upstream.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut ur, &mut cw).await;
                        let _ = cw.shutdown().await;
                    });
                    // Client to server: startup packets (length, code, body) until the
                    // startup message, then typed messages (type, length, body).
                    let mut name = String::new();
                    let mut started = false;
                    loop {
                        let mut head = [0u8; 5];
                        let typed = usize::from(started);
                        if cr.read_exact(&mut head[..4 + typed]).await.is_err() {
                            break;
                        }
                        let len_at = &head[typed..typed + 4];
                        let len = u32::from_be_bytes(len_at.try_into().unwrap()) as usize;
                        let mut body = vec![0u8; len.saturating_sub(4)];
                        if cr.read_exact(&mut body).await.is_err() {
                            break;
                        }
                        if started {
                            if head[0] == b'S' {
                                *counts.lock().unwrap().entry(name.clone()).or_insert(0) += 1;
                            }
                        } else if body.len() >= 4 && body[..4] == [0, 3, 0, 0] {
                            // The startup message: protocol 3.0, then name\0value\0 pairs.
                            let params: Vec<&[u8]> = body[4..].split(|b| *b == 0).collect();
                            for kv in params.chunks(2) {
                                if kv.len() == 2 && kv[0] == b"application_name" {
                                    name = String::from_utf8_lossy(kv[1]).into_owned();
                                }
                            }
                            started = true;
                        }
                        if uw.write_all(&head[..4 + typed]).await.is_err()
                            || uw.write_all(&body).await.is_err()
                        {
                            break;
                        }
                    }
                });
            }
        });
        SyncTap { port, counts }
    }

    /// Syncs sent so far on connections whose `application_name` starts with `prefix`.
    pub fn syncs(&self, prefix: &str) -> usize {
        let counts = self.counts.lock().unwrap();
        counts
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, c)| c)
            .sum()
    }
}
