//! The two architectures the project ships for, by every name the tools
//! use for them: `uname -m`, Debian, Rust's target, QEMU.

/// An architecture the probe is built, shipped and booted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// x86_64 (Debian's amd64).
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// aarch64 (Debian's arm64: Graviton, Ampere, a Firecracker arm64 guest).
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// As `uname -m` and the ELF header say it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Debian's name for it.
    pub fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// The static Rust target the executables are built for.
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-musl",
            Arch::Aarch64 => "aarch64-unknown-linux-musl",
        }
    }

    /// The architecture an ELF executable was built for (its header's
    /// e_machine), or None when the file is not a 64-bit little-endian ELF
    /// of one of the two.
    pub fn of_elf(path: &std::path::Path) -> Option<Arch> {
        use std::io::Read as _;
        let mut header = [0u8; 20];
        std::fs::File::open(path)
            .ok()?
            .read_exact(&mut header)
            .ok()?;
        if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
            return None;
        }
        match u16::from_le_bytes([header[18], header[19]]) {
            62 => Some(Arch::X86_64),
            183 => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// The machine this runs on.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_elf_reads_the_machine_of_an_executable_and_nothing_else() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(Arch::of_elf(&me), Some(Arch::host()));
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        assert_eq!(Arch::of_elf(&manifest), None);
        assert_eq!(Arch::of_elf(std::path::Path::new("/nonexistent")), None);
    }
}
