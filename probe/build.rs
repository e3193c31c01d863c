//! Builds probe-ebpf for bpfel-unknown-none with the nightly pinned in
//! ebpf-toolchain.toml and leaves the object in OUT_DIR, where
//! `include_bytes_aligned!` embeds it.
//!
//! `AYA_BUILD_SKIP=1` (aya-build's own switch) skips all of that and embeds
//! an empty object, so `cargo check` and clippy work on a machine without
//! the pinned nightly and bpf-linker; such a probe refuses to load, saying why.
use std::process::Command;

use anyhow::{Context as _, bail};

fn main() -> anyhow::Result<()> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest).join("../probe-ebpf");
    let root = root
        .canonicalize()
        .with_context(|| format!("{}", root.display()))?;
    let root_dir = root.to_str().context("non-UTF-8 path to probe-ebpf")?;
    println!("cargo:rerun-if-changed={root_dir}/abi/src");
    // the schema is embedded (store.rs): a new migration must never ship missing
    println!("cargo:rerun-if-changed={manifest}/../migrations");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        let out = std::env::var("OUT_DIR").context("OUT_DIR")?;
        std::fs::write(std::path::Path::new(&out).join("probe"), b"")
            .context("writing the empty eBPF object")?;
        println!(
            "cargo:warning=AYA_BUILD_SKIP is set: this probe has no eBPF programs (checks and lints only)"
        );
        return Ok(());
    }
    let pin_path = format!("{manifest}/../ebpf-toolchain.toml");
    println!("cargo:rerun-if-changed={pin_path}");
    let nightly = check_pin(&pin_path)?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&nightly),
    )
    .with_context(|| {
        format!("building probe-ebpf with {nightly} (run `cargo xtask setup` to install the pinned toolchain)")
    })
}

/// The pinned nightly, after checking that the installed one has the LLVM
/// major the pinned bpf-linker links with: a mismatch "works" with a warning
/// about a missing libLLVM, until it does not.
fn check_pin(path: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let table: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {path}"))?;
    let nightly = table
        .get("nightly")
        .and_then(|v| v.as_str())
        .with_context(|| format!("{path}: no `nightly`"))?
        .to_owned();
    let llvm = table
        .get("llvm")
        .and_then(|v| v.as_integer())
        .with_context(|| format!("{path}: no `llvm`"))?;
    let linker = table
        .get("bpf-linker")
        .and_then(|v| v.as_str())
        .with_context(|| format!("{path}: no `bpf-linker`"))?;
    let out = Command::new("rustup")
        .args(["run", &nightly, "rustc", "-vV"])
        .output()
        .context("running rustup (the eBPF build needs rustup and the pinned nightly)")?;
    if !out.status.success() {
        bail!(
            "{nightly} (pinned in ebpf-toolchain.toml) is not installed: run `cargo xtask setup`"
        );
    }
    let vv = String::from_utf8_lossy(&out.stdout);
    let have = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse::<i64>().ok());
    if have != Some(llvm) {
        bail!(
            "{nightly} has LLVM {}, ebpf-toolchain.toml pairs it with LLVM {llvm} for bpf-linker {linker}",
            have.map_or("unknown".into(), |m| m.to_string())
        );
    }
    let installed = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if installed.split_whitespace().nth(1) != Some(linker) {
        bail!(
            "bpf-linker {linker} (LLVM {llvm}) is pinned in ebpf-toolchain.toml, found {:?}: run `cargo xtask setup`",
            installed.trim()
        );
    }
    Ok(nightly)
}
