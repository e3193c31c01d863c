//! A throwaway PostgreSQL cluster on loopback, for tests and benchmarks:
//! initdb in a directory of its own as an unprivileged user (the server
//! refuses root), password authentication, a free port; stopped and
//! removed when dropped. Standard library only: xtask and the test
//! binaries both include this file.

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
    gid: u32,
}

/// The user the server runs as: `postgres` (or `nobody`) under root, else us.
fn server_ids() -> (u32, u32) {
    let id = |flag: &str, user: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, user]).output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // SAFETY: as above.
        return unsafe { (libc::geteuid(), libc::getegid()) };
    }
    ["postgres", "nobody"]
        .iter()
        .find_map(|u| Some((id("-u", u)?, id("-g", u)?)))
        .expect("a postgres or nobody user to run the server as")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Cluster {
    /// initdb + pg_ctl start in a new directory under `parent`; panics
    /// (with the server's log) when it cannot.
    pub fn start(parent: &Path) -> Cluster {
        assert!(
            Path::new(PG_BIN).join("initdb").exists(),
            "PostgreSQL 15 is not installed ({PG_BIN}/initdb): `cargo xtask setup` installs postgresql-15"
        );
        let (uid, gid) = server_ids();
        let dir = parent.join(format!(
            "pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
        ));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown cluster directory");
        let pwfile = dir.join("pw");
        std::fs::write(&pwfile, PASSWORD).expect("password file");
        std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid)).expect("chown password file");
        let cluster = Cluster {
            dir,
            port: free_port(),
            uid,
            gid,
        };
        let out = cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.dir.join("data"))
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
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.start_again();
        cluster
    }

    /// A PostgreSQL program, run as the server's user.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(Path::new(PG_BIN).join(program));
        c.uid(self.uid).gid(self.gid).env_remove("PGPASSWORD");
        c
    }

    /// pg_ctl start on the cluster's directory and port.
    pub fn start_again(&self) {
        let log = self.dir.join("server.log");
        let out = self
            .command("pg_ctl")
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
            .expect("run pg_ctl");
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// The URL of database `db`, created on first use.
    pub fn url(&self, db: &str) -> String {
        let exists = self.psql(
            "postgres",
            &format!("SELECT 1 FROM pg_database WHERE datname = '{db}'"),
        );
        if exists.trim() != "1" {
            self.psql("postgres", &format!("CREATE DATABASE \"{db}\""));
        }
        format!("postgres://{USER}:{PASSWORD}@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs one SQL command in `db` with psql; its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new(Path::new(PG_BIN).join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER])
            .args([
                "-d",
                db,
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// pg_ctl stop: the database goes away (fast shutdown, connections cut).
    pub fn stop(&self) {
        self.pg_ctl_stop("fast");
    }

    fn pg_ctl_stop(&self, mode: &str) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", mode, "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Cluster {
    /// Stops the server and removes its directory (what dropping it does).
    pub fn stop_and_remove(&self) {
        self.pg_ctl_stop("immediate");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_and_remove();
    }
}
