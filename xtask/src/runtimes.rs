//! The sandbox runtimes the probe's runtime tests run under
//! (`probe/tests/runtimes.rs`): bubblewrap, firejail, Anthropic's
//! sandbox-runtime (`srt`, from npm, pinned by
//! `probe/tests/runtimes/srt/package-lock.json`), and podman with runc and
//! systemd-nspawn over a small Debian root filesystem (no image registry is
//! reachable: mmdebstrap builds it, cached in `target/runtimes/rootfs-KEY`,
//! KEY hashing the recipe).

use std::path::PathBuf;
use std::process::Command;

use anyhow::bail;

use crate::image::{SUITE, mirrors, sha256_hex};
use crate::{ensure_debian, workspace_root};

/// Debian packages the runtimes need, with a check for each.
pub const PACKAGES: [(&str, &str); 8] = [
    ("bubblewrap", "command -v bwrap"),
    // srt's relays to its proxy, and its deny-path scan
    ("socat", "command -v socat"),
    ("ripgrep", "command -v rg"),
    ("podman", "command -v podman"),
    // crun refuses this host's hybrid cgroups
    ("runc", "command -v runc"),
    ("mmdebstrap", "command -v mmdebstrap"),
    ("firejail", "command -v firejail"),
    ("systemd-container", "command -v systemd-nspawn"),
];

/// What the runtime tests are told (as environment variables).
pub struct Installed {
    /// `SRT`: srt's executable.
    pub srt: PathBuf,
    /// `RUNTIMES_ROOTFS`: the containers' root filesystem (podman, nspawn).
    pub rootfs: PathBuf,
}

impl Installed {
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("SRT", self.srt.clone()),
            ("RUNTIMES_ROOTFS", self.rootfs.clone()),
        ]
    }
}

pub fn install() -> anyhow::Result<Installed> {
    ensure_debian(&PACKAGES)?;
    Ok(Installed {
        srt: install_srt()?,
        rootfs: rootfs()?,
    })
}

fn runtimes_dir() -> PathBuf {
    workspace_root().join("target/runtimes")
}

/// srt, by `npm ci` of its pinned lock file (the newest release that runs
/// on Node 20; later ones need Node 22).
fn install_srt() -> anyhow::Result<PathBuf> {
    let dir = runtimes_dir().join("srt");
    crate::clients::npm_ci_pinned(
        "srt",
        &workspace_root().join("probe/tests/runtimes/srt"),
        &dir,
    )?;
    let bin = dir.join("node_modules/.bin/srt");
    if !bin.exists() {
        bail!("npm ci in {} left no {}", dir.display(), bin.display());
    }
    Ok(bin)
}

/// The container's root: Debian's essential set, python3-minimal and
/// merged /usr (without the hook, usrmerge drags in perl: 130+ MiB instead
/// of ~80), no documentation.
const ROOTFS_ARGS: [&str; 7] = [
    "--variant=essential",
    "--include=python3-minimal",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
];

fn rootfs() -> anyhow::Result<PathBuf> {
    let mirrors = mirrors()?;
    let recipe = format!(
        "{SUITE}\n{}\n{}\n",
        ROOTFS_ARGS.join("\n"),
        mirrors.join("\n")
    );
    let key = &sha256_hex(recipe.as_bytes())[..16];
    let rootfs = runtimes_dir().join(format!("rootfs-{key}"));
    if rootfs.join(".complete").exists() {
        return Ok(rootfs);
    }
    std::fs::create_dir_all(runtimes_dir())?;
    let tmp = rootfs.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    crate::install_step::run(
        "building the containers' root filesystem with mmdebstrap (about 30 s)",
        Command::new("mmdebstrap")
            .args(["--mode=root", "--format=directory"])
            .args(ROOTFS_ARGS)
            .arg(SUITE)
            .arg(&tmp)
            .args(&mirrors),
    )?;
    std::fs::write(tmp.join(".complete"), recipe)?;
    std::fs::rename(&tmp, &rootfs)?;
    Ok(rootfs)
}
