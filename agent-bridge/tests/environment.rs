//! The environment a run ran in: `sandbox_environment` through the bridge
//! and through the proxy, stored with every campaign run, and `campaign
//! compare` tying the tests that broke in a bubblewrap sandbox to the
//! differences planted in it (a hidden command, a read-only workdir, a
//! small file descriptor limit, a /tmp that forgets between calls, no
//! network, another time zone), with the one failure no measured facet
//! touches listed as unexplained.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{BRIDGE, Bridge, Opts, is_error, root, structured};
use serde_json::{Value, json};

const TERMINAL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/terminal_server.py"
);

fn must_run_here() -> bool {
    if root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI runs the environment tests as root"
    );
    eprintln!("SKIPPED: needs root (bubblewrap sandboxes, a probe daemon)");
    false
}

fn facets(snapshot: &Value) -> Vec<String> {
    snapshot["facets"]
        .as_object()
        .map(|f| f.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bridge_takes_its_snapshot_as_a_workload_and_never_a_secret() {
    let secret = "s3cr3t-value-8c1f0e";
    let bridge = Bridge::stdio(Opts::default()).await;
    let r = bridge
        .call(
            "sandbox_environment",
            json!({"commands": ["no-such-tool-e7", "sh"]}),
        )
        .await;
    assert!(!is_error(&r), "{r:?}");
    let s = &structured(&r)["snapshot"];
    let parsed = probe::env::Snapshot::from_value(s.clone()).expect("a probe-env document");
    for facet in [
        "runtime",
        "identity",
        "commands",
        "writable",
        "resources",
        "syscalls",
        "network",
        "variables",
    ] {
        assert!(
            parsed.facets.contains_key(facet),
            "no {facet}: {:?}",
            facets(s)
        );
    }
    assert_eq!(
        s["facets"]["commands"]["items"]["no-such-tool-e7"]["path"],
        Value::Null
    );
    assert!(
        s["facets"]["commands"]["items"]["sh"]["path"].is_string(),
        "{s}"
    );
    drop(bridge);

    // a bad name is refused with a word, before anything runs
    let bridge = Bridge::stdio(Opts::default()).await;
    let r = bridge
        .call("sandbox_environment", json!({"commands": ["../../bin/sh"]}))
        .await;
    assert!(is_error(&r), "{r:?}");
    assert!(
        common::text(&r).contains("not a command name"),
        "{}",
        common::text(&r)
    );

    // what the bridge runs for it, with a secret in its environment: the
    // name is kept, the value never is
    let out = std::process::Command::new(BRIDGE)
        .args(["worker", "env", "snapshot"])
        .env("ENVTEST_TOKEN", secret)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("\"ENVTEST_TOKEN\""), "the name is kept");
    assert!(!text.contains(secret), "the value never is");
}

/// The snapshot a bridge under `profile` takes of its workloads' world.
async fn snapshot_under(profile: &'static str) -> probe::env::Snapshot {
    let bridge = Bridge::stdio(Opts {
        profile: Some(profile),
        ..Opts::default()
    })
    .await;
    let r = bridge.call("sandbox_environment", json!({})).await;
    assert!(!is_error(&r), "{profile}: {r:?}");
    probe::env::Snapshot::from_value(structured(&r)["snapshot"].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_profiles_limits_and_filters_show_in_the_snapshot_its_workloads_take() {
    if !must_run_here() {
        return;
    }
    let clean = snapshot_under("clean").await;
    let keys = |other: &probe::env::Snapshot| -> Vec<String> {
        probe::env::diff::diff(&clean, other)
            .differences
            .iter()
            .map(|d| format!("{}/{}", d.facet, d.key))
            .collect()
    };
    // a memory and a pids cgroup per call: the worker is in it
    let memory = snapshot_under("memory-limit").await;
    let mem = &memory.facet("resources").unwrap().items["memory.max"];
    assert_eq!(mem, &json!((64u64 << 20).to_string()), "{mem}");
    assert!(keys(&memory).contains(&"resources/memory.max".to_string()));
    let pids = snapshot_under("pids-limit").await;
    assert_eq!(
        pids.facet("resources").unwrap().items["pids.max"],
        json!("24")
    );
    assert!(keys(&pids).contains(&"resources/pids.max".to_string()));
    // a seccomp filter on the workloads
    let filtered = snapshot_under("seccomp-errno").await;
    let sys = &filtered.facet("syscalls").unwrap().items;
    assert_eq!(sys["seccomp"], "filter", "{sys:?}");
    assert!(keys(&filtered).contains(&"syscalls/seccomp".to_string()));
    // a read-only root
    let ro = snapshot_under("readonly").await;
    assert_eq!(
        ro.facet("writable").unwrap().items["tmp"]["writable"],
        "EROFS"
    );
    // PATH of a slim image: the compiler and the browser are gone
    let slim = snapshot_under("no-tools").await;
    for tool in ["gcc", "chromium"] {
        if clean.facet("commands").unwrap().items[tool]["path"].is_string() {
            assert!(
                slim.facet("commands").unwrap().items[tool]["path"].is_null(),
                "{tool}"
            );
            assert!(keys(&slim).contains(&format!("commands/{tool}")));
        }
    }
    // a network namespace with only loopback
    let offline = snapshot_under("no-network").await;
    let net = &offline.facet("network").unwrap().items;
    assert_eq!(net["route.default"], Value::Null, "{net:?}");
    assert!(
        net.keys()
            .filter(|k| k.starts_with("if."))
            .all(|k| k == "if.lo"),
        "{net:?}"
    );
    // a seccomp filter that denies user namespaces (what leaves Chromium
    // "No usable sandbox!"): a profile file of the user's own
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("no-userns.toml");
    std::fs::write(
        &file,
        "description = \"no user namespaces\"\nreproduces = \"seccomp\"\n[[seccomp]]\naction = \"errno\"\nsyscalls = [\"unshare\", \"clone3\"]\n",
    )
    .unwrap();
    let bridge = Bridge::stdio(Opts {
        extra: vec!["--profile".into(), file.display().to_string()],
        ..Opts::default()
    })
    .await;
    let r = bridge.call("sandbox_environment", json!({})).await;
    assert!(!is_error(&r), "{r:?}");
    let denied = probe::env::Snapshot::from_value(structured(&r)["snapshot"].clone()).unwrap();
    let sys = &denied.facet("syscalls").unwrap().items;
    assert_eq!(sys["try.userns"], "EPERM", "{sys:?}");
    assert!(keys(&denied).contains(&"syscalls/try.userns".to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_answers_sandbox_environment_as_its_server_would_see_it() {
    let args: Vec<String> = [
        "proxy",
        "--stdio",
        "--probe-socket",
        "/nonexistent/probe.sock",
        "--",
        "python3",
        TERMINAL,
    ]
    .map(String::from)
    .to_vec();
    let proxied = Bridge::stdio_with(&args, false)
        .await
        .expect("handshake through the proxy");
    let r = proxied
        .call("sandbox_environment", json!({"commands": ["python3"]}))
        .await;
    assert!(!is_error(&r), "{r:?}");
    let s = &structured(&r)["snapshot"];
    probe::env::Snapshot::from_value(s.clone()).expect("a probe-env document");
    assert!(
        s["facets"]["commands"]["items"]["python3"]["path"].is_string(),
        "{s}"
    );
    // the foreign server's own tools are untouched
    let tools = proxied.client.list_all_tools().await.unwrap();
    assert!(tools.iter().all(|t| t.name != "sandbox_environment"));
}

/// One test of the suite: `steps` of exec commands, each to exit 0
/// (the last one's stdout `expect_stdout` when given).
fn test_file(dir: &Path, id: &str, commands: &[&str], expect_stdout: Option<&str>) {
    let steps: Vec<Value> = commands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut expect = json!({"exit_code": 0});
            if i + 1 == commands.len()
                && let Some(out) = expect_stdout
            {
                expect["stdout_equals"] = json!(out);
            }
            json!({"tool": "exec", "arguments": {"command": c, "timeout_ms": 30000}, "expect": expect})
        })
        .collect();
    let t = json!({"id": id, "domain": "files", "title": id, "steps": steps});
    std::fs::write(
        dir.join(format!("{id}.json")),
        serde_json::to_vec_pretty(&t).unwrap(),
    )
    .unwrap();
}

/// bubblewrap over the host's /usr and /etc, with the differences this
/// test plants: no `tools` dir (its command is gone), the workdir bound
/// read-only, a private /tmp, no network, Tokyo time; the daemon's socket
/// at /run/probe.
fn sandbox_words(sockdir: &Path, work: &Path) -> Vec<String> {
    let bridge_dir = Path::new(BRIDGE).parent().unwrap().display().to_string();
    let mut w: Vec<String> = [
        "prlimit",
        "--nofile=128:128",
        "--",
        "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--die-with-parent",
        "--tmpfs",
        "/tmp",
        "--setenv",
        "TZ",
        "Asia/Tokyo",
    ]
    .map(String::from)
    .to_vec();
    w.extend(common::bwrap_system_binds(&[&bridge_dir]));
    let work = work.display().to_string();
    w.extend([
        "--ro-bind".into(),
        work.clone(),
        work.clone(),
        "--chdir".into(),
        work,
    ]);
    w.extend(
        [
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--bind",
            &sockdir.display().to_string(),
            "/run/probe",
        ]
        .map(String::from),
    );
    w
}

/// The differences the compare test plants in its sandbox.
fn planted_key(k: &str) -> bool {
    matches!(
        k,
        "commands/zz-planted-tool"
            | "resources/rlimit.nofile"
            | "identity/tz"
            | "syscalls/no_new_privs"
            | "network/route.default"
    )
}

fn quoted(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn compare_ties_each_test_that_broke_in_a_sandbox_to_the_difference_planted_there() {
    if !must_run_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = common::probe_daemon(dir.path());
    let sockdir = socket.parent().unwrap().to_path_buf();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    // the workdir outside /tmp: the ephemeral profile mounts a fresh /tmp
    // over everything under it
    let workdir = tempfile::Builder::new()
        .prefix("envtest-work-")
        .tempdir_in("/var/lib")
        .unwrap();
    let work = workdir.path().to_path_buf();
    let tool = tools.join("zz-planted-tool");
    std::fs::write(&tool, "#!/bin/sh\necho planted\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // a file where no facet looks: its absence is a difference nobody measured
    let elsewhere = tempfile::Builder::new()
        .prefix("envtest-")
        .tempdir_in("/var/lib")
        .unwrap();
    let unmeasured = elsewhere.path().join("data.txt");
    std::fs::write(&unmeasured, "data\n").unwrap();

    let suite = dir.path().join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    let w = work.display();
    test_file(&suite, "env-tool", &["zz-planted-tool"], Some("planted\n"));
    test_file(
        &suite,
        "env-readonly",
        &[&format!("echo x > {w}/out.txt")],
        None,
    );
    test_file(
        &suite,
        "env-persist",
        &[
            "mkdir -p /tmp/envt && echo 1 > /tmp/envt/token",
            "cat /tmp/envt/token",
        ],
        Some("1\n"),
    );
    test_file(
        &suite,
        "env-files",
        &["python3 -c \"fs = [open('/dev/null') for _ in range(300)]\""],
        None,
    );
    test_file(
        &suite,
        "env-unmeasured",
        &[&format!("cat {}", unmeasured.display())],
        None,
    );
    test_file(&suite, "env-fine", &["echo fine"], Some("fine\n"));

    let path = format!(
        "{}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        tools.display()
    );
    let serve = |socket: &str, profile: &str| {
        format!(
            "env PATH={path} {BRIDGE} serve --stdio --profile {profile} --workdir {w} --probe-socket {socket}"
        )
    };
    let host = format!(
        "stdio:cd {w} && {}",
        serve(&socket.display().to_string(), "clean")
    );
    let sandbox = format!(
        "stdio:{} {}",
        quoted(&sandbox_words(&sockdir, &work)),
        serve("/run/probe/probe.sock", "ephemeral")
    );
    // markers of runs that never read theirs back: a stale one in each
    // place is swept by the next run; a recent one (a live run's) is kept
    let stale = format!(".probe-env-marker-envtest-stale-{}", std::process::id());
    let recent = format!(".probe-env-marker-envtest-recent-{}", std::process::id());
    let planted: Vec<PathBuf> = [Path::new("/tmp"), work.as_path()]
        .iter()
        .flat_map(|place| [place.join(&stale), place.join(&recent)])
        .collect();
    for marker in &planted {
        std::fs::write(marker, "an earlier run's marker\n").unwrap();
        if marker.ends_with(&stale) {
            let three_days = std::time::SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
            std::fs::File::options()
                .write(true)
                .open(marker)
                .unwrap()
                .set_modified(three_days)
                .unwrap();
        }
    }
    let db = dir.path().join("results.db");
    let db = db.to_str().unwrap();
    let suite = suite.to_str().unwrap();
    for (run, target) in [("host", &host), ("sandbox", &sandbox)] {
        let out = common::campaign(&[
            "run",
            "--suite",
            suite,
            "--target",
            target,
            "--db",
            db,
            "--run",
            run,
            "--workers",
            "1",
            "--no-bar",
        ]);
        assert!(
            out.status.success() || out.status.code() == Some(1),
            "campaign run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let host_report: Value = serde_json::from_str(&common::ok(&[
        "report", "--db", db, "--run", "host", "--json",
    ]))
    .unwrap();
    assert_eq!(
        host_report["failed"], 0,
        "the host passes everything: {host_report}"
    );
    let env = &host_report["environment"][0];
    assert_eq!(
        env["snapshot"]["facets"]["persistence"]["items"]["tmp"], "kept",
        "{}",
        env["snapshot"]["facets"]["persistence"]
    );
    for marker in &planted {
        assert_eq!(
            marker.exists(),
            marker.ends_with(&recent),
            "{}: a stale marker is swept, a recent one kept",
            marker.display()
        );
        let _ = std::fs::remove_file(marker);
    }
    let own: Vec<_> = std::fs::read_dir(&work)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".probe-env-marker-"))
        .collect();
    assert!(own.is_empty(), "the runs' own markers are removed: {own:?}");

    let html = dir.path().join("compare.html");
    let out = common::ok(&[
        "compare",
        "--db",
        db,
        "host",
        "sandbox",
        "--json",
        "--html",
        html.to_str().unwrap(),
    ]);
    let c: Value = serde_json::from_str(&out).unwrap();
    let broke: Vec<&str> = c["broke"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["test_id"].as_str())
        .collect();
    let mut sorted = broke.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "env-files",
            "env-persist",
            "env-readonly",
            "env-tool",
            "env-unmeasured"
        ],
        "{out}"
    );
    let e = &c["environment"];
    let explains = |facet: &str, key: &str| -> Vec<String> {
        e["differences"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["facet"] == facet && d["key"] == key)
            .unwrap_or_else(|| panic!("no difference {facet}/{key}: {e}"))["explains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(explains("commands", "zz-planted-tool"), ["env-tool"]);
    assert_eq!(explains("writable", "cwd"), ["env-readonly"]);
    assert_eq!(explains("persistence", "tmp"), ["env-persist"]);
    assert_eq!(explains("resources", "rlimit.nofile"), ["env-files"]);
    assert!(explains("identity", "tz").is_empty());
    assert_eq!(e["unexplained"], json!(["env-unmeasured"]), "{e}");
    // every test explained is explained by the difference planted for it
    for d in e["differences"].as_array().unwrap() {
        for t in d["explains"].as_array().unwrap() {
            let planted = match t.as_str().unwrap() {
                "env-tool" => d["facet"] == "commands",
                "env-readonly" => d["facet"] == "writable" && d["key"] == "cwd",
                "env-persist" => {
                    d["facet"] == "persistence" || (d["facet"] == "writable" && d["key"] == "tmp")
                }
                "env-files" => d["key"] == "rlimit.nofile",
                other => panic!("{other} explained by {d}"),
            };
            assert!(planted, "{t} explained by {d}");
        }
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("which difference broke which test") && page.contains("zz-planted-tool"));
    let text = common::ok(&["compare", "--db", db, "host", "sandbox"]);
    eprintln!("{text}");
    assert!(
        text.contains("ENVIRONMENT:") && text.contains("UNEXPLAINED"),
        "{text}"
    );

    // the two stored snapshots, diffed on their own: every planted
    // difference is there
    let sandbox_report: Value = serde_json::from_str(&common::ok(&[
        "report", "--db", db, "--run", "sandbox", "--json",
    ]))
    .unwrap();
    let files: Vec<PathBuf> = [("a", &host_report), ("b", &sandbox_report)]
        .iter()
        .map(|(n, r)| {
            let f = dir.path().join(format!("{n}.json"));
            std::fs::write(&f, r["environment"][0]["snapshot"].to_string()).unwrap();
            f
        })
        .collect();
    let out = std::process::Command::new(common::probe_binary())
        .args(["env", "diff", "--json"])
        .args(&files)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "differences: exit 1; {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<String> = d["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            format!(
                "{}/{}",
                x["facet"].as_str().unwrap(),
                x["key"].as_str().unwrap()
            )
        })
        .collect();
    for planted in [
        "commands/zz-planted-tool",
        "writable/cwd",
        "writable/tmp",
        "resources/rlimit.nofile",
        "identity/tz",
        "syscalls/no_new_privs",
    ] {
        assert!(
            keys.contains(&planted.to_string()),
            "{planted} not in {keys:?}"
        );
    }
    let host_net = &host_report["environment"][0]["snapshot"]["facets"]["network"]["items"];
    if !host_net["route.default"].is_null() {
        assert!(
            keys.contains(&"network/route.default".to_string()),
            "{keys:?}"
        );
    }
    // and nothing else: every difference is one planted, or what follows
    // from one (the private /tmp's free space in the places under it,
    // the interfaces the network namespace hides, the TZ variable)
    let follows = |k: &str| {
        k.starts_with("writable/")
            || k.starts_with("network/if.")
            || k.starts_with("persistence/")
            || k == "variables/TZ"
    };
    let unplanted: Vec<&String> = keys
        .iter()
        .filter(|k| !follows(k) && !planted_key(k))
        .collect();
    assert!(
        unplanted.is_empty(),
        "differences nobody planted: {unplanted:?}"
    );
    // before a run, the sandbox's snapshot says which tests are at risk;
    // after it, how that held
    let pre: Value = serde_json::from_str(&common::ok(&[
        "preflight",
        "--suite",
        suite,
        "--env",
        files[1].to_str().unwrap(),
        "--db",
        db,
        "--run",
        "sandbox",
        "--json",
    ]))
    .unwrap();
    let at_risk: Vec<(&str, Vec<&str>)> = pre["at_risk"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["test"].as_str().unwrap(),
                r["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i.as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        at_risk,
        [
            ("env-persist", vec!["persistence/tmp"]),
            ("env-readonly", vec!["writable/cwd"]),
            ("env-tool", vec!["commands/zz-planted-tool"]),
        ],
        "{pre}"
    );
    assert_eq!(
        pre["held"]["at_risk_failed"],
        json!(["env-persist", "env-readonly", "env-tool"])
    );
    assert_eq!(pre["held"]["at_risk_passed"], json!([]));
    assert_eq!(
        pre["held"]["failed_unpredicted"],
        json!(["env-files", "env-unmeasured"])
    );

    // no network: only lo inside, and no default route
    let b = &sandbox_report["environment"][0]["snapshot"]["facets"]["network"]["items"];
    let ifs: Vec<&String> = b
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| k.starts_with("if."))
        .collect();
    assert_eq!(ifs, ["if.lo"], "{b}");
    assert_eq!(b["route.default"], Value::Null, "{b}");
}

/// `probe env diff A B`.
fn env_diff(a: &Path, b: &Path) -> std::process::Output {
    std::process::Command::new(common::probe_binary())
        .args(["env", "diff"])
        .args([a, b])
        .output()
        .unwrap()
}

#[test]
fn two_snapshots_of_one_machine_differ_in_nothing() {
    let take = || {
        let out = std::process::Command::new(common::probe_binary())
            .args(["env", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&a, take()).unwrap();
    std::fs::write(&b, take()).unwrap();
    let out = env_diff(&a, &b);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // a corrupt one, and one from a newer probe: a word, not a crash
    std::fs::write(&b, b"{\"format\": \"probe-env\", \"version\": 99}").unwrap();
    let out = env_diff(&a, &b);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("newer probe") && err.contains("b.json"),
        "{err}"
    );
    std::fs::write(&b, b"\xff\xfe not json").unwrap();
    let out = env_diff(&a, &b);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not JSON"));
}

/// The snapshot is the bridge's own measurement: its trials fail on
/// purpose and its lookups of absent tools are the point. The probe is not
/// asked to trace it (a burst of ~50k failed calls a second, which made
/// the ring buffer drop the evidence of calls running beside it); the
/// next call is traced as ever.
#[tokio::test(flavor = "multi_thread")]
async fn the_snapshot_is_not_traced_and_the_next_call_is() {
    if !must_run_here() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_daemon, socket) = common::probe_daemon(dir.path());
    let ended = || {
        let out = std::process::Command::new(common::probe_binary())
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        let status: Value = serde_json::from_slice(&out.stdout).unwrap();
        status["spans_ended"].as_u64().unwrap()
    };
    let bridge = Bridge::stdio(Opts {
        probe_at: Some(socket.clone()),
        ..Opts::default()
    })
    .await;
    let r = bridge.call("sandbox_environment", json!({})).await;
    assert!(!is_error(&r), "{r:?}");
    assert_eq!(ended(), 0, "the snapshot was traced");
    let r = bridge.call("exec", json!({"argv": ["true"]})).await;
    assert_eq!(structured(&r)["kernel"]["available"], true, "{r:?}");
    assert_eq!(ended(), 1);
}
