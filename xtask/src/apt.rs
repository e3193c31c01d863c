//! The Debian archive as this machine's apt configuration names it: the
//! mirrors mmdebstrap builds the project's root filesystems from (the
//! image, the containers' root, the precision corpus's images). No archive
//! host is written into the project; a machine with another mirror uses it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::arch::Arch;
use crate::output;

/// A private apt state for one suite and architecture: packages of the
/// archive (a kernel, busybox, musl's headers) downloaded and unpacked
/// without installing them. The host's own apt state, its architectures
/// and its installed packages are never touched.
pub struct Private {
    at: PathBuf,
    arch: Arch,
}

impl Private {
    /// `target/debian/SUITE-ARCH`, with its lists updated.
    pub fn open(suite: &str, arch: Arch) -> anyhow::Result<Private> {
        let at = crate::workspace_root()
            .join("target/debian")
            .join(format!("{suite}-{}", arch.debian()));
        for sub in ["lists/partial", "cache", "archives/partial", "debs"] {
            std::fs::create_dir_all(at.join(sub))?;
        }
        let sources: String = mirrors(suite)?
            .iter()
            .map(|l| l.replacen("deb ", &format!("deb [arch={}] ", arch.debian()), 1) + "\n")
            .collect();
        std::fs::write(at.join("sources.list"), sources)?;
        let apt = Private { at, arch };
        output(apt.command("apt-get").args(["-q", "update"]))
            .with_context(|| format!("apt-get update for {suite} {}", arch.debian()))?;
        Ok(apt)
    }

    /// apt-get or apt-cache on this state.
    fn command(&self, tool: &str) -> Command {
        let mut cmd = Command::new(tool);
        let arch = self.arch.debian();
        for (opt, path) in [
            ("Dir::Etc::sourcelist", self.at.join("sources.list")),
            ("Dir::State::Lists", self.at.join("lists")),
            ("Dir::Cache", self.at.join("cache")),
            ("Dir::Cache::Archives", self.at.join("archives")),
        ] {
            cmd.arg("-o").arg(format!("{opt}={}", path.display()));
        }
        cmd.args(["-o", "Dir::Etc::sourceparts=-", "-o", "Debug::NoLocking=1"])
            .args(["-o", &format!("APT::Architecture={arch}")])
            .args(["-o", &format!("APT::Architectures={arch}")])
            .current_dir(&self.at)
            .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    }

    /// The packages `package` depends on.
    pub fn depends(&self, package: &str) -> anyhow::Result<Vec<String>> {
        let text = output(self.command("apt-cache").args(["depends", package]))?;
        Ok(text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .map(|p| p.split_whitespace().next().unwrap_or(p).to_string())
            .collect())
    }

    /// The version of `package` apt would take.
    pub fn version(&self, package: &str) -> anyhow::Result<String> {
        let shown = output(
            self.command("apt-cache")
                .args(["show", "--no-all-versions", package]),
        )?;
        Ok(shown
            .lines()
            .find_map(|l| l.strip_prefix("Version: "))
            .with_context(|| format!("no version of {package}"))?
            .trim()
            .to_string())
    }

    /// `package` (only `subtree` of it, e.g. `./boot`; `.` for all),
    /// downloaded once per version and unpacked into `PACKAGE_VERSION`.
    /// apt checks the hashes against the signed release files.
    pub fn unpack(&self, package: &str, subtree: &str) -> anyhow::Result<PathBuf> {
        let version = self.version(package)?;
        let unpacked = self.at.join(format!("{package}_{version}"));
        let done = unpacked.join(".unpacked");
        if done.is_file() {
            return Ok(unpacked);
        }
        let debs = self.at.join("debs");
        output(
            self.command("apt-get")
                .current_dir(&debs)
                .args(["-q", "download", package]),
        )
        .with_context(|| format!("downloading {package} {version}"))?;
        let deb = std::fs::read_dir(&debs)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")))
            })
            .with_context(|| format!("{package}: apt-get download left no .deb"))?;
        let _ = std::fs::remove_dir_all(&unpacked);
        std::fs::create_dir_all(&unpacked)?;
        crate::run(Command::new("sh").arg("-c").arg(format!(
            "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' '{subtree}'",
            deb.display(),
            unpacked.display()
        )))?;
        std::fs::remove_file(&deb)?;
        std::fs::write(&done, "")?;
        Ok(unpacked)
    }
}

/// This machine's Debian release (`VERSION_CODENAME` of /etc/os-release).
pub fn host_suite() -> anyhow::Result<String> {
    let text = std::fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
        .context("/etc/os-release names no VERSION_CODENAME")
}

/// One `deb` source of the apt configuration.
struct Source {
    uri: String,
    suites: Vec<String>,
}

/// `deb URI SUITE main` lines for Debian `suite` (bookworm, trixie…): every
/// Debian archive source of this machine (a URI whose path is Debian's
/// layout, `…/debian` or `…/debian-security`), with the machine's own
/// release swapped for `suite` in each of its suites (`bookworm-updates`
/// becomes `trixie-updates`). Other vendors' sources are left out.
pub fn mirrors(suite: &str) -> anyhow::Result<Vec<String>> {
    mirrors_of(&sources(), suite)
}

fn mirrors_of(sources: &[Source], suite: &str) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    for source in sources {
        let path = source.uri.trim_end_matches('/');
        if !(path.ends_with("/debian") || path.ends_with("/debian-security")) {
            continue;
        }
        for s in &source.suites {
            // `bookworm`, `bookworm-updates`, `bookworm-security`
            let variant = s.split_once('-').map(|(_, v)| v);
            let line = match variant {
                Some(v) => format!("deb {} {suite}-{v} main", source.uri),
                None => format!("deb {} {suite} main", source.uri),
            };
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
    }
    if !lines.iter().any(|l| l.ends_with(&format!(" {suite} main"))) {
        bail!(
            "no Debian archive in /etc/apt/sources.list or /etc/apt/sources.list.d \
             (a `deb` source whose URI ends in /debian): mmdebstrap needs one to build {suite}"
        );
    }
    Ok(lines)
}

/// The `deb` sources apt reads: sources.list and the .list and .sources
/// files of sources.list.d (files named otherwise are switched off).
fn sources() -> Vec<Source> {
    let mut texts = Vec::new();
    if let Ok(t) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(t);
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let read = |p: &Path| p.extension().is_some_and(|x| x == "list" || x == "sources");
        let mut paths: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| read(p))
            .collect();
        paths.sort();
        for p in paths {
            if let Ok(t) = std::fs::read_to_string(p) {
                texts.push(t);
            }
        }
    }
    texts.iter().flat_map(|t| parse(t)).collect()
}

/// The `deb` sources of one file, one-line or deb822 style.
fn parse(text: &str) -> Vec<Source> {
    let mut out = Vec::new();
    // one-line style: `deb [options] URI SUITE COMPONENTS`
    for line in text.lines() {
        let words: Vec<&str> = line
            .split_whitespace()
            .filter(|w| !w.starts_with('['))
            .collect();
        if let ["deb", uri, suite, ..] = words.as_slice() {
            out.push(Source {
                uri: uri.to_string(),
                suites: vec![suite.to_string()],
            });
        }
    }
    // deb822 style: paragraphs of `Types:`, `URIs:`, `Suites:`
    for para in text.split("\n\n") {
        let field = |name: &str| {
            para.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
        };
        let enabled = field("Enabled:").is_none_or(|v| v.first().is_none_or(|e| e != "no"));
        if let (Some(types), Some(uris), Some(suites)) =
            (field("Types:"), field("URIs:"), field("Suites:"))
            && enabled
            && types.iter().any(|t| t == "deb")
        {
            for uri in uris {
                out.push(Source {
                    uri,
                    suites: suites.clone(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_styles_parse_and_other_vendors_are_not_debian() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n\
                      Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n\
                      Suites: bookworm-security\nComponents: main\n\nTypes: deb-src\n\
                      URIs: http://src.example/debian\nSuites: bookworm\n";
        let s = parse(deb822);
        assert_eq!(s.len(), 2, "deb-src is no binary source");
        assert_eq!(s[0].suites, ["bookworm", "bookworm-updates"]);
        let one =
            parse("# comment\ndeb [arch=amd64] http://vendor.example/node_20.x nodistro main\n");
        assert_eq!(one[0].uri, "http://vendor.example/node_20.x");
        let off = parse("Types: deb\nURIs: http://x/debian\nSuites: bookworm\nEnabled: no\n");
        assert!(off.is_empty());
        // the machine's release swapped for the one to build
        let mut all = s;
        all.extend(one);
        assert_eq!(
            mirrors_of(&all, "trixie").unwrap(),
            [
                "deb http://mirror.example/debian trixie main",
                "deb http://mirror.example/debian trixie-updates main",
                "deb http://mirror.example/debian-security trixie-security main",
            ]
        );
        assert!(
            mirrors_of(&all[2..], "trixie").is_err(),
            "no Debian archive"
        );
    }
}
