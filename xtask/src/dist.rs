//! `cargo xtask dist`: `probe`, `probe-fault` and `agent-bridge` as fully
//! static release executables for x86_64 and aarch64 (musl; the eBPF
//! object built for each architecture and embedded, SQLite compiled in),
//! each set in `<target dir>/dist/ARCH` with a `SHA256SUMS`, and a tarball
//! and a Debian package per architecture beside them (with their own
//! `SHA256SUMS`).
//! They run on any Linux of their architecture, in an image with no libc.
//!
//! aarch64 is built on this x86_64 machine: Debian's aarch64 gcc links,
//! and SQLite compiles against musl's own headers (Debian's musl-dev for
//! arm64, unpacked, not installed): glibc's would ask for `open64` and
//! friends, which musl 1.2.4+ no longer has.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::arch::Arch;

/// (package, binary) in the order they are listed.
pub const BINARIES: [(&str, &str); 3] = [
    ("probe", "probe"),
    ("probe", "probe-fault"),
    ("agent-bridge", "agent-bridge"),
];

/// What the C parts (SQLite, through the cc crate) compile with, for x86_64.
const MUSL_GCC: (&str, &str) = ("musl-tools", "command -v musl-gcc");

/// The aarch64 compiler and linker.
const AARCH64_GCC: (&str, &str) = ("gcc-aarch64-linux-gnu", "command -v aarch64-linux-gnu-gcc");

/// Builds every architecture of `arches`, then one tarball each
/// (`probe-VERSION-ARCH.tar.gz`: the executables and their SHA256SUMS
/// under `probe-VERSION-ARCH/`) and `dist/SHA256SUMS` of the tarballs.
/// Returns each architecture's directory.
pub fn build_all(arches: &[Arch]) -> anyhow::Result<Built> {
    build_all_logged(arches, None)
}

/// Each architecture built and its directory, `dist/ARCH`.
pub type Built = Vec<(Arch, PathBuf)>;

/// [`build_all`] in a thread of its own at the lowest CPU priority, its
/// compiler's output in `log`: `cargo xtask test` builds the release
/// executables while its tests run (they leave a core idle much of the
/// time; at nice 19 the build takes only that) and waits for them where it
/// needs them. What the build installs (Rust targets, Debian packages) is
/// installed first, here, so no apt-get runs beside the caller's own.
pub fn build_all_in_background(
    arches: &[Arch],
    log: PathBuf,
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<Built>>> {
    for &arch in arches {
        prepare(arch)?;
    }
    let arches = arches.to_vec();
    Ok(std::thread::spawn(move || {
        crate::background::lowest_priority_here();
        build_all_logged(&arches, Some(&log)).with_context(|| {
            format!(
                "building the release executables (the compiler's output: {})",
                log.display()
            )
        })
    }))
}

fn build_all_logged(arches: &[Arch], log: Option<&Path>) -> anyhow::Result<Built> {
    let mut built = Vec::new();
    for &arch in arches {
        built.push((arch, build(arch, log)?));
    }
    let root = crate::workspace_root();
    let dist = target_dir(&root)?.join("dist");
    let version = version(&root)?;
    for (arch, dir) in &built {
        let name = format!("probe-{version}-{arch}");
        let tarball = dist.join(format!("{name}.tar.gz"));
        // reproducible: sorted, no owner, no time
        crate::run(
            Command::new("tar")
                .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
                .args(["--mtime=@0", "--transform", &format!("s,^\\.,{name},")])
                .arg("-czf")
                .arg(&tarball)
                .arg("-C")
                .arg(dir)
                .arg("."),
        )?;
        eprintln!("xtask: wrote {}", tarball.display());
        let deb = deb(*arch, dir, &version, &dist)?;
        eprintln!("xtask: wrote {}", deb.display());
    }
    // every release file there, also an architecture built by an earlier run
    let mut files: Vec<String> = std::fs::read_dir(&dist)?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tar.gz") || n.ends_with(".deb"))
        .collect();
    files.sort();
    let mut sums = String::new();
    for name in files {
        let hash = crate::image::sha256_file(&dist.join(&name))?;
        sums.push_str(&format!("{hash}  {name}\n"));
    }
    std::fs::write(dist.join("SHA256SUMS"), sums)?;
    Ok(built)
}

/// The Debian package of one architecture's executables, as a platform
/// engineer bakes it into an image (`apt-get install ./probe_*.deb` in a
/// Dockerfile): the three executables in /usr/bin, the daemon's systemd
/// unit (installed, not enabled: the image decides) and its config file
/// /etc/probe/probe.toml (a conffile, kept across upgrades). Static
/// executables: no dependencies. Built with dpkg-deb.
fn deb(arch: Arch, dir: &Path, version: &str, out: &Path) -> anyhow::Result<PathBuf> {
    let root = crate::workspace_root();
    let tree = out.join(format!("deb-{}", arch.debian()));
    let _ = std::fs::remove_dir_all(&tree);
    let put = |path: &str, data: &[u8], mode: u32| -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let to = tree.join(path);
        std::fs::create_dir_all(to.parent().context("a parent")?)?;
        std::fs::write(&to, data)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    let mut installed = 0;
    for (_, bin) in BINARIES {
        let data = std::fs::read(dir.join(bin))?;
        installed += data.len();
        put(&format!("usr/bin/{bin}"), &data, 0o755)?;
    }
    put(
        "lib/systemd/system/probe.service",
        package_unit(&root)?.as_bytes(),
        0o644,
    )?;
    let config = std::fs::read(root.join("dist/probe.toml"))?;
    put("etc/probe/probe.toml", &config, 0o644)?;
    let control = format!(
        "Package: probe\n\
         Version: {version}\n\
         Architecture: {}\n\
         Maintainer: probe developers <probe@localhost>\n\
         Installed-Size: {}\n\
         Section: admin\n\
         Priority: optional\n\
         Description: kernel evidence for sandboxed AI agent workloads\n \
         probe (an eBPF daemon: which kernel primitive made a tool call fail),\n \
         probe-fault and agent-bridge (the MCP server that asks it), static.\n \
         The probe.service unit is installed but not enabled.\n",
        arch.debian(),
        installed.div_ceil(1024)
    );
    put("DEBIAN/control", control.as_bytes(), 0o644)?;
    put("DEBIAN/conffiles", b"/etc/probe/probe.toml\n", 0o644)?;
    // what debhelper's systemd snippet does for a unit it does not enable:
    // systemd learns of the new unit file
    put(
        "DEBIAN/postinst",
        b"#!/bin/sh\nset -e\nif [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi\n",
        0o755,
    )?;
    let deb = out.join(format!("probe_{version}_{}.deb", arch.debian()));
    crate::run(
        Command::new("dpkg-deb")
            // reproducible: every mtime clamped, as the tarballs' are
            .env("SOURCE_DATE_EPOCH", "0")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&tree)
            .arg(&deb),
    )?;
    std::fs::remove_dir_all(&tree)?;
    Ok(deb)
}

/// dist/probe.service as the package installs it: the executable in
/// /usr/bin, everything else from /etc/probe/probe.toml.
fn package_unit(root: &Path) -> anyhow::Result<String> {
    let unit = std::fs::read_to_string(root.join("dist/probe.service"))?;
    let mut out = String::from(
        "# systemd unit for the probe daemon, installed by the probe package and\n\
         # not enabled: `systemctl enable --now probe`. Settings: /etc/probe/probe.toml.\n",
    );
    for line in unit.lines().skip_while(|l| l.starts_with('#')) {
        if line.starts_with("ExecStart=") {
            out.push_str("ExecStart=/usr/bin/probe run --config /etc/probe/probe.toml\n");
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !unit
        .lines()
        .any(|l| l.starts_with("ExecStart=/usr/local/bin/probe run"))
    {
        bail!("dist/probe.service: no `ExecStart=/usr/local/bin/probe run` line to replace");
    }
    Ok(out)
}

/// Installs what building `arch` needs: its Rust target and its C
/// compiler.
fn prepare(arch: Arch) -> anyhow::Result<()> {
    ensure_target(&crate::workspace_root(), arch.rust_target())?;
    crate::ensure_debian(&[match arch {
        Arch::X86_64 => MUSL_GCC,
        Arch::Aarch64 => AARCH64_GCC,
    }])
}

/// Builds the static executables for `arch` and returns their directory,
/// `dist/ARCH`, which holds exactly them and `SHA256SUMS`; cargo's output
/// goes to `log` (appended) when given.
fn build(arch: Arch, log: Option<&Path>) -> anyhow::Result<PathBuf> {
    let root = crate::workspace_root();
    let target = arch.rust_target();
    prepare(arch)?;
    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(&root)
        .args(["build", "--release", "--locked", "--target", target]);
    if let Some(log) = log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        cargo.stdout(file.try_clone()?).stderr(file);
    }
    match arch {
        Arch::X86_64 => {
            // cc would find musl-gcc by itself; say it, so it never falls back to the glibc gcc
            cargo.env("CC_x86_64_unknown_linux_musl", "musl-gcc");
        }
        Arch::Aarch64 => {
            let apt = crate::apt::Private::open(&crate::apt::host_suite()?, arch)?;
            let musl = apt.unpack("musl-dev", ".")?;
            let gcc_include = crate::output(
                Command::new("aarch64-linux-gnu-gcc").arg("-print-file-name=include"),
            )?;
            let cflags = format!(
                "-nostdinc -isystem {} -isystem {}",
                musl.join("usr/include/aarch64-linux-musl").display(),
                gcc_include.trim()
            );
            cargo
                .env("CC_aarch64_unknown_linux_musl", "aarch64-linux-gnu-gcc")
                .env("CFLAGS_aarch64_unknown_linux_musl", cflags)
                .env(
                    "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER",
                    "aarch64-linux-gnu-gcc",
                );
        }
    }
    for (package, bin) in BINARIES {
        cargo.args(["-p", package, "--bin", bin]);
    }
    crate::run(&mut cargo)?;

    let target_dir = target_dir(&root)?;
    let built = target_dir.join(target).join("release");
    let dist = target_dir.join("dist").join(arch.name());
    if dist.exists() {
        std::fs::remove_dir_all(&dist).with_context(|| format!("removing {}", dist.display()))?;
    }
    std::fs::create_dir_all(&dist)?;
    let mut sums = String::new();
    for (_, bin) in BINARIES {
        let out = dist.join(bin);
        std::fs::copy(built.join(bin), &out)
            .with_context(|| format!("copying {bin} from {}", built.display()))?;
        let data = std::fs::read(&out)?;
        let linkage = linkage(&data).with_context(|| format!("reading {}", out.display()))?;
        eprintln!(
            "xtask: dist/{arch}/{bin:<13} {:>6.1} MiB  {linkage}",
            data.len() as f64 / (1 << 20) as f64
        );
        if !linkage.is_static() {
            bail!("{} is not static: {linkage}", out.display());
        }
        sums.push_str(&format!("{}  {bin}\n", crate::image::sha256_file(&out)?));
    }
    std::fs::write(dist.join("SHA256SUMS"), sums)?;
    eprintln!("xtask: wrote {} (with SHA256SUMS)", dist.display());
    Ok(dist)
}

/// The probe's version, as its Cargo.toml says.
fn version(root: &Path) -> anyhow::Result<String> {
    let path = root.join("probe/Cargo.toml");
    let text = std::fs::read_to_string(&path)?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    table
        .get("package")
        .and_then(|p| p.get("version"))
        .and_then(|v| v.as_str())
        .map(String::from)
        .with_context(|| format!("{}: no package.version", path.display()))
}

/// Adds `target` to the userspace toolchain of rust-toolchain.toml.
fn ensure_target(root: &Path, target: &str) -> anyhow::Result<()> {
    let path = root.join("rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let channel = table
        .get("toolchain")
        .and_then(|t| t.get("channel"))
        .and_then(|c| c.as_str())
        .with_context(|| format!("{}: no toolchain.channel", path.display()))?;
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed", "--toolchain", channel])
        .output()
        .context("running rustup")?;
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        eprintln!("xtask: adding the {target} target to Rust {channel}");
        crate::run(Command::new("rustup").args(["target", "add", target, "--toolchain", channel]))?;
    }
    Ok(())
}

/// Cargo's target directory (CARGO_TARGET_DIR or build.target-dir when set).
pub fn target_dir(root: &Path) -> anyhow::Result<PathBuf> {
    let out = Command::new("cargo")
        .current_dir(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    meta["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("cargo metadata: no target_directory")
}

/// How an ELF executable is linked, from its own headers.
#[derive(Debug, PartialEq)]
pub enum Linkage {
    /// No dynamic section at all.
    Static,
    /// Relocates itself (a dynamic section) but asks for no loader and no library.
    StaticPie,
    /// Needs a program interpreter or shared libraries.
    Dynamic { interpreter: bool, needed: usize },
}

impl Linkage {
    pub fn is_static(&self) -> bool {
        !matches!(self, Linkage::Dynamic { .. })
    }
}

impl std::fmt::Display for Linkage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Linkage::Static => f.write_str("static"),
            Linkage::StaticPie => f.write_str("static (static-pie: no interpreter, no DT_NEEDED)"),
            Linkage::Dynamic {
                interpreter,
                needed,
            } => write!(
                f,
                "DYNAMIC ({}{needed} DT_NEEDED)",
                if *interpreter { "PT_INTERP, " } else { "" }
            ),
        }
    }
}

/// Reads a little-endian ELF64's program headers: PT_INTERP, and the
/// DT_NEEDED entries of PT_DYNAMIC.
pub fn linkage(elf: &[u8]) -> anyhow::Result<Linkage> {
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NEEDED: u64 = 1;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        bail!("not a little-endian ELF64 file");
    }
    let truncated = || anyhow::anyhow!("truncated ELF headers");
    let phoff = u64_at(0x20).ok_or_else(truncated)? as usize;
    let phentsize = u16_at(0x36).ok_or_else(truncated)? as usize;
    let phnum = u16_at(0x38).ok_or_else(truncated)? as usize;
    let (mut interpreter, mut dynamic, mut needed) = (false, false, 0);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        match u32_at(ph).ok_or_else(truncated)? {
            PT_INTERP => interpreter = true,
            PT_DYNAMIC => {
                dynamic = true;
                let offset = u64_at(ph + 8).ok_or_else(truncated)? as usize;
                let size = u64_at(ph + 32).ok_or_else(truncated)? as usize;
                for entry in (offset..offset + size).step_by(16) {
                    match u64_at(entry).ok_or_else(truncated)? {
                        0 => break,
                        DT_NEEDED => needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(match (interpreter, needed, dynamic) {
        (false, 0, false) => Linkage::Static,
        (false, 0, true) => Linkage::StaticPie,
        _ => Linkage::Dynamic {
            interpreter,
            needed,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_not_static() {
        // this test binary is linked against glibc: an interpreter and libc.so.6
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        match linkage(&me).unwrap() {
            Linkage::Dynamic {
                interpreter,
                needed,
            } => assert!(interpreter && needed >= 1),
            other => panic!("the glibc test binary reads as {other}"),
        }
        assert!(linkage(b"#!/bin/sh\n").is_err());
    }
}
