//! The arm64 image as a VM: its base built by mmdebstrap with arm64's
//! maintainer scripts run by qemu-user (registered in a binfmt_misc private
//! to a user namespace, so this machine's own binfmt_misc is never
//! touched), booted from a disk under `qemu-system-aarch64 -M virt` (TCG)
//! with its own kernel, initramfs and systemd, and inspected over ssh
//! carried by a virtio-serial port: the VM has no network device.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::demo::{Booted, Checks, campaign_in};
use super::*;
use crate::{ensure_debian, run};

/// What building a foreign architecture's base needs on this machine.
pub const FOREIGN_TOOLS: [(&str, &str); 2] = [
    ("arch-test", "command -v arch-test"),
    (
        "qemu-user-static",
        "test -e /usr/lib/binfmt.d/qemu-aarch64.conf",
    ),
];

/// What booting the VM needs.
const BOOT_TOOLS: [(&str, &str); 4] = [
    ("qemu-system-arm", "command -v qemu-system-aarch64"),
    ("socat", "command -v socat"),
    ("openssh-client", "command -v ssh && command -v scp"),
    ("e2fsprogs", "command -v mkfs.ext4"),
];

/// The unit that serves ssh on the virtio-serial port, enabled in the layer.
pub const SSH_UNIT: &str = "sandbox-ssh-console.service";

/// What the arm64 layer adds: (file in the workspace, or None for `data`;
/// path in the image; data; mode).
pub const LAYER_FILES: [(Option<&str>, &str, &str, u32); 2] = [
    (
        Some("dist/sandbox-ssh-console.service"),
        "etc/systemd/system/sandbox-ssh-console.service",
        "",
        0o644,
    ),
    (
        None,
        "etc/fstab",
        "/dev/vda / ext4 errors=remount-ro 0 1\n",
        0o644,
    ),
];

/// The bridge's port inside the VM (dist/agent-bridge.service).
const BRIDGE_PORT_INSIDE: u16 = 8765;

/// Starts `cmd` (its program and arguments; its output to `log`) in a new
/// user and mount namespace with every uid and gid mapped to itself, after
/// mounting a binfmt_misc of its own there (Linux 6.7 and later give each
/// user namespace its own) and registering qemu-user for `arch` in it, as
/// the qemu-user-static package would register it for the machine. The
/// registration's F flag opens the interpreter now, so it runs in a chroot.
pub fn spawn_under_qemu_user(
    arch: Arch,
    cmd: &Command,
    log: &std::fs::File,
) -> anyhow::Result<Child> {
    let conf = format!("/usr/lib/binfmt.d/qemu-{}.conf", arch.name());
    let register = std::fs::read_to_string(&conf)
        .with_context(|| format!("reading {conf} (qemu-user-static's registration)"))?;
    // the namespace waits on stdin until its maps are written
    let script = "read _ || exit 1
mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || {
  echo 'cannot mount a binfmt_misc in a user namespace: Linux 6.7 or later is needed' >&2; exit 1; }
printf '%s' \"$REGISTER\" > /proc/sys/fs/binfmt_misc/register || exit 1
exec \"$@\"";
    let mut child = Command::new("unshare")
        .args(["--user", "--mount", "--", "sh", "-c", script, "sh"])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env("REGISTER", register.trim())
        .stdin(Stdio::piped())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .spawn()
        .context("starting unshare")?;
    let maps = || -> anyhow::Result<()> {
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{map}", child.id()), "0 0 4294967295")
                .with_context(|| format!("writing the namespace's {map}"))?;
        }
        Ok(())
    };
    // unshare writes nothing until it has unshared: wait for the namespace
    let deadline = Instant::now() + Duration::from_secs(10);
    let own_ns = std::fs::read_link("/proc/self/ns/user")?;
    while std::fs::read_link(format!("/proc/{}/ns/user", child.id())).ok() == Some(own_ns.clone()) {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("unshare did not make a user namespace within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = maps() {
        let _ = child.kill();
        return Err(e);
    }
    let mut stdin = child.stdin.take().context("unshare's stdin")?;
    stdin.write_all(b"go\n")?;
    Ok(child)
}

/// A booted VM of the arm64 image.
pub struct Vm {
    qemu: Option<Child>,
    pub run_dir: PathBuf,
    disk: PathBuf,
    console: PathBuf,
    control: PathBuf,
    ssh_config: PathBuf,
    /// The host's loopback port forwarded (over ssh) to the bridge inside.
    pub bridge_port: u16,
    /// From starting QEMU to the first ssh command answered.
    pub booted_in: Duration,
    /// From starting QEMU to systemd reporting the boot finished.
    pub ready_in: Duration,
}

/// The single file in `dir` whose name starts with `prefix`.
fn the_one(dir: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "{} has {} files named {prefix}*, not one: rebuild the image with \
             `cargo xtask image --arch aarch64 --rebuild`",
            dir.display(),
            found.len()
        ),
    }
}

impl Vm {
    /// Makes a disk of the image (base and layer, with mkfs.ext4 -d), boots
    /// it with the image's own kernel and initramfs, and waits until ssh
    /// answers and systemd has finished booting.
    pub fn boot(image: &Image, run_dir: &Path) -> anyhow::Result<Vm> {
        if image.arch != Arch::Aarch64 {
            bail!(
                "the VM boots the arm64 image; the {} one boots under bubblewrap",
                image.arch
            );
        }
        ensure_debian(&BOOT_TOOLS)?;
        image.check()?;
        let boot = image.base.join("boot");
        let kernel = the_one(&boot, "vmlinuz-")?;
        let initrd = the_one(&boot, "initrd.img-")?;
        std::fs::create_dir_all(run_dir)?;
        let stage = run_dir.join("stage");
        let disk = run_dir.join("disk.img");
        let _ = std::fs::remove_dir_all(&stage);
        std::fs::create_dir_all(&stage)?;
        for tree in [&image.base, &image.layer] {
            run(Command::new("cp").arg("-a").arg(tree.join(".")).arg(&stage))?;
        }
        let _ = std::fs::remove_file(stage.join(".complete"));
        // room for the evidence DB and the campaign's files
        let mib = tree_bytes(&stage) / (1 << 20) * 5 / 4 + 768;
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "sandbox", "-d"])
            .arg(&stage)
            .arg(&disk)
            .arg(format!("{mib}M")))?;
        std::fs::remove_dir_all(&stage)?;

        let socket = run_dir.join("ssh.sock");
        let control = run_dir.join("ssh.control");
        let console = run_dir.join("console.log");
        let ssh_config = run_dir.join("ssh_config");
        for f in [&socket, &control] {
            let _ = std::fs::remove_file(f);
        }
        std::fs::write(
            &ssh_config,
            format!(
                "Host sandbox\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n  \
                 UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n  BatchMode yes\n  \
                 ConnectTimeout 300\n  ServerAliveInterval 30\n  LogLevel ERROR\n  \
                 ProxyCommand socat - UNIX-CONNECT:{socket}\n  ControlPath {control}\n",
                key = image.ssh.join("id_ed25519").display(),
                known = image.ssh.join("known_hosts").display(),
                socket = socket.display(),
                control = control.display(),
            ),
        )?;
        let started = Instant::now();
        say(format!(
            "booting the arm64 image under qemu-system-aarch64 (TCG; {}, disk {mib} MiB); \
             console: {}",
            kernel.display(),
            console.display()
        ));
        let qemu = Command::new("qemu-system-aarch64")
            .args(["-M", "virt", "-cpu", "max,pauth-impdef=on", "-smp", "2"])
            .args(["-m", "2048", "-display", "none", "-monitor", "none"])
            .args(["-nic", "none", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(&kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", "root=/dev/vda rw console=ttyAMA0 panic=-1"])
            .arg("-drive")
            .arg(format!(
                "file={},format=raw,if=none,id=disk",
                disk.display()
            ))
            .args(["-device", "virtio-blk-device,drive=disk"])
            .args(["-device", "virtio-serial-device"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=ssh,path={},server=on,wait=off",
                socket.display()
            ))
            .args(["-device", "virtserialport,chardev=ssh,name=ssh"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(run_dir.join("qemu.log"))?)
            .spawn()
            .context("starting qemu-system-aarch64")?;
        let bridge_port = Ports::pick()?.bridge;
        let mut vm = Vm {
            qemu: Some(qemu),
            run_dir: run_dir.to_path_buf(),
            disk,
            console,
            control,
            ssh_config,
            bridge_port,
            booted_in: Duration::ZERO,
            ready_in: Duration::ZERO,
        };
        vm.connect(&socket, started)?;
        Ok(vm)
    }

    /// The end of the console, to explain a failure.
    fn console_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.console).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The ssh master (every later command multiplexes over it: the port
    /// carries one connection), the wait for systemd, the bridge's port.
    fn connect(&mut self, socket: &Path, started: Instant) -> anyhow::Result<()> {
        while !socket.exists() {
            if let Some(s) = self.qemu.as_mut().and_then(|q| q.try_wait().ok().flatten()) {
                bail!(
                    "qemu-system-aarch64 exited ({s}): {}",
                    std::fs::read_to_string(self.run_dir.join("qemu.log")).unwrap_or_default()
                );
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("QEMU made no {} within 30 s", socket.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let master = Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .args([
                "-f",
                "-N",
                "-o",
                "ControlMaster=yes",
                "-o",
                "ControlPersist=yes",
                "sandbox",
            ])
            .stdin(Stdio::null())
            .output()?;
        if !master.status.success() {
            bail!(
                "ssh over the VM's virtio-serial port failed after {:.0} s ({}): {}\n\
                 the console's end:\n{}",
                started.elapsed().as_secs_f64(),
                master.status,
                String::from_utf8_lossy(&master.stderr).trim(),
                self.console_tail()
            );
        }
        self.booted_in = started.elapsed();
        // `running` or `degraded` (a unit failed: the checks say which)
        let state = self.ssh_output("systemctl is-system-running --wait")?;
        self.ready_in = started.elapsed();
        say(format!(
            "the VM answered ssh after {:.1} s; systemd: {} after {:.1} s",
            self.booted_in.as_secs_f64(),
            String::from_utf8_lossy(&state.stdout).trim(),
            self.ready_in.as_secs_f64()
        ));
        run(Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .args(["-O", "forward", "-L"])
            .arg(format!(
                "127.0.0.1:{}:127.0.0.1:{BRIDGE_PORT_INSIDE}",
                self.bridge_port
            ))
            .arg("sandbox"))
    }

    fn ssh_output(&self, command: &str) -> anyhow::Result<std::process::Output> {
        Ok(Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .args(["sandbox", command])
            .stdin(Stdio::null())
            .output()?)
    }

    /// Stops the VM (`systemctl poweroff` inside; killed after 120 s) and
    /// removes its disk. Fails when QEMU had to be killed or the ssh master
    /// outlived it.
    pub fn shutdown(mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        // the connection drops as the VM goes down: its status says nothing
        let _ = self.ssh_output("systemctl poweroff");
        let mut qemu = self.qemu.take().context("the VM is not running")?;
        let clean = loop {
            if qemu.try_wait()?.is_some() {
                break true;
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = qemu.kill();
                let _ = qemu.wait();
                break false;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let stopped_in = started.elapsed();
        let _ = self.master_exit();
        std::fs::remove_file(&self.disk)?;
        if !clean {
            bail!(
                "the VM did not power off within 120 s (killed); the console's end:\n{}",
                self.console_tail()
            );
        }
        // the master exits when its connection closes, and removes its socket
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.control.exists() {
            if Instant::now() > deadline {
                bail!(
                    "the ssh master outlived the VM ({} is still there)",
                    self.control.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(stopped_in)
    }

    fn master_exit(&self) -> std::io::Result<std::process::Output> {
        Command::new("ssh")
            .arg("-F")
            .arg(&self.ssh_config)
            .args(["-O", "exit", "sandbox"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut q) = self.qemu.take() {
            let _ = q.kill();
            let _ = q.wait();
            let _ = self.master_exit();
            let _ = std::fs::remove_file(&self.disk);
        }
    }
}

impl Booted for Vm {
    fn run_dir(&self) -> &Path {
        &self.run_dir
    }
    fn bridge_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.bridge_port)
    }
    fn ssh(&self, command: &str) -> anyhow::Result<String> {
        crate::output(
            Command::new("ssh")
                .arg("-F")
                .arg(&self.ssh_config)
                .args(["sandbox", command])
                .stdin(Stdio::null()),
        )
    }
    fn scp_from(&self, remote: &str, local: &Path) -> anyhow::Result<()> {
        run(Command::new("scp")
            .arg("-F")
            .arg(&self.ssh_config)
            .arg(format!("sandbox:{remote}"))
            .arg(local))
    }
}

/// The arm64 image's test (root): the x86_64 executables refused, the image
/// (cached after the first build), a boot under QEMU, what runs inside, a
/// campaign of `count` tests (less the browser's) from the host against the
/// bridge in the VM, inspection over ssh, the import, and a power-off.
pub fn test(bin: &Path, host_bin: &Path, count: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = crate::workspace_root().join("target/image-test/arm64");
    std::fs::create_dir_all(&dir)?;
    let mut c = Checks::default();

    c.check(
        "x86_64 executables for the arm64 image: refused",
        match build(Arch::Aarch64, host_bin, false) {
            Ok(_) => Err(anyhow::anyhow!("it built")),
            Err(e) => {
                let e = e.to_string();
                say(format!("  said: {e}"));
                if e.contains("an x86_64 executable") && e.contains("--target aarch64") {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("said {e:?}"))
                }
            }
        },
    );

    let t = Instant::now();
    let image = build(Arch::Aarch64, bin, false)?;
    let build_s = t.elapsed().as_secs_f64();
    let vm = Vm::boot(&image, &dir)?;
    let (booted, ready) = (vm.booted_in, vm.ready_in);

    c.check(
        "inside: aarch64, systemd is PID 1, the probe and the bridge started from their units",
        vm.ssh(
            "uname -m; cat /proc/1/comm; \
             systemctl is-active probe.service agent-bridge.service; \
             systemctl --failed --no-legend --plain",
        )
        .and_then(|out| {
            let want = "aarch64\nsystemd\nactive\nactive\n";
            if out == want {
                Ok(())
            } else {
                Err(anyhow::anyhow!("got {out:?}, want {want:?}"))
            }
        }),
    );
    c.check(
        "inside: the installed executables are the ones given, by sha256",
        vm.ssh("sha256sum /usr/local/bin/probe /usr/local/bin/agent-bridge")
            .and_then(|out| {
                for b in BINARIES {
                    let want = sha256_file(&bin.join(b))?;
                    if !out.contains(&format!("{want}  /usr/local/bin/{b}")) {
                        bail!("{b}: want {want}, the VM has {out:?}");
                    }
                }
                Ok(())
            }),
    );
    c.check(
        "inside: probe check passes, architecture aarch64",
        vm.ssh("probe check 2>&1").and_then(|out| {
            let arch = out
                .lines()
                .find(|l| l.split_whitespace().nth(1) == Some("architecture"))
                .unwrap_or("");
            if arch.starts_with("ok") && arch.contains("aarch64") {
                Ok(())
            } else {
                Err(anyhow::anyhow!("the architecture line is {arch:?}:\n{out}"))
            }
        }),
    );
    let omit: Vec<&str> = VM_OMITS.iter().map(|(_, d)| *d).collect();
    let run = campaign_in(&vm, &host_bin.join("agent-bridge"), count, &omit, 2);
    match run {
        Err(e) => c.check("the campaign in the VM", Err(e)),
        Ok(o) => c.campaign(&o),
    }
    let stopped = vm.shutdown();
    c.check(
        "power-off: QEMU exited by itself, the ssh master with it, the disk removed",
        stopped
            .as_ref()
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("{e:#}")),
    );
    c.finish(
        "arm64 image test",
        &format!(
            "image build {build_s:.1} s, ssh after {:.1} s, booted after {:.1} \
         s, power-off {:.1} s, all {:.0} s",
            booted.as_secs_f64(),
            ready.as_secs_f64(),
            stopped.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN),
            started.elapsed().as_secs_f64()
        ),
    )
}
