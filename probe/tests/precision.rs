//! Precision on images nobody here tuned the attribution for: real programs
//! that fail by their own logic (an exception, a failed test, a compile
//! error, a usage error, no match) must be `none`, and beside them,
//! failures the sandbox caused on the same image must keep their primitive.
//!
//! Each image is a root filesystem `cargo xtask precision` (and `cargo
//! xtask test`) builds with mmdebstrap, listed in the manifest
//! `PRECISION_IMAGES` names; the host itself is always one. Every case
//! runs as `probe trace -- bwrap --ro-bind ROOT / … -- sh -c SCRIPT`: the
//! image's own programs, its locale, its search paths. The results go to
//! `PRECISION_RESULTS` (JSON) when set, for docs/CONFUSION.md.
//! `PRECISION_PROBE` judges another probe binary (an older build, for a
//! before/after comparison); by default, this build's.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{Value, json};

use common::{FAULT, PROBE, ci, root};

/// One program run on an image.
struct Case {
    name: &'static str,
    /// What the image must have: commands, or `numpy`.
    needs: &'static [&'static str],
    script: &'static str,
    /// `none` for a failure of the program's own logic, else the primitive
    /// the sandbox caused.
    expect: &'static str,
}

const OWN_LOGIC: &[Case] = &[
    Case {
        name: "python exception",
        needs: &["python3"],
        script: "python3 -c \"raise ValueError('bad input')\"",
        expect: "none",
    },
    Case {
        name: "python failed assert",
        needs: &["python3"],
        script: "python3 -c \"assert 1 + 1 == 3, 'arithmetic'\"",
        expect: "none",
    },
    Case {
        name: "python failing unittest",
        needs: &["python3"],
        script: "cd /tmp && printf 'import unittest\\nclass T(unittest.TestCase):\\n    def test_sum(self):\\n        self.assertEqual(1 + 1, 3)\\n' > test_sum.py && python3 -m unittest test_sum",
        expect: "none",
    },
    Case {
        name: "python JSON parse error",
        needs: &["python3"],
        script: "python3 -c \"import json; json.loads('{bad')\"",
        expect: "none",
    },
    Case {
        name: "python KeyError",
        needs: &["python3"],
        script: "python3 -c \"d = {}; print(d['user'])\"",
        expect: "none",
    },
    Case {
        name: "grep with no match",
        needs: &["grep"],
        script: "echo hay | grep needle",
        expect: "none",
    },
    Case {
        name: "grep usage error",
        needs: &["grep"],
        script: "grep --no-such-option x",
        expect: "none",
    },
    Case {
        name: "diff of two files",
        needs: &["diff"],
        script: "echo a > /tmp/a && echo b > /tmp/b && diff /tmp/a /tmp/b",
        expect: "none",
    },
    Case {
        name: "sort check of unsorted input",
        needs: &["sort"],
        script: "printf 'b\\na\\n' | sort -c",
        expect: "none",
    },
    Case {
        name: "ls usage error",
        needs: &["ls"],
        script: "ls --no-such-option",
        expect: "none",
    },
    Case {
        name: "tar of a corrupt archive",
        needs: &["tar"],
        script: "echo garbage > /tmp/x.tar && tar -tf /tmp/x.tar",
        expect: "none",
    },
    Case {
        name: "sed syntax error",
        needs: &["sed"],
        script: "echo x | sed 's/(/'",
        expect: "none",
    },
    Case {
        name: "perl die",
        needs: &["perl"],
        script: "perl -e 'die \"bad input\\n\"'",
        expect: "none",
    },
    Case {
        name: "shell exit 3",
        needs: &[],
        script: "echo checking; exit 3",
        expect: "none",
    },
    Case {
        name: "C compile error",
        needs: &["gcc"],
        script: "printf 'int main(void) { return undefined_name; }\\n' > /tmp/bad.c && gcc -c /tmp/bad.c -o /tmp/bad.o",
        expect: "none",
    },
    Case {
        name: "C link error",
        needs: &["gcc"],
        script: "printf 'int f(void);\\nint main(void) { return f(); }\\n' > /tmp/link.c && gcc /tmp/link.c -o /tmp/link",
        expect: "none",
    },
    Case {
        name: "make with a failing recipe",
        needs: &["make"],
        script: "mkdir -p /tmp/m && printf 'all:\\n\\t@echo building\\n\\t@false\\n' > /tmp/m/Makefile && make -C /tmp/m",
        expect: "none",
    },
    Case {
        name: "numpy shape mismatch",
        needs: &["python3", "numpy"],
        script: "python3 -c 'import numpy as np; np.ones((2, 3)) @ np.ones((2, 3))'",
        expect: "none",
    },
    Case {
        name: "node exception",
        needs: &["node"],
        script: "node -e \"throw new Error('boom')\"",
        expect: "none",
    },
    Case {
        name: "node JSON parse error",
        needs: &["node"],
        script: "node -e \"JSON.parse('{bad')\"",
        expect: "none",
    },
    Case {
        name: "node failed assert",
        needs: &["node"],
        script: "node -e \"require('assert').strictEqual(1 + 1, 3)\"",
        expect: "none",
    },
    Case {
        name: "Java exception",
        needs: &["javac", "java"],
        script: "printf 'public class Boom { public static void main(String[] a) { throw new IllegalStateException(\"boom\"); } }\n' > Boom.java && javac Boom.java && java Boom",
        expect: "none",
    },
    Case {
        name: "Java compile error",
        needs: &["javac"],
        script: "printf 'public class Bad { int x = ; }\n' > Bad.java && javac Bad.java",
        expect: "none",
    },
];

const SANDBOX: &[Case] = &[
    Case {
        name: "missing data file (cat)",
        needs: &["cat"],
        script: "cat /data/input.csv",
        expect: "fs.missing",
    },
    Case {
        name: "missing data file (python)",
        needs: &["python3"],
        script: "python3 -c \"print(open('/data/input.csv').read())\"",
        expect: "fs.missing",
    },
    Case {
        name: "missing command",
        needs: &[],
        script: "no-such-tool --version",
        expect: "exec.missing",
    },
    Case {
        name: "missing command, PATH of one directory",
        needs: &["env"],
        script: "env -i PATH=/bin sh -c no-such-tool",
        expect: "exec.missing",
    },
    Case {
        name: "seccomp denial",
        needs: &["mkdir"],
        script: "/tmp/probe-fault --seccomp errno:mkdir -- mkdir /tmp/out",
        expect: "seccomp",
    },
    Case {
        name: "file descriptor limit",
        needs: &["python3"],
        script: "/tmp/probe-fault --rlimit nofile=12 -- python3 -c \"fs = [open('/etc/passwd') for _ in range(32)]\"",
        expect: "proc.limit",
    },
    Case {
        name: "read-only root",
        needs: &["touch"],
        script: "touch /usr/local/made-here",
        expect: "fs.readonly",
    },
];

/// An image of the manifest.
struct Image {
    name: String,
    root: String,
    env: BTreeMap<String, String>,
    /// Python packages installed under /opt/wheels (on PYTHONPATH).
    wheels: Vec<String>,
}

fn images() -> Vec<Image> {
    let mut images = vec![Image {
        name: "host".into(),
        root: "/".into(),
        env: BTreeMap::from([("LANG".into(), "C.UTF-8".into())]),
        wheels: Vec::new(),
    }];
    let Ok(manifest) = std::env::var("PRECISION_IMAGES") else {
        assert!(
            !ci(),
            "CI=true: PRECISION_IMAGES must name the images `cargo xtask test` builds"
        );
        eprintln!(
            "PRECISION_IMAGES unset: the host only (`cargo xtask precision` builds the images)"
        );
        return images;
    };
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(&manifest).unwrap_or_else(|e| panic!("{manifest}: {e}")),
    )
    .unwrap_or_else(|e| panic!("{manifest}: {e}"));
    for i in manifest.as_array().expect("a list of images") {
        images.push(Image {
            name: i["name"].as_str().expect("name").into(),
            root: i["root"].as_str().expect("root").into(),
            env: serde_json::from_value(i["env"].clone()).unwrap_or_default(),
            wheels: serde_json::from_value(i["wheels"].clone()).unwrap_or_default(),
        });
    }
    images
}

/// Whether `image` has what `case` needs.
fn has(image: &Image, need: &str) -> bool {
    if image.wheels.iter().any(|w| w == need) {
        return true;
    }
    ["usr/local/bin", "usr/bin", "bin"].iter().any(|dir| {
        std::path::Path::new(&image.root)
            .join(dir)
            .join(need)
            .exists()
    })
}

/// `bwrap` words that run `argv` on `image`: its root read-only, a
/// private /tmp, the fault injector, a clean environment. `own_pids`: in a
/// PID namespace of its own.
fn bwrap_on(image: &Image, own_pids: bool, argv: &[&str]) -> Vec<String> {
    let mut bwrap = vec![
        "bwrap".to_string(),
        "--ro-bind".into(),
        image.root.clone(),
        "/".into(),
        "--proc".into(),
        "/proc".into(),
        "--dev".into(),
        "/dev".into(),
        "--tmpfs".into(),
        "/tmp".into(),
        "--ro-bind".into(),
        FAULT.into(),
        "/tmp/probe-fault".into(),
        "--die-with-parent".into(),
        "--clearenv".into(),
        "--setenv".into(),
        "PATH".into(),
        "/usr/local/bin:/usr/bin:/bin".into(),
        "--setenv".into(),
        "HOME".into(),
        "/tmp".into(),
        "--chdir".into(),
        "/tmp".into(),
    ];
    if own_pids {
        bwrap.push("--unshare-pid".into());
    }
    for (k, v) in &image.env {
        bwrap.extend(["--setenv".into(), k.clone(), v.clone()]);
    }
    bwrap.push("--".into());
    bwrap.extend(argv.iter().map(|a| a.to_string()));
    bwrap
}

/// `probe trace --json -- bwrap … sh -c SCRIPT` on `image`.
fn run(image: &Image, script: &str) -> Value {
    let bwrap = bwrap_on(image, true, &["sh", "-c", script]);
    let probe = std::env::var("PRECISION_PROBE").unwrap_or_else(|_| PROBE.to_string());
    let out = Command::new(probe)
        .args(["trace", "--json", "--"])
        .args(&bwrap)
        .output()
        .expect("run probe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "{}: `{script}`: not JSON ({e}): {stdout}\n{}",
            image.name,
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn own_logic_failures_are_none_and_sandbox_failures_keep_their_primitive() {
    if !root() {
        return;
    }
    let mut results = Vec::new();
    let mut wrong = Vec::new();
    for image in images() {
        for case in OWN_LOGIC.iter().chain(SANDBOX) {
            if !case.needs.iter().all(|n| has(&image, n)) {
                continue;
            }
            let a = run(&image, case.script);
            let got = a["primitive"].as_str().unwrap_or("?").to_string();
            // a case that did not fail proves nothing: the corpus is broken
            assert_eq!(
                a["failed"], true,
                "{}: {}: `{}` did not fail: {a:#}",
                image.name, case.name, case.script
            );
            let right = got == case.expect;
            eprintln!(
                "{:<14} {:<40} {:<14} {}",
                image.name,
                case.name,
                got,
                if right { "ok" } else { "WRONG" }
            );
            if !right {
                wrong.push(format!(
                    "{}: {} (`{}`): expected {}, got {got}: {}\nnoticed: {}",
                    image.name, case.name, case.script, case.expect, a["explanation"], a["noticed"]
                ));
            }
            results.push(json!({
                "image": image.name,
                "case": case.name,
                "own_logic": case.expect == "none",
                "expect": case.expect,
                "got": got,
                "explanation": a["explanation"],
                "noticed": a["noticed"],
            }));
        }
    }
    if let Ok(path) = std::env::var("PRECISION_RESULTS") {
        std::fs::write(&path, serde_json::to_vec_pretty(&results).unwrap())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// A terminal-style server on the image: a shell kept between calls that
/// runs each command it reads with `sh -c` (one line, its bytes as octal
/// escapes: a script may span lines), answers its output and `@@exit N`,
/// and between and during calls runs version probes of its own (for a
/// tool the image lacks). Its first line is its pid.
const SERVER: &str = "echo $$; \
    ( while kill -0 $$ 2>/dev/null; do no-such-version-probe --version >/dev/null 2>&1; sleep 0.01; done ) & \
    while IFS= read -r line; do \
      cmd=$(printf '%b' \"$line\"); \
      sh -c \"$cmd\" </dev/null >/tmp/.call-out 2>&1; code=$?; \
      cat /tmp/.call-out; echo \"@@exit $code\"; \
    done";

/// One call: a span over the server (`server`), the command written to
/// it, its answer read back, the span ended as a server that never says
/// `isError` would (exit 0) with the call's words.
fn call_server(
    daemon: &mut probe::client::Client,
    session: &str,
    server: &mut std::process::Child,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    pid: u32,
    script: &str,
) -> Value {
    use std::io::Write as _;
    let span = daemon
        .call(
            json!({"op": "begin_span", "session": session, "label": script,
                     "pid": pid, "tree": true, "server": true}),
        )
        .expect("begin_span")["span_id"]
        .as_u64()
        .unwrap();
    let stdin = server.stdin.as_mut().unwrap();
    let escaped: String = script.bytes().map(|b| format!("\\0{b:o}")).collect();
    writeln!(stdin, "{escaped}").unwrap();
    stdin.flush().unwrap();
    let mut output = String::new();
    for line in lines.by_ref() {
        let line = line.expect("the server's answer");
        output.push_str(&line);
        output.push('\n');
        if line.starts_with("@@exit ") {
            break;
        }
    }
    let ended = daemon
        .call(
            json!({"op": "end_span", "span_id": span, "exit": {"code": 0, "signal": null},
                     "words": {"command": script, "output": output}}),
        )
        .expect("end_span");
    ended["attribution"].clone()
}

/// The same corpus inside one call each to a long-lived server: own-logic
/// failures stay `none` with no hidden failure, whatever the server runs
/// around the call; sandbox-caused ones are the call's hidden failure, as
/// its words and its work say (the server answers without `isError`).
#[test]
fn inside_a_long_lived_servers_calls_own_logic_stays_none() {
    if !root() {
        return;
    }
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("probe.sock");
    let mut daemon_process = Command::new(PROBE)
        .args(["run", "--socket"])
        .arg(&socket)
        .arg("--db")
        .arg(dir.path().join("evidence.db"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    probe::client::wait_until_ready(&socket, std::time::Duration::from_secs(30))
        .expect("the daemon came up");
    let mut daemon = probe::client::Client::connect(&socket).unwrap();
    // the cases whose sandbox failure a call shows in its words
    let shown = ["fs.missing", "exec.missing", "fs.readonly", "seccomp"];
    let mut wrong = Vec::new();
    let mut judged = 0;
    for image in images() {
        let words = bwrap_on(&image, false, &["sh", "-c", SERVER]);
        // a process group of its own: the whole server goes at the end
        let mut server = Command::new(&words[0])
            .args(&words[1..])
            .process_group(0)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(server.stdout.take().unwrap()).lines();
        let pid: u32 = lines.next().unwrap().unwrap().trim().parse().unwrap();
        let cases = OWN_LOGIC
            .iter()
            .chain(SANDBOX.iter().filter(|c| shown.contains(&c.expect)));
        for case in cases {
            if !case.needs.iter().all(|n| has(&image, n)) {
                continue;
            }
            // a session per server: each image's server is its own sandbox
            // with its own /tmp
            let session = format!("precision-server-{}", image.name);
            let a = call_server(
                &mut daemon,
                &session,
                &mut server,
                &mut lines,
                pid,
                case.script,
            );
            judged += 1;
            let got = match a["hidden_failure"]["primitive"].as_str() {
                Some(hidden) => hidden.to_string(),
                None => a["primitive"].as_str().unwrap_or("?").to_string(),
            };
            let right = got == case.expect && a["primitive"] == "none";
            eprintln!(
                "{:<14} server: {:<32} {:<14} {}",
                image.name,
                case.name,
                got,
                if right { "ok" } else { "WRONG" }
            );
            if !right {
                wrong.push(format!(
                    "{} (server): {} (`{}`): expected {}, got {got}: {} / {}",
                    image.name,
                    case.name,
                    case.script,
                    case.expect,
                    a["explanation"],
                    a["hidden_failure"]
                ));
            }
        }
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(server.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = server.wait();
    }
    let _ = daemon_process.kill();
    let _ = daemon_process.wait();
    assert!(judged >= OWN_LOGIC.len() / 2, "only {judged} calls judged");
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}
