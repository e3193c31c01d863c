//! The soak's three long-lived processes — the probe daemon, a bridge over
//! HTTP and a proxy over HTTP in front of a stdio server — started, killed
//! with SIGKILL and restarted the way a supervisor would, on fixed ports so
//! clients find them again. The daemon's DB lives on a tmpfs of its own,
//! so the soak can fill that filesystem without touching the machine's.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The DB filesystem's size: small enough to fill in a moment.
pub const FS_MIB: u64 = 128;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Role {
    Daemon,
    Bridge,
    Proxy,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Daemon, Role::Bridge, Role::Proxy];

    pub fn name(self) -> &'static str {
        match self {
            Role::Daemon => "daemon",
            Role::Bridge => "bridge",
            Role::Proxy => "proxy",
        }
    }
}

pub struct Fleet {
    pub bin: PathBuf,
    pub dir: PathBuf,
    /// The tmpfs the DB lives on.
    pub fs: PathBuf,
    pub socket: PathBuf,
    pub db: PathBuf,
    pub bridge_port: u16,
    pub proxy_port: u16,
    children: Mutex<BTreeMap<Role, Child>>,
    /// When each role was last (re)started.
    pub started: Mutex<BTreeMap<Role, Instant>>,
}

impl Fleet {
    pub fn start(bin: &Path, dir: &Path) -> anyhow::Result<Fleet> {
        let fs = dir.join("fs");
        std::fs::create_dir_all(&fs)?;
        crate::run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={FS_MIB}m"), "soak-db"])
                .arg(&fs),
        )?;
        let fleet = Fleet {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            socket: dir.join("probe.sock"),
            db: fs.join("evidence.db"),
            fs,
            bridge_port: free_port()?,
            proxy_port: free_port()?,
            children: Mutex::new(BTreeMap::new()),
            started: Mutex::new(BTreeMap::new()),
        };
        for role in Role::ALL {
            fleet.spawn(role)?;
        }
        Ok(fleet)
    }

    pub fn bridge_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.bridge_port)
    }

    pub fn proxy_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.proxy_port)
    }

    pub fn agent_bridge(&self) -> PathBuf {
        self.bin.join("agent-bridge")
    }

    pub fn probe(&self) -> PathBuf {
        self.bin.join("probe")
    }

    /// The live pid of `role`, if it runs.
    pub fn pid(&self, role: Role) -> Option<u32> {
        let mut children = self.children.lock().unwrap();
        let child = children.get_mut(&role)?;
        matches!(child.try_wait(), Ok(None)).then(|| child.id())
    }

    /// Starts `role` and waits until it answers.
    pub fn spawn(&self, role: Role) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", role.name())))?;
        let mut cmd = match role {
            Role::Daemon => {
                let mut c = Command::new(self.probe());
                c.args(["run", "--socket"])
                    .arg(&self.socket)
                    .arg("--db")
                    .arg(&self.db);
                c
            }
            Role::Bridge => {
                let mut c = Command::new(self.agent_bridge());
                c.arg("serve")
                    .args(["--http", &format!("127.0.0.1:{}", self.bridge_port)])
                    .args(LIMITS)
                    .arg("--probe-socket")
                    .arg(&self.socket);
                c
            }
            Role::Proxy => {
                let mut c = Command::new(self.agent_bridge());
                c.arg("proxy")
                    .args(["--http", &format!("127.0.0.1:{}", self.proxy_port)])
                    .args(LIMITS)
                    .arg("--probe-socket")
                    .arg(&self.socket)
                    .arg("--")
                    .arg(self.agent_bridge())
                    .args(["serve", "--stdio", "--no-probe"]);
                c
            }
        };
        // cargo points LD_LIBRARY_PATH into target/: workloads must not inherit it
        dies_with_the_soak(&mut cmd)
            .env_remove("LD_LIBRARY_PATH")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting the {}", role.name()))?;
        self.children.lock().unwrap().insert(role, child);
        self.started.lock().unwrap().insert(role, Instant::now());
        self.wait_ready(role)
    }

    /// Waits until `role` answers: the daemon its status, a server a
    /// connection on its port.
    fn wait_ready(&self, role: Role) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = match role {
                Role::Daemon => Command::new(self.probe())
                    .args(["status", "--socket"])
                    .arg(&self.socket)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success()),
                Role::Bridge => TcpStream::connect((Ipv4Addr::LOCALHOST, self.bridge_port)).is_ok(),
                Role::Proxy => TcpStream::connect((Ipv4Addr::LOCALHOST, self.proxy_port)).is_ok(),
            };
            if up {
                return Ok(());
            }
            if self.pid(role).is_none() {
                bail!(
                    "the {} exited before it answered; see {}",
                    role.name(),
                    self.dir.join(format!("{}.log", role.name())).display()
                );
            }
            if Instant::now() > deadline {
                bail!("the {} did not answer within 60 s", role.name());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs `role` and reaps it; its pid, or None if it was not running.
    pub fn kill(&self, role: Role) -> Option<u32> {
        let mut children = self.children.lock().unwrap();
        let child = children.get_mut(&role)?;
        let pid = child.id();
        let _ = child.kill();
        let _ = child.wait();
        Some(pid)
    }
}

/// Short limits, so the hostile clients' stalled bodies, idle connections
/// and abandoned sessions are reclaimed within the run.
const LIMITS: [&str; 6] = [
    "--body-timeout",
    "3",
    "--idle-timeout",
    "10",
    "--session-idle-timeout",
    "20",
];

impl Drop for Fleet {
    fn drop(&mut self) {
        for role in Role::ALL.iter().rev() {
            let pid = self.pid(*role);
            if let Some(pid) = pid {
                // SIGTERM first: the daemon stores its open spans
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            if let Some(mut child) = self.children.lock().unwrap().remove(role) {
                let deadline = Instant::now() + Duration::from_secs(10);
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = Command::new("umount").arg(&self.fs).status();
    }
}

/// Makes the process get SIGKILL when the soak's thread that starts it
/// ends, so a soak stopped by anything (`kill`, a CI timeout, a panic)
/// leaves none of its processes running. The fleet is started by the
/// soak's main thread, the campaigns by their loops' threads, which live
/// as long as the load.
pub fn dies_with_the_soak(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: between fork and exec the closure only calls prctl, which
    // is async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn a_process_started_for_the_soak_dies_with_the_thread_that_started_it() {
        let mut child = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            dies_with_the_soak(&mut cmd).arg("300").spawn().unwrap()
        })
        .join()
        .unwrap();
        // the thread has ended: the kernel sends the child SIGKILL
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }
}
