//! `cargo xtask bench` (filled in below).
use std::path::Path;

pub fn run(_bin: &Path, _n: u64, _runs: usize, _write: bool) -> anyhow::Result<()> {
    anyhow::bail!("bench: not built yet")
}
