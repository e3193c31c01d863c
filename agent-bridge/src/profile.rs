//! Sandbox profiles: what the bridge applies to every workload it spawns.
//!
//! A profile is a TOML file (see `docs/PROFILES.md`); the built-in ones in
//! `agent-bridge/profiles/` each reproduce one primitive of the taxonomy, so
//! a platform team can preview what a hardening change will break.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The built-in profiles, by name (the file stem).
pub const BUILT_IN: &[(&str, &str)] = &[
    ("clean", include_str!("../profiles/clean.toml")),
    (
        "seccomp-errno",
        include_str!("../profiles/seccomp-errno.toml"),
    ),
    (
        "seccomp-kill",
        include_str!("../profiles/seccomp-kill.toml"),
    ),
    (
        "seccomp-trap",
        include_str!("../profiles/seccomp-trap.toml"),
    ),
    ("readonly", include_str!("../profiles/readonly.toml")),
    ("noexec", include_str!("../profiles/noexec.toml")),
    ("ephemeral", include_str!("../profiles/ephemeral.toml")),
    ("full-disk", include_str!("../profiles/full-disk.toml")),
    (
        "unprivileged",
        include_str!("../profiles/unprivileged.toml"),
    ),
    ("no-caps", include_str!("../profiles/no-caps.toml")),
    ("pids-limit", include_str!("../profiles/pids-limit.toml")),
    (
        "memory-limit",
        include_str!("../profiles/memory-limit.toml"),
    ),
    (
        "address-space",
        include_str!("../profiles/address-space.toml"),
    ),
    ("no-network", include_str!("../profiles/no-network.toml")),
    ("no-tools", include_str!("../profiles/no-tools.toml")),
    ("hidden-data", include_str!("../profiles/hidden-data.toml")),
    ("cpu-limit", include_str!("../profiles/cpu-limit.toml")),
    ("deadline", include_str!("../profiles/deadline.toml")),
];

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Set from the built-in name or the file name.
    #[serde(default, skip_deserializing)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The primitive this profile is expected to produce (documentation and
    /// campaign scoring; not enforced).
    #[serde(default)]
    pub reproduces: Option<String>,
    /// Seccomp filters, stacked in order.
    #[serde(default)]
    pub seccomp: Vec<SeccompRule>,
    /// Bind-mounted read-only onto themselves.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// Bind-mounted noexec onto themselves.
    #[serde(default)]
    pub noexec: Vec<PathBuf>,
    /// A fresh tmpfs per call: nothing written survives the call.
    #[serde(default)]
    pub ephemeral: Vec<PathBuf>,
    /// Replaced by an empty read-only tmpfs.
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// A small tmpfs that lasts for the MCP session, bind-mounted on `path`.
    #[serde(default)]
    pub disk_limit: Vec<DiskLimit>,
    /// Memory cgroup limit per call, e.g. "64M".
    #[serde(default)]
    pub memory_limit: Option<Size>,
    /// Pids cgroup limit per call.
    #[serde(default)]
    pub pids_limit: Option<u32>,
    /// A network namespace per call with loopback only.
    #[serde(default)]
    pub no_network: bool,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    /// Run without capabilities (bounding, effective, permitted, inheritable, ambient).
    #[serde(default)]
    pub drop_caps: bool,
    /// Resource limits (soft = hard): as, cpu, fsize, nofile, nproc, core.
    #[serde(default)]
    pub rlimits: BTreeMap<String, u64>,
    /// Environment variables set for every workload (override the caller's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Upper bound on any call's timeout, in milliseconds.
    #[serde(default)]
    pub max_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SeccompRule {
    /// `errno` (EPERM), `errno=ENAME`, `kill`, `trap` or `log`.
    pub action: String,
    pub syscalls: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DiskLimit {
    pub path: PathBuf,
    pub size: Size,
}

/// A byte count: an integer, or a string with a K/M/G suffix (powers of 1024).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SizeRepr", into = "u64")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(u64),
    Str(String),
}

impl TryFrom<SizeRepr> for Size {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<Size, String> {
        match r {
            SizeRepr::Int(n) => Ok(Size(n)),
            SizeRepr::Str(s) => contract::units::parse_size(&s).map(Size),
        }
    }
}

impl From<Size> for u64 {
    fn from(s: Size) -> u64 {
        s.0
    }
}

/// setrlimit's resource argument: glibc's `__rlimit_resource_t`, a plain
/// int in musl (the static `cargo xtask dist` build).
#[cfg(target_env = "gnu")]
pub type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
pub type RlimitResource = libc::c_int;

/// The rlimit names a profile may set, and their resources.
pub const RLIMITS: &[(&str, RlimitResource)] = &[
    ("as", libc::RLIMIT_AS),
    ("core", libc::RLIMIT_CORE),
    ("cpu", libc::RLIMIT_CPU),
    ("fsize", libc::RLIMIT_FSIZE),
    ("nofile", libc::RLIMIT_NOFILE),
    ("nproc", libc::RLIMIT_NPROC),
];

/// Why a profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no built-in profile or file named `{name}` (built-in: {built_in})")]
    NotFound { name: String, built_in: String },
    // `error`, not `source`: the message says it, and a source would be
    // said again by every `{:#}` that prints the chain
    #[error("cannot read profile {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A problem in the file at `path`.
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<ProfileError>,
    },
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A value the format accepts but a sandbox cannot apply.
    #[error("{0}")]
    Invalid(String),
}

impl Profile {
    /// A built-in name, or a path to a TOML file.
    pub fn load(name_or_file: &str) -> Result<Profile, ProfileError> {
        if let Some((name, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_file) {
            return Profile::parse(name, text);
        }
        let path = Path::new(name_or_file);
        if !path.exists() {
            let names: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
            return Err(ProfileError::NotFound {
                name: name_or_file.to_owned(),
                built_in: names.join(", "),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|error| ProfileError::Read {
            path: path.to_owned(),
            error,
        })?;
        let name = path.file_stem().map_or_else(
            || name_or_file.to_owned(),
            |s| s.to_string_lossy().into_owned(),
        );
        Profile::parse(&name, &text).map_err(|e| ProfileError::InFile {
            path: path.to_owned(),
            error: Box::new(e),
        })
    }

    pub fn parse(name: &str, text: &str) -> Result<Profile, ProfileError> {
        let mut p: Profile = toml::from_str(text)?;
        p.name = name.to_owned();
        p.validate().map_err(ProfileError::Invalid)?;
        Ok(p)
    }

    fn validate(&self) -> Result<(), String> {
        let paths = self
            .read_only
            .iter()
            .chain(&self.noexec)
            .chain(&self.ephemeral)
            .chain(&self.hidden)
            .chain(self.disk_limit.iter().map(|d| &d.path));
        for p in paths {
            if !p.is_absolute() {
                return Err(format!("path `{}` must be absolute", p.display()));
            }
            if p == Path::new("/") {
                return Err("`/` cannot be remounted by a profile".into());
            }
        }
        for rule in &self.seccomp {
            probe::fault::seccomp_filter(&rule.action, &rule.syscalls)
                .map_err(|e| format!("seccomp rule {:?}: {e}", rule.syscalls))?;
        }
        for name in self.rlimits.keys() {
            if !RLIMITS.iter().any(|(n, _)| n == name) {
                let known: Vec<&str> = RLIMITS.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "unknown rlimit `{name}` (known: {})",
                    known.join(", ")
                ));
            }
        }
        if self.gid.is_some() && self.uid.is_none() {
            return Err("`gid` needs `uid` too".into());
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                return Err(format!(
                    "env `{k}`: names may not be empty or hold = or NUL"
                ));
            }
        }
        Ok(())
    }

    /// Whether the profile changes anything at all.
    pub fn is_clean(&self) -> bool {
        let named = self.name.clone();
        *self
            == Profile {
                name: named,
                description: self.description.clone(),
                reproduces: self.reproduces.clone(),
                ..Profile::default()
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_parses() {
        for (name, text) in BUILT_IN {
            let p = Profile::parse(name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!p.description.is_empty(), "{name} has no description");
            assert!(
                p.reproduces.is_some(),
                "{name} says nothing of what it reproduces"
            );
            assert_eq!(p.is_clean(), *name == "clean", "{name}");
        }
        // every file in profiles/ is listed
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
        let files = std::fs::read_dir(dir).unwrap().count();
        assert_eq!(files, BUILT_IN.len());
    }

    #[test]
    fn docs_list_every_built_in_profile_as_it_is() {
        let doc = include_str!("../../docs/PROFILES.md");
        for (name, text) in BUILT_IN {
            let p = Profile::parse(name, text).unwrap();
            let row = format!(
                "| `{name}` | `{}` | {} |",
                p.reproduces.as_deref().unwrap_or("-"),
                p.description
            );
            assert!(
                doc.contains(&row),
                "docs/PROFILES.md lacks or misstates:\n{row}"
            );
        }
        // the knob example in the docs is itself a valid profile
        let example = doc
            .split("```toml\n")
            .nth(1)
            .unwrap()
            .split("```")
            .next()
            .unwrap();
        let example = serde_json::to_value(Profile::parse("example", example).unwrap()).unwrap();
        let default = serde_json::to_value(Profile::default()).unwrap();
        for (knob, value) in default.as_object().unwrap() {
            if knob != "name" {
                assert_ne!(
                    &example[knob], value,
                    "the docs' example does not show `{knob}`"
                );
            }
        }
    }

    #[test]
    fn bad_profiles_say_what_is_wrong() {
        let e = Profile::parse("x", "read_only = [\"tmp\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("absolute"), "{e}");
        let e = Profile::parse("x", "readonly = [\"/tmp\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
        let e = Profile::parse(
            "x",
            "[[seccomp]]\naction = \"errno\"\nsyscalls = [\"nosuch\"]",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nosuch"), "{e}");
        let e = Profile::parse("x", "[rlimits]\nstack = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("stack"), "{e}");
        let e = Profile::parse("x", "memory_limit = \"lots\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lots"), "{e}");
        assert!(
            Profile::load("no-such-profile")
                .unwrap_err()
                .to_string()
                .contains("built-in: clean")
        );
    }
}
