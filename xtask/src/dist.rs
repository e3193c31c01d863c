//! `cargo xtask dist`: `probe`, `probe-fault` and `agent-bridge` as fully
//! static release executables for x86_64-unknown-linux-musl (the eBPF object
//! embedded, SQLite compiled in), copied to `<target dir>/dist` with a
//! `SHA256SUMS`. They run on any x86_64 Linux, in an image with no libc.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

pub const TARGET: &str = "x86_64-unknown-linux-musl";

/// (package, binary) in the order they are listed.
pub const BINARIES: [(&str, &str); 3] = [
    ("probe", "probe"),
    ("probe", "probe-fault"),
    ("agent-bridge", "agent-bridge"),
];

/// What the C parts (SQLite, through the cc crate) compile with.
const MUSL_GCC: (&str, &str) = ("musl-tools", "command -v musl-gcc");

/// Builds the static executables and returns the dist directory, which
/// holds exactly them and `SHA256SUMS`.
pub fn build() -> anyhow::Result<PathBuf> {
    let root = crate::workspace_root();
    ensure_target(&root)?;
    crate::ensure_debian(&[MUSL_GCC])?;
    let mut cargo = Command::new("cargo");
    cargo
        .current_dir(&root)
        .args(["build", "--release", "--locked", "--target", TARGET])
        // cc would find musl-gcc by itself; say it, so it never falls back to the glibc gcc
        .env("CC_x86_64_unknown_linux_musl", "musl-gcc");
    for (package, bin) in BINARIES {
        cargo.args(["-p", package, "--bin", bin]);
    }
    crate::run(&mut cargo)?;

    let target_dir = target_dir(&root)?;
    let built = target_dir.join(TARGET).join("release");
    let dist = target_dir.join("dist");
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
            "xtask: dist/{bin:<13} {:>6.1} MiB  {linkage}",
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

/// Adds the musl target to the userspace toolchain of rust-toolchain.toml.
fn ensure_target(root: &Path) -> anyhow::Result<()> {
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
        .any(|l| l.trim() == TARGET)
    {
        eprintln!("xtask: adding the {TARGET} target to Rust {channel}");
        crate::run(Command::new("rustup").args(["target", "add", TARGET, "--toolchain", channel]))?;
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
