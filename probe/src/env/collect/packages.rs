//! The `packages` facet: Python and Node packages installed where the
//! interpreters on PATH would find them, by name and version, read from
//! their metadata files (no interpreter is run).

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::{Path, PathBuf};

use super::util::{env_nonempty, home};
use crate::env::Facet;

/// Packages recorded at most (a huge node_modules must not bloat the
/// snapshot).
pub const MAX_PACKAGES: usize = 5000;

pub fn facet(path_dirs: &[PathBuf]) -> Facet {
    let mut f = Facet::new(
        "Name and Version of *.dist-info/METADATA and *.egg-info/PKG-INFO in the Python \
         site/dist-packages dirs; name and version of package.json in the global, Debian \
         and ./node_modules dirs.",
    );
    let mut found = Found::default();
    for dir in python_dirs(path_dirs) {
        python_packages(&dir, &mut found);
    }
    for dir in node_dirs() {
        node_packages(&dir, &mut found);
    }
    if found.dropped > 0 {
        f.cannot(
            "packages",
            format!(
                "{} more packages not recorded: at most {MAX_PACKAGES} are",
                found.dropped
            ),
        );
    }
    for (k, v) in found.items {
        f.set(k, v);
    }
    f
}

#[derive(Default)]
struct Found {
    items: BTreeMap<String, String>,
    dropped: usize,
}

impl Found {
    /// The first one found wins, as the earlier directory shadows the later.
    fn add(&mut self, key: String, version: String) {
        if self.items.contains_key(&key) {
            return;
        }
        if self.items.len() >= MAX_PACKAGES {
            self.dropped += 1;
            return;
        }
        self.items.insert(key, version);
    }
}

/// PEP 503's normalized name: lower case, runs of `-_.` as one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.extend(c.to_lowercase());
    }
    out
}

/// Entries of `dir` whose names start with `prefix`, sorted.
fn starting_with(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The site/dist-packages dirs: a virtualenv's first, then the user's,
/// then those beside each python3 on PATH, /usr/local and /usr.
fn python_dirs(path_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = env_nonempty("VIRTUAL_ENV") {
        prefixes.push(venv.into());
    }
    if let Some(h) = home() {
        prefixes.push(Path::new(&h).join(".local"));
    }
    // PREFIX/bin/python3 → PREFIX/lib/python3*/site-packages
    for d in path_dirs {
        if d.join("python3").is_file()
            && d.file_name().is_some_and(|n| n == "bin")
            && let Some(prefix) = d.parent()
        {
            prefixes.push(prefix.to_path_buf());
        }
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    let mut out: Vec<PathBuf> = Vec::new();
    for prefix in prefixes {
        for py in starting_with(&prefix.join("lib"), "python3") {
            for kind in ["site-packages", "dist-packages"] {
                let d = py.join(kind);
                if d.is_dir() && !out.contains(&d) {
                    out.push(d);
                }
            }
        }
    }
    out
}

fn python_packages(dir: &Path, found: &mut Found) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    names.sort();
    for p in names {
        let n = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let meta = if n.ends_with(".dist-info") {
            p.join("METADATA")
        } else if n.ends_with(".egg-info") {
            // a directory, or (old setuptools) the PKG-INFO file itself
            if p.is_dir() {
                p.join("PKG-INFO")
            } else {
                p.clone()
            }
        } else {
            continue;
        };
        if let Some((name, version)) = metadata_head(&meta) {
            found.add(format!("python:{}", normalize(&name)), version);
        }
    }
}

/// Name and Version from the header of a METADATA / PKG-INFO file (read
/// up to the first blank line only: the description may be long).
fn metadata_head(path: &Path) -> Option<(String, String)> {
    let file = std::fs::File::open(path).ok()?;
    let (mut name, mut version) = (None, None);
    for line in std::io::BufReader::new(file).lines().take(200) {
        let line = line.ok()?;
        if line.trim().is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("Name:") {
            name.get_or_insert_with(|| v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("Version:") {
            version.get_or_insert_with(|| v.trim().to_string());
        }
        if name.is_some() && version.is_some() {
            break;
        }
    }
    Some((name?, version?))
}

fn node_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = vec!["node_modules".into()];
    dirs.extend(
        [
            "/usr/local/lib/node_modules",
            "/usr/lib/node_modules",
            "/usr/share/nodejs",
        ]
        .iter()
        .map(PathBuf::from),
    );
    dirs
}

fn node_packages(dir: &Path, found: &mut Found) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut pkgs: Vec<PathBuf> = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with('@') {
            // a scope: its packages one level down
            let mut scoped: Vec<PathBuf> = std::fs::read_dir(&p)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            pkgs.append(&mut scoped);
        } else if !n.starts_with('.') {
            pkgs.push(p);
        }
    }
    pkgs.sort();
    for p in pkgs {
        if found.items.len() >= MAX_PACKAGES {
            found.dropped += 1;
            continue;
        }
        if let Some((name, version)) = package_json(&p.join("package.json")) {
            found.add(format!("node:{name}"), version);
        }
    }
}

fn package_json(path: &Path) -> Option<(String, String)> {
    // a package.json is small; a huge one is not a package's
    let meta = std::fs::metadata(path).ok()?;
    if meta.len() > 1 << 20 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some((
        v.get("name")?.as_str()?.to_string(),
        v.get("version")?.as_str()?.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize() {
        assert_eq!(normalize("Foo_Bar.baz"), "foo-bar-baz");
        assert_eq!(normalize("requests"), "requests");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("A--_b"), "a-b");
    }

    #[test]
    fn metadata_and_package_json_read() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("Foo_Bar-1.2.dist-info")).unwrap();
        std::fs::write(
            d.join("Foo_Bar-1.2.dist-info/METADATA"),
            "Metadata-Version: 2.1\nName: Foo_Bar\nVersion: 1.2\n\nVersion: 9\n",
        )
        .unwrap();
        std::fs::write(d.join("old.egg-info"), "Name: old\nVersion: 0.1\n").unwrap();
        let mut found = Found::default();
        python_packages(d, &mut found);
        assert_eq!(found.items["python:foo-bar"], "1.2");
        assert_eq!(found.items["python:old"], "0.1");
        let nm = d.join("node_modules");
        std::fs::create_dir_all(nm.join("@scope/pkg")).unwrap();
        std::fs::create_dir_all(nm.join("left-pad")).unwrap();
        std::fs::write(
            nm.join("@scope/pkg/package.json"),
            r#"{"name":"@scope/pkg","version":"2.0.0"}"#,
        )
        .unwrap();
        std::fs::write(
            nm.join("left-pad/package.json"),
            r#"{"name":"left-pad","version":"1.3.0"}"#,
        )
        .unwrap();
        node_packages(&nm, &mut found);
        assert_eq!(found.items["node:@scope/pkg"], "2.0.0");
        assert_eq!(found.items["node:left-pad"], "1.3.0");
    }

    #[test]
    fn the_count_is_capped() {
        let mut found = Found::default();
        for i in 0..MAX_PACKAGES + 7 {
            found.add(format!("python:p{i}"), "1".into());
        }
        assert_eq!(found.items.len(), MAX_PACKAGES);
        assert_eq!(found.dropped, 7);
    }
}
