//! `campaign generate`: a deterministic suite across the ten domains.
//! Variety comes from parameters (sizes, byte patterns, depths, counts)
//! drawn from a seeded generator, not from copies: the same seed gives the
//! same files, byte for byte.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::spec::{DOMAINS, Expect, ImageSize, Step, TestSpec};
use super::upstream;
use contract::bytes::{base64_encode, sha256_hex};

/// splitmix64: small, seedable, stable across platforms and releases.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

fn step(tool: &str, arguments: Value, expect: Expect) -> Step {
    let arguments: BTreeMap<String, Value> = serde_json::from_value(arguments).expect("an object");
    Step {
        tool: tool.into(),
        arguments,
        expect,
    }
}

fn exec(command: String, expect: Expect) -> Step {
    step(
        "exec",
        json!({"command": command, "timeout_ms": 60_000}),
        expect,
    )
}

fn code(language: &str, code: String, expect: Expect) -> Step {
    step(
        "run_code",
        json!({"language": language, "code": code, "timeout_ms": 60_000}),
        expect,
    )
}

fn ok_stdout(text: impl Into<String>) -> Expect {
    Expect {
        exit_code: Some(0),
        stdout_equals: Some(text.into()),
        ..Expect::default()
    }
}

fn exit(code: i32) -> Expect {
    Expect {
        exit_code: Some(code),
        ..Expect::default()
    }
}

/// The bytes moved are exactly `data`.
fn exactly(data: &[u8]) -> Expect {
    Expect {
        sha256: Some(sha256_hex(data)),
        size: Some(data.len() as u64),
        ..Expect::default()
    }
}

fn write(path: &str, data: &[u8]) -> Step {
    step(
        "write_file",
        json!({"path": path, "content_base64": base64_encode(data), "sha256": sha256_hex(data)}),
        exactly(data),
    )
}

fn read_back(path: &str, data: &[u8]) -> Step {
    step("read_file", json!({"path": path}), exactly(data))
}

/// One generated test: its title, what it needs, its steps.
struct Made {
    title: String,
    requires: Vec<String>,
    steps: Vec<Step>,
}

fn made(title: String, steps: Vec<Step>) -> Made {
    Made {
        title,
        requires: vec![],
        steps,
    }
}

/// A byte pattern of `n` bytes: the encoding cases the seed's bugs broke.
fn pattern(rng: &mut Rng, n: usize) -> (&'static str, Vec<u8>) {
    match rng.below(5) {
        0 => ("random", rng.bytes(n)),
        1 => ("nul-only", vec![0; n]),
        2 => ("all-256-values", (0..n).map(|i| i as u8).collect()),
        3 => (
            "invalid-utf8",
            b"\xff\xfe\xc3\x28\x80\xa0\xa1\xe2\x28\xa1"
                .iter()
                .copied()
                .cycle()
                .take(n)
                .collect(),
        ),
        _ => (
            "text-with-nul",
            b"line\0with\0nul\n"
                .iter()
                .copied()
                .cycle()
                .take(n)
                .collect(),
        ),
    }
}

fn files(rng: &mut Rng, dir: &str) -> Made {
    match rng.below(4) {
        0 => {
            let n = *rng.pick(&[0usize, 1, 100, 4096, 65_536, 1 << 20]);
            let data = rng.bytes(n);
            let path = format!("{dir}/data.bin");
            let stat = step(
                "stat",
                json!({"path": path}),
                Expect {
                    size: Some(n as u64),
                    exists: Some(true),
                    ..Expect::default()
                },
            );
            made(
                format!("write {n} random bytes, read them back, stat the size"),
                vec![write(&path, &data), read_back(&path, &data), stat],
            )
        }
        1 => {
            let depth = 1 + rng.below(12) as usize;
            let sub: Vec<String> = (0..depth).map(|i| format!("d{i}")).collect();
            let path = format!("{dir}/{}/leaf.txt", sub.join("/"));
            let text = format!("depth {depth}\n");
            made(
                format!("write a file {depth} directories deep and find it"),
                vec![
                    write(&path, text.as_bytes()),
                    exec(format!("find {dir} -type f | wc -l"), ok_stdout("1\n")),
                    step(
                        "list_dir",
                        json!({"path": dir, "recursive": true}),
                        Expect {
                            exists: Some(true),
                            ..Expect::default()
                        },
                    ),
                ],
            )
        }
        2 => {
            let chunks = 2 + rng.below(8) as usize;
            let path = format!("{dir}/log.txt");
            let mut all = Vec::new();
            let mut steps = Vec::new();
            for i in 0..chunks {
                let line = format!("entry {i} {}\n", rng.below(1_000_000));
                all.extend_from_slice(line.as_bytes());
                steps.push(step(
                    "write_file",
                    json!({"path": path, "text": line, "append": true}),
                    Expect {
                        size: Some(all.len() as u64),
                        ..Expect::default()
                    },
                ));
            }
            steps.push(read_back(&path, &all));
            made(
                format!("append {chunks} lines and read the whole file"),
                steps,
            )
        }
        _ => {
            let path = format!("{dir}/gone-{}.txt", rng.below(10_000));
            let n = 1 + rng.below(4096) as usize;
            let data = rng.bytes(n);
            made(
                format!(
                    "write {} bytes, delete with rm, and find the file absent",
                    data.len()
                ),
                vec![
                    write(&path, &data),
                    exec(format!("rm {path}"), exit(0)),
                    step(
                        "stat",
                        json!({"path": path}),
                        Expect {
                            is_error: true,
                            exists: Some(false),
                            ..Expect::default()
                        },
                    ),
                ],
            )
        }
    }
}

fn encoding(rng: &mut Rng, dir: &str) -> Made {
    match rng.below(4) {
        0 => {
            let n = *rng.pick(&[1usize, 255, 4096, 100_000, 1 << 20]) + rng.below(64) as usize;
            let (name, data) = pattern(rng, n);
            let path = format!("{dir}/{name}.bin");
            made(
                format!("round-trip {n} bytes of {name}"),
                vec![write(&path, &data), read_back(&path, &data)],
            )
        }
        1 => {
            let n = 1 + rng.below(2048) as usize;
            let (name, data) = pattern(rng, n);
            let escaped: String = data.iter().map(|b| format!("\\{b:03o}")).collect();
            let expect = Expect {
                exit_code: Some(0),
                stdout_base64: Some(base64_encode(&data)),
                ..Expect::default()
            };
            made(
                format!("exec prints {} bytes of {name} exactly", data.len()),
                vec![exec(format!("printf '{escaped}'"), expect)],
            )
        }
        2 => {
            let stem = *rng.pick(&["café", "日本語", "emoji-😀", "space name", "ünïcödé-ñ"]);
            let name = format!("{stem}-{}.txt", rng.below(10_000));
            let path = format!("{dir}/{name}");
            let text = format!("named {name}\n");
            made(
                format!("a file named {name}"),
                vec![
                    write(&path, text.as_bytes()),
                    read_back(&path, text.as_bytes()),
                ],
            )
        }
        _ => {
            let (w, h) = (1 + rng.below(64) as u32, 1 + rng.below(64) as u32);
            let png = png(w, h, rng.next_u64() as u8);
            let path = format!("{dir}/image.png");
            let check = code(
                "python",
                format!(
                    "d = open({path:?}, 'rb').read()\nprint(d[:8] == b'\\x89PNG\\r\\n\\x1a\\n', len(d))"
                ),
                ok_stdout(format!("True {}\n", png.len())),
            );
            made(
                format!("a {w}x{h} PNG survives the round trip"),
                vec![write(&path, &png), read_back(&path, &png), check],
            )
        }
    }
}

/// A valid PNG (RGB, stored deflate blocks): real bytes without a library.
pub fn png(width: u32, height: u32, seed: u8) -> Vec<u8> {
    let mut raw = Vec::new();
    for y in 0..height {
        raw.push(0); // filter: none
        for x in 0..width * 3 {
            raw.push(seed.wrapping_add((x * 7 + y * 3) as u8));
        }
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        z.extend_from_slice(&len.to_le_bytes());
        z.extend_from_slice(&(!len).to_le_bytes());
        z.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in &raw {
        a = (a + byte as u32) % 65_521;
        b = (b + a) % 65_521;
    }
    z.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [(&b"IHDR"[..], &ihdr[..]), (b"IDAT", &z), (b"IEND", &[])] {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn process(rng: &mut Rng, _dir: &str) -> Made {
    match rng.below(6) {
        4 => {
            let n = 30 + rng.below(30);
            let token = rng.below(1_000_000);
            made(
                format!("a pool of {n} concurrent processes ({token})"),
                vec![exec(
                    format!("for i in $(seq {n}); do sleep 0.5 & done; wait; echo {token}"),
                    ok_stdout(format!("{token}\n")),
                )],
            )
        }
        5 => {
            let token = rng.below(1_000_000);
            let (what, cmd) = *rng.pick(&[
                ("a private mount namespace", "unshare -m true"),
                ("a private UTS namespace", "unshare -u true"),
                (
                    "a tmpfs mount in a private namespace",
                    "unshare -m sh -c 'mount -t tmpfs none /mnt'",
                ),
            ]);
            made(
                format!("privileged: {what} ({token})"),
                vec![exec(
                    format!("{cmd} && echo {token}"),
                    ok_stdout(format!("{token}\n")),
                )],
            )
        }
        0 => {
            let k = rng.below(126) as i32;
            made(
                format!("a shell exits {k}"),
                vec![exec(format!("exit {k}"), exit(k))],
            )
        }
        1 => {
            let n = 1 + rng.below(16);
            let token = rng.below(1_000_000);
            made(
                format!("fork {n} children and wait for them ({token})"),
                vec![exec(
                    format!("for i in $(seq {n}); do (sleep 0.0$i) & done; wait; echo {token}"),
                    ok_stdout(format!("{token}\n")),
                )],
            )
        }
        2 => {
            let sig = *rng.pick(&["SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP"]);
            let n = rng.below(100_000);
            let expect = Expect {
                signal: Some(sig.into()),
                stdout_equals: Some(format!("{n}\n")),
                ..Expect::default()
            };
            made(
                format!("a process prints {n}, then is killed by its own {sig}"),
                vec![code(
                    "python",
                    format!(
                        "import os, signal, sys\nprint({n}); sys.stdout.flush()\nos.kill(os.getpid(), signal.{sig})"
                    ),
                    expect,
                )],
            )
        }
        _ => {
            let depth = 1 + rng.below(6) as usize;
            let token = rng.below(1_000_000);
            made(
                format!("exec through {depth} nested shells ({token})"),
                vec![exec(
                    nested_shells(depth, &format!("echo {token}")),
                    ok_stdout(format!("{token}\n")),
                )],
            )
        }
    }
}

/// `command` run through `depth` levels of `sh -c`, quoted at each level.
fn nested_shells(depth: usize, command: &str) -> String {
    (0..depth).fold(command.to_string(), |inner, _| {
        format!("sh -c '{}'", inner.replace('\'', "'\\''"))
    })
}

fn memory(rng: &mut Rng, _dir: &str) -> Made {
    let mib = 4 + rng.below(252);
    match rng.below(3) {
        2 => {
            let gib = 2 + rng.below(3);
            made(
                format!("reserve {gib} GiB of address space without touching it"),
                vec![code(
                    "python",
                    format!("import mmap\nm = mmap.mmap(-1, {gib} << 30)\nprint(len(m) >> 30)"),
                    ok_stdout(format!("{gib}\n")),
                )],
            )
        }
        0 => made(
            format!("allocate and touch {mib} MiB"),
            vec![code(
                "python",
                format!(
                    "b = bytearray({mib} << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ok', sum(b[::4096]))"
                ),
                ok_stdout(format!("ok {}\n", mib * 256)),
            )],
        ),
        _ => {
            let n = 10_000 * (1 + rng.below(50));
            made(
                format!("{n} small allocations"),
                vec![code(
                    "python",
                    format!("xs = [bytes(64) for _ in range({n})]\nprint(len(xs))"),
                    ok_stdout(format!("{n}\n")),
                )],
            )
        }
    }
}

fn persistence(rng: &mut Rng, dir: &str) -> Made {
    let n = 1 + rng.below(65_536) as usize;
    let data = rng.bytes(n);
    let path = format!("{dir}/state.bin");
    match rng.below(3) {
        0 => made(
            "write_file in one call, read_file in the next".into(),
            vec![write(&path, &data), read_back(&path, &data)],
        ),
        1 => {
            let token = rng.next_u64();
            let file = format!("{dir}/token.txt");
            made(
                "one exec writes, the next exec reads".into(),
                vec![
                    exec(format!("mkdir -p {dir} && echo {token} > {file}"), exit(0)),
                    exec(format!("cat {file}"), ok_stdout(format!("{token}\n"))),
                ],
            )
        }
        _ => {
            let expect = Expect {
                exit_code: Some(0),
                stdout_contains: Some(sha256_hex(&data)),
                ..Expect::default()
            };
            made(
                "a file written by write_file is seen by a later exec".into(),
                vec![
                    write(&path, &data),
                    exec(format!("sha256sum {path}"), expect),
                ],
            )
        }
    }
}

fn packages(rng: &mut Rng, dir: &str) -> Made {
    match rng.below(3) {
        0 => {
            let value = rng.below(1_000_000);
            let module = format!("mod_{}", rng.below(1000));
            let steps = vec![
                write(
                    &format!("{dir}/lib/{module}.py"),
                    format!("VALUE = {value}\n").as_bytes(),
                ),
                exec(
                    format!(
                        "PYTHONPATH={dir}/lib python3 -c 'import {module}; print({module}.VALUE)'"
                    ),
                    ok_stdout(format!("{value}\n")),
                ),
            ];
            made(
                format!("install a module into a path and import it ({module})"),
                steps,
            )
        }
        1 => {
            let (a, b) = (rng.below(10_000), rng.below(10_000));
            let src = format!(
                "#include <stdio.h>\nint main(void) {{ printf(\"%d\\n\", {a} + {b}); return 0; }}\n"
            );
            let mut m = made(
                format!("compile a C program into a directory and run it ({a}+{b})"),
                vec![
                    write(&format!("{dir}/src/main.c"), src.as_bytes()),
                    exec(
                        format!(
                            "mkdir -p {dir}/bin && gcc -O1 -o {dir}/bin/sum {dir}/src/main.c && {dir}/bin/sum"
                        ),
                        ok_stdout(format!("{}\n", a + b)),
                    ),
                ],
            );
            m.requires.push("gcc".into());
            m
        }
        _ => {
            let tool = *rng.pick(&["sh", "python3", "sha256sum", "tar", "gzip", "find"]);
            let token = rng.below(1_000_000);
            made(
                format!("`{tool}` is on PATH ({token})"),
                vec![exec(
                    format!("command -v {tool} >/dev/null && echo {token}"),
                    ok_stdout(format!("{token}\n")),
                )],
            )
        }
    }
}

fn network(rng: &mut Rng, _dir: &str) -> Made {
    match rng.below(9) {
        0 | 1 => {
            let n = *rng.pick(&[1usize, 100, 65_536, 1 << 20]);
            let script = format!(
                "import socket, threading, hashlib\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
                 def serve():\n    c, _ = s.accept(); d = b''\n    while len(d) < {n}: d += c.recv(65536)\n    c.sendall(hashlib.sha256(d).hexdigest().encode()); c.close()\n\
                 threading.Thread(target=serve).start()\nc = socket.create_connection(s.getsockname()); c.sendall(bytes(i % 251 for i in range({n})))\n\
                 print(c.recv(64).decode())"
            );
            let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            made(
                format!("loopback TCP: send {n} bytes, get their sha256"),
                vec![code(
                    "python",
                    script,
                    ok_stdout(format!("{}\n", sha256_hex(&data))),
                )],
            )
        }
        2 => {
            let n = 1 + rng.below(1000);
            let script = format!(
                "import socket\na = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(('127.0.0.1', 0))\n\
                 b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.sendto(b'x' * {n}, a.getsockname())\nprint(len(a.recv(65536)))"
            );
            made(
                format!("loopback UDP datagram of {n} bytes"),
                vec![code("python", script, ok_stdout(format!("{n}\n")))],
            )
        }
        3 => {
            let n = 1 + rng.below(1 << 20);
            let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
            let script = format!(
                "import hashlib, http.server, threading, urllib.request\nbody = bytes(i % 253 for i in range({n}))\n\
                 class H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n    def log_message(self, *a): pass\n\
                 srv = http.server.HTTPServer(('127.0.0.1', 0), H)\nthreading.Thread(target=srv.serve_forever, daemon=True).start()\n\
                 r = urllib.request.urlopen(f'http://127.0.0.1:{{srv.server_address[1]}}/')\nprint(r.status, hashlib.sha256(r.read()).hexdigest())"
            );
            made(
                format!("download {n} bytes from an HTTP server on loopback"),
                vec![code(
                    "python",
                    script,
                    ok_stdout(format!("200 {}\n", sha256_hex(&data))),
                )],
            )
        }
        4 | 5 => {
            let n = *rng.pick(&[1usize, 1000, 65_536, 1 << 20, 4 << 20]) + rng.below(100) as usize;
            let seed = rng.below(256) as u8;
            let sha = sha256_hex(&upstream::bytes_body(n, seed));
            made(
                format!("download {n} bytes from the upstream over HTTP"),
                vec![code(
                    "python",
                    format!(
                        "import hashlib, urllib.request\n\
                         r = urllib.request.urlopen('{{{{upstream.http}}}}/bytes/{n}?seed={seed}', timeout=10)\n\
                         print(r.status, hashlib.sha256(r.read()).hexdigest())"
                    ),
                    ok_stdout(format!("200 {sha}\n")),
                )],
            )
        }
        6 => {
            let k = rng.below(10_000);
            let (what, script, want) = match rng.below(3) {
                0 => {
                    let n = 1 + rng.below(100_000) as usize;
                    (
                        format!("follow a redirect to {n} bytes"),
                        format!(
                            "import hashlib, urllib.request\n\
                             r = urllib.request.urlopen('{{{{upstream.http}}}}/redirect/{n}?seed=7', timeout=10)\n\
                             print(r.status, r.url.split('/', 3)[3], hashlib.sha256(r.read()).hexdigest())"
                        ),
                        format!(
                            "200 bytes/{n}?seed=7 {}\n",
                            sha256_hex(&upstream::bytes_body(n, 7))
                        ),
                    )
                }
                1 => (
                    format!("a missing page is a 404 ({k})"),
                    format!(
                        "import urllib.request, urllib.error\n\
                         try:\n    urllib.request.urlopen('{{{{upstream.http}}}}/missing/{k}', timeout=10); print('found')\n\
                         except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode().strip())"
                    ),
                    "404 not found\n".to_string(),
                ),
                _ => {
                    let ms = 100 + rng.below(1400);
                    (
                        format!("a slow response ({ms} ms) within the client's timeout"),
                        format!(
                            "import urllib.request\n\
                             print(urllib.request.urlopen('{{{{upstream.http}}}}/slow/{ms}', timeout=10).read().decode(), end='')"
                        ),
                        format!("slow {ms}\n"),
                    )
                }
            };
            made(what, vec![code("python", script, ok_stdout(want))])
        }
        7 => {
            let n = 1 + rng.below(1 << 20) as usize;
            let seed = rng.below(256);
            made(
                format!("{n} bytes through the upstream's TCP echo"),
                vec![code(
                    "python",
                    format!(
                        "import socket\n\
                         data = bytes((i * 7 + {seed}) % 256 for i in range({n}))\n\
                         c = socket.create_connection(('{{{{upstream.host}}}}', {{{{upstream.echo_port}}}}), timeout=10)\n\
                         c.sendall(data); c.shutdown(socket.SHUT_WR)\n\
                         got = bytearray()\n\
                         while True:\n    b = c.recv(65536)\n    if not b: break\n    got += b\n\
                         print(len(got), bytes(got) == data)"
                    ),
                    ok_stdout(format!("{n} True\n")),
                )],
            )
        }
        _ => {
            let k = rng.below(256);
            let page = rng.below(10_000);
            made(
                format!("resolve names with the upstream's DNS, then fetch page {page} by name"),
                vec![code(
                    "python",
                    format!(
                        "import socket, struct, urllib.request\n\
                         def resolve(name):\n    \
                             q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\\0' + struct.pack('>HH', 1, 1)\n    \
                             s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)\n    \
                             s.connect(('{{{{upstream.host}}}}', {{{{upstream.dns_port}}}})); s.send(q)\n    \
                             r = s.recv(512)\n    \
                             return 'NXDOMAIN' if r[3] & 15 == 3 else socket.inet_ntoa(r[-4:])\n\
                         ip = resolve('www.campaign.test')\n\
                         print(ip, resolve('n{k}.campaign.test'), resolve('nowhere-{page}.campaign.test'))\n\
                         html = urllib.request.urlopen(f'http://{{ip}}:{{{{upstream.http_port}}}}/page/{page}', timeout=10).read().decode()\n\
                         print(html[html.index('<title>') + 7:html.index('</title>')])"
                    ),
                    ok_stdout(format!(
                        "{{{{upstream.host}}}} 127.66.1.{k} NXDOMAIN\npage {page}\n"
                    )),
                )],
            )
        }
    }
}

fn compute(rng: &mut Rng, _dir: &str) -> Made {
    match rng.below(5) {
        3 => {
            let ms = 2000 + rng.below(1000);
            made(
                format!("CPU-bound loop for {ms} ms of CPU time"),
                vec![code(
                    "python",
                    format!(
                        "import time\nt = time.process_time()\nn = 0\nwhile time.process_time() - t < {ms} / 1000: n += 1\nprint('done')"
                    ),
                    ok_stdout("done\n"),
                )],
            )
        }
        0 => {
            let n = 1_000 * (1 + rng.below(5_000));
            made(
                format!("sum of range({n})"),
                vec![code(
                    "python",
                    format!("print(sum(range({n})))"),
                    ok_stdout(format!("{}\n", n * (n - 1) / 2)),
                )],
            )
        }
        1 => {
            let workers = 2 + rng.below(3);
            let n = 100 + rng.below(1000);
            let total: u64 = (0..n).map(|i| i * i).sum();
            let script = format!(
                "from multiprocessing import Pool\ndef sq(x): return x * x\nif __name__ == '__main__':\n    with Pool({workers}) as p: print(sum(p.map(sq, range({n}))))"
            );
            made(
                format!("multiprocessing pool of {workers} squares {n} numbers"),
                vec![code("python", script, ok_stdout(format!("{total}\n")))],
            )
        }
        _ => {
            let mib = 1 + rng.below(32);
            let expect = Expect {
                exit_code: Some(0),
                stdout_contains: Some(sha256_hex(&vec![0u8; (mib as usize) << 20])),
                ..Expect::default()
            };
            made(
                format!("sha256 of {mib} MiB of zeros"),
                vec![exec(
                    format!("head -c {mib}M /dev/zero | sha256sum"),
                    expect,
                )],
            )
        }
    }
}

fn documents(rng: &mut Rng, dir: &str) -> Made {
    match rng.below(5) {
        4 => {
            let (tz, offset) = *rng.pick(&[
                ("Europe/Paris", "1:00:00"),
                ("Asia/Tokyo", "9:00:00"),
                ("America/New_York", "-1 day, 19:00:00"),
                ("Australia/Sydney", "11:00:00"),
            ]);
            let day = 10 + rng.below(15);
            made(
                format!("stamp a report with a {tz} time (timezone data) on January {day}"),
                vec![code(
                    "python",
                    format!(
                        "from datetime import datetime\nfrom zoneinfo import ZoneInfo\nprint(datetime(2024, 1, {day}, 12, tzinfo=ZoneInfo({tz:?})).utcoffset())"
                    ),
                    ok_stdout(format!("{offset}\n")),
                )],
            )
        }
        0 => {
            let rows = 1 + rng.below(500);
            let expected: String = (0..rows).map(|i| format!("{i},{}\r\n", i * i)).collect();
            let path = format!("{dir}/table.csv");
            made(
                format!("generate a CSV of {rows} rows and download it"),
                vec![
                    code(
                        "python",
                        format!(
                            "import csv, os\nos.makedirs({dir:?}, exist_ok=True)\nw = csv.writer(open({path:?}, 'w', newline=''))\nfor i in range({rows}): w.writerow([i, i * i])"
                        ),
                        exit(0),
                    ),
                    read_back(&path, expected.as_bytes()),
                ],
            )
        }
        1 => {
            let files = 1 + rng.below(20);
            let path = format!("{dir}/bundle.zip");
            made(
                format!("build a ZIP of {files} files and check its magic bytes"),
                vec![code(
                    "python",
                    format!(
                        "import zipfile, os\nos.makedirs({dir:?}, exist_ok=True)\nwith zipfile.ZipFile({path:?}, 'w') as z:\n    for i in range({files}): z.writestr(f'f{{i}}.txt', 'x' * i)\nprint(open({path:?}, 'rb').read(4) == b'PK\\x03\\x04', len(zipfile.ZipFile({path:?}).namelist()))"
                    ),
                    ok_stdout(format!("True {files}\n")),
                )],
            )
        }
        2 => {
            let text = format!("Report {}", rng.below(100_000));
            let pdf = minimal_pdf(&text);
            let path = format!("{dir}/report.pdf");
            made(
                "a PDF round-trips and keeps its magic".into(),
                vec![
                    write(&path, &pdf),
                    read_back(&path, &pdf),
                    exec(format!("head -c 5 {path}"), ok_stdout("%PDF-")),
                ],
            )
        }
        _ => {
            let (w, h) = (8 + rng.below(200) as u32, 8 + rng.below(200) as u32);
            let png = png(w, h, rng.next_u64() as u8);
            let path = format!("{dir}/chart.png");
            made(
                format!("a {w}x{h} PNG chart is downloaded exactly"),
                vec![write(&path, &png), read_back(&path, &png)],
            )
        }
    }
}

fn minimal_pdf(text: &str) -> Vec<u8> {
    let content = format!("BT /F1 12 Tf 72 720 Td ({text}) Tj ET");
    format!(
        "%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >> endobj\n\
         3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >> endobj\n\
         4 0 obj << /Length {} >> stream\n{content}\nendstream endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n",
        content.len()
    )
    .into_bytes()
}

/// Chromium as agents run it: headless, no sandbox of its own (the bridge's
/// profile is the sandbox), nothing of Google's: no background networking,
/// and every host name but the upstream's maps to NOTFOUND, so the browser
/// sends no packet off this machine.
const CHROMIUM: &str = "chromium --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-default-apps --disable-domain-reliability --no-pings --disable-breakpad \
    --host-resolver-rules='MAP * ~NOTFOUND, EXCLUDE {{upstream.host}}'";

/// Steps every test starts with (emptying its directory): indices of a
/// test's own steps are offset by this much.
const SETUP_STEPS: usize = 1;

/// A browser step: slow on a loaded machine, never slower than `max_ms`
/// when the sandbox is healthy (past it the test is `degraded`), killed at
/// twice that (a browser whose renderer died waits for it forever).
fn browser_step(command: String, mut expect: Expect, max_ms: u64) -> Step {
    expect.max_duration_ms = Some(max_ms);
    step(
        "exec",
        json!({"command": command, "timeout_ms": 2 * max_ms}),
        expect,
    )
}

fn contains(text: impl Into<String>) -> Expect {
    Expect {
        exit_code: Some(0),
        stdout_contains: Some(text.into()),
        ..Expect::default()
    }
}

/// A read_file of a file the workload made, checked against the sha256 the
/// workload printed at `hashed_at` (an index among the test's own steps).
fn read_made(path: &str, hashed_at: usize, mut expect: Expect) -> Step {
    expect.sha256_from_step = Some(hashed_at + SETUP_STEPS);
    step("read_file", json!({"path": path}), expect)
}

fn browser(rng: &mut Rng, dir: &str) -> Made {
    let chromium = format!("{CHROMIUM} --user-data-dir={dir}/profile");
    let n = rng.below(1_000_000);
    let mut m = match rng.below(8) {
        0 => made(
            format!("load page {n} from the upstream over HTTP and dump its DOM"),
            vec![browser_step(
                format!("{chromium} --dump-dom '{{{{upstream.http}}}}/page/{n}'"),
                contains(format!("<h1>page {n}</h1>")),
                30_000,
            )],
        ),
        1 => {
            let (w, h) = *rng.pick(&[(320u32, 240u32), (640, 480), (800, 600), (1024, 768)]);
            let shot = format!("{dir}/shot.png");
            made(
                format!("screenshot a {w}x{h} canvas page ({n}), hash it, read the PNG back"),
                vec![
                    browser_step(
                        format!(
                            "mkdir -p {dir} && {chromium} --screenshot={shot} --window-size={w},{h} '{{{{upstream.http}}}}/canvas/{n}?w={w}&h={h}' && \
                             python3 -c \"import struct; d = open('{shot}', 'rb').read(); print(d[:8] == b'\\x89PNG\\r\\n\\x1a\\n' and 'png', *struct.unpack('>II', d[16:24]))\""
                        ),
                        ok_stdout(format!("png {w} {h}\n")),
                        30_000,
                    ),
                    exec(format!("sha256sum {shot}"), exit(0)),
                    read_made(
                        &shot,
                        1,
                        Expect {
                            png: Some(ImageSize {
                                width: w,
                                height: h,
                            }),
                            ..Expect::default()
                        },
                    ),
                ],
            )
        }
        2 => {
            let pages = 1 + rng.below(5) as u32;
            let pdf = format!("{dir}/report.pdf");
            made(
                format!("print a {pages}-page report ({n}) to PDF and read it back"),
                vec![
                    browser_step(
                        format!(
                            "mkdir -p {dir} && {chromium} --print-to-pdf={pdf} --no-pdf-header-footer '{{{{upstream.http}}}}/report/{n}?pages={pages}' && \
                             python3 -c \"d = open('{pdf}', 'rb').read(); print(d[:5].decode(), d.count(b'/Type /Page') - d.count(b'/Type /Pages'))\""
                        ),
                        ok_stdout(format!("%PDF- {pages}\n")),
                        30_000,
                    ),
                    exec(format!("sha256sum {pdf}"), exit(0)),
                    read_made(
                        &pdf,
                        1,
                        Expect {
                            pdf_pages: Some(pages),
                            ..Expect::default()
                        },
                    ),
                ],
            )
        }
        3 => {
            let k = 1_000 + rng.below(100_000);
            let sum: u64 = (1..=k).map(|i| i * i).sum();
            // no double quotes: Chromium's command line drops a data: URL with them
            made(
                format!("run JavaScript: the sum of squares to {k}"),
                vec![browser_step(
                    format!(
                        "{chromium} --dump-dom 'data:text/html,<p id=o>waiting</p><script>let s = 0; for (let i = 1; i <= {k}; i++) s += i * i; document.getElementById(`o`).textContent = `result=` + s;</script>'"
                    ),
                    contains(format!("result={sum}<")),
                    30_000,
                )],
            )
        }
        4 => {
            let tabs = 4 + rng.below(29);
            let mib = *rng.pick(&[4u64, 8, 16]);
            made(
                format!("open {tabs} tabs at once, {mib} MiB each ({n})"),
                vec![browser_step(
                    format!(
                        "{chromium} --virtual-time-budget=30000 --dump-dom '{{{{upstream.http}}}}/tabs/{tabs}?mib={mib}&n={n}'"
                    ),
                    contains(format!("frames loaded {tabs}")),
                    30_000,
                )],
            )
        }
        5 => {
            let count = 2 + rng.below(4);
            let first = n % 10_000;
            let expected: String = (first..first + count)
                .map(|p| {
                    format!(
                        "page {p}: {} words, {} links\n",
                        upstream::page_words(p).len(),
                        upstream::page_links(p)
                    )
                })
                .collect();
            let script = format!(
                "import html.parser, subprocess\n\
                 class Summary(html.parser.HTMLParser):\n    \
                     def __init__(self):\n        super().__init__(); self.title = ''; self.words = 0; self.links = 0; self.tag = None\n    \
                     def handle_starttag(self, tag, attrs):\n        self.tag = tag\n        if tag == 'a': self.links += 1\n    \
                     def handle_data(self, data):\n        if self.tag == 'title': self.title += data\n        elif self.tag == 'p': self.words += len(data.split())\n\
                 for p in range({first}, {}):\n    \
                     dom = subprocess.run({chromium:?} + ' --dump-dom {{{{upstream.http}}}}/page/%d' % p, shell=True, capture_output=True, check=True).stdout.decode()\n    \
                     s = Summary(); s.feed(dom)\n    \
                     print(f'{{s.title}}: {{s.words}} words, {{s.links}} links')\n",
                first + count
            );
            let mut steps = vec![code("python", script, ok_stdout(expected))];
            steps[0].expect.max_duration_ms = Some(60_000);
            made(
                format!("scrape and summarize {count} pages from page {first}"),
                steps,
            )
        }
        6 => {
            let size =
                *rng.pick(&[1usize << 10, 100_000, 1 << 20, 3 << 20]) + rng.below(1000) as usize;
            let seed = rng.below(256) as u8;
            let sha = sha256_hex(&upstream::bytes_body(size, seed));
            made(
                format!("the browser downloads {size} bytes and checks their sha256"),
                vec![browser_step(
                    format!(
                        "{chromium} --virtual-time-budget=20000 --dump-dom '{{{{upstream.http}}}}/fetch/{size}?seed={seed}'"
                    ),
                    contains(format!("sha256={sha} bytes={size}<")),
                    30_000,
                )],
            )
        }
        _ => {
            let user = format!("user-{}", n % 10_000);
            made(
                format!(
                    "fill a login form as {user}, keep the session cookie, open the account page"
                ),
                vec![browser_step(
                    format!(
                        "{chromium} --virtual-time-budget=20000 --dump-dom '{{{{upstream.http}}}}/login-form?user={user}'"
                    ),
                    contains(format!(
                        "welcome {user} | cookie session={}<",
                        upstream::session_cookie(&user)
                    )),
                    30_000,
                )],
            )
        }
    };
    m.requires.push("chromium".into());
    m
}

/// `count` tests spread evenly over the domains, deterministically from `seed`.
/// Where generated tests keep their files by default (`ID/` below it).
pub const DEFAULT_BASE: &str = "/tmp/campaign";

/// `count` tests from `seed`; each works in `BASE/ID`.
pub fn suite(count: usize, seed: u64, base: &str) -> Vec<TestSpec> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|i| {
            let domain = DOMAINS[i % DOMAINS.len()];
            let id = format!("{domain}-{:04}", i / DOMAINS.len() + 1);
            let dir = format!("{}/{id}", base.trim_end_matches('/'));
            let m = match domain {
                "files" => files(&mut rng, &dir),
                "encoding" => encoding(&mut rng, &dir),
                "process" => process(&mut rng, &dir),
                "memory" => memory(&mut rng, &dir),
                "persistence" => persistence(&mut rng, &dir),
                "packages" => packages(&mut rng, &dir),
                "network" => network(&mut rng, &dir),
                "compute" => compute(&mut rng, &dir),
                "documents" => documents(&mut rng, &dir),
                _ => browser(&mut rng, &dir),
            };
            // every test starts from an empty directory of its own, so a
            // rerun (or --resume) finds no leftovers of an earlier run
            let mut steps = vec![exec(format!("rm -rf {dir} && mkdir -p {dir}"), exit(0))];
            steps.extend(m.steps);
            TestSpec {
                id,
                domain: domain.into(),
                title: m.title,
                requires: m.requires,
                steps,
            }
        })
        .collect()
}

/// A browser step of the vocabulary (docs/ADAPTERS.md), answered by a
/// browser MCP server through its adapter.
fn browse(tool: &str, arguments: Value, expect: Expect) -> Step {
    let arguments = match arguments {
        Value::Object(m) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    Step {
        tool: tool.into(),
        arguments,
        expect,
    }
}

/// The browser as agents drive it, in the browser vocabulary: pages of the
/// local upstream opened, read, scripted, captured (PNG and JPEG), filled and
/// clicked, tabs opened and closed, printed to PDF, a file downloaded, and
/// tab-heavy pages (`heavy_mib` MiB per frame, 8
/// frames) that a memory limit takes tabs from. `count` tests, ids
/// `browser-tools-NNNN`, from `seed`; they need no files and no commands,
/// so a browser server with nothing else runs every one it can express.
pub fn browser_tools_suite(count: usize, seed: u64, heavy_mib: u64) -> Vec<TestSpec> {
    let mut rng = Rng::new(seed);
    let page = |n: u64| format!("{{{{upstream.http}}}}/page/{n}");
    (0..count)
        .map(|i| {
            let n = rng.below(900) + 1;
            let (title, steps) = match i % 8 {
                0 => {
                    let words = crate::upstream::page_words(n)[..3].join(" ");
                    (
                        format!("open page {n}: its title and text"),
                        vec![browse(
                            "browser_open",
                            json!({"url": page(n)}),
                            Expect {
                                title: Some(format!("page {n}")),
                                text_contains: Some(words),
                                ..Expect::default()
                            },
                        )],
                    )
                }
                1 => (
                    format!("a script in page {n} counts its links"),
                    vec![
                        browse("browser_open", json!({"url": page(n)}), Expect::default()),
                        browse(
                            "browser_eval",
                            json!({"script": "() => document.querySelectorAll('a').length"}),
                            Expect {
                                value_json: Some(json!(crate::upstream::page_links(n))),
                                ..Expect::default()
                            },
                        ),
                    ],
                ),
                2 => {
                    // every other one a JPEG: the size is in its frame header
                    let size = Some(ImageSize {
                        width: 1280,
                        height: 720,
                    });
                    let (format, expect) = match (i / 8) % 2 {
                        0 => ("png", Expect { png: size, ..Expect::default() }),
                        _ => ("jpeg", Expect { jpeg: size, ..Expect::default() }),
                    };
                    (
                        format!("a 1280x720 {format} screenshot of a page with canvas {n}"),
                        vec![
                            browse(
                                "browser_open",
                                // noise on a quarter of the window: a PNG of about 0.7 MB
                                json!({"url": format!("{{{{upstream.http}}}}/canvas/{n}?w=640&h=360")}),
                                Expect::default(),
                            ),
                            browse("browser_screenshot", json!({"format": format}), expect),
                        ],
                    )
                }
                3 => {
                    let name = format!("agent-{n}");
                    (
                        format!("fill and submit form {n}"),
                        vec![
                            browse(
                                "browser_open",
                                json!({"url": format!("{{{{upstream.http}}}}/form/{n}")}),
                                Expect::default(),
                            ),
                            browse(
                                "browser_fill",
                                json!({"selector": "#name", "text": name}),
                                Expect::default(),
                            ),
                            browse("browser_click", json!({"selector": "#go"}), Expect::default()),
                            browse(
                                "browser_text",
                                json!({}),
                                Expect {
                                    text_contains: Some(format!("hello {name}")),
                                    ..Expect::default()
                                },
                            ),
                        ],
                    )
                }
                4 => {
                    let other = n + 1000;
                    let listed = |has: bool| Expect {
                        text_contains: has.then(|| format!("/page/{other}")),
                        text_lacks: (!has).then(|| format!("/page/{other}")),
                        ..Expect::default()
                    };
                    (
                        format!("open page {other} in a second tab, list the tabs, close it"),
                        vec![
                            browse("browser_open", json!({"url": page(n)}), Expect::default()),
                            browse("browser_new_tab", json!({"url": page(other)}), Expect::default()),
                            browse("browser_tabs", json!({}), listed(true)),
                            browse("browser_close_tab", json!({"index": 1}), Expect::default()),
                            browse("browser_tabs", json!({}), listed(false)),
                        ],
                    )
                }
                6 => {
                    let pages = 1 + n % 3;
                    (
                        format!("report {n} of {pages} pages printed to PDF"),
                        vec![
                            browse(
                                "browser_open",
                                json!({"url": format!("{{{{upstream.http}}}}/report/{n}?pages={pages}")}),
                                Expect::default(),
                            ),
                            browse(
                                "browser_pdf",
                                json!({}),
                                Expect {
                                    pdf_pages: Some(pages as u32),
                                    ..Expect::default()
                                },
                            ),
                        ],
                    )
                }
                7 => {
                    let file = crate::upstream::FileLink::of(n);
                    (
                        format!("download {} from files page {n}", file.name()),
                        vec![
                            browse(
                                "browser_open",
                                json!({"url": format!("{{{{upstream.http}}}}/files/{n}")}),
                                Expect::default(),
                            ),
                            browse(
                                "browser_download",
                                json!({"selector": "#dl"}),
                                Expect {
                                    sha256: Some(sha256_hex(&file.bytes())),
                                    size: Some(file.size as u64),
                                    ..Expect::default()
                                },
                            ),
                        ],
                    )
                }
                _ => {
                    let frames = 8;
                    (
                        format!("a page of {frames} frames of {heavy_mib} MiB each"),
                        vec![
                            browse(
                                "browser_open",
                                json!({"url": format!("{{{{upstream.http}}}}/tabs/{frames}?mib={heavy_mib}")}),
                                Expect::default(),
                            ),
                            browse(
                                "browser_eval",
                                json!({"script": "() => new Promise(r => { const o = document.getElementById('o'); const done = () => o.textContent.startsWith('frames loaded'); if (done()) return r(o.textContent); new MutationObserver(() => done() && r(o.textContent)).observe(o, {childList: true}); setTimeout(() => r(o.textContent), 45000); })"}),
                                Expect {
                                    value_json: Some(json!(format!("frames loaded {frames}"))),
                                    ..Expect::default()
                                },
                            ),
                        ],
                    )
                }
            };
            TestSpec {
                id: format!("browser-tools-{:04}", i + 1),
                domain: "browser".into(),
                title,
                requires: vec!["a browser MCP server".into()],
                steps,
            }
        })
        .collect()
}

/// Writes `tests` as `DIR/ID.json`, pretty-printed with a trailing newline.
pub fn write_suite(dir: &std::path::Path, tests: &[TestSpec]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for t in tests {
        let mut text = serde_json::to_string_pretty(t).expect("a test is JSON");
        text.push('\n');
        std::fs::write(dir.join(format!("{}.json", t.id)), text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_same_seed_gives_the_same_suite_and_another_differs() {
        let a = suite(200, 7, DEFAULT_BASE);
        assert_eq!(a, suite(200, 7, DEFAULT_BASE));
        assert_ne!(a, suite(200, 8, DEFAULT_BASE));
    }

    #[test]
    fn a_thousand_tests_cover_every_domain_and_all_validate() {
        let tests = suite(1000, 1, DEFAULT_BASE);
        assert_eq!(tests.len(), 1000);
        for d in DOMAINS {
            assert_eq!(tests.iter().filter(|t| t.domain == d).count(), 100, "{d}");
        }
        let ids: HashSet<&str> = tests.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids.len(), 1000);
        // written to disk, every file loads and passes validation
        let dir = tempfile::tempdir().unwrap();
        write_suite(dir.path(), &tests).unwrap();
        let mut loaded = super::super::validate::load_dir(dir.path()).unwrap();
        assert_eq!(loaded.problems, vec![], "generated tests must validate");
        loaded.tests.sort_by(|a, b| a.id.cmp(&b.id));
        let mut tests = tests;
        tests.sort_by(|a, b| a.id.cmp(&b.id));
        assert!(
            loaded.tests == tests,
            "the files do not read back as written"
        );
    }

    #[test]
    fn browser_tools_tests_use_only_browser_steps_reach_only_the_upstream_and_validate() {
        let tests = browser_tools_suite(24, 5, 16);
        assert_eq!(tests, browser_tools_suite(24, 5, 16));
        let dir = tempfile::tempdir().unwrap();
        write_suite(dir.path(), &tests).unwrap();
        let loaded = super::super::validate::load_dir(dir.path()).unwrap();
        assert_eq!(
            loaded.problems,
            vec![],
            "generated browser tests must validate"
        );
        assert_eq!(
            loaded.egress_problems(&[]),
            vec![],
            "only the upstream is named"
        );
        let tools: HashSet<&str> = tests
            .iter()
            .flat_map(|t| t.steps.iter().map(|s| s.tool.as_str()))
            .collect();
        // every step of the browser vocabulary is exercised, and nothing else
        let browser: HashSet<&str> = super::super::adapter::STEPS
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| n.starts_with("browser_"))
            .collect();
        assert_eq!(tools, browser);
        let shots: Vec<&Expect> = tests
            .iter()
            .flat_map(|t| &t.steps)
            .filter(|s| s.tool == "browser_screenshot")
            .map(|s| &s.expect)
            .collect();
        assert!(shots.iter().any(|e| e.png.is_some()) && shots.iter().any(|e| e.jpeg.is_some()));
        let download = tests
            .iter()
            .flat_map(|t| &t.steps)
            .find(|s| s.tool == "browser_download")
            .unwrap();
        assert!(download.expect.sha256.is_some() && download.expect.size.is_some());
        let heavy = tests
            .iter()
            .find(|t| t.title.contains("frames of 16 MiB"))
            .unwrap();
        assert!(
            heavy.steps[0].arguments["url"]
                .as_str()
                .unwrap()
                .ends_with("/tabs/8?mib=16")
        );
    }

    #[test]
    fn variety_comes_from_parameters() {
        let tests = suite(1000, 3, DEFAULT_BASE);
        let distinct: HashSet<String> = tests
            .iter()
            .map(|t| serde_json::to_string(&t.steps).unwrap())
            .collect();
        assert!(
            distinct.len() >= 900,
            "only {} distinct step lists in 1000 tests",
            distinct.len()
        );
        for d in DOMAINS {
            let kinds: HashSet<String> = tests
                .iter()
                .filter(|t| t.domain == d)
                .map(|t| {
                    t.title
                        .split(|c: char| c.is_ascii_digit())
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .collect();
            assert!(kinds.len() >= 2, "{d} has one kind of test: {kinds:?}");
        }
    }

    #[test]
    fn no_seed_names_a_host_off_this_machine() {
        for seed in [1, 2, 42, 123_456_789] {
            for t in suite(1000, seed, DEFAULT_BASE) {
                let named = super::super::egress::named_hosts(&t, &[]);
                assert!(named.is_empty(), "seed {seed}: {}: {named:?}", t.id);
                for step in &t.steps {
                    let text = serde_json::to_string(&step.arguments).unwrap();
                    let unknown = upstream::unknown_placeholders(&text);
                    assert!(unknown.is_empty(), "seed {seed}: {}: {unknown:?}", t.id);
                }
            }
        }
        // and the detector is not blind: the old suite's egress test is caught
        let old = r#"import socket\nsocket.create_connection(('192.0.2.107', 80), timeout=3)"#;
        assert_eq!(super::super::egress::hosts_in(old), vec!["192.0.2.107"]);
    }

    #[test]
    fn network_and_browser_tests_reach_the_upstream_by_placeholder() {
        let tests = suite(1000, 1, DEFAULT_BASE);
        for domain in ["network", "browser"] {
            let reaching = tests
                .iter()
                .filter(|t| t.domain == domain)
                .filter(|t| {
                    serde_json::to_string(&t.steps)
                        .unwrap()
                        .contains("{{upstream.")
                })
                .count();
            assert!(
                reaching >= 40,
                "{domain}: only {reaching} tests use the upstream"
            );
        }
    }

    #[test]
    fn nested_shells_quote_each_level() {
        for depth in 1..=6 {
            let cmd = nested_shells(depth, "echo 'a b'");
            let out = std::process::Command::new("sh")
                .args(["-c", &cmd])
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "a b\n",
                "depth {depth}: {cmd}"
            );
        }
    }

    #[test]
    fn the_png_is_a_real_png() {
        let png = png(5, 3, 9);
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys, zlib, struct\nd = sys.stdin.buffer.read()\nassert d[:8] == b'\\x89PNG\\r\\n\\x1a\\n'\npos, raw = 8, b''\nwhile pos < len(d):\n    n, = struct.unpack('>I', d[pos:pos+4]); t = d[pos+4:pos+8]; body = d[pos+8:pos+8+n]\n    assert zlib.crc32(t + body) == struct.unpack('>I', d[pos+8+n:pos+12+n])[0], t\n    if t == b'IDAT': raw += body\n    pos += 12 + n\nprint(len(zlib.decompress(raw)))"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin.take().unwrap().write_all(&png)?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            (3 * (1 + 5 * 3)).to_string()
        );
    }
}
