//! `probe env`: the real binary takes a snapshot of this machine, keeps
//! secrets out, survives hostile commands and PATHs, and sees what a
//! bubblewrap sandbox changes (root only for that one; under CI=true it is
//! never skipped).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use probe::env::{FACETS, Snapshot};
use serde_json::Value;

const PROBE: &str = env!("CARGO_BIN_EXE_probe");

/// A scratch directory outside /tmp (the sandbox test puts a tmpfs there).
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("env-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir")
}

/// An executable shell script `name` in `dir`.
fn tool(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// The directory of the probe binary (bound again inside sandboxes that
/// get a private /tmp).
fn probe_dir() -> &'static Path {
    Path::new(PROBE).parent().unwrap()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run probe");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn snapshot_of(out: &Output) -> Snapshot {
    Snapshot::parse(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a snapshot ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn item<'a>(s: &'a Snapshot, facet: &str, key: &str) -> &'a Value {
    s.facet(facet)
        .unwrap_or_else(|| panic!("no facet {facet}"))
        .items
        .get(key)
        .unwrap_or_else(|| panic!("no {facet}.{key} in {:#?}", s.facet(facet)))
}

/// PATH with `dir` first.
fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn a_json_snapshot_has_every_facet_and_no_value() {
    let secret = "hunter2-9f8e7d6c5b4a-unique-secret";
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().to_string();
    let out = run(Command::new(PROBE)
        .args([
            "env",
            "--json",
            "--command",
            "no-such-tool-xyz",
            "--reach",
            &open,
        ])
        .args(["--reach", "example.invalid:443"])
        .env("PROBE_TEST_SECRET_VAR", secret)
        .env(
            "HTTPS_PROXY",
            format!("http://user:{secret}@proxy.invalid:3128"),
        ));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(secret), "a variable's value leaked");
    assert!(text.contains("PROBE_TEST_SECRET_VAR"));
    let s = snapshot_of(&out);
    assert_eq!(s.source, "probe env");
    for name in FACETS {
        match *name {
            "mcp" => assert!(s.facet(name).is_none(), "mcp is the campaign's"),
            "persistence" => {
                let f = s.facet(name).expect("persistence");
                assert!(f.items.is_empty());
                assert!(f.unreadable.contains_key("tmp") && f.unreadable.contains_key("workdir"));
            }
            _ => assert!(s.facet(name).is_some(), "no facet {name}"),
        }
        if let Some(f) = s.facet(name) {
            assert!(!f.how.is_empty(), "{name} says not how");
        }
    }
    assert_eq!(
        item(&s, "commands", "no-such-tool-xyz"),
        &serde_json::json!({"path": null})
    );
    let sh = item(&s, "commands", "sh");
    assert!(sh["path"].is_string(), "{sh}");
    assert!(
        item(&s, "network", "proxy.HTTPS_PROXY")
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    for key in ["uid", "gid", "groups", "locale", "tz", "bin_sh"] {
        assert!(
            s.facet("identity").unwrap().items.contains_key(key),
            "identity.{key}"
        );
    }
    assert!(item(&s, "writable", "tmp")["writable"].is_string());
    assert_eq!(item(&s, "network", &format!("reach.{open}")), "ok");
    assert_eq!(
        item(&s, "network", "reach.example.invalid:443"),
        "needs DNS: not tried"
    );
    assert!(item(&s, "syscalls", "try.userns").is_string());
}

#[test]
fn the_text_view_is_a_table_per_facet() {
    let out = run(Command::new(PROBE).args(["env"]));
    let text = String::from_utf8_lossy(&out.stdout);
    for facet in [
        "runtime:",
        "commands:",
        "writable:",
        "syscalls:",
        "network:",
    ] {
        assert!(text.contains(facet), "{facet} missing:\n{text}");
    }
    assert!(text.contains("absent"), "{text}");
}

#[test]
fn a_path_of_thousands_of_dirs_is_capped() {
    let mut path = String::from("/usr/bin:/bin");
    for i in 0..5000 {
        path.push_str(&format!(":/nx/{i}")); // (an env string is at most 128 KiB)
    }
    let out = run(Command::new(PROBE)
        .args(["env", "--json"])
        .env("PATH", &path));
    let s = snapshot_of(&out);
    let why = &s.facet("commands").unwrap().unreadable["PATH"];
    assert!(why.contains("5002 entries"), "{why}");
    assert!(item(&s, "commands", "sh")["path"].is_string());
}

#[test]
fn a_hung_or_flooding_version_is_cut() {
    let dir = scratch();
    let pidfile = dir.path().join("hangs.pid");
    tool(
        dir.path(),
        "zz-hangs",
        &format!("echo $$ > {}; exec sleep 100", pidfile.display()),
    );
    tool(
        dir.path(),
        "zz-floods",
        "yes 0123456789abcdefghijklmnopqrstuvwxyz | tr -d '\\n'",
    );
    let out = run(Command::new(PROBE)
        .args([
            "env",
            "--json",
            "--command",
            "zz-hangs",
            "--command",
            "zz-floods",
        ])
        .env("PATH", path_with(dir.path())));
    // cut at the timeout: the hung process is gone, not left running
    let hung: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(hung), None),
        Err(nix::errno::Errno::ESRCH),
        "the hung --version still runs"
    );
    let s = snapshot_of(&out);
    let hangs = item(&s, "commands", "zz-hangs");
    assert!(
        hangs["path"].is_string() && hangs["version"].is_null(),
        "{hangs}"
    );
    assert!(
        hangs["machine"].is_null(),
        "a script has no machine: {hangs}"
    );
    let why = &s.facet("commands").unwrap().unreadable["zz-hangs.version"];
    assert!(why.starts_with("no answer"), "{why}");
    let line = item(&s, "commands", "zz-floods")["version"]
        .as_str()
        .expect("a flood keeps its first line")
        .to_string();
    assert!(line.chars().count() <= 200, "{}", line.len());
    assert!(line.starts_with("0123456789abc"), "{line}");
}

#[test]
fn the_sbom_is_cyclonedx() {
    let out = run(Command::new(PROBE).args(["env", "--sbom"]));
    let bom: Value = serde_json::from_slice(&out.stdout).expect("SBOM JSON");
    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    for c in bom["components"].as_array().expect("components") {
        assert_eq!(c["type"], "library");
        let purl = c["purl"].as_str().unwrap();
        assert!(
            purl.starts_with("pkg:pypi/") || purl.starts_with("pkg:npm/"),
            "{purl}"
        );
    }
}

#[test]
fn env_diff_reads_snapshots_and_names_bad_ones() {
    let dir = scratch();
    let a = dir.path().join("a.json");
    let out = run(Command::new(PROBE).args(["env", "--output"]).arg(&a));
    assert!(String::from_utf8_lossy(&out.stdout).contains("commands:"));
    Snapshot::parse(&std::fs::read(&a).unwrap()).expect("--output writes a snapshot");
    let same = Command::new(PROBE)
        .args(["env", "diff"])
        .arg(&a)
        .arg(&a)
        .output()
        .unwrap();
    assert_eq!(same.status.code(), Some(0), "{same:?}");
    // two snapshots of one machine in a row differ in nothing
    let b = dir.path().join("b.json");
    run(Command::new(PROBE).args(["env", "--output"]).arg(&b));
    let again = Command::new(PROBE)
        .args(["env", "diff"])
        .arg(&a)
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\": \"other\"}").unwrap();
    let out = Command::new(PROBE)
        .args(["env", "diff", "--json"])
        .arg(&a)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.json") && err.lines().count() == 1,
        "{err}"
    );
}

fn root() -> bool {
    if nix::unistd::Uid::effective().is_root() {
        return true;
    }
    assert!(
        !std::env::var("CI").is_ok_and(|v| v == "true"),
        "the bubblewrap test needs root, and CI=true forbids skipping it"
    );
    eprintln!("SKIPPED: the bubblewrap test needs root");
    false
}

/// The same probe inside bubblewrap with a read-only cwd, no network, a
/// tmpfs /tmp and a command hidden: each shows in its facet.
#[test]
fn a_bubblewrap_sandbox_shows_what_it_changed() {
    if !root() {
        return;
    }
    let bwrap = which::which("bwrap").expect("bwrap (bubblewrap) is installed");
    let tools = scratch();
    tool(
        tools.path(),
        "zz-planted-tool",
        "echo 'zz-planted-tool 1.0'",
    );
    let work = scratch();
    let path = path_with(tools.path());
    let probe_env = |cmd: &mut Command| {
        run(cmd
            .args(["env", "--json", "--command", "zz-planted-tool"])
            .env("PATH", &path)
            .current_dir(work.path()))
    };
    let host = snapshot_of(&probe_env(&mut Command::new(PROBE)));
    let mut sandboxed = Command::new(&bwrap);
    sandboxed
        .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
        .args([
            "--tmpfs",
            "/tmp",
            "--unshare-net",
            "--unshare-pid",
            "--die-with-parent",
        ])
        // the binary again over the private /tmp: the workspace may live under /tmp
        .arg("--ro-bind")
        .args([probe_dir(), probe_dir()])
        .arg("--ro-bind")
        .args([work.path(), work.path()])
        .arg("--tmpfs")
        .arg(tools.path())
        .arg("--chdir")
        .arg(work.path())
        .args(["--", PROBE]);
    let sandbox = snapshot_of(&probe_env(&mut sandboxed));

    // the planted command: there outside, hidden inside
    let planted = item(&host, "commands", "zz-planted-tool");
    assert_eq!(planted["version"], "zz-planted-tool 1.0", "{planted}");
    assert!(item(&sandbox, "commands", "zz-planted-tool")["path"].is_null());

    // a read-only cwd
    let cwd = item(&sandbox, "writable", "cwd");
    assert_eq!(cwd["writable"], "EROFS", "{cwd}");
    assert_eq!(cwd["read_only"], true, "{cwd}");
    assert_eq!(item(&host, "writable", "cwd")["writable"], "ok");

    // a tmpfs /tmp
    assert_eq!(item(&sandbox, "writable", "tmp")["tmpfs"], true);

    // no network: loopback only, no default route
    let net = &sandbox.facet("network").unwrap().items;
    let ifs: Vec<&String> = net.keys().filter(|k| k.starts_with("if.")).collect();
    assert!(ifs.iter().all(|k| *k == "if.lo"), "{ifs:?}");
    assert!(net["route.default"].is_null(), "{}", net["route.default"]);

    // and `probe env diff` says they differ, naming the planted command
    let dir = scratch();
    let (a, b) = (
        dir.path().join("host.json"),
        dir.path().join("sandbox.json"),
    );
    std::fs::write(&a, serde_json::to_vec(&host).unwrap()).unwrap();
    std::fs::write(&b, serde_json::to_vec(&sandbox).unwrap()).unwrap();
    let out = Command::new(PROBE)
        .args(["env", "diff", "--json"])
        .args([&a, &b])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let d: Value = serde_json::from_slice(&out.stdout).expect("diff JSON");
    let keys: Vec<&str> = d["differences"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["key"].as_str())
        .collect();
    assert!(keys.contains(&"zz-planted-tool"), "{keys:?}");
}

#[test]
fn empty_proc_and_sys_give_a_partial_snapshot_that_says_why() {
    if !root() {
        return;
    }
    let bwrap = which::which("bwrap").expect("bwrap (bubblewrap) is installed");
    // /proc and /sys as empty directories: what a stripped container or a
    // restricted runtime may leave a workload
    let out = run(Command::new(&bwrap)
        .args(["--ro-bind", "/", "/", "--dev", "/dev"])
        .args(["--tmpfs", "/proc", "--tmpfs", "/sys", "--tmpfs", "/tmp"])
        .arg("--ro-bind")
        .args([probe_dir(), probe_dir()])
        .args(["--unshare-pid", "--die-with-parent", "--"])
        .arg(PROBE)
        .args(["env", "--json"]));
    let s = snapshot_of(&out);
    for facet in ["runtime", "resources", "syscalls", "network", "commands"] {
        assert!(s.facet(facet).is_some(), "no {facet}");
    }
    // read from /proc: not there, and said so rather than guessed
    let sys = s.facet("syscalls").unwrap();
    assert!(
        sys.unreadable.contains_key("seccomp") && !sys.items.contains_key("seccomp"),
        "{sys:?}"
    );
    let res = s.facet("resources").unwrap();
    assert!(!res.unreadable.is_empty(), "{res:?}");
    // what needs neither still is
    assert!(item(&s, "commands", "sh")["path"].is_string());
}
