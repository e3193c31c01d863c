//! The `identity` facet: who the workload runs as, and the locale, time
//! zone and /bin/sh it gets.

use serde_json::Value;

use super::util::{env_nonempty, io_name};
use crate::env::Facet;

pub fn facet() -> Facet {
    let mut f = Facet::new(
        "Effective uid/gid and groups of this process, its passwd entry, \
         the locale and TZ variables, /etc/localtime and /bin/sh.",
    );
    let uid = nix::unistd::geteuid();
    f.set("uid", uid.as_raw());
    f.set("gid", nix::unistd::getegid().as_raw());
    match nix::unistd::getgroups() {
        Ok(groups) => f.set(
            "groups",
            groups.iter().map(|g| g.as_raw()).collect::<Vec<_>>(),
        ),
        Err(e) => f.cannot("groups", format!("getgroups: {e:?}")),
    }
    let passwd = super::util::passwd(uid.as_raw());
    f.set(
        "user",
        passwd
            .as_ref()
            .map_or(Value::Null, |u| u.name.clone().into()),
    );
    let home = env_nonempty("HOME").or_else(|| passwd.as_ref().map(|u| u.dir.clone()));
    f.set("home", home.map_or(Value::Null, Value::from));
    let shell = env_nonempty("SHELL").or_else(|| passwd.as_ref().map(|u| u.shell.clone()));
    f.set("shell", shell.map_or(Value::Null, Value::from));
    f.set("locale", locale(env_nonempty));
    f.set("tz", tz());
    match std::fs::canonicalize("/bin/sh") {
        Ok(p) => f.set("bin_sh", p.display().to_string()),
        Err(e) => f.cannot("bin_sh", format!("{} resolving /bin/sh", io_name(&e))),
    }
    f
}

/// The locale that decides character handling: LC_ALL, else LC_CTYPE,
/// else LANG, else the C locale.
fn locale(var: impl Fn(&str) -> Option<String>) -> String {
    ["LC_ALL", "LC_CTYPE", "LANG"]
        .iter()
        .find_map(|k| var(k))
        .unwrap_or_else(|| "C".into())
}

/// $TZ, else the zone /etc/localtime links to, else Debian's
/// /etc/timezone, else `UTC?` (glibc's default, unconfirmed).
fn tz() -> String {
    if let Some(tz) = env_nonempty("TZ") {
        return tz;
    }
    if let Ok(target) = std::fs::read_link("/etc/localtime") {
        let t = target.display().to_string();
        return match t.split_once("zoneinfo/") {
            Some((_, zone)) => zone.to_string(),
            None => t,
        };
    }
    std::fs::read_to_string("/etc/timezone")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s.len() < 64 && !s.contains(char::is_whitespace))
        .unwrap_or_else(|| "UTC?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locale_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(locale(env(&[])), "C");
        assert_eq!(locale(env(&[("LANG", "en_US.UTF-8")])), "en_US.UTF-8");
        assert_eq!(
            locale(env(&[("LANG", "en_US.UTF-8"), ("LC_CTYPE", "C.UTF-8")])),
            "C.UTF-8"
        );
        assert_eq!(
            locale(env(&[("LC_ALL", "POSIX"), ("LC_CTYPE", "C.UTF-8")])),
            "POSIX"
        );
    }
}
