//! A booted sandbox: the image's overlay mounted in a private mount
//! namespace, bubblewrap running sandbox-init as PID 1 in its own PID, IPC,
//! UTS and cgroup namespaces, and a teardown that proves nothing outlived it.

use std::fmt::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{ensure_debian, run};

use super::*;

/// Loopback ports of a booted sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub ssh: u16,
    pub bridge: u16,
}

impl Ports {
    /// Fails, before anything boots, when one is taken.
    pub fn require_free(&self) -> anyhow::Result<()> {
        require_free_port(self.ssh, "the sandbox's sshd", "--ssh-port")?;
        require_free_port(self.bridge, "the sandbox's agent-bridge", "--bridge-port")
    }

    /// Two ports free now (the kernel's choice).
    pub fn pick() -> anyhow::Result<Ports> {
        let a = TcpListener::bind("127.0.0.1:0")?;
        let b = TcpListener::bind("127.0.0.1:0")?;
        Ok(Ports {
            ssh: a.local_addr()?.port(),
            bridge: b.local_addr()?.port(),
        })
    }
}

/// Quotes for sh.
fn shq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What teardown found.
#[derive(Debug)]
pub struct Teardown {
    pub stopped_in: Duration,
    /// Stopped by SIGTERM to its init (false: killed).
    pub clean_stop: bool,
    /// Processes or mounts that outlived the sandbox (killed, unmounted).
    pub leftovers: Vec<String>,
}

/// A booted sandbox: bubblewrap running sandbox-init as PID 1.
pub struct Sandbox {
    bwrap: Option<Child>,
    boot: PathBuf,
    root: PathBuf,
    cgroups: Vec<PathBuf>,
    pub ports: Ports,
    pub run_dir: PathBuf,
    pub logs: PathBuf,
    pub ssh_config: PathBuf,
    pub booted_in: Duration,
}

/// The cgroups (cgroup2, v1 memory and pids) this process is in.
fn own_cgroup_dirs() -> anyhow::Result<Vec<PathBuf>> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let mounts: Vec<(&str, &str, Vec<&str>)> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 3 && f[1].starts_with("/sys/fs/cgroup"))
                .then(|| (f[1], f[2], f[3].split(',').collect()))
        })
        .collect();
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let mount = if id == "0" {
            mounts.iter().find(|m| m.1 == "cgroup2")
        } else if ctl.split(',').any(|c| c == "memory" || c == "pids") {
            mounts
                .iter()
                .find(|m| m.1 == "cgroup" && ctl.split(',').all(|c| m.2.contains(&c)))
        } else {
            None
        };
        if let Some(m) = mount {
            dirs.push(Path::new(m.0).join(path.trim_start_matches('/')));
        }
    }
    Ok(dirs)
}

/// Removes what sandboxes of processes that died without a teardown (a
/// killed xtask: bubblewrap's --die-with-parent took the sandbox with it)
/// left: their overlay directories and their empty cgroups.
fn sweep_stale(boots: &Path) -> anyhow::Result<()> {
    let dead = |name: &str| {
        name.split('-')
            .next()
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    for e in std::fs::read_dir(boots)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if dead(&name) {
            say(format!(
                "removing {}, left by a sandbox whose runner died",
                e.path().display()
            ));
            std::fs::remove_dir_all(e.path())?;
        }
    }
    for parent in own_cgroup_dirs()? {
        for e in std::fs::read_dir(&parent)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.strip_prefix("probe-sandbox-").is_some_and(dead)
                && cgroup_pids(&e.path()).is_empty()
            {
                remove_cgroup(&e.path());
            }
        }
    }
    Ok(())
}

/// Pids in a cgroup and every cgroup below it.
fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            pids.extend(cgroup_pids(&e.path()));
        }
    }
    pids
}

/// Removes a cgroup and the cgroups below it (they must be empty).
fn remove_cgroup(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            remove_cgroup(&e.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .map(|c| c.replace('\0', " ").trim().to_string())
        .unwrap_or_default()
}

fn port_open(port: u16) -> bool {
    TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Sandbox {
    /// Boots `image` under bubblewrap: its own PID, mount, IPC, UTS and
    /// cgroup namespaces, the host's network (loopback ports), root's
    /// capabilities, /sys from the host, /proc of its PID namespace, a
    /// minimal /dev. `run_dir` gets the logs and an ssh config. Returns
    /// when sshd, the probe (`probe status` over ssh) and the bridge answer.
    pub fn boot(image: &Image, ports: Ports, run_dir: &Path) -> anyhow::Result<Sandbox> {
        require_root("image-demo")?;
        image.check()?;
        ports.require_free()?;
        ensure_debian(&BOOT_TOOLS)?;
        let started = Instant::now();
        let boots = image.dir.join("boots");
        std::fs::create_dir_all(&boots)?;
        sweep_stale(&boots)?;
        let boot = (0..)
            .map(|i| boots.join(format!("{}-{i}", std::process::id())))
            .find(|p| !p.exists())
            .expect("a free name");
        let root = boot.join("root");
        for d in ["upper", "work", "root"] {
            std::fs::create_dir_all(boot.join(d))?;
        }
        for p in [&image.layer, &image.base, &boot] {
            let s = p.display().to_string();
            if s.contains([':', ',', '\'', ' ']) {
                bail!("{s}: the overlay cannot take a path with ':', ',', quotes or spaces");
            }
        }
        std::fs::create_dir_all(run_dir)?;
        let logs = run_dir.join("logs");
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs)?;
        // a cgroup of its own in every hierarchy the bridge uses: teardown
        // finds every process of the sandbox there, and the sandbox's
        // cgroup namespace is rooted at it
        let name = boot.file_name().unwrap().to_string_lossy().into_owned();
        let mut cgroups = Vec::new();
        for d in own_cgroup_dirs()? {
            let cg = d.join(format!("probe-sandbox-{name}"));
            std::fs::create_dir(&cg).with_context(|| format!("creating {}", cg.display()))?;
            cgroups.push(cg);
        }
        let mut script = String::from("set -e\n");
        for cg in &cgroups {
            let _ = writeln!(
                script,
                "echo $$ > {}",
                shq(&cg.join("cgroup.procs").display().to_string())
            );
        }
        let _ = writeln!(
            script,
            "mount -t overlay overlay -o lowerdir={}:{},upperdir={},workdir={} {}",
            image.layer.display(),
            image.base.display(),
            boot.join("upper").display(),
            boot.join("work").display(),
            root.display()
        );
        let env = [
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOME", "/root".into()),
            ("LANG", "C.UTF-8".into()),
            ("SANDBOX_SSH_PORT", ports.ssh.to_string()),
            ("SANDBOX_BRIDGE_PORT", ports.bridge.to_string()),
            ("SANDBOX_CGROUPS", "remount".into()),
            ("SANDBOX_STOP_TIMEOUT", "10".into()),
        ];
        let mut bwrap = vec![
            "exec bwrap".to_string(),
            format!("--bind {} /", shq(&root.display().to_string())),
            "--proc /proc --dev /dev --bind /sys /sys".into(),
            format!(
                "--bind {} /var/log/sandbox",
                shq(&logs.display().to_string())
            ),
            "--unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup --hostname sandbox".into(),
            "--die-with-parent --as-pid-1 --cap-add ALL --clearenv".into(),
        ];
        for (k, v) in env {
            bwrap.push(format!("--setenv {k} {}", shq(&v)));
        }
        bwrap.push("--chdir / /usr/sbin/sandbox-init".into());
        script.push_str(&bwrap.join(" \\\n  "));
        script.push('\n');
        std::fs::write(run_dir.join("boot.sh"), &script)?;
        say(format!(
            "booting the sandbox (bubblewrap, sandbox-init as PID 1; ssh on 127.0.0.1:{}, bridge on 127.0.0.1:{})",
            ports.ssh, ports.bridge
        ));
        let console = std::fs::File::create(logs.join("console.log"))?;
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh"])
            .arg(run_dir.join("boot.sh"))
            .stdin(Stdio::null())
            .stdout(console.try_clone()?)
            .stderr(console)
            .spawn()
            .context("starting unshare + bwrap")?;
        let ssh_config = run_dir.join("ssh_config");
        std::fs::write(
            &ssh_config,
            format!(
                "Host sandbox\n  HostName 127.0.0.1\n  Port {}\n  User root\n  IdentityFile {}\n  \
                 IdentitiesOnly yes\n  UserKnownHostsFile {}\n  HostKeyAlias sandbox\n  \
                 StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n",
                ports.ssh,
                image.ssh.join("id_ed25519").display(),
                image.ssh.join("known_hosts").display()
            ),
        )?;
        let mut sb = Sandbox {
            bwrap: Some(child),
            boot,
            root,
            cgroups,
            ports,
            run_dir: run_dir.to_path_buf(),
            logs,
            ssh_config,
            booted_in: Duration::ZERO,
        };
        sb.wait_ready(started)?;
        sb.booted_in = started.elapsed();
        say(format!(
            "sandbox up in {:.1} s; ssh -F {} sandbox",
            sb.booted_in.as_secs_f64(),
            sb.ssh_config.display()
        ));
        Ok(sb)
    }

    fn wait_ready(&mut self, started: Instant) -> anyhow::Result<()> {
        let deadline = started + Duration::from_secs(120);
        let mut stage = 0;
        while stage < 3 {
            if let Some(s) = self.bwrap.as_mut().unwrap().try_wait()? {
                bail!(
                    "the sandbox exited during boot ({s}); its console ({}):\n{}",
                    self.logs.join("console.log").display(),
                    tail(&self.logs.join("console.log"), 20)
                );
            }
            if Instant::now() > deadline {
                let what = ["sshd", "the probe", "the bridge"][stage];
                bail!(
                    "{what} did not come up in the sandbox within 120 s; logs in {}:\n{}",
                    self.logs.display(),
                    tail(&self.logs.join("init.log"), 20)
                );
            }
            let up = match stage {
                0 => port_open(self.ports.ssh),
                1 => self
                    .ssh_quiet("probe status >/dev/null")
                    .map(|o| o.status.success())
                    .unwrap_or(false),
                _ => port_open(self.ports.bridge),
            };
            if up {
                say(format!(
                    "  {} up after {:.1} s",
                    ["sshd", "probe (`probe status` over ssh)", "agent-bridge"][stage],
                    started.elapsed().as_secs_f64()
                ));
                stage += 1;
            } else {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The host pid of the sandbox's PID 1 (bwrap's child).
    fn init_pid(&self) -> Option<u32> {
        let b = self.bwrap.as_ref()?.id();
        std::fs::read_to_string(format!("/proc/{b}/task/{b}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn ssh_quiet(&self, command: &str) -> std::io::Result<std::process::Output> {
        Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .args(["sandbox", command])
            .stdin(Stdio::null())
            .output()
    }

    /// Runs `command` in the sandbox over ssh; fails with its stderr.
    pub fn ssh(&self, command: &str) -> anyhow::Result<String> {
        let out = self.ssh_quiet(command)?;
        if !out.status.success() {
            bail!(
                "ssh sandbox {command:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Copies a file out of the sandbox with scp.
    pub fn scp_from(&self, remote: &str, local: &Path) -> anyhow::Result<()> {
        run(Command::new("scp")
            .arg("-F")
            .arg(&self.ssh_config)
            .arg(format!("sandbox:{remote}"))
            .arg(local))
    }

    /// Stops the sandbox (SIGTERM to its init; SIGKILL after 30 s), then
    /// checks that nothing outlived it: no process in its cgroups, none
    /// whose root is its root, no mount below its directory. Leftovers are
    /// killed and reported. The overlay's directories are removed.
    pub fn shutdown(mut self) -> anyhow::Result<Teardown> {
        let t = self.stop();
        self.bwrap = None;
        if !t.leftovers.is_empty() {
            bail!(
                "the sandbox left {} behind (now killed): {}",
                t.leftovers.len(),
                t.leftovers.join("; ")
            );
        }
        Ok(t)
    }

    fn stop(&mut self) -> Teardown {
        let started = Instant::now();
        let mut clean_stop = false;
        let init = self.init_pid();
        if let Some(mut child) = self.bwrap.take() {
            if let Some(init) = init {
                // SAFETY: kill has no memory preconditions.
                unsafe { libc::kill(init as i32, libc::SIGTERM) };
            }
            // bwrap exits when its child (init) does
            clean_stop = matches!(child.wait_timeout(Duration::from_secs(30)), Ok(Some(_)));
            if !clean_stop {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        let stopped_in = started.elapsed();
        let mut leftovers = Vec::new();
        // the kernel empties a dying PID namespace quickly, not at once
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut pids: Vec<u32> = self.cgroups.iter().flat_map(|c| cgroup_pids(c)).collect();
        while !pids.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            pids = self.cgroups.iter().flat_map(|c| cgroup_pids(c)).collect();
        }
        let root = self.root.display().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let r = std::fs::read_link(e.path().join("root")).unwrap_or_default();
            if r.starts_with(&root) && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            leftovers.push(format!("process {pid} ({})", comm(pid)));
            // SAFETY: as above.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let boot = self.boot.display().to_string();
        for line in std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
        {
            if let Some(point) = line.split(' ').nth(4)
                && point.starts_with(&boot)
            {
                leftovers.push(format!("mount {point}"));
                let _ = Command::new("umount").args(["-l", point]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        for cg in &self.cgroups {
            remove_cgroup(cg);
            if cg.exists() {
                leftovers.push(format!("cgroup {}", cg.display()));
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.boot) {
            leftovers.push(format!("{}: {e}", self.boot.display()));
        }
        Teardown {
            stopped_in,
            clean_stop,
            leftovers,
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.bwrap.is_some() {
            let t = self.stop();
            if !t.leftovers.is_empty() {
                eprintln!("xtask: the sandbox left behind: {}", t.leftovers.join("; "));
            }
        }
    }
}
