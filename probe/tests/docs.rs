//! The reference pages are generated from the code: fail when they drift.

use probe::primitive::{Primitive, reference_markdown};

fn read(path: &str) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    std::fs::read_to_string(format!("{root}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn primitives_reference_is_current() {
    let on_disk = read("docs/PRIMITIVES.md");
    assert!(
        on_disk == reference_markdown(),
        "docs/PRIMITIVES.md is stale: run `cargo xtask docs`"
    );
}

#[test]
fn readme_lists_every_primitive() {
    let readme = read("README.md");
    for p in Primitive::ALL {
        assert!(
            readme.contains(&format!("`{}`", p.id())),
            "README.md does not mention `{}`",
            p.id()
        );
    }
}

#[test]
fn primitive_ids_round_trip_through_json() {
    for p in Primitive::ALL {
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, format!("\"{}\"", p.id()));
        assert_eq!(serde_json::from_str::<Primitive>(&json).unwrap(), p);
        assert_eq!(Primitive::from_id(p.id()), Some(p));
    }
}

/// The library roots a newcomer starts reading from.
const CRATE_ROOTS: [&str; 4] = [
    "probe/src/lib.rs",
    "agent-bridge/src/lib.rs",
    "agent-bridge/contract/src/lib.rs",
    "agent-bridge/campaign/src/lib.rs",
];

/// The `pub mod NAME;` lines of a crate root.
fn modules_of(root_text: &str) -> Vec<String> {
    root_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(String::from)
        .collect()
}

#[test]
fn every_crate_roots_layout_names_every_module() {
    for root in CRATE_ROOTS {
        let text = read(root);
        let doc: String = text
            .lines()
            .filter(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        let modules = modules_of(&text);
        assert!(!modules.is_empty(), "{root}: no modules found");
        let unnamed: Vec<&String> = modules
            .iter()
            .filter(|m| !doc.contains(&format!("[`{m}`]")))
            .collect();
        assert!(
            unnamed.is_empty(),
            "{root}: its Layout list does not name {unnamed:?}"
        );
    }
}

/// The modules of the crate below `src` (`a`, `a::b`) with their source,
/// test modules left out (they may import anything).
fn crate_sources(src: &std::path::Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().to_str().unwrap();
            let Some(rel) = rel.strip_suffix(".rs") else {
                continue;
            };
            let name = rel.trim_end_matches("/mod").replace('/', "::");
            if name == "lib" || name == "main" || name.starts_with("bin") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: Vec<&str> = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            out.push((name, code.join("\n")));
        }
    }
    out
}

/// Which modules each module names (`crate::x`, `super::x`, `use crate::{x, y}`).
fn imports(modules: &[(String, String)]) -> Vec<Vec<usize>> {
    let index = |name: &str| modules.iter().position(|(m, _)| m == name);
    modules
        .iter()
        .enumerate()
        .map(|(me, (name, code))| {
            let parent = name.rsplit_once("::").map_or("", |(p, _)| p);
            let mut named = Vec::new();
            let mut add = |candidate: String| {
                if let Some(i) = index(&candidate)
                    && i != me
                    && !named.contains(&i)
                {
                    named.push(i);
                }
            };
            for (prefix, base) in [("crate::", String::new()), ("super::", parent.to_string())] {
                for (at, _) in code.match_indices(prefix) {
                    let rest = &code[at + prefix.len()..];
                    let join = |m: &str| {
                        if base.is_empty() {
                            m.to_string()
                        } else {
                            format!("{base}::{m}")
                        }
                    };
                    if let Some(group) = rest.strip_prefix('{') {
                        let group = &group[..group.find('}').unwrap_or(group.len())];
                        for part in group.split(',') {
                            let head = part.trim().split("::").next().unwrap_or("");
                            add(join(head));
                        }
                        continue;
                    }
                    let path: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                        .collect();
                    let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
                    // the deepest module the path names
                    for n in (1..=parts.len()).rev() {
                        let candidate = join(&parts[..n].join("::"));
                        if index(&candidate).is_some() {
                            add(candidate);
                            break;
                        }
                    }
                }
            }
            named
        })
        .collect()
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for src in [
        "probe/src",
        "agent-bridge/src",
        "agent-bridge/contract/src",
        "agent-bridge/campaign/src",
        "xtask/src",
    ] {
        let modules = crate_sources(&root.join(src));
        let edges = imports(&modules);
        // depth-first search for a back edge, which closes a circle
        let mut state = vec![0u8; modules.len()]; // 0 new, 1 on the path, 2 done
        fn visit(
            v: usize,
            edges: &[Vec<usize>],
            state: &mut [u8],
            path: &mut Vec<usize>,
        ) -> Option<Vec<usize>> {
            state[v] = 1;
            path.push(v);
            for &w in &edges[v] {
                if state[w] == 1 {
                    let from = path.iter().position(|&p| p == w).unwrap();
                    return Some(path[from..].to_vec());
                }
                if state[w] == 0
                    && let Some(circle) = visit(w, edges, state, path)
                {
                    return Some(circle);
                }
            }
            path.pop();
            state[v] = 2;
            None
        }
        for v in 0..modules.len() {
            if state[v] == 0
                && let Some(circle) = visit(v, &edges, &mut state, &mut Vec::new())
            {
                let names: Vec<&str> = circle.iter().map(|&i| modules[i].0.as_str()).collect();
                panic!(
                    "{src}: the modules {} import each other in a circle",
                    names.join(" → ")
                );
            }
        }
    }
}

#[test]
fn docs_name_no_issues() {
    // a user has no issue tracker: "issue 17" means nothing to them
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let named = lower.match_indices("issue").any(|(at, _)| {
                let rest = lower[at + 5..].trim_start_matches([' ', '#', 's']);
                rest.starts_with(|c: char| c.is_ascii_digit())
            });
            assert!(
                !named,
                "{}:{}: names an issue: {line}",
                page.display(),
                n + 1
            );
        }
    }
}
