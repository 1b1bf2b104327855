//! What backends that program this node read from the node itself: which addresses are local
//! (`--nodeport-addresses` given as CIDRs, iptables' "every local address"). Linux only: other
//! systems have their own backends, which ask their own data plane.

use std::net::IpAddr;
use std::process::Command;

use tracing::warn;

/// Every address configured on a local interface (`ip -o addr show`). Backends read it at full,
/// node and periodic syncs, never at a change's sync (a process per call).
pub fn local_addresses() -> Vec<IpAddr> {
    let output = match Command::new("ip").args(["-o", "addr", "show"]).output() {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            warn!(
                "`ip -o addr show` failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return Vec::new();
        }
        Err(e) => {
            warn!("cannot run `ip -o addr show`: {e}");
            return Vec::new();
        }
    };
    parse(&String::from_utf8_lossy(&output.stdout))
}

fn parse(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == "inet" || w == "inet6" {
                if let Some(ip) = words
                    .next()
                    .and_then(|cidr| cidr.split('/').next())
                    .and_then(|ip| ip.parse().ok())
                {
                    out.push(ip);
                }
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_ip_o_addr() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                    2: eth0    inet 192.168.100.1/24 brd 192.168.100.255 scope global eth0\n\
                    2: eth0    inet6 fd00:100::1/64 scope global nodad\n";
        let ips: Vec<String> = super::parse(text).iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["127.0.0.1", "192.168.100.1", "fd00:100::1"]);
    }
}
