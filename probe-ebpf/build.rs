use which::which;

/// Rebuild the eBPF object when bpf-linker changes (it is what links it).
fn main() {
    let bpf_linker = which("bpf-linker").expect("bpf-linker not found: run `cargo xtask setup`");
    println!("cargo:rerun-if-changed={}", bpf_linker.to_str().unwrap());
}
