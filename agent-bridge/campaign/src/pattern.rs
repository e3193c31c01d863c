//! A failure explanation as a pattern: the same failure seen with another
//! pid, port, count, digest, temp name or quoted value reads the same, so a
//! report can group tests by *what* went wrong rather than by its exact words.
//!
//! `connect(127.66.0.1:43273) failed with ECONNREFUSED … in python3 (pid 26734)`
//! becomes `connect(127.66.0.1:<port>) failed with ECONNREFUSED … in python3
//! (pid <pid>)`. What stays: words (errno names, syscalls, commands such as
//! `python3`), IP addresses (they name the destination), the fixed parts of
//! paths. What goes: free-standing numbers (`<n>`), pids (`<pid>`), ports
//! (`<port>`), hex digests and addresses (`<hex>`), temp names (`tmp<*>`) and
//! quoted values that are not paths (`"<str>"`).

/// The placeholders [`pattern`] writes, for a reader that wants to mark them.
pub const PLACEHOLDERS: [&str; 6] = ["<n>", "<pid>", "<port>", "<hex>", "<str>", "tmp<*>"];

/// `explanation` with its variable parts replaced by placeholders.
pub fn pattern(explanation: &str) -> String {
    let chars: Vec<char> = explanation.chars().collect();
    let mut out = String::with_capacity(explanation.len());
    scan(&chars, &mut out, true);
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Normalizes `s` into `out`; quoted values are only looked at on the top
/// level (a path inside quotes is scanned again, without quote handling).
fn scan(s: &[char], out: &mut String, quotes: bool) {
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let boundary = i == 0 || !is_word(s[i - 1]);
        if quotes && c == '"' {
            i = quoted(s, i, out);
        } else if c == '[' {
            if let Some(next) = ipv6_port(s, i, out) {
                i = next;
            } else {
                out.push(c);
                i += 1;
            }
        } else if boundary && c.is_ascii_digit() {
            i = number(s, i, out);
        } else if boundary
            && c.is_ascii_hexdigit()
            && let Some(end) = hex_run(s, i)
        {
            out.push_str("<hex>");
            i = end;
        } else if boundary && let Some(end) = temp_name(s, i) {
            out.push_str("tmp<*>");
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
}

/// A `"…"` value at `s[start]`: a path keeps its fixed parts, anything else
/// becomes `"<str>"`. Returns the index after the closing quote (or the end).
fn quoted(s: &[char], start: usize, out: &mut String) -> usize {
    let mut j = start + 1;
    while j < s.len() && s[j] != '"' {
        j += if s[j] == '\\' { 2 } else { 1 };
    }
    let inner = &s[start + 1..j.min(s.len())];
    let path_like = inner.contains(&'/') && !inner.iter().any(|c| c.is_whitespace());
    out.push('"');
    if path_like {
        scan(inner, out, false);
    } else {
        out.push_str("<str>");
    }
    if j < s.len() {
        out.push('"');
    }
    (j + 1).min(s.len())
}

/// Digits starting at a word boundary: an IPv4 address (kept, its port
/// normalized), a hex digest that happens to start with a digit, or a number.
fn number(s: &[char], start: usize, out: &mut String) -> usize {
    if let Some(end) = ipv4(s, start) {
        out.extend(&s[start..end]);
        return port(s, end, out);
    }
    if let Some(end) = hex_run(s, start) {
        out.push_str("<hex>");
        return end;
    }
    if s[start] == '0' && matches!(s.get(start + 1), Some('x' | 'X')) {
        let end = take(s, start + 2, |c| c.is_ascii_hexdigit());
        if end > start + 2 {
            out.push_str("<hex>");
            return end;
        }
    }
    let mut end = take(s, start, |c| c.is_ascii_digit());
    if s.get(end) == Some(&'.') && s.get(end + 1).is_some_and(|c| c.is_ascii_digit()) {
        end = take(s, end + 1, |c| c.is_ascii_digit());
    }
    out.push_str(if out.ends_with("pid ") || out.ends_with("pid=") {
        "<pid>"
    } else if out.ends_with("port ") || out.ends_with("port=") {
        "<port>"
    } else {
        "<n>"
    });
    end
}

/// `:digits` after an address becomes `:<port>`.
fn port(s: &[char], at: usize, out: &mut String) -> usize {
    if s.get(at) == Some(&':') && s.get(at + 1).is_some_and(|c| c.is_ascii_digit()) {
        out.push_str(":<port>");
        take(s, at + 1, |c| c.is_ascii_digit())
    } else {
        at
    }
}

/// `[v6addr]:port`: the address kept, the port normalized.
fn ipv6_port(s: &[char], start: usize, out: &mut String) -> Option<usize> {
    let close = take(s, start + 1, |c| {
        c.is_ascii_hexdigit() || c == ':' || c == '.'
    });
    if s.get(close) != Some(&']') || !s[start + 1..close].contains(&':') {
        return None;
    }
    out.extend(&s[start..=close]);
    Some(port(s, close + 1, out))
}

/// The end of a dotted quad starting at `start`, if there is one.
fn ipv4(s: &[char], start: usize) -> Option<usize> {
    let mut i = start;
    for part in 0..4 {
        let end = take(s, i, |c| c.is_ascii_digit());
        if end == i || end - i > 3 {
            return None;
        }
        i = end;
        if part < 3 {
            if s.get(i) != Some(&'.') {
                return None;
            }
            i += 1;
        }
    }
    (!s.get(i).is_some_and(|&c| is_word(c) || c == '.')).then_some(i)
}

/// A digest-like run: 8 or more hex digits, with at least one digit and one
/// letter, ending at a word boundary.
fn hex_run(s: &[char], start: usize) -> Option<usize> {
    let end = take(s, start, |c| c.is_ascii_hexdigit());
    let run = &s[start..end];
    let ok = run.len() >= 8
        && run.iter().any(|c| c.is_ascii_digit())
        && run.iter().any(|c| c.is_ascii_alphabetic())
        && !s.get(end).is_some_and(|&c| is_word(c));
    ok.then_some(end)
}

/// A temp name (`tmpk3j9_x2a`, `tmp.AbC123xy`): `tmp`, an optional
/// separator, then at least 6 word characters with a digit among them.
fn temp_name(s: &[char], start: usize) -> Option<usize> {
    if s.get(start..start + 3)? != ['t', 'm', 'p'] {
        return None;
    }
    let mut i = start + 3;
    if matches!(s.get(i), Some('.' | '_' | '-')) {
        i += 1;
    }
    let end = take(s, i, is_word);
    let tail = &s[i..end];
    (tail.len() >= 6 && tail.iter().any(|c| c.is_ascii_digit())).then_some(end)
}

fn take(s: &[char], mut i: usize, f: impl Fn(char) -> bool) -> usize {
    while i < s.len() && f(s[i]) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::pattern;

    #[test]
    fn pids_ports_and_numbers_vary_within_one_pattern() {
        let a = "step 1: the call exited 0, but connect(127.66.0.1:43273) failed with ECONNREFUSED (connection refused) in exe (pid 21931), reported by getsockopt(SO_ERROR) 36 ms after the non-blocking connect";
        let b = "step 1: the call exited 0, but connect(127.66.0.1:38819) failed with ECONNREFUSED (connection refused) in exe (pid 24338), reported by getsockopt(SO_ERROR) 0 ms after the non-blocking connect";
        assert_eq!(pattern(a), pattern(b));
        assert_eq!(
            pattern(a),
            "step <n>: the call exited <n>, but connect(127.66.0.1:<port>) failed with ECONNREFUSED (connection refused) in exe (pid <pid>), reported by getsockopt(SO_ERROR) <n> ms after the non-blocking connect"
        );
    }

    #[test]
    fn digests_and_sizes_vary_within_one_pattern() {
        let a = "step 3: read_file: the 39169 bytes carried hash to 7183de243a5600fc5fe052abe3ee7d303f45d5f31cf247efbaaf631d290e9072, the bridge says 39e9ffbcae8e4b9b0b1417dd58e42853e79846bd9bb78fd05e410f626c45bf19";
        let b = "step 3: read_file: the 65536 bytes carried hash to 0a0a89e6ef2af48e53182113ae72d81acddc8501242ae6d20731ec6e0c3ac35d, the bridge says bf8fd6ecb70afc467a78d0b2c48f547fc5fd95f3e1049d67e41afc8122b2321e";
        assert_eq!(pattern(a), pattern(b));
        assert_eq!(
            pattern(a),
            "step <n>: read_file: the <n> bytes carried hash to <hex>, the bridge says <hex>"
        );
        assert_eq!(
            pattern("fault at 0x7ffd1234"),
            pattern("fault at 0xdeadbeef")
        );
    }

    #[test]
    fn paths_keep_their_fixed_parts() {
        let a = r#"newfstatat("self/task/13300/") failed with ENOENT in chromium (pid 13297)"#;
        let b = r#"newfstatat("self/task/14464/") failed with ENOENT in chromium (pid 14452)"#;
        assert_eq!(pattern(a), pattern(b));
        assert!(pattern(a).contains(r#""self/task/<n>/""#), "{}", pattern(a));
        assert_eq!(
            pattern(r#"openat("/tmp/tmpk3j9_x2a/in.txt") failed"#),
            pattern(r#"openat("/tmp/tmpq81zz0b/in.txt") failed"#)
        );
        // A different file is a different pattern.
        assert_ne!(
            pattern(r#"openat("/usr/share/fonts/.uuid") failed with ENOENT"#),
            pattern(r#"openat("/etc/hosts") failed with ENOENT"#)
        );
    }

    #[test]
    fn quoted_values_become_placeholders() {
        assert_eq!(
            pattern(
                r#"stdout does not contain "welcome user-6283 | cookie": got "<!DOCTYPE \"x\"…" (252375 bytes)"#
            ),
            r#"stdout does not contain "<str>": got "<str>" (<n> bytes)"#
        );
    }

    #[test]
    fn words_errnos_and_addresses_stay() {
        let refused = "connect(127.66.0.1:43273) failed with ECONNREFUSED in python3 (pid 1)";
        let unreachable = "connect(127.66.0.1:43273) failed with ENETUNREACH in python3 (pid 1)";
        assert_ne!(pattern(refused), pattern(unreachable));
        assert!(pattern(refused).contains("python3"));
        assert_ne!(
            pattern("connect(10.0.0.1:80) failed"),
            pattern("connect(10.0.0.2:80) failed")
        );
        assert_eq!(
            pattern("connect([2001:4860:4860::8888]:443) failed"),
            "connect([2001:4860:4860::8888]:<port>) failed"
        );
        assert_eq!(pattern("x86_64 utf8 sha256"), "x86_64 utf8 sha256");
    }
}
