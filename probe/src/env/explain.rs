//! Which difference explains which failure, Strider-style: of the tests
//! that flipped between two environments, a difference *explains* one when
//! the failure's evidence touches that facet's object (the command it
//! could not run, the mount holding the path it could not write, the
//! limit it hit, the syscall denied); the same class of facet with another
//! object is only *possible*; a flipped test no difference explains is
//! *unexplained* (a regression in the target, or a flake).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use super::diff::{Diff, Difference, Unknown};

/// A failed test and the object its failure touched.
#[derive(Debug, Clone, Default)]
pub struct Failed {
    pub test: String,
    pub primitive: String,
    /// The path of the decisive event (or the program a missing command
    /// would have been).
    pub path: Option<String>,
    /// The syscall of the decisive event.
    pub syscall: Option<String>,
    pub errno: Option<String>,
}

impl Failed {
    /// Reads the object from a failure's kernel evidence (the probe's
    /// attribution: its decisive event, or its hidden failure's).
    pub fn from_evidence(test: &str, primitive: &str, kernel: &Value) -> Failed {
        // a call that exited 0 names its failure as a hidden one
        let decisive = kernel
            .get("decisive")
            .filter(|d| d.is_object())
            .or_else(|| kernel.pointer("/hidden_failure/decisive"));
        let field = |k: &str| {
            decisive
                .and_then(|d| d.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Failed {
            test: test.into(),
            primitive: primitive.into(),
            path: field("path"),
            syscall: field("syscall"),
            errno: field("errno"),
        }
    }

    /// The command a missing-command failure names: the last part of its path.
    fn command(&self) -> Option<&str> {
        self.path.as_deref().and_then(|p| p.rsplit('/').next())
    }
}

/// How a difference bears on a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tie {
    Explains,
    Possible,
}

/// A difference and the flipped tests it explains (or may explain).
#[derive(Debug, Clone, Serialize)]
pub struct Explained {
    #[serde(flatten)]
    pub difference: Difference,
    pub explains: Vec<String>,
    pub possible: Vec<String>,
}

/// The environment section of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// Differences that explain a flipped test first, then possible ones,
    /// then those no failure touched.
    pub differences: Vec<Explained>,
    /// Flipped tests no difference explains.
    pub unexplained: Vec<String>,
    pub unknown: Vec<Unknown>,
}

/// Syscall families a sandbox commonly denies, as `syscalls`' trials name them.
fn trial_of(syscall: &str) -> Option<&'static [&'static str]> {
    Some(match syscall {
        "unshare" | "clone" | "clone3" | "setns" => &["try.userns", "try.mountns"],
        "mount" | "fsopen" | "fsmount" | "move_mount" | "pivot_root" => &["try.mountns"],
        s if s.starts_with("io_uring") => &["try.io_uring"],
        "bpf" => &["try.bpf"],
        "ptrace" => &["try.ptrace"],
        "perf_event_open" => &["try.perf_event"],
        "userfaultfd" => &["try.userfaultfd"],
        _ => return None,
    })
}

/// Whether `path` lies at or under `dir`.
fn under(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The directories a `writable` item stands for, on either side.
fn places(d: &Difference) -> Vec<String> {
    [&d.a, &d.b]
        .into_iter()
        .flatten()
        .flat_map(|v| ["path", "mount"].map(|k| v.get(k).and_then(Value::as_str)))
        .flatten()
        .map(str::to_string)
        .collect()
}

/// Whether the difference changed one of `fields` (or the item is there
/// on one side only).
fn changed(d: &Difference, fields: &[&str]) -> bool {
    d.a.is_none()
        || d.b.is_none()
        || d.fields.is_empty()
        || d.fields.iter().any(|f| fields.contains(&f.as_str()))
}

/// Whether an item is absent on one side: a command or browser gone.
fn gone_on_one_side(d: &Difference) -> bool {
    let absent = |v: &Option<Value>| {
        v.as_ref()
            .is_none_or(|v| v.get("path").is_some_and(Value::is_null))
    };
    absent(&d.a) != absent(&d.b)
}

/// Whether `text` holds `addr` as a whole `HOST:PORT` (not `1.2.3.4:8080`
/// for `1.2.3.4:80`).
fn names_address(text: &str, addr: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || ".:[]-".contains(c)))
        .any(|token| token == addr)
}

/// How difference `d` bears on failure `f`, if at all.
pub fn tie(d: &Difference, f: &Failed) -> Option<Tie> {
    let facet = d.facet.as_str();
    let key = d.key.as_str();
    let path = f.path.as_deref().unwrap_or("");
    let touches_place = || {
        // the item's own path decides first: /tmp's mount may be /
        let own = [&d.a, &d.b]
            .into_iter()
            .flatten()
            .filter_map(|v| v.get("path").and_then(Value::as_str))
            .any(|p| under(path, p));
        own || places(d).iter().any(|p| p != "/" && under(path, p))
    };
    let explains = |yes: bool| Some(if yes { Tie::Explains } else { Tie::Possible });
    match (f.primitive.as_str(), facet) {
        ("exec.missing", "commands" | "browser") => {
            explains(f.command() == Some(key) && gone_on_one_side(d))
        }
        ("fs.readonly" | "fs.permission" | "fs.noexec" | "fs.space", "writable") => {
            let fields: &[&str] = match f.primitive.as_str() {
                "fs.space" => &["free_bytes", "free_inodes", "tmpfs", "mount", "fstype"],
                "fs.noexec" => &["noexec", "mount", "fstype"],
                _ => &["read_only", "writable", "mount", "fstype", "exists"],
            };
            explains(!path.is_empty() && touches_place() && changed(d, fields))
        }
        ("fs.permission", "identity") if key == "uid" || key == "gid" || key == "groups" => {
            Some(Tie::Possible)
        }
        ("fs.persistence", "persistence") => {
            // the marker's place: /tmp, or the working directory
            let in_tmp = under(path, "/tmp") || under(path, "/var/tmp");
            explains((key == "tmp") == in_tmp)
        }
        ("fs.persistence", "writable") => {
            // a memory-backed or per-call filesystem over the path
            explains(changed(d, &["tmpfs", "mount", "fstype"]) && touches_place())
        }
        ("fs.missing", "persistence" | "writable") => Some(Tie::Possible),
        ("mem.oom" | "mem.limit" | "mem.pressure", "resources") => {
            explains(key.starts_with("memory.") || key == "mem_total_bytes" || key == "rlimit.as")
        }
        ("proc.limit", "resources") => {
            let files = matches!(f.errno.as_deref(), Some("EMFILE" | "ENFILE"));
            let named = if files {
                key == "rlimit.nofile"
            } else {
                key == "pids.max" || key == "rlimit.nproc"
            };
            if named {
                Some(Tie::Explains)
            } else if key.starts_with("rlimit.") || key == "pids.max" {
                Some(Tie::Possible)
            } else {
                None
            }
        }
        ("seccomp", "syscalls") => {
            let trials = f.syscall.as_deref().and_then(trial_of).unwrap_or(&[]);
            if matches!(key, "seccomp" | "seccomp_filters" | "no_new_privs")
                || trials.contains(&key)
            {
                Some(Tie::Explains)
            } else if key.starts_with("try.") {
                Some(Tie::Possible)
            } else {
                None
            }
        }
        ("caps", "syscalls") if key.starts_with("caps.") => Some(Tie::Explains),
        ("caps", "identity") if key == "uid" => Some(Tie::Possible),
        ("net.egress", "network") => {
            if let Some(target) = key.strip_prefix("reach.") {
                explains(names_address(path, target))
            } else {
                // interfaces, routes and loopback decide whether a packet
                // leaves at all; resolvers and proxies only may
                explains(key.starts_with("if.") || key == "route.default" || key == "loopback_bind")
            }
        }
        ("timeout", "resources") if key == "cpu.max" || key.starts_with("cpus") => {
            Some(Tie::Possible)
        }
        ("sandbox.kernel", "runtime") => explains(matches!(key, "kind" | "kernel" | "arch")),
        _ => None,
    }
}

/// Ties each difference of `diff` to the `flipped` tests (passed in A,
/// failed in B).
pub fn explain(diff: &Diff, flipped: &[Failed]) -> Environment {
    let mut explained_tests = BTreeSet::new();
    let mut differences: Vec<Explained> = diff
        .differences
        .iter()
        .map(|d| {
            let mut e = Explained {
                difference: d.clone(),
                explains: vec![],
                possible: vec![],
            };
            for f in flipped {
                match tie(d, f) {
                    Some(Tie::Explains) => {
                        explained_tests.insert(f.test.clone());
                        e.explains.push(f.test.clone());
                    }
                    Some(Tie::Possible) => e.possible.push(f.test.clone()),
                    None => {}
                }
            }
            e
        })
        .collect();
    // most explaining first; the order of the diff otherwise
    differences.sort_by_key(|e| {
        (
            std::cmp::Reverse(e.explains.len()),
            std::cmp::Reverse(e.possible.len()),
        )
    });
    let unexplained = flipped
        .iter()
        .filter(|f| !explained_tests.contains(&f.test))
        .map(|f| f.test.clone())
        .collect();
    Environment {
        differences,
        unexplained,
        unknown: diff.unknown.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(facet: &str, key: &str, a: Value, b: Value, fields: &[&str]) -> Difference {
        Difference {
            facet: facet.into(),
            key: key.into(),
            a: Some(a),
            b: Some(b),
            fields: fields.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn failed(primitive: &str, path: &str, syscall: &str, errno: &str) -> Failed {
        Failed {
            test: format!("{primitive}:{path}"),
            primitive: primitive.into(),
            path: (!path.is_empty()).then(|| path.into()),
            syscall: (!syscall.is_empty()).then(|| syscall.into()),
            errno: (!errno.is_empty()).then(|| errno.into()),
        }
    }

    #[test]
    fn each_failure_is_tied_to_the_facet_its_object_is_in() {
        let chromium = d(
            "commands",
            "chromium",
            json!({"path": "/usr/bin/chromium"}),
            json!({"path": null}),
            &[],
        );
        let gcc = d(
            "commands",
            "gcc",
            json!({"path": "/usr/bin/gcc"}),
            json!({"path": null}),
            &[],
        );
        let missing = failed(
            "exec.missing",
            "/usr/local/bin/chromium",
            "execve",
            "ENOENT",
        );
        assert_eq!(tie(&chromium, &missing), Some(Tie::Explains));
        assert_eq!(tie(&gcc, &missing), Some(Tie::Possible));

        let cwd = d(
            "writable",
            "cwd",
            json!({"path": "/work", "mount": "/work", "read_only": false}),
            json!({"path": "/work", "mount": "/work", "read_only": true}),
            &["read_only"],
        );
        let tmp = d(
            "writable",
            "tmp",
            json!({"path": "/tmp", "mount": "/", "tmpfs": false}),
            json!({"path": "/tmp", "mount": "/tmp", "tmpfs": true}),
            &["mount", "tmpfs"],
        );
        let ro = failed("fs.readonly", "/work/out/result.json", "openat", "EROFS");
        assert_eq!(tie(&cwd, &ro), Some(Tie::Explains));
        // /tmp's mount is / on one side: that is not a reason to blame it
        assert_eq!(tie(&tmp, &ro), Some(Tie::Possible));

        let gone = failed("fs.persistence", "/tmp/t-1/out.csv", "openat", "ENOENT");
        assert_eq!(tie(&tmp, &gone), Some(Tie::Explains));
        let kept = d("persistence", "tmp", json!("kept"), json!("lost"), &[]);
        assert_eq!(tie(&kept, &gone), Some(Tie::Explains));
        assert_eq!(tie(&kept, &ro), None);
        // the working directory's marker does not explain a file lost in /tmp
        let workdir = d("persistence", "workdir", json!("kept"), json!("lost"), &[]);
        assert_eq!(tie(&workdir, &gone), Some(Tie::Possible));
        // a place that differs only in free space does not explain EROFS
        let roomier = d(
            "writable",
            "cwd",
            json!({"path": "/work", "free_bytes": 1}),
            json!({"path": "/work", "free_bytes": 100}),
            &["free_bytes"],
        );
        assert_eq!(tie(&roomier, &ro), Some(Tie::Possible));
        // a command that differs only in its version is not missing
        let newer = d(
            "commands",
            "chromium",
            json!({"path": "/usr/bin/chromium", "version": "1"}),
            json!({"path": "/usr/bin/chromium", "version": "2"}),
            &["version"],
        );
        assert_eq!(tie(&newer, &missing), Some(Tie::Possible));
        // an address is a whole token
        let reach = d(
            "network",
            "reach.10.0.0.1:80",
            json!("ok"),
            json!("ECONNREFUSED"),
            &[],
        );
        let refused = failed("net.egress", "10.0.0.1:8080", "connect", "ECONNREFUSED");
        assert_eq!(tie(&reach, &refused), Some(Tie::Possible));
        let exact = failed("net.egress", "10.0.0.1:80", "connect", "ECONNREFUSED");
        assert_eq!(tie(&reach, &exact), Some(Tie::Explains));

        let pids = d("resources", "pids.max", json!("max"), json!("32"), &[]);
        let nofile = d(
            "resources",
            "rlimit.nofile",
            json!("1024/1024"),
            json!("64/64"),
            &[],
        );
        let fork = failed("proc.limit", "", "clone", "EAGAIN");
        let files = failed("proc.limit", "/etc/hosts", "openat", "EMFILE");
        assert_eq!(tie(&pids, &fork), Some(Tie::Explains));
        assert_eq!(tie(&nofile, &fork), Some(Tie::Possible));
        assert_eq!(tie(&nofile, &files), Some(Tie::Explains));

        let userns = d("syscalls", "try.userns", json!("ok"), json!("EPERM"), &[]);
        let bpf = d("syscalls", "try.bpf", json!("ok"), json!("EPERM"), &[]);
        let denied = failed("seccomp", "", "unshare", "EPERM");
        assert_eq!(tie(&userns, &denied), Some(Tie::Explains));
        assert_eq!(tie(&bpf, &denied), Some(Tie::Possible));

        let mem = d(
            "resources",
            "memory.max",
            json!("max"),
            json!("268435456"),
            &[],
        );
        assert_eq!(
            tie(&mem, &failed("mem.oom", "", "", "")),
            Some(Tie::Explains)
        );
        assert_eq!(tie(&mem, &denied), None);
    }

    #[test]
    fn flipped_tests_no_difference_touches_are_unexplained() {
        let a_b = Diff {
            a: super::super::diff::Side {
                source: "a".into(),
                taken_at_ms: 0,
                probe_version: "t".into(),
            },
            b: super::super::diff::Side {
                source: "b".into(),
                taken_at_ms: 0,
                probe_version: "t".into(),
            },
            differences: vec![
                d("identity", "tz", json!("UTC"), json!("Asia/Tokyo"), &[]),
                d("persistence", "tmp", json!("kept"), json!("lost"), &[]),
            ],
            unknown: vec![],
        };
        let flipped = [
            failed("fs.persistence", "/tmp/x", "openat", "ENOENT"),
            failed("seccomp", "", "socket", "EPERM"),
        ];
        let env = explain(&a_b, &flipped);
        assert_eq!(env.differences[0].difference.key, "tmp");
        assert_eq!(env.differences[0].explains, ["fs.persistence:/tmp/x"]);
        assert!(env.differences[1].explains.is_empty());
        assert_eq!(env.unexplained, ["seccomp:"]);
    }

    #[test]
    fn the_object_is_read_from_the_decisive_event() {
        let k = json!({"decisive": {"path": "/ro/x", "syscall": "openat", "errno": "EROFS"}});
        let f = Failed::from_evidence("t-1", "fs.readonly", &k);
        assert_eq!(f.path.as_deref(), Some("/ro/x"));
        let k = json!({"decisive": null, "hidden_failure": {"decisive": {"path": "/tmp/a"}}});
        let f = Failed::from_evidence("t-1", "fs.persistence", &k);
        assert_eq!(f.path.as_deref(), Some("/tmp/a"));
        let f = Failed::from_evidence("t-1", "mem.oom", &json!({"decisive": null}));
        assert_eq!(f.path, None);
    }
}
