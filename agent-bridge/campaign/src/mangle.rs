//! How bytes that came back differ from the bytes sent, named the way a
//! person debugging an MCP server would say it: "lossy UTF-8 decode",
//! "cut at the first NUL", "CRLF became LF", "cut after 65,536 bytes",
//! "a prefix was added". Servers we did not write mangle bytes in ways our
//! own injected faults do not, and often in two ways at once (a text tool
//! decodes lossily *and* adds a line of its own), so single transforms are
//! tried first, then pairs, then truncation and added text.

/// One way bytes get mangled: a short stable name (`kind`, what `campaign
/// shrink` keeps constant while it minimizes) and a sentence.
#[derive(Debug, Clone, PartialEq)]
pub struct Mangle {
    pub kind: String,
    pub description: String,
}

type Transform = fn(&[u8]) -> Vec<u8>;

/// Transforms seen in real text-oriented transports, with their names.
const TRANSFORMS: [(&str, &str, Transform); 8] = [
    (
        "lossy-utf8",
        "lossy UTF-8 decode: invalid sequences became U+FFFD",
        lossy_utf8,
    ),
    ("cut-at-nul", "cut at the first NUL byte", cut_at_nul),
    ("nul-dropped", "NUL bytes dropped", |b| without(b, b'\0')),
    ("crlf-to-lf", "CRLF became LF", crlf_to_lf),
    ("cr-dropped", "every CR dropped, a lone CR too", |b| {
        without(b, b'\r')
    }),
    ("cr-to-lf", "every CR became LF", |b| {
        let lf = crlf_to_lf(b);
        lf.iter()
            .map(|&c| if c == b'\r' { b'\n' } else { c })
            .collect()
    }),
    ("lf-to-crlf", "LF became CRLF", lf_to_crlf),
    (
        "trimmed",
        "trailing whitespace and newlines trimmed",
        trim_end,
    ),
];

fn lossy_utf8(b: &[u8]) -> Vec<u8> {
    String::from_utf8_lossy(b).into_owned().into_bytes()
}

fn cut_at_nul(b: &[u8]) -> Vec<u8> {
    b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())].to_vec()
}

fn without(b: &[u8], byte: u8) -> Vec<u8> {
    b.iter().copied().filter(|&c| c != byte).collect()
}

fn crlf_to_lf(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    for (i, &c) in b.iter().enumerate() {
        if !(c == b'\r' && b.get(i + 1) == Some(&b'\n')) {
            out.push(c);
        }
    }
    out
}

fn lf_to_crlf(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    for (i, &c) in b.iter().enumerate() {
        if c == b'\n' && (i == 0 || b[i - 1] != b'\r') {
            out.push(b'\r');
        }
        out.push(c);
    }
    out
}

fn trim_end(b: &[u8]) -> Vec<u8> {
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    b[..end].to_vec()
}

/// Thousands separated, as a person writes a byte count.
pub fn count(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A short escaped view of bytes (`"ab\r\n"`, `"\xff"`).
pub fn escaped(b: &[u8]) -> String {
    const MAX: usize = 40;
    let shown: String = b[..b.len().min(MAX)]
        .escape_ascii()
        .map(char::from)
        .collect();
    if b.len() > MAX {
        format!("\"{shown}…\" ({} bytes)", count(b.len()))
    } else {
        format!("\"{shown}\"")
    }
}

/// The transforms (one, or two in a row) that turn `sent` into `got`.
fn transformed(sent: &[u8], got: &[u8]) -> Option<Mangle> {
    let singles: Vec<Vec<u8>> = TRANSFORMS.iter().map(|(_, _, f)| f(sent)).collect();
    if let Some(i) = singles.iter().position(|t| t == got) {
        let (kind, description, _) = TRANSFORMS[i];
        return Some(Mangle {
            kind: kind.into(),
            description: description.into(),
        });
    }
    for (i, once) in singles.iter().enumerate() {
        if once == sent {
            continue; // did nothing: pairs starting with it are singles
        }
        for (j, (kind2, description2, g)) in TRANSFORMS.iter().enumerate() {
            if j != i && g(once) == got {
                let (kind, description, _) = TRANSFORMS[i];
                return Some(Mangle {
                    kind: format!("{kind}+{kind2}"),
                    description: format!("{description}, then {description2}"),
                });
            }
        }
    }
    None
}

/// Lines in `b` (a last line without a newline counts).
fn lines(b: &[u8]) -> usize {
    b.split(|&c| c == b'\n').count() - usize::from(b.ends_with(b"\n"))
}

/// How `got` differs from `sent`; `None` when they are equal.
pub fn describe(sent: &[u8], got: &[u8]) -> Option<Mangle> {
    if sent == got {
        return None;
    }
    if let Some(m) = transformed(sent, got) {
        return Some(m);
    }
    if got.len() < sent.len() && sent.starts_with(got) {
        let at_line = got.ends_with(b"\n") || got.is_empty();
        let description = if at_line && lines(got) > 0 {
            format!(
                "cut after {} bytes ({} lines) of {}",
                count(got.len()),
                count(lines(got)),
                count(sent.len())
            )
        } else {
            format!(
                "cut after {} bytes of {}",
                count(got.len()),
                count(sent.len())
            )
        };
        return Some(Mangle {
            kind: "truncated".into(),
            description,
        });
    }
    // text the server added around the bytes, possibly with a transform
    for (kind, description, f) in [("", "", (|b: &[u8]| b.to_vec()) as Transform)]
        .into_iter()
        .chain(TRANSFORMS)
    {
        let t = f(sent);
        if t.is_empty() || got.len() <= t.len() {
            continue;
        }
        let Some(at) = got.windows(t.len()).position(|w| w == t.as_slice()) else {
            continue;
        };
        let (before, after) = (&got[..at], &got[at + t.len()..]);
        let mut parts = Vec::new();
        let mut kinds = Vec::new();
        if !kind.is_empty() {
            parts.push(description.to_string());
            kinds.push(kind.to_string());
        }
        if !before.is_empty() {
            parts.push(format!("the server added the prefix {}", escaped(before)));
            kinds.push("prefix-added".into());
        }
        if !after.is_empty() {
            parts.push(format!("the server added the suffix {}", escaped(after)));
            kinds.push("suffix-added".into());
        }
        return Some(Mangle {
            kind: kinds.join("+"),
            description: parts.join(", then "),
        });
    }
    let at = sent
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(sent.len().min(got.len()));
    let byte = |b: &[u8]| {
        b.get(at)
            .map_or("the end".to_string(), |c| format!("0x{c:02x}"))
    };
    Some(Mangle {
        kind: "changed".into(),
        description: format!(
            "{} bytes sent, {} came back, first different at byte {} (sent {}, got {})",
            count(sent.len()),
            count(got.len()),
            count(at),
            byte(sent),
            byte(got)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(sent: &[u8], got: &[u8]) -> String {
        describe(sent, got).map(|m| m.kind).unwrap_or_default()
    }

    #[test]
    fn single_transforms_are_named() {
        assert_eq!(kind(b"a\xffb", "a\u{fffd}b".as_bytes()), "lossy-utf8");
        assert_eq!(kind(b"ab\0cd", b"ab"), "cut-at-nul");
        assert_eq!(kind(b"ab\0cd", b"abcd"), "nul-dropped");
        assert_eq!(kind(b"a\r\nb", b"a\nb"), "crlf-to-lf");
        assert_eq!(kind(b"a\rb\r\n", b"ab\n"), "cr-dropped");
        assert_eq!(kind(b"a\rb", b"a\nb"), "cr-to-lf");
        assert_eq!(kind(b"a\nb", b"a\r\nb"), "lf-to-crlf");
        assert_eq!(kind(b"x \n\n", b"x"), "trimmed");
        assert_eq!(describe(b"same", b"same"), None);
    }

    #[test]
    fn pairs_truncation_and_added_text_are_named() {
        assert_eq!(
            kind(b"a\xff\r\n", "a\u{fffd}\n".as_bytes()),
            "lossy-utf8+crlf-to-lf"
        );
        let m = describe(&[b'a'; 100_000], &[b'a'; 65_536]).unwrap();
        assert_eq!(m.kind, "truncated");
        assert!(m.description.contains("65,536 bytes of 100,000"), "{m:?}");
        let m = describe(b"1\n2\n3\n", b"1\n2\n").unwrap();
        assert!(m.description.contains("(2 lines)"), "{m:?}");
        let m = describe(b"hello", b"[Reading 1 line]\nhello").unwrap();
        assert_eq!(m.kind, "prefix-added");
        assert!(m.description.contains("[Reading 1 line]\\n"), "{m:?}");
        assert_eq!(
            kind(b"a\xff", "<a\u{fffd}>".as_bytes()),
            "lossy-utf8+prefix-added+suffix-added"
        );
        let m = describe(b"abc", b"abd").unwrap();
        assert_eq!(m.kind, "changed");
        assert!(
            m.description.contains("byte 2 (sent 0x63, got 0x64)"),
            "{m:?}"
        );
    }
}
