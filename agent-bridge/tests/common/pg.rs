//! A real PostgreSQL cluster for the tests: initdb in a temp directory as
//! an unprivileged user, password authentication, a free loopback port;
//! stopped and removed when dropped.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
pub const USER: &str = "bridge";
pub const PASSWORD: &str = "fleet-secret";

pub struct Cluster {
    dir: PathBuf,
    pub port: u16,
    uid: u32,
}

/// A user the server may run as (it refuses root).
fn server_uid() -> (u32, u32) {
    if !nix::unistd::geteuid().is_root() {
        return (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
    }
    let user = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .or_else(|| nix::unistd::User::from_name("nobody").ok().flatten())
        .expect("a postgres or nobody user to run the server as");
    (user.uid.as_raw(), user.gid.as_raw())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn as_user(cmd: &mut Command, uid: u32, gid: u32) -> &mut Command {
    cmd.uid(uid).gid(gid).env_remove("PGPASSWORD")
}

impl Cluster {
    /// initdb + pg_ctl start; panics (with the server's log) when it cannot.
    pub fn start() -> Cluster {
        assert!(
            Path::new(PG_BIN).join("initdb").exists(),
            "PostgreSQL 15 is not installed ({PG_BIN}/initdb): `cargo xtask setup` installs postgresql-15"
        );
        let (uid, gid) = server_uid();
        let dir = std::env::temp_dir().join(format!(
            "bridge-test-pg-{}-{}",
            std::process::id(),
            probe::clock::now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        nix::unistd::chown(&dir, Some(uid.into()), Some(gid.into())).unwrap();
        let pwfile = dir.join("pw");
        std::fs::write(&pwfile, PASSWORD).unwrap();
        nix::unistd::chown(&pwfile, Some(uid.into()), Some(gid.into())).unwrap();
        let data = dir.join("data");
        let out = as_user(
            &mut Command::new(Path::new(PG_BIN).join("initdb")),
            uid,
            gid,
        )
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            USER,
            "--auth=scram-sha-256",
            "--no-sync",
            "-E",
            "UTF8",
        ])
        .arg(format!("--pwfile={}", pwfile.display()))
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let cluster = Cluster { dir, port, uid };
        cluster.start_again();
        cluster
    }

    /// pg_ctl start on the cluster's directory and port.
    pub fn start_again(&self) {
        let (_, gid) = server_uid();
        let log = self.dir.join("server.log");
        let out = as_user(
            &mut Command::new(Path::new(PG_BIN).join("pg_ctl")),
            self.uid,
            gid,
        )
        .arg("-D")
        .arg(self.dir.join("data"))
        .arg("-l")
        .arg(&log)
        .args(["-w", "-t", "60", "start", "-o"])
        .arg(format!(
            "-h 127.0.0.1 -p {} -k {} -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        ))
        .stdout(Stdio::null())
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// The URL of database `db` (created on first use).
    pub fn url(&self, db: &str) -> String {
        let admin = format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/postgres",
            self.port
        );
        let mut c = postgres::Client::connect(&admin, postgres::NoTls).unwrap();
        let exists = c
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
            .unwrap()
            .is_some();
        if !exists {
            c.batch_execute(&format!("CREATE DATABASE \"{db}\""))
                .unwrap();
        }
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}", self.port)
    }

    pub fn client(&self, db: &str) -> postgres::Client {
        postgres::Client::connect(&self.url(db), postgres::NoTls).unwrap()
    }

    /// pg_ctl stop: the database goes away (fast shutdown, connections cut).
    pub fn stop(&self) {
        self.pg_ctl_stop("fast");
    }

    fn pg_ctl_stop(&self, mode: &str) {
        let (_, gid) = server_uid();
        let _ = as_user(
            &mut Command::new(Path::new(PG_BIN).join("pg_ctl")),
            self.uid,
            gid,
        )
        .arg("-D")
        .arg(self.dir.join("data"))
        .args(["-m", mode, "-w", "stop"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.pg_ctl_stop("immediate");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
