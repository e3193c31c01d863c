//! The sandbox image: `cargo xtask image` builds a Debian bookworm root
//! filesystem with mmdebstrap and installs probe and agent-bridge into it as
//! a user would (binaries in /usr/local/bin, systemd units, an init script);
//! [`Sandbox::boot`] boots it under bubblewrap; `cargo xtask image-demo`
//! runs the campaign against the bridge inside and inspects the sandbox over
//! ssh; [`test`] is the image's part of `cargo xtask test`, with the
//! Debian package installed in the base under systemd (`package`). docs/IMAGE.md.
//!
//! `--arch aarch64` builds the same image for arm64 (mmdebstrap running
//! arm64's maintainer scripts under qemu-user, registered in a private
//! binfmt_misc, see [`vm`]) with a kernel and systemd, and [`vm`] boots it
//! as a disk under `qemu-system-aarch64`, inspected over ssh carried by a
//! virtio-serial port (the VM has no network device).
//!
//! Layout under target/image/ (target/image/arm64/ for arm64):
//! - `base-KEY/`: the Debian root filesystem, cached. KEY hashes the recipe
//!   (suite, mirrors, packages, hooks), so a changed recipe builds anew and
//!   an unchanged one never does. Never modified once built.
//! - `apt-cache/`: the .deb files mmdebstrap downloaded, so a rebuild
//!   downloads only what changed.
//! - `layer/`: what is installed on top (binaries, units, sandbox-init, ssh
//!   keys), rebuilt by every `cargo xtask image` (it takes a second).
//! - `ssh/`: the client key pair, the sandbox's host key, known_hosts.
//! - `boots/N/`: one booted sandbox's overlay (upper, work, root), removed
//!   at teardown.
//!
//! The root a sandbox sees is an overlay of `layer` over `base` with a fresh
//! upper directory, mounted in a private mount namespace, so the cached image
//! is never written and no mount outlives the sandbox.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{ensure_debian, run};

mod demo;
mod package;
mod sandbox;
pub mod vm;

pub use demo::{binaries, demo, test};
pub use sandbox::{Ports, Sandbox};

use crate::arch::Arch;

pub const SUITE: &str = "bookworm";
/// The Debian archive's sources for [`SUITE`], as this machine's apt
/// configuration names them.
pub fn mirrors() -> anyhow::Result<Vec<String>> {
    crate::apt::mirrors(SUITE)
}

/// The Debian packages on top of the essential set (which brings sh, bash,
/// coreutils, findutils, grep, sed, tar, gzip, util-linux, perl-base), and
/// what needs each: the default campaign's tests run sh, python3, gcc and
/// Chromium inside the sandbox (agent-bridge/campaign/src/generate.rs).
pub const PACKAGES: [(&str, &str); 11] = [
    ("coreutils", "every exec step (head, sha256sum, seq, wc, …)"),
    (
        "python3",
        "run_code python: network, memory, compute, documents",
    ),
    ("tzdata", "documents: zoneinfo time zones"),
    (
        "mount",
        "sandbox-init's mounts; process: unshare -m … mount",
    ),
    ("procps", "ps and friends, for inspection over ssh"),
    ("openssh-server", "inspection over ssh"),
    ("openssh-sftp-server", "scp (OpenSSH 9's scp speaks SFTP)"),
    ("gcc", "packages: compile a C program and run it"),
    ("libc6-dev", "packages: gcc's headers and crt files"),
    (
        "chromium",
        "browser: headless Chromium, as `cargo xtask setup` installs",
    ),
    (
        "fonts-liberation",
        "browser: fonts for screenshots and PDFs",
    ),
];

/// What the arm64 image adds (it boots as a VM: a kernel, an initramfs
/// that finds the virtio disk, and systemd as init).
pub const VM_PACKAGES: [(&str, &str); 2] = [
    (
        "linux-image-cloud-arm64",
        "the VM's kernel and initramfs (Debian's cloud kernel: virtio, no firmware)",
    ),
    ("systemd-sysv", "the VM's init: systemd starts the units"),
];

/// What the arm64 image leaves out: every test of these domains is left
/// out of its campaign, since under emulation Chromium is minutes per page.
pub const VM_OMITS: [(&str, &str); 2] = [("chromium", "browser"), ("fonts-liberation", "browser")];

/// The packages of an architecture's image.
pub fn packages(arch: Arch) -> Vec<(&'static str, &'static str)> {
    match arch {
        Arch::X86_64 => PACKAGES.to_vec(),
        Arch::Aarch64 => PACKAGES
            .iter()
            .filter(|(p, _)| !VM_OMITS.iter().any(|(o, _)| o == p))
            .chain(VM_PACKAGES.iter())
            .copied()
            .collect(),
    }
}

/// Changes to the base after the packages are installed (mmdebstrap
/// customize hooks, run on the host with the root filesystem as $1).
const HOOKS: [&str; 4] = [
    // host keys come with the layer, one pair per image directory
    r#"rm -f "$1"/etc/ssh/ssh_host_*"#,
    r#"printf 'sandbox\n' > "$1/etc/hostname""#,
    r#"printf '127.0.0.1 localhost\n127.0.1.1 sandbox\n::1 localhost ip6-localhost ip6-loopback\n' > "$1/etc/hosts""#,
    // not the build machine's resolver: a name lookup in the sandbox must
    // not send a packet off this machine
    r#"printf '# no resolver: names resolve from /etc/hosts, nothing leaves the machine\nnameserver 127.0.0.1\n' > "$1/etc/resolv.conf""#,
];

/// Bumped when the recipe changes in a way the text above does not show.
const RECIPE_VERSION: u32 = 1;

/// The files the layer takes from dist/: (source, path in the image, mode).
const DIST_FILES: [(&str, &str, u32); 5] = [
    ("dist/sandbox-init", "usr/sbin/sandbox-init", 0o755),
    ("dist/sandbox.conf", "etc/sandbox/sandbox.conf", 0o644),
    (
        "dist/sandbox-sshd.conf",
        "etc/ssh/sshd_config.d/sandbox.conf",
        0o644,
    ),
    (
        "dist/probe.service",
        "etc/systemd/system/probe.service",
        0o644,
    ),
    (
        "dist/agent-bridge.service",
        "etc/systemd/system/agent-bridge.service",
        0o644,
    ),
];

/// The binaries installed into /usr/local/bin.
const BINARIES: [&str; 2] = ["probe", "agent-bridge"];

/// What booting needs on the host (package, check).
const BOOT_TOOLS: [(&str, &str); 4] = [
    ("bubblewrap", "command -v bwrap"),
    ("openssh-client", "command -v ssh && command -v scp"),
    ("util-linux", "command -v unshare"),
    ("iproute2", "command -v ss"),
];

fn say(msg: impl std::fmt::Display) {
    eprintln!("xtask: {msg}");
}

/// Fails unless this process runs as root.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "`cargo xtask {what}` needs root: mmdebstrap installs packages as root, and the \
             sandbox keeps root's capabilities for the probe (CAP_BPF, CAP_PERFMON). \
             Run `sudo -E cargo xtask {what}`"
        );
    }
    Ok(())
}

/// Fails when a loopback port is taken, naming it, what holds it and what
/// to do.
pub fn require_free_port(port: u16, what: &str, flag: &str) -> anyhow::Result<()> {
    match TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) => {
            let holder = Command::new("ss")
                .args(["-Hltnp", &format!("sport = :{port}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default();
            let holder = holder
                .split("users:")
                .nth(1)
                .map(|u| format!(", held by {u}"))
                .unwrap_or_default();
            bail!(
                "port {port} on 127.0.0.1 ({what}) is not free: {e}{holder}. Stop what holds it, \
                 or give the sandbox another port with {flag} N"
            )
        }
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The sha256 of a file, as `sha256sum` prints it.
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    Ok(sha256_hex(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    ))
}

/// Bytes in a tree (du -sb).
fn tree_bytes(path: &Path) -> u64 {
    Command::new("du")
        .arg("-sb")
        .arg(path)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A built image: the cached Debian base and the layer on top.
#[derive(Debug, Clone)]
pub struct Image {
    pub arch: Arch,
    pub dir: PathBuf,
    pub base: PathBuf,
    pub layer: PathBuf,
    pub ssh: PathBuf,
}

/// Where `cargo xtask image` keeps everything for an architecture.
pub fn image_dir(arch: Arch) -> PathBuf {
    let dir = crate::workspace_root().join("target/image");
    match arch {
        Arch::X86_64 => dir,
        Arch::Aarch64 => dir.join(arch.debian()),
    }
}

/// The recipe's text: everything that decides the base's contents.
fn recipe(arch: Arch) -> anyhow::Result<String> {
    let mut r = format!("recipe {RECIPE_VERSION}\nsuite {SUITE}\nvariant apt\n");
    if arch != Arch::X86_64 {
        let _ = writeln!(r, "arch {}", arch.debian());
    }
    for m in mirrors()? {
        let _ = writeln!(r, "mirror {m}");
    }
    for (p, _) in packages(arch) {
        let _ = writeln!(r, "package {p}");
    }
    for h in HOOKS {
        let _ = writeln!(r, "hook {h}");
    }
    Ok(r)
}

/// Checks a directory of binaries to install: both there, executable,
/// built for the image's architecture, and matching its SHA256SUMS when it
/// has one (as `cargo xtask dist` writes).
fn check_bin_dir(bin_dir: &Path, arch: Arch) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for b in BINARIES {
        let path = bin_dir.join(b);
        let meta = std::fs::metadata(&path).map_err(|e| {
            anyhow::anyhow!(
                "no `{b}` in {} ({e}): the image needs probe and agent-bridge there \
                 (build them with `cargo build --release -p probe -p agent-bridge`, or \
                 `cargo xtask dist`)",
                bin_dir.display()
            )
        })?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            bail!("{} is not an executable file", path.display());
        }
        match Arch::of_elf(&path) {
            Some(a) if a == arch => {}
            found => bail!(
                "{} is {}, but this is the {arch} image: give it the {arch} executables \
                 (`cargo xtask dist --target {arch}` writes them to target/dist/{arch})",
                path.display(),
                found.map_or("not an x86_64 or aarch64 executable".to_string(), |a| {
                    format!("an {a} executable")
                }),
            ),
        }
    }
    let sums = bin_dir.join("SHA256SUMS");
    if let Ok(text) = std::fs::read_to_string(&sums) {
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let (Some(want), Some(name)) = (f.next(), f.next()) else {
                continue;
            };
            let name = name.trim_start_matches('*');
            if BINARIES.contains(&name) {
                let got = sha256_file(&bin_dir.join(name))?;
                if got != want {
                    bail!(
                        "{}: sha256 {got}, but {} says {want}: rebuild the binaries",
                        bin_dir.join(name).display(),
                        sums.display()
                    );
                }
            }
        }
    }
    Ok(())
}

/// The Debian base of `arch`'s image: the cached one when its recipe is
/// unchanged (and not `rebuild`), else built with mmdebstrap.
pub fn base(arch: Arch, rebuild: bool) -> anyhow::Result<PathBuf> {
    require_root("image")?;
    let dir = image_dir(arch);
    let base = base_dir(arch)?;
    if !rebuild && base.join(".complete").exists() {
        say(format!(
            "image base {} (cached; --rebuild builds it anew)",
            base.display()
        ));
        return Ok(base);
    }
    ensure_debian(&base_tools(arch))?;
    std::fs::create_dir_all(&dir)?;
    build_base(arch, &dir, &base)?;
    // other recipes' bases are stale now; each is a GiB
    for e in std::fs::read_dir(&dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("base-") && e.path() != base {
            say(format!("removing the stale base {}", e.path().display()));
            std::fs::remove_dir_all(e.path())?;
        }
    }
    Ok(base)
}

/// The bases of `arches`, one after another, built in a thread of its own
/// at the lowest priority (see [`crate::background`]) unless cached: `cargo
/// xtask test` builds them while its tests run, most of it dpkg under
/// qemu-user for arm64. What building needs on this machine is installed
/// first, here, so no apt-get runs beside the caller's own.
pub fn bases_in_background(
    arches: &[Arch],
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<Vec<PathBuf>>>> {
    require_root("image")?;
    for &arch in arches {
        ensure_debian(&base_tools(arch))?;
    }
    let arches = arches.to_vec();
    Ok(std::thread::spawn(move || {
        crate::background::lowest_priority_here();
        arches.into_iter().map(|arch| base(arch, false)).collect()
    }))
}

/// Where `arch`'s base of the current recipe is (or will be).
fn base_dir(arch: Arch) -> anyhow::Result<PathBuf> {
    let key = sha256_hex(recipe(arch)?.as_bytes())[..16].to_string();
    Ok(image_dir(arch).join(format!("base-{key}")))
}

/// What building `arch`'s base needs on this machine.
fn base_tools(arch: Arch) -> Vec<(&'static str, &'static str)> {
    let mut tools = vec![("mmdebstrap", "command -v mmdebstrap")];
    if arch != Arch::host() {
        tools.extend(vm::FOREIGN_TOOLS);
    }
    tools
}

/// `cargo xtask image`: the base (cached, or built with mmdebstrap) and the
/// layer with the binaries of `bin_dir`. `rebuild` builds the base anew.
pub fn build(arch: Arch, bin_dir: &Path, rebuild: bool) -> anyhow::Result<Image> {
    require_root("image")?;
    let mut tools = vec![("openssh-client", "command -v ssh-keygen")];
    if rebuild || !base_dir(arch)?.join(".complete").exists() {
        tools.extend(base_tools(arch));
    }
    ensure_debian(&tools)?;
    check_bin_dir(bin_dir, arch)?;
    let base = base(arch, rebuild)?;
    let dir = image_dir(arch);
    let ssh = ssh_keys(&dir)?;
    let layer = build_layer(arch, &dir, bin_dir, &ssh, &base)?;
    let image = Image {
        arch,
        dir,
        base,
        layer,
        ssh,
    };
    image.check()?;
    say(format!(
        "image ready: base {} ({}), layer {} ({})",
        image.base.display(),
        mib(tree_bytes(&image.base)),
        image.layer.display(),
        mib(tree_bytes(&image.layer))
    ));
    Ok(image)
}

fn build_base(arch: Arch, dir: &Path, base: &Path) -> anyhow::Result<()> {
    let cache = dir.join("apt-cache");
    std::fs::create_dir_all(&cache)?;
    let tmp = base.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let log = dir.join("mmdebstrap.log");
    let packages: Vec<&str> = packages(arch).iter().map(|(p, _)| *p).collect();
    say(format!(
        "building the {arch} image base with mmdebstrap ({SUITE}, {} packages; about {} \
         minutes, less with the .deb cache in {}); log: {}",
        packages.len(),
        if arch == Arch::host() { 3 } else { 7 },
        cache.display(),
        log.display()
    ));
    let started = Instant::now();
    let mut cmd = Command::new("mmdebstrap");
    cmd.arg(format!("--arch={}", arch.debian()))
        .args([
            "--mode=root",
            "--variant=apt",
            "--format=directory",
            // the downloaded .debs stay for sync-out to keep
            "--skip=essential/unlink",
            "--aptopt=Acquire::Retries \"3\"",
        ])
        .arg(format!("--include={}", packages.join(",")))
        .arg(r#"--setup-hook=mkdir -p "$1"/var/cache/apt/archives/"#)
        .arg(format!(
            "--setup-hook=sync-in {} /var/cache/apt/archives/",
            cache.display()
        ))
        .arg(format!(
            "--customize-hook=sync-out /var/cache/apt/archives {}",
            cache.display()
        ));
    for h in HOOKS {
        cmd.arg(format!("--customize-hook={h}"));
    }
    cmd.arg(SUITE).arg(&tmp).args(mirrors()?);
    let out = std::fs::File::create(&log)?;
    let mut child = if arch == Arch::host() {
        cmd.stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting mmdebstrap")?
    } else {
        vm::spawn_under_qemu_user(arch, &cmd, &out)?
    };
    // a line every 30 s: the longest step says nothing for minutes
    let status = loop {
        if let Some(s) = child.wait_timeout(Duration::from_secs(30))? {
            break s;
        }
        let last = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| l.starts_with("I: "))
            .unwrap_or("")
            .to_string();
        say(format!(
            "mmdebstrap ({arch}): {:.0} s, {last}",
            started.elapsed().as_secs_f64()
        ));
    };
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let _ = std::fs::remove_dir_all(&tmp);
        bail!(
            "mmdebstrap failed ({status}); the end of {}:\n{}",
            log.display(),
            tail.join("\n")
        );
    }
    std::fs::write(tmp.join(".complete"), recipe(arch)?)?;
    let _ = std::fs::remove_dir_all(base);
    std::fs::rename(&tmp, base)?;
    say(format!(
        "image base built in {:.0} s: {} ({})",
        started.elapsed().as_secs_f64(),
        base.display(),
        mib(tree_bytes(base))
    ));
    Ok(())
}

/// `Child::wait` with a timeout (polling).
trait WaitTimeout {
    fn wait_timeout(&mut self, d: Duration) -> std::io::Result<Option<std::process::ExitStatus>>;
}

impl WaitTimeout for Child {
    fn wait_timeout(&mut self, d: Duration) -> std::io::Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + d;
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(Some(s));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The test's key pair (the client's) and the sandbox's host key, made
/// once per image directory; known_hosts names the host `sandbox`.
fn ssh_keys(dir: &Path) -> anyhow::Result<PathBuf> {
    let ssh = dir.join("ssh");
    std::fs::create_dir_all(&ssh)?;
    for (file, comment) in [
        ("id_ed25519", "xtask-image-client"),
        ("ssh_host_ed25519_key", "sandbox-host"),
    ] {
        if !ssh.join(file).exists() {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                .arg(ssh.join(file)))?;
        }
    }
    let host = std::fs::read_to_string(ssh.join("ssh_host_ed25519_key.pub"))?;
    let host: Vec<&str> = host.split_whitespace().take(2).collect();
    std::fs::write(
        ssh.join("known_hosts"),
        format!("sandbox {}\n", host.join(" ")),
    )?;
    Ok(ssh)
}

/// Writes `data` at `rel` under `root` with `mode`, creating directories
/// with the mode the base gives them (an overlay's upper directory decides
/// a directory's mode).
fn install(root: &Path, base: &Path, rel: &str, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = root.join(rel);
    let mut parents: Vec<&Path> = Path::new(rel).ancestors().skip(1).collect();
    parents.reverse();
    for p in parents.into_iter().filter(|p| !p.as_os_str().is_empty()) {
        let dir = root.join(p);
        if dir.exists() {
            continue;
        }
        std::fs::create_dir(&dir)?;
        let m = std::fs::metadata(base.join(p)).map_or(0o755, |m| m.permissions().mode() & 0o7777);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m))?;
    }
    std::fs::write(&path, data)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The layer: the binaries, units (enabled), sandbox-init, sshd's config
/// and host key, root's authorized_keys; then a manifest.
fn build_layer(
    arch: Arch,
    dir: &Path,
    bin_dir: &Path,
    ssh: &Path,
    base: &Path,
) -> anyhow::Result<PathBuf> {
    let layer = dir.join("layer");
    let tmp = dir.join("layer.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let root = crate::workspace_root();
    let mut manifest = serde_json::Map::new();
    for b in BINARIES {
        let data = std::fs::read(bin_dir.join(b))?;
        manifest.insert(
            format!("/usr/local/bin/{b}"),
            serde_json::json!({"from": bin_dir.join(b), "sha256": sha256_hex(&data), "bytes": data.len()}),
        );
        install(&tmp, base, &format!("usr/local/bin/{b}"), &data, 0o755)?;
    }
    for (src, dst, mode) in DIST_FILES {
        let data = std::fs::read(root.join(src)).with_context(|| format!("reading {src}"))?;
        install(&tmp, base, dst, &data, mode)?;
    }
    let mut units = vec!["probe.service", "agent-bridge.service"];
    // the arm64 image boots as a VM (see `packages`)
    if arch == Arch::Aarch64 {
        for (src, dst, data, mode) in vm::LAYER_FILES {
            let data = match src {
                Some(src) => {
                    std::fs::read(root.join(src)).with_context(|| format!("reading {src}"))?
                }
                None => data.as_bytes().to_vec(),
            };
            install(&tmp, base, dst, &data, mode)?;
        }
        units.push(vm::SSH_UNIT);
    }
    // `systemctl enable` for the units
    let wants = tmp.join("etc/systemd/system/multi-user.target.wants");
    std::fs::create_dir_all(&wants)?;
    for unit in units {
        std::os::unix::fs::symlink(format!("/etc/systemd/system/{unit}"), wants.join(unit))?;
    }
    for (file, mode) in [
        ("ssh_host_ed25519_key", 0o600),
        ("ssh_host_ed25519_key.pub", 0o644),
    ] {
        install(
            &tmp,
            base,
            &format!("etc/ssh/{file}"),
            &std::fs::read(ssh.join(file))?,
            mode,
        )?;
    }
    install(
        &tmp,
        base,
        "root/.ssh/authorized_keys",
        &std::fs::read(ssh.join("id_ed25519.pub"))?,
        0o600,
    )?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            tmp.join("root/.ssh"),
            std::fs::Permissions::from_mode(0o700),
        )?;
    }
    manifest.insert("base".into(), Value::String(base.display().to_string()));
    install(
        &tmp,
        base,
        "etc/sandbox/image.json",
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
        0o644,
    )?;
    let _ = std::fs::remove_dir_all(&layer);
    std::fs::rename(&tmp, &layer)?;
    Ok(layer)
}

impl Image {
    /// Fails when the image lacks what booting needs.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.base.join(".complete").exists() {
            bail!(
                "{} is not a complete image base: run `cargo xtask image`",
                self.base.display()
            );
        }
        for (path, what) in [
            ("usr/local/bin/probe", "the probe binary"),
            ("usr/local/bin/agent-bridge", "the agent-bridge binary"),
            ("usr/sbin/sandbox-init", "the init script"),
            ("usr/sbin/sshd", "sshd"),
        ] {
            if !self.layer.join(path).is_file() && !self.base.join(path).is_file() {
                bail!(
                    "the image ({} over {}) has no /{path} ({what}): rebuild it with \
                     `cargo xtask image`",
                    self.layer.display(),
                    self.base.display()
                );
            }
        }
        Ok(())
    }

    /// Sizes: (base, layer) in bytes.
    pub fn sizes(&self) -> (u64, u64) {
        (tree_bytes(&self.base), tree_bytes(&self.layer))
    }
}
