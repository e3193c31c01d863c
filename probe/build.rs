//! Builds probe-ebpf for bpfel-unknown-none with the nightly toolchain and
//! leaves the object in OUT_DIR, where `include_bytes_aligned!` embeds it.
use anyhow::Context as _;

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
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context(
        "building probe-ebpf (needs `cargo xtask setup`: nightly rust-src and bpf-linker 0.10.0)",
    )
}
