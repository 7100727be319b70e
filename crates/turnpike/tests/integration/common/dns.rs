//! A real DNS server for tests: dnsmasq (the `dnsmasq-base` package) on a free UDP port in a
//! temp dir, authoritative for `.test`, answering from a hosts file the test rewrites (read
//! again on SIGHUP) with a TTL of 1 s, plus fixed SRV records. Can be killed (a resolver outage).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Dnsmasq {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Dnsmasq {
    /// `hosts`: hosts-file lines; `srv`: dnsmasq `srv-host` values
    /// (`_service._proto.name,target,port,priority,weight`).
    pub fn start(hosts: &str, srv: &[&str]) -> Dnsmasq {
        // Picked free, then bound by dnsmasq: another process can take it between the two;
        // a second port is tried then.
        for attempt in 0..3 {
            match Self::try_start(hosts, srv) {
                Ok(d) => return d,
                Err(e) if attempt < 2 => eprintln!("dnsmasq: {e}; trying another port"),
                Err(e) => panic!("dnsmasq did not start: {e}"),
            }
        }
        unreachable!()
    }

    fn try_start(hosts: &str, srv: &[&str]) -> Result<Dnsmasq, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hosts"), hosts).unwrap();
        let port = free_udp_port();
        let mut args = vec![
            "--keep-in-foreground".to_string(),
            "--conf-file=/dev/null".into(),
            "--no-resolv".into(),
            "--no-hosts".into(),
            "--local=/test/".into(),
            format!("--addn-hosts={}", dir.path().join("hosts").display()),
            "--local-ttl=1".into(),
            format!("--port={port}"),
            "--listen-address=127.0.0.1".into(),
            "--bind-interfaces".into(),
            "--pid-file=".into(),
            "--log-facility=-".into(),
        ];
        // As root dnsmasq would switch to `nobody`, who cannot read the temp dir.
        if unsafe { libc::geteuid() } == 0 {
            args.push("--user=root".into());
        }
        args.extend(srv.iter().map(|s| format!("--srv-host={s}")));
        // /usr/sbin is not on every user's PATH.
        let program = if std::path::Path::new("/usr/sbin/dnsmasq").exists() {
            "/usr/sbin/dnsmasq"
        } else {
            "dnsmasq"
        };
        // Its log (stderr, --log-facility=-) says why it stopped when it exits at start.
        let log = std::fs::File::create(dir.path().join("dnsmasq.log")).unwrap();
        let child = Command::new(program)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start dnsmasq (install the dnsmasq-base package)");
        let mut d = Dnsmasq {
            port,
            dir,
            child: Some(child),
        };
        // Up once it answers a query. (Probing by binding its port would race with dnsmasq
        // binding it.)
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        probe
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        // A query for `probe.test` A (id 0x1234, recursion desired).
        let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in ["probe", "test"] {
            query.push(label.len() as u8);
            query.extend_from_slice(label.as_bytes());
        }
        query.extend_from_slice(&[0, 0, 1, 0, 1]);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 512];
        loop {
            let _ = probe.send_to(&query, ("127.0.0.1", port));
            if matches!(probe.recv_from(&mut buf), Ok((n, _)) if n >= 12 && buf[..2] == [0x12, 0x34])
            {
                return Ok(d);
            }
            if let Some(status) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                d.child = None;
                let log =
                    std::fs::read_to_string(d.dir.path().join("dnsmasq.log")).unwrap_or_default();
                return Err(format!(
                    "it exited at start ({status}), port {port}: {}",
                    log.trim()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("no answer on port {port} within 20 s"));
            }
        }
    }

    /// Replaces the hosts file and makes dnsmasq read it again.
    pub fn set_hosts(&self, hosts: &str) {
        std::fs::write(self.dir.path().join("hosts"), hosts).unwrap();
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Stops the server at once: queries go unanswered.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
