//! The pinned eBPF toolchain (`ebpf-toolchain.toml`): a dated nightly with
//! rust-src, and the bpf-linker built for that nightly's LLVM.
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, bail};

pub struct Pin {
    pub nightly: String,
    pub llvm: u32,
    pub bpf_linker: String,
}

impl Pin {
    pub fn load(root: &Path) -> anyhow::Result<Pin> {
        let path = root.join("ebpf-toolchain.toml");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let table: toml::Table =
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let field = |name: &str| {
            table
                .get(name)
                .with_context(|| format!("{}: no `{name}`", path.display()))
        };
        Ok(Pin {
            nightly: field("nightly")?
                .as_str()
                .context("`nightly` must be a string")?
                .to_owned(),
            llvm: field("llvm")?
                .as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .context("`llvm` must be a major version number")?,
            bpf_linker: field("bpf-linker")?
                .as_str()
                .context("`bpf-linker` must be a string")?
                .to_owned(),
        })
    }

    /// Installs the pinned nightly (with rust-src) and bpf-linker when they
    /// are missing, then checks that the pair matches.
    pub fn ensure(&self) -> anyhow::Result<()> {
        if !self.has_rust_src() {
            let what = format!("installing {} with rust-src", self.nightly);
            crate::install_step::run(
                &what,
                Command::new("rustup").args([
                    "toolchain",
                    "install",
                    &self.nightly,
                    "--profile",
                    "minimal",
                    "--component",
                    "rust-src",
                ]),
            )?;
        }
        if self.installed_linker().as_deref() != Some(self.bpf_linker.as_str()) {
            let what = format!("installing bpf-linker {} (about 90 s)", self.bpf_linker);
            crate::install_step::run(
                &what,
                Command::new("cargo").args([
                    "install",
                    "--locked",
                    "--force",
                    &format!("bpf-linker@{}", self.bpf_linker),
                ]),
            )?;
        }
        self.check()
    }

    /// Fails, saying which half is off, unless the installed nightly has the
    /// pinned LLVM major and rust-src, and bpf-linker is the pinned version.
    pub fn check(&self) -> anyhow::Result<()> {
        let llvm = self.nightly_llvm()?;
        if llvm != self.llvm {
            bail!(
                "{} has LLVM {llvm}, but ebpf-toolchain.toml pairs it with LLVM {} \
                 (bpf-linker {}): pick a nightly whose `rustc -vV` says LLVM {}",
                self.nightly,
                self.llvm,
                self.bpf_linker,
                self.llvm
            );
        }
        if !self.has_rust_src() {
            bail!("{} has no rust-src: run `cargo xtask setup`", self.nightly);
        }
        match self.installed_linker() {
            Some(v) if v == self.bpf_linker => Ok(()),
            Some(v) => bail!(
                "bpf-linker {v} is installed; ebpf-toolchain.toml pins {} (LLVM {}): \
                 run `cargo xtask setup`",
                self.bpf_linker,
                self.llvm
            ),
            None => bail!("bpf-linker is not installed: run `cargo xtask setup`"),
        }
    }

    fn has_rust_src(&self) -> bool {
        Command::new("rustup")
            .args([
                "component",
                "list",
                "--installed",
                "--toolchain",
                &self.nightly,
            ])
            .output()
            .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("rust-src"))
            .unwrap_or(false)
    }

    fn nightly_llvm(&self) -> anyhow::Result<u32> {
        let out = Command::new("rustup")
            .args(["run", &self.nightly, "rustc", "-vV"])
            .output()
            .context("running rustup")?;
        if !out.status.success() {
            bail!(
                "{} is not installed ({}): run `cargo xtask setup`",
                self.nightly,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        llvm_major(&String::from_utf8_lossy(&out.stdout))
            .with_context(|| format!("no `LLVM version:` in `rustc -vV` of {}", self.nightly))
    }

    /// `bpf-linker --version` says `bpf-linker X.Y.Z`.
    fn installed_linker(&self) -> Option<String> {
        let out = Command::new("bpf-linker").arg("--version").output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace().nth(1).map(str::to_owned)
    }
}

/// The major of `LLVM version: 22.1.6` in `rustc -vV` output.
pub fn llvm_major(rustc_vv: &str) -> Option<u32> {
    rustc_vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_llvm_major() {
        let vv = "rustc 1.98.0-nightly (14210df0e 2026-05-31)\nhost: x86_64-unknown-linux-gnu\nLLVM version: 22.1.6\n";
        assert_eq!(llvm_major(vv), Some(22));
        assert_eq!(llvm_major("rustc 1.0\n"), None);
    }

    #[test]
    fn the_repository_pin_parses() {
        let pin = Pin::load(&crate::workspace_root()).unwrap();
        assert!(pin.nightly.starts_with("nightly-20"), "{}", pin.nightly);
        assert!(pin.llvm >= 20);
        assert_eq!(pin.bpf_linker.split('.').count(), 3);
    }
}
