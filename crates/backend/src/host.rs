//! What backends that program this node read from the node itself: which addresses are local
//! (`--nodeport-addresses` given as CIDRs, iptables' "every local address"). Linux only: other
//! systems have their own backends, which ask their own data plane.

use std::net::IpAddr;
use std::process::Command;

use tracing::warn;

/// Every address configured on a local interface (`ip -o addr show`) that the host can use:
/// IPv6 addresses still in duplicate address detection (`tentative`, not `optimistic`) or whose
/// detection failed (`dadfailed`: another host has the address) are left out. Nothing can be
/// bound to them (a health check's listener fails with `EADDRNOTAVAIL`) and no packet to them
/// is delivered here; a tentative address becomes local when its detection succeeds, and the
/// kernel's notification of that is a gain for the address watch. Backends read it at full,
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

/// The usable addresses of `ip -o addr show`'s lines: one address a line, its flags after it
/// (`scope global tentative`, `dadfailed tentative`, `optimistic tentative`…) and before the
/// `\` that `-o` leaves where the lifetimes' line began (after a space, or on an IPv4
/// address's label: `lo\`).
fn parse(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == "inet" || w == "inet6" {
                let ip = words
                    .next()
                    .and_then(|cidr| cidr.split('/').next())
                    .and_then(|ip| ip.parse().ok());
                let mut flags = Vec::new();
                for w in words.by_ref() {
                    // `\` ends the flags, alone or on the label (`lo\`).
                    if let Some(last) = w.strip_suffix('\\') {
                        flags.push(last);
                        break;
                    }
                    flags.push(w);
                }
                if let Some(ip) = ip
                    && usable(&flags)
                {
                    out.push(ip);
                }
                break;
            }
        }
    }
    out
}

/// Whether an address with these flags can be bound and receives packets: the kernel refuses
/// a tentative address (duplicate address detection running) unless it is optimistic (RFC
/// 4429: usable during detection), and keeps one whose detection failed tentative for good.
fn usable(flags: &[&str]) -> bool {
    let has = |flag: &str| flags.contains(&flag);
    !has("dadfailed") && (!has("tentative") || has("optimistic"))
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

    /// Addresses in or after duplicate address detection, as `ip -o addr show` prints them:
    /// only those the kernel lets a listener bind are local.
    #[test]
    fn leaves_out_tentative_and_dadfailed_addresses() {
        let line = |flags: &str| {
            format!(
                "2: eth0    inet6 2001:db8:1::20/64 scope global {flags}\\       \
                 valid_lft forever preferred_lft forever\n"
            )
        };
        for (flags, local) in [
            ("", true),
            ("nodad", true),
            ("tentative", false),
            ("dadfailed tentative", false),
            ("tentative dadfailed", false),
            ("optimistic tentative", true),
            ("optimistic", true),
            ("deprecated", true),
            ("dynamic mngtmpaddr noprefixroute", true),
            ("temporary dynamic", true),
        ] {
            let ips = super::parse(&line(flags));
            assert_eq!(!ips.is_empty(), local, "flags {flags:?}: {ips:?}");
        }
        // The lifetimes after the `\\` are not flags; an IPv4 label is not one either.
        let text = "3: eth1    inet 10.0.0.5/24 scope global secondary eth1:tentative\\       \
                    valid_lft forever preferred_lft forever\n\
                    3: eth1    inet6 fd00::5/64 scope global \\       \
                    valid_lft 1200sec preferred_lft 0sec tentative\n";
        let ips: Vec<String> = super::parse(text).iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["10.0.0.5", "fd00::5"]);
    }
}
