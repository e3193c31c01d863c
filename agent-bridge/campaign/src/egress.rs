//! The network guard rail: finds the addresses and host names a test's
//! tool arguments name outside this machine. No test may send a packet
//! off the machine unless the user says so (`campaign run --allow-egress
//! HOST`); the campaign's own "internet" is the local upstream.
//!
//! What counts as naming a host: an IPv4 literal, a quoted IPv6 literal, the
//! host of a URL (`scheme://host`), and a bare name ending in a public or
//! well-known internal suffix (`files.example.net`,
//! `metadata.google.internal`).
//! Loopback (127.0.0.0/8, `localhost`, `::1`), the unspecified address, the
//! upstream's placeholders and its DNS zone (`*.campaign.test`) are on
//! this machine. It is a guard rail, not a sandbox: a workload that builds
//! an address at run time is not seen here (the `no-network` profile is
//! the sandbox for that).

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::Value;

use super::spec::TestSpec;

/// One off-machine host a test names, and where.
#[derive(Debug, Clone, PartialEq)]
pub struct Named {
    /// e.g. `steps[1].arguments.code`
    pub field: String,
    pub host: String,
}

/// Suffixes of names that resolve off this machine. File extensions that
/// are also country codes (`.py`, `.sh`, `.rs`, `.pl`, `.md`…) are left out
/// on purpose: `main.py` is a file, not Paraguay.
const SUFFIXES: [&str; 30] = [
    "com", "org", "net", "io", "dev", "ai", "app", "edu", "gov", "info", "cloud", "xyz", "co",
    "uk", "de", "fr", "jp", "cn", "ru", "us", "eu", "me", "tv", "biz", "internal", "local", "lan",
    "corp", "home", "arpa",
];

/// Every off-machine host named in `spec`'s tool arguments, not in `allowed`.
pub fn named_hosts(spec: &TestSpec, allowed: &[String]) -> Vec<Named> {
    let mut out = Vec::new();
    for (i, step) in spec.steps.iter().enumerate() {
        for (name, v) in &step.arguments {
            strings(
                v,
                &format!("steps[{i}].arguments.{name}"),
                &mut |field, s| {
                    for host in hosts_in(s) {
                        if !allowed.iter().any(|a| a.eq_ignore_ascii_case(&host)) {
                            out.push(Named {
                                field: field.to_string(),
                                host,
                            });
                        }
                    }
                },
            );
        }
    }
    out
}

fn strings(v: &Value, field: &str, f: &mut impl FnMut(&str, &str)) {
    match v {
        Value::String(s) => f(field, s),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| strings(v, &format!("{field}[{i}]"), f)),
        Value::Object(o) => o
            .iter()
            .for_each(|(k, v)| strings(v, &format!("{field}.{k}"), f)),
        _ => {}
    }
}

/// Is `host` (an address or a name) on this machine?
pub fn is_local(host: &str) -> bool {
    let h = host
        .trim_matches(|c| c == '[' || c == ']')
        .to_ascii_lowercase();
    if let Ok(ip) = h.parse::<Ipv4Addr>() {
        return ip.is_loopback() || ip.is_unspecified();
    }
    if let Ok(ip) = h.parse::<Ipv6Addr>() {
        return ip.is_loopback() || ip.is_unspecified();
    }
    h == "localhost"
        || h.ends_with(".localhost")
        || h.starts_with("{{upstream.")
        || h == super::upstream::ZONE
        || h.ends_with(&format!(".{}", super::upstream::ZONE))
}

/// The off-machine hosts `text` names, in order, without repeats.
pub fn hosts_in(text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut add = |h: String| {
        if !is_local(&h) && !found.contains(&h) {
            found.push(h);
        }
    };
    // URLs: scheme://host[:port]
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let after = &rest[i + 3..];
        let authority = after
            .split(|c: char| "/?#'\" \\`<>\n\t".contains(c))
            .next()
            .unwrap_or("");
        let authority = authority.rsplit('@').next().unwrap_or("");
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => authority.split(':').next().unwrap_or(""),
        };
        if !host.is_empty() && !host.starts_with('{') {
            add(host.to_string());
        }
        rest = after;
    }
    // words: IPv4 literals and dotted names with a known suffix
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-')) {
        let word = word.trim_matches('.');
        if word.split('.').count() < 2 {
            continue;
        }
        if word.parse::<Ipv4Addr>().is_ok() {
            add(word.to_string());
            continue;
        }
        let labels: Vec<&str> = word.split('.').collect();
        let tld = labels
            .last()
            .map(|l| l.to_ascii_lowercase())
            .unwrap_or_default();
        let name_like = labels.iter().all(|l| {
            !l.is_empty() && !l.starts_with('-') && l.chars().any(|c| c.is_ascii_alphabetic())
        });
        if name_like && SUFFIXES.contains(&tld.as_str()) {
            add(word.to_ascii_lowercase());
        }
    }
    // quoted IPv6 literals: '2001:db8::1', "fe80::1"
    for quote in ['\'', '"'] {
        for (i, part) in text.split(quote).enumerate() {
            if i % 2 == 1 && part.contains(':') && part.parse::<Ipv6Addr>().is_ok() {
                add(part.to_string());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_machine_addresses_and_names_are_found() {
        for (text, want) in [
            (
                "socket.create_connection(('192.0.2.7', 80))",
                vec!["192.0.2.7"],
            ),
            (
                "curl -s https://files.example.net/simple/",
                vec!["files.example.net"],
            ),
            ("curl http://user@10.0.0.5:8080/x", vec!["10.0.0.5"]),
            ("wget http://[2001:db8::1]:80/", vec!["2001:db8::1"]),
            ("connect(('fe80::1', 80))", vec!["fe80::1"]),
            (
                "ping -c1 example.com; ping -c1 example.com",
                vec!["example.com"],
            ),
            ("curl 169.254.169.254/latest", vec!["169.254.169.254"]),
            (
                "getent hosts metadata.google.internal",
                vec!["metadata.google.internal"],
            ),
        ] {
            assert_eq!(hosts_in(text), want, "{text}");
        }
    }

    #[test]
    fn this_machine_and_ordinary_text_are_not_hosts() {
        for text in [
            "curl http://127.0.0.1:8000/ http://localhost/ http://[::1]:9/",
            "urlopen('{{upstream.http}}/bytes/10'); nc {{upstream.host}} {{upstream.echo_port}}",
            "dig @{{upstream.host}} www.campaign.test",
            "python3 main.py && cat report.pdf data.bin README.md run.sh x.rs",
            "print(sum(range(10))); x[1::2]; std::cout; version 1.2.3",
            "s.bind(('0.0.0.0', 0)); data:text/html,<h1>hi</h1>",
            "printf '\\001\\002'; sha256sum a.b.c",
        ] {
            assert_eq!(hosts_in(text), Vec::<String>::new(), "{text}");
        }
    }

    #[test]
    fn allowed_hosts_pass_and_fields_are_named() {
        let spec: TestSpec = serde_json::from_value(serde_json::json!({
            "id": "n-1", "domain": "network", "title": "t",
            "steps": [
                {"tool": "exec", "arguments": {"command": "true"}},
                {"tool": "exec", "arguments": {"argv": ["curl", "https://example.org/", "http://192.0.2.1/"]}}
            ]
        }))
        .unwrap();
        let named = named_hosts(&spec, &[]);
        assert_eq!(
            named,
            vec![
                Named {
                    field: "steps[1].arguments.argv[1]".into(),
                    host: "example.org".into()
                },
                Named {
                    field: "steps[1].arguments.argv[2]".into(),
                    host: "192.0.2.1".into()
                },
            ]
        );
        assert_eq!(
            named_hosts(&spec, &["Example.ORG".into(), "192.0.2.1".into()]),
            vec![]
        );
    }
}
