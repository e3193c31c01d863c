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
