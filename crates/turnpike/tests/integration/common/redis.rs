//! A real Redis for tests: `redis-server` from the system's packages, in a temp dir, on a free
//! port, with persistence off. Stopped on drop; can be killed and restarted on the same port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Serve TLS only (a self-signed certificate for `localhost`) instead of plain TCP.
    tls: bool,
}

impl Redis {
    pub fn start() -> Redis {
        let mut r = Redis {
            port: super::free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
            tls: false,
        };
        r.resume();
        r
    }

    /// A Redis that only speaks TLS, with a self-signed certificate for `localhost`.
    pub fn start_tls() -> Redis {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = super::cert_for("localhost");
        std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        let mut r = Redis {
            port: super::free_port(),
            dir,
            child: None,
            tls: true,
        };
        r.resume();
        r
    }

    /// Starts (again) the server on the same port (empty: nothing is persisted).
    pub fn resume(&mut self) {
        let port = self.port.to_string();
        let d = self.dir.path();
        let (cert, key) = (d.join("cert.pem"), d.join("key.pem"));
        let mut args: Vec<&str> = if self.tls {
            vec![
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-cert-file",
                cert.to_str().unwrap(),
                "--tls-key-file",
                key.to_str().unwrap(),
                "--tls-ca-cert-file",
                cert.to_str().unwrap(),
                "--tls-auth-clients",
                "no",
            ]
        } else {
            vec!["--port", &port]
        };
        args.extend(["--bind", "127.0.0.1"]);
        let child = Command::new("redis-server")
            .args(args)
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir.path().to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (install the redis-server package)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let up = if self.tls {
                std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                self.command(&["PING"]).is_some_and(|r| r.contains("PONG"))
            };
            if up {
                return;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        panic!("redis-server did not start");
    }

    /// Kills the server at once (SIGKILL: connections drop without goodbye).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs one command (inline protocol) and returns the raw reply.
    pub fn command(&self, args: &[&str]) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
