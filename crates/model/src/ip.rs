//! Lenient ("sloppy") IP and CIDR parsing, as Kubernetes does it.
//!
//! Old API servers accepted IPv4 addresses with leading zeros (`172.30.0.041`). Go's
//! `net.ParseIPSloppy` reads each octet as decimal, and kube-proxy then writes the address back
//! canonically (`172.30.0.41`). Rust's parser rejects leading zeros, so we parse them ourselves.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parses an IP address, accepting decimal octets with leading zeros. `None` when invalid.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if s.contains(':') {
        return s.parse::<IpAddr>().ok();
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse::<u8>().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// Parses a CIDR leniently (leading zeros in octets and prefix length) and returns the
/// *network* (host bits cleared), as Go's `ParseCIDR` does. `None` when invalid.
pub fn parse_cidr_sloppy(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.trim().split_once('/')?;
    let ip = parse_ip_sloppy(addr)?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    IpNet::new(ip, prefix).ok().map(|net| net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ips() {
        let cases: &[(&str, Option<&str>)] = &[
            ("10.0.0.1", Some("10.0.0.1")),
            ("172.30.0.041", Some("172.30.0.41")),
            ("010.000.000.001", Some("10.0.0.1")),
            (" 1.2.3.4 ", Some("1.2.3.4")),
            ("2001:db8::1", Some("2001:db8::1")),
            ("2001:DB8:0::1", Some("2001:db8::1")),
            ("256.0.0.1", None),
            ("1.2.3", None),
            ("1.2.3.4.5", None),
            ("1.2.3.0004", None),
            ("a.b.c.d", None),
            ("", None),
            ("None", None),
        ];
        for (input, want) in cases {
            let got = parse_ip_sloppy(input).map(|ip| ip.to_string());
            assert_eq!(got.as_deref(), *want, "input {input:?}");
        }
    }

    #[test]
    fn cidrs() {
        let cases: &[(&str, Option<&str>)] = &[
            ("203.0.113.000/025", Some("203.0.113.0/25")),
            ("10.0.0.1/8", Some("10.0.0.0/8")),
            ("10.0.0.0/33", None),
            ("2001:db8::5/64", Some("2001:db8::/64")),
            ("10.0.0.0", None),
            ("10.0.0.0/", None),
            ("0.0.0.0/0", Some("0.0.0.0/0")),
        ];
        for (input, want) in cases {
            let got = parse_cidr_sloppy(input).map(|n| n.to_string());
            assert_eq!(got.as_deref(), *want, "input {input:?}");
        }
    }
}
