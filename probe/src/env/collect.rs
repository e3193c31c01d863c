//! Taking a snapshot (`probe env`): every facet measured from inside the
//! environment, as the workload's user, without root or a daemon.
//!
//! Nothing is written and no packet leaves for an address not asked for
//! (`Options::reach`). A facet that cannot be read in part records why in
//! its `unreadable` and the snapshot goes on; one that panics is recorded
//! the same way.
//!
//! Layout: [`trials`] (system calls tried in forked children) run first,
//! before any thread; then [`commands`] starts its version probes on a few
//! threads while the other facets are read on this one.

mod commands;
mod elf;
mod identity;
mod network;
mod packages;
mod places;
mod resources;
mod runtime;
mod sbom;
mod syscalls;
mod text;
mod trials;
mod util;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

pub use sbom::cyclonedx;
pub use text::render_text;

use super::{Facet, Snapshot, hash_of};

/// What a snapshot measures beyond the defaults.
#[derive(Debug, Clone)]
pub struct Options {
    /// Commands looked for besides [`commands::DEFAULT_COMMANDS`].
    pub extra_commands: Vec<String>,
    /// `HOST:PORT`s to try a TCP connection to (literal addresses and
    /// `localhost` only).
    pub reach: Vec<String>,
    /// How long a command's `--version` may take before it is killed.
    pub version_timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            extra_commands: Vec::new(),
            reach: Vec::new(),
            version_timeout: Duration::from_secs(2),
        }
    }
}

/// Takes a snapshot of the environment this process runs in. Never fails
/// as a whole.
pub fn snapshot(opts: &Options, source: &str) -> Snapshot {
    let started = Instant::now();
    let mut s = Snapshot::empty(source);
    // forks first, while this process has a single thread
    let trials = guarded(Vec::new, trials::run_all);
    let userns = trials
        .iter()
        .find(|(k, _)| *k == "try.userns")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "not tried".into());

    // lossy: a PATH entry that is not UTF-8 is not searched, the others are
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (dirs, path_note) = commands::path_dirs(&path.to_string_lossy());
    let mut names: Vec<String> = commands::DEFAULT_COMMANDS
        .iter()
        .map(|n| n.to_string())
        .collect();
    for extra in &opts.extra_commands {
        if !names.contains(extra) {
            names.push(extra.clone());
        }
    }
    let probes = commands::Commands::start(names, &dirs, path_note, opts.version_timeout);

    let mut put = |name: &str, f: Result<Facet, String>| {
        let facet = f.unwrap_or_else(|why| {
            let mut f = Facet::new("(failed)");
            f.cannot(name, why);
            f
        });
        s.facets.insert(name.to_string(), facet);
    };
    put("runtime", attempt(runtime::facet));
    put("identity", attempt(identity::facet));
    put("syscalls", attempt(|| syscalls::facet(&trials)));
    put("resources", attempt(resources::facet));
    put("writable", attempt(places::facet));
    put("network", attempt(|| network::facet(&opts.reach)));
    put("variables", attempt(variables));
    put("persistence", attempt(persistence));
    put("packages", attempt(|| packages::facet(&dirs)));
    let mut libs = elf::LibSearch::from_system();
    put(
        "browser",
        attempt(|| commands::browser_facet(&dirs, &mut libs, &userns)),
    );
    put("commands", attempt(move || probes.finish(&mut libs)));
    s.took_ms = started.elapsed().as_millis() as u64;
    s
}

/// `f()`, or why it panicked.
fn attempt<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        format!("the probe failed measuring it: {msg}")
    })
}

/// `f()`, or `fallback()` when it panicked.
fn guarded<T>(fallback: impl FnOnce() -> T, f: impl FnOnce() -> T) -> T {
    attempt(f).unwrap_or_else(|_| fallback())
}

/// Every environment variable by name, its value only as a hash.
fn variables() -> Facet {
    use std::os::unix::ffi::OsStrExt as _;
    let mut f = Facet::new("The process environment: each name with a hash of its value.");
    for (name, value) in std::env::vars_os() {
        f.set(name.to_string_lossy(), hash_of(value.as_bytes()));
    }
    f
}

/// What one snapshot cannot measure: a campaign fills these in.
fn persistence() -> Facet {
    let mut f = Facet::new("Not measured by one snapshot.");
    for key in ["tmp", "workdir"] {
        f.cannot(
            key,
            "one snapshot cannot tell: a campaign run writes a marker at its start and \
             reads it at its end",
        );
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_has_its_facets_and_no_values() {
        let s = snapshot(&Options::default(), "unit test");
        for name in crate::env::FACETS {
            if *name == "mcp" {
                assert!(s.facet(name).is_none());
                continue;
            }
            assert!(s.facet(name).is_some(), "{name}");
        }
        // (values kept out: tests/env.rs plants a secret in a child's env)
        let vars = &s.facet("variables").unwrap().items;
        if let Some(path) = std::env::var_os("PATH") {
            use std::os::unix::ffi::OsStrExt as _;
            assert_eq!(vars["PATH"], hash_of(path.as_bytes()));
        }
        assert_eq!(s.source, "unit test");
        let text = render_text(&s);
        assert!(text.contains("commands:"), "{text}");
    }
}
