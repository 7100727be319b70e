//! A real LDAP server for tests: OpenLDAP's `slapd` from the system's packages, in a temp dir,
//! on free ports (plain with StartTLS, and ldaps), with a self-signed certificate for
//! `localhost`, an MDB database under `dc=example,dc=com` and users `uid=<name>,ou=people`
//! added with `slapadd`. Stopped on drop; can be killed and restarted.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Slapd {
    /// Plain LDAP (StartTLS offered).
    pub port: u16,
    /// LDAP over TLS.
    pub tls_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

pub const BASE_DN: &str = "ou=people,dc=example,dc=com";

impl Slapd {
    /// A server with these (user, password) pairs.
    pub fn start(users: &[(&str, &str)]) -> Slapd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (cert, key) = super::cert_for("localhost");
        std::fs::write(d.join("cert.pem"), cert).unwrap();
        std::fs::write(d.join("key.pem"), key).unwrap();
        std::fs::create_dir(d.join("db")).unwrap();
        let p = |f: &str| d.join(f).to_str().unwrap().to_string();
        let conf = format!(
            "include /etc/ldap/schema/core.schema\n\
             include /etc/ldap/schema/cosine.schema\n\
             include /etc/ldap/schema/inetorgperson.schema\n\
             modulepath /usr/lib/ldap\n\
             moduleload back_mdb\n\
             pidfile {pid}\n\
             TLSCertificateFile {cert}\n\
             TLSCertificateKeyFile {key}\n\
             database mdb\n\
             maxsize 10485760\n\
             suffix \"dc=example,dc=com\"\n\
             rootdn \"cn=admin,dc=example,dc=com\"\n\
             rootpw admin-secret\n\
             directory {db}\n",
            pid = p("slapd.pid"),
            cert = p("cert.pem"),
            key = p("key.pem"),
            db = p("db"),
        );
        std::fs::write(d.join("slapd.conf"), conf).unwrap();
        let mut ldif = String::from(
            "dn: dc=example,dc=com\nobjectClass: dcObject\nobjectClass: organization\no: Example\ndc: example\n\n\
             dn: ou=people,dc=example,dc=com\nobjectClass: organizationalUnit\nou: people\n\n",
        );
        for (user, pass) in users {
            ldif.push_str(&format!(
                "dn: uid={user},{BASE_DN}\nobjectClass: inetOrgPerson\nuid: {user}\ncn: {user}\nsn: {user}\nuserPassword: {pass}\n\n"
            ));
        }
        std::fs::write(d.join("data.ldif"), ldif).unwrap();
        let out = Command::new("slapadd")
            .args(["-f", &p("slapd.conf"), "-l", &p("data.ldif")])
            .output()
            .expect("slapadd (install the slapd package)");
        assert!(out.status.success(), "slapadd: {out:?}");
        let mut s = Slapd {
            port: super::free_port(),
            tls_port: super::free_port(),
            dir,
            child: None,
        };
        s.resume();
        s
    }

    /// Starts (again) the server on the same ports.
    pub fn resume(&mut self) {
        let conf = self.dir.path().join("slapd.conf");
        let urls = format!(
            "ldap://127.0.0.1:{}/ ldaps://127.0.0.1:{}/",
            self.port, self.tls_port
        );
        let slapd = ["/usr/sbin/slapd", "slapd"]
            .into_iter()
            .find(|c| std::path::Path::new(c).exists())
            .unwrap_or("slapd");
        let child = Command::new(slapd)
            .args(["-f", conf.to_str().unwrap(), "-h", &urls, "-d", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start slapd (install the slapd package)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", self.tls_port)).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        panic!("slapd did not start");
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Slapd {
    fn drop(&mut self) {
        self.kill();
    }
}
