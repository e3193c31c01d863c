//! The `network` facet: interfaces, default routes, resolvers, proxies by
//! hash, and whether the addresses asked for can be reached. No packet
//! leaves for any address but those in `reach` (and loopback).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{Value, json};

use super::util::{io_name, read_text};
use crate::env::{Facet, hash_of};

const PROXY_VARS: &[&str] = &["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"];

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

pub fn facet(reach: &[String]) -> Facet {
    let mut f = Facet::new(
        "getifaddrs; default routes from /proc/net/route and ipv6_route; nameserver lines \
         of /etc/resolv.conf; a TCP bind on 127.0.0.1; proxy variables by hash; a TCP \
         connect (1 s) to each address asked for.",
    );
    interfaces(&mut f);
    match default_routes() {
        Ok(Some(r)) => f.set("route.default", r),
        Ok(None) => f.set("route.default", Value::Null),
        Err(why) => f.cannot("route.default", why),
    }
    match std::fs::read_to_string("/etc/resolv.conf") {
        Ok(text) => f.set("resolver.nameservers", nameservers(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            f.set("resolver.nameservers", Vec::<String>::new())
        }
        Err(e) => f.cannot(
            "resolver.nameservers",
            format!("{} reading /etc/resolv.conf", io_name(&e)),
        ),
    }
    f.set(
        "loopback_bind",
        match std::net::TcpListener::bind("127.0.0.1:0") {
            Ok(_) => "ok".to_string(),
            Err(e) => io_name(&e),
        },
    );
    for name in PROXY_VARS
        .iter()
        .flat_map(|v| [v.to_string(), v.to_lowercase()])
    {
        if let Some(value) = std::env::var_os(&name) {
            f.set(
                format!("proxy.{name}"),
                hash_of(std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str())),
            );
        }
    }
    for target in reach {
        f.set(format!("reach.{target}"), try_reach(target));
    }
    f
}

fn interfaces(f: &mut Facet) {
    let addrs = match nix::ifaddrs::getifaddrs() {
        Ok(a) => a,
        Err(e) => {
            f.cannot("if", format!("getifaddrs: {e:?}"));
            return;
        }
    };
    let mut ifs: BTreeMap<String, (bool, Vec<String>)> = BTreeMap::new();
    for a in addrs {
        let entry = ifs.entry(a.interface_name.clone()).or_default();
        entry.0 |= a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
        let (Some(addr), netmask) = (a.address, a.netmask) else {
            continue;
        };
        let prefix = |mask: Option<IpAddr>| match mask {
            Some(IpAddr::V4(m)) => u32::from(m).count_ones(),
            Some(IpAddr::V6(m)) => u128::from(m).count_ones(),
            None => 0,
        };
        let ip = |s: &nix::sys::socket::SockaddrStorage| -> Option<IpAddr> {
            if let Some(v4) = s.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        };
        if let Some(ip_addr) = ip(&addr) {
            let mask = netmask.as_ref().and_then(ip);
            entry.1.push(format!("{ip_addr}/{}", prefix(mask)));
        }
    }
    for (name, (up, addrs)) in ifs {
        f.set(format!("if.{name}"), json!({"up": up, "addrs": addrs}));
    }
}

/// The default routes, `via GW dev IF` (`dev IF` without a gateway),
/// IPv4 then IPv6, joined by `; `; None when there is none.
fn default_routes() -> Result<Option<String>, String> {
    let v4 = read_text("/proc/net/route")?;
    let mut routes = routes_v4(&v4);
    // a kernel without IPv6 has no ipv6_route
    if let Ok(v6) = std::fs::read_to_string("/proc/net/ipv6_route") {
        routes.extend(routes_v6(&v6));
    }
    Ok((!routes.is_empty()).then(|| routes.join("; ")))
}

fn routes_v4(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        let (Some(dest), Some(gw), Some(flags), Some(mask)) =
            (hex(f[1]), hex(f[2]), hex(f[3]), hex(f[7]))
        else {
            continue;
        };
        // RTF_UP; the kernel prints the network-order word as a host integer
        if dest != 0 || mask != 0 || flags & 1 == 0 {
            continue;
        }
        out.push(if gw == 0 {
            format!("dev {}", f[0])
        } else {
            format!("via {} dev {}", Ipv4Addr::from(gw.to_ne_bytes()), f[0])
        });
    }
    out
}

fn routes_v6(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let flags = u32::from_str_radix(f[8], 16).unwrap_or(0);
        // ::/0, not the reject route the kernel keeps on lo (RTF_REJECT)
        if f[0].chars().any(|c| c != '0') || f[1] != "00" || flags & 0x0200 != 0 || f[9] == "lo" {
            continue;
        }
        let gw = u128::from_str_radix(f[4], 16).unwrap_or(0);
        out.push(if gw == 0 {
            format!("dev {}", f[9])
        } else {
            format!("via {} dev {}", Ipv6Addr::from(gw), f[9])
        });
    }
    out
}

fn nameservers(resolv_conf: &str) -> Vec<String> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "nameserver").then(|| w.next().map(String::from))?
        })
        .collect()
}

/// `ok`, an errno name, `timeout`, or why it was not tried. Only literal
/// addresses and `localhost` are tried: a name would need a DNS query.
fn try_reach(target: &str) -> String {
    let addr: Option<SocketAddr> = target.parse().ok().or_else(|| {
        let (host, port) = target.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        if host == "localhost" {
            // not through the resolver: no query may leave for a name
            return Some(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, port))
    });
    let Some(addr) = addr else {
        return if target
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            "needs DNS: not tried".into()
        } else {
            "not HOST:PORT: not tried".into()
        };
    };
    match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(_) => "ok".into(),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "timeout".into(),
        Err(e) => io_name(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\n";
        if cfg!(target_endian = "little") {
            assert_eq!(routes_v4(v4), ["via 192.0.2.1 dev eth0"]);
        }
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
                  00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        assert_eq!(routes_v6(v6), ["via fd00::1 dev eth0"]);
        assert_eq!(
            nameservers("# x\nnameserver 10.0.0.2\nsearch a\nnameserver ::1\n"),
            ["10.0.0.2", "::1"]
        );
    }

    #[test]
    fn reach_tries_only_literal_addresses() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(try_reach(&format!("127.0.0.1:{port}")), "ok");
        assert_eq!(try_reach(&format!("localhost:{port}")), "ok");
        drop(l);
        assert_eq!(try_reach(&format!("127.0.0.1:{port}")), "ECONNREFUSED");
        assert_eq!(try_reach("example.invalid:443"), "needs DNS: not tried");
        assert_eq!(try_reach("nonsense"), "not HOST:PORT: not tried");
    }
}
