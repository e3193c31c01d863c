//! The precision corpus's images (`probe/tests/precision.rs`): root
//! filesystems nobody tuned the attribution for, built with mmdebstrap
//! from the Debian archive this machine's apt configuration names, cached
//! in `target/precision/NAME-KEY` (KEY hashes the recipe); and
//! `cargo xtask precision`, which runs the corpus over them and writes
//! precision and recall per image into docs/CONFUSION.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use crate::image::sha256_hex;
use crate::workspace_root;

/// One image of the corpus.
struct Recipe {
    name: &'static str,
    suite: &'static str,
    /// Packages on top of the essential set (sh, coreutils, grep, sed,
    /// tar, diffutils, perl-base…).
    include: &'static [&'static str],
    /// The environment its programs run with.
    env: &'static [(&'static str, &'static str)],
    /// Wheels from PyPI, installed under /opt/wheels (on PYTHONPATH).
    wheels: &'static [&'static str],
    /// What it is for, in docs/CONFUSION.md.
    about: &'static str,
}

const RECIPES: [Recipe; 2] = [
    Recipe {
        name: "bookworm-de",
        suite: "bookworm",
        include: &["python3", "locales-all", "make"],
        env: &[
            ("LANG", "de_DE.UTF-8"),
            ("LANGUAGE", "de_DE:de"),
            ("PYTHONPATH", "/opt/wheels"),
        ],
        wheels: &["numpy==1.26.4"],
        about: "Debian bookworm, every locale (`locales-all`) and a German `LANG`, so message \
                catalogs are looked up in several places; numpy 1.26.4 from PyPI's wheels",
    },
    Recipe {
        name: "trixie-build",
        suite: "trixie",
        include: &["python3", "gcc", "libc6-dev", "make", "nodejs"],
        env: &[("LANG", "C.UTF-8")],
        wheels: &[],
        about: "Debian trixie with gcc, make, Node.js and Python: newer compilers, \
                interpreters and their search paths",
    },
];

fn dir() -> PathBuf {
    workspace_root().join("target/precision")
}

/// Builds (or finds cached) every image and writes their manifest for the
/// test; returns its path.
pub fn images() -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir())?;
    // one after the other: each is under a minute, and their logs stay apart
    let manifest: Vec<Value> = RECIPES.iter().map(build).collect::<anyhow::Result<_>>()?;
    let path = dir().join("images.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest)?)?;
    Ok(path)
}

fn build(r: &Recipe) -> anyhow::Result<Value> {
    let mirrors = crate::apt::mirrors(r.suite)?;
    let recipe = format!(
        "{}\n{}\n{}\n{:?}\n{:?}\n",
        r.suite,
        mirrors.join("\n"),
        r.include.join(","),
        r.env,
        r.wheels
    );
    let key = &sha256_hex(recipe.as_bytes())[..12];
    let root = dir().join(format!("{}-{key}", r.name));
    let manifest = json!({
        "name": r.name,
        "root": root,
        "env": r.env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        "wheels": r.wheels.iter().map(|w| w.split("==").next().unwrap_or(w)).collect::<Vec<_>>(),
    });
    if root.join(".complete").exists() {
        return Ok(manifest);
    }
    let tmp = root.with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    crate::install_step::run(
        &format!(
            "building the precision image {} with mmdebstrap ({}, under a minute)",
            r.name, r.suite
        ),
        Command::new("mmdebstrap")
            .args(["--mode=root", "--format=directory", "--variant=essential"])
            .arg(format!("--include={}", r.include.join(",")))
            .arg("--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr")
            .arg("--dpkgopt=path-exclude=/usr/share/man/*")
            .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
            .arg(r.suite)
            .arg(&tmp)
            .args(&mirrors),
    )?;
    if !r.wheels.is_empty() {
        install_wheels(&tmp, r.wheels)?;
    }
    std::fs::write(tmp.join(".complete"), recipe)?;
    std::fs::rename(&tmp, &root)?;
    Ok(manifest)
}

/// `wheels` from PyPI into ROOT/opt/wheels, for the image's Python (3.11).
fn install_wheels(root: &Path, wheels: &[&str]) -> anyhow::Result<()> {
    crate::install_step::run(
        &format!("installing {} into the image from PyPI", wheels.join(" ")),
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
            ])
            .args(["--python-version", "3.11", "--implementation", "cp"])
            .args(["--platform", "manylinux2014_x86_64", "--target"])
            .arg(root.join("opt/wheels"))
            .args(wheels),
    )
}

/// `cargo xtask precision`: the corpus over the host and every image;
/// writes the per-image table into docs/CONFUSION.md unless `no_write`.
pub fn precision(write: bool) -> anyhow::Result<()> {
    let manifest = images()?;
    let results = dir().join("results.json");
    let _ = std::fs::remove_file(&results);
    let passed = run_test(&manifest, Some(&results))?;
    let results: Vec<Value> = serde_json::from_slice(
        &std::fs::read(&results).context("the precision test wrote no results")?,
    )?;
    let section = render(&results);
    println!("{section}");
    if write {
        let path = workspace_root().join("docs/CONFUSION.md");
        let doc = std::fs::read_to_string(&path)?;
        std::fs::write(&path, with_section(&doc, &section))?;
        eprintln!("xtask: wrote the precision section of docs/CONFUSION.md");
    }
    if !passed {
        bail!("the precision corpus has wrong answers (see above)");
    }
    Ok(())
}

/// Runs the precision test binary over `manifest`'s images; true if it passed.
pub fn run_test(manifest: &Path, results: Option<&Path>) -> anyhow::Result<bool> {
    let mut cmd = crate::cargo_test(&["--test", "precision", "--", "--nocapture"]);
    cmd.env("PRECISION_IMAGES", manifest);
    if let Some(r) = results {
        cmd.env("PRECISION_RESULTS", r);
    }
    Ok(cmd.status().context("running cargo test")?.success())
}

pub const SECTION_BEGIN: &str = "<!-- precision: cargo xtask precision -->";
pub const SECTION_END: &str = "<!-- /precision -->";

/// `doc` with its precision section replaced by `section` (appended when
/// it has none).
pub fn with_section(doc: &str, section: &str) -> String {
    let block = format!("{SECTION_BEGIN}\n{section}{SECTION_END}\n");
    match (doc.find(SECTION_BEGIN), doc.find(SECTION_END)) {
        (Some(a), Some(b)) if b > a => {
            format!(
                "{}{block}{}",
                &doc[..a],
                doc[b + SECTION_END.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{}\n{block}", doc.trim_end()),
    }
}

/// The precision section of `doc`, markers excluded, when it has one.
pub fn section_of(doc: &str) -> Option<&str> {
    let a = doc.find(SECTION_BEGIN)? + SECTION_BEGIN.len() + 1;
    let b = doc.find(SECTION_END)?;
    doc.get(a..b)
}

/// The section: how the corpus is run, a table per image, and the cases.
fn render(results: &[Value]) -> String {
    let mut per_image: BTreeMap<&str, [u32; 4]> = BTreeMap::new();
    for r in results {
        let image = r["image"].as_str().unwrap_or("?");
        let right = r["got"] == r["expect"];
        let own = r["own_logic"] == true;
        let e = per_image.entry(image).or_default();
        let i = if own { 0 } else { 2 };
        e[i] += u32::from(right);
        e[i + 1] += 1;
    }
    let mut o = String::new();
    o.push_str(
        "## Precision on images nobody tuned it for\n\n\
         Regenerate with `cargo xtask precision` (the images are built once and cached; \
         `cargo xtask test` runs the same corpus). Real programs fail on each image, \
         run as `probe trace -- bwrap --ro-bind IMAGE / … -- sh -c SCRIPT`: those that fail \
         by their own logic (an exception, a failed test or assert, a compile or link error, a \
         usage error, no match) must be `none`; beside them, failures the sandbox caused on the \
         same image (a missing file or command, a seccomp denial, a file descriptor limit, a \
         read-only root) must keep their primitive. *Precision*: own-logic failures called \
         `none`; *recall*: sandbox-caused failures named right. A failed lookup (ENOENT, \
         ENOTDIR, or EACCES on a read) is named as a cause only when the workload's output or \
         its command names the path (docs/ARCHITECTURE.md, *Weak and strong evidence*); \
         the others are listed as `noticed`.\n\n",
    );
    o.push_str("| image | what it is | precision | recall |\n|---|---|---:|---:|\n");
    for (image, [own_ok, own, sb_ok, sb]) in &per_image {
        let about = RECIPES
            .iter()
            .find(|r| r.name == *image)
            .map(|r| r.about)
            .unwrap_or("this machine: Debian bookworm with its gcc, make, Node.js and Python, `LANG=C.UTF-8`");
        let pct = |a: u32, b: u32| {
            if b == 0 {
                "—".to_string()
            } else {
                format!("{a}/{b} ({:.0}%)", a as f64 * 100.0 / b as f64)
            }
        };
        let _ = writeln!(
            o,
            "| {image} | {about} | {} | {} |",
            pct(*own_ok, *own),
            pct(*sb_ok, *sb)
        );
    }
    o.push_str("\nEvery case and what the probe said (noticed: failed lookups it saw and did not blame):\n\n");
    o.push_str("| image | case | expected | got | noticed |\n|---|---|---|---|---:|\n");
    for r in results {
        let noticed = r["noticed"].as_array().map_or(0, Vec::len);
        let got = r["got"].as_str().unwrap_or("?");
        let mark = if r["got"] == r["expect"] {
            got.to_string()
        } else {
            format!("**{got}** (wrong)")
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {mark} | {noticed} |",
            r["image"].as_str().unwrap_or("?"),
            r["case"].as_str().unwrap_or("?"),
            r["expect"].as_str().unwrap_or("?"),
        );
    }
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_in_place_or_appended() {
        let doc = "# Title\n\nbody\n";
        let once = with_section(doc, "A\n");
        assert!(once.ends_with(&format!("{SECTION_BEGIN}\nA\n{SECTION_END}\n")));
        let twice = with_section(&once, "B\n");
        assert_eq!(twice.matches(SECTION_BEGIN).count(), 1);
        assert!(
            twice.contains("\nB\n") && !twice.contains("\nA\n"),
            "{twice}"
        );
        let mut later = once.clone();
        later.push_str("\n## after\n");
        let replaced = with_section(&later, "C\n");
        assert!(replaced.ends_with("## after\n"), "{replaced}");
        assert_eq!(section_of(&replaced), Some("C\n"));
        assert_eq!(section_of(doc), None);
    }
}
