//! Lenient ("sloppy") IP and CIDR parsing, as Kubernetes does it.
//!
//! Old API servers accepted IPv4 addresses with leading zeros (`172.30.0.041`). Go's
//! `net.ParseIPSloppy` reads each octet as decimal, and kube-proxy then writes the address back
//! canonically (`172.30.0.41`). Rust's parser rejects leading zeros, so we parse them ourselves.
//!
//! An IPv4-mapped IPv6 address (`::ffff:10.96.0.99`) is the IPv4 address it maps: Go's
//! `net.ParseIP` (kube-proxy, the API server's legacy validation) returns it as IPv4
//! (`To4() != nil`), so kube-proxy programs it in IPv4. Kept as IPv6 it would go to the `ip6`
//! tables and never match a packet; a source that no API server validates (`file`) can carry
//! one, so every IP and CIDR is unmapped here, where it is parsed.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parses an IP address, accepting decimal octets with leading zeros; an IPv4-mapped IPv6
/// address is returned as IPv4. `None` when invalid, white space around it included: Go's
/// `netutils.ParseIPSloppy` trims nothing, so kube-proxy skips `" 10.0.0.1"` as an invalid IP
/// (an external IP, an ingress IP) or refuses the object (a cluster IP), and so must kpng.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        return s.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
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

/// Why a CIDR cannot be used. The message names the value; the caller names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// Not `ADDRESS/PREFIX`.
    #[error("{0:?} is not a CIDR")]
    Invalid(String),
    /// An IPv4-mapped address with a prefix below 96: the range reaches beyond the mapped
    /// addresses (into plain IPv6), so it is no IPv4 range, and taking it as IPv6 would never
    /// match an IPv4 packet.
    #[error(
        "{text:?} is an IPv4-mapped IPv6 CIDR with prefix /{prefix}: only a prefix of 96 or more \
         is an IPv4 range (/96 + the IPv4 prefix); write it as IPv4"
    )]
    MappedPrefix {
        /// The value as written.
        text: String,
        /// Its prefix length.
        prefix: u8,
    },
}

/// Parses a CIDR leniently (leading zeros in octets and prefix length) and returns the
/// *network* (host bits cleared), as Go's `ParseCIDR` does; an IPv4-mapped CIDR is returned
/// as the IPv4 one ([`unmap_cidr`]). White space anywhere makes it invalid, as in
/// `netutils.ParseCIDRSloppy` (which trims nothing): a field kube-proxy trims first
/// (`loadBalancerSourceRanges`) is trimmed by its caller.
pub fn parse_cidr_sloppy(s: &str) -> Result<IpNet, CidrError> {
    let invalid = || CidrError::Invalid(s.to_string());
    let (addr, prefix) = s.split_once('/').ok_or_else(invalid)?;
    // Not `parse_ip_sloppy`: the prefix of a mapped address counts in IPv6 bits.
    let ip = if addr.contains(':') {
        addr.parse::<IpAddr>().map_err(|_| invalid())?
    } else {
        parse_ip_sloppy(addr).ok_or_else(invalid)?
    };
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
    let net = IpNet::new(ip, prefix).map_err(|_| invalid())?;
    Ok(unmap_cidr(net, s)?.trunc())
}

/// An IPv4-mapped IPv6 CIDR (`::ffff:192.168.100.0/120`) as the IPv4 CIDR it covers
/// (`192.168.100.0/24`: the prefix less 96); other CIDRs unchanged. `text` is the value as
/// written, for the error when the prefix is below 96. Host bits are kept (kpng's flags keep
/// them as written).
pub fn unmap_cidr(net: IpNet, text: &str) -> Result<IpNet, CidrError> {
    let IpNet::V6(v6) = net else {
        return Ok(net);
    };
    let Some(v4) = v6.addr().to_ipv4_mapped() else {
        return Ok(net);
    };
    let prefix = v6.prefix_len();
    prefix
        .checked_sub(96)
        .and_then(|p| IpNet::new(IpAddr::V4(v4), p).ok())
        .ok_or_else(|| CidrError::MappedPrefix {
            text: text.to_string(),
            prefix,
        })
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
            // Go's ParseIPSloppy trims nothing: white space makes an address invalid.
            (" 1.2.3.4 ", None),
            ("1.2.3.4 ", None),
            ("\t1.2.3.4", None),
            (" 2001:db8::1", None),
            ("2001:db8::1\n", None),
            ("2001:db8::1", Some("2001:db8::1")),
            ("2001:DB8:0::1", Some("2001:db8::1")),
            ("::ffff:10.96.0.99", Some("10.96.0.99")),
            ("::FFFF:0a60:0063", Some("10.96.0.99")),
            // Only mapped addresses are IPv4 (Go's To4): not the deprecated compatible ones.
            ("::10.96.0.99", Some("::a60:63")),
            ("64:ff9b::10.96.0.99", Some("64:ff9b::a60:63")),
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
        const INVALID: Result<&str, &str> = Err("is not a CIDR");
        const MAPPED: Result<&str, &str> = Err("is an IPv4-mapped IPv6 CIDR with prefix");
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("203.0.113.000/025", Ok("203.0.113.0/25")),
            ("10.0.0.1/8", Ok("10.0.0.0/8")),
            ("10.0.0.0/33", INVALID),
            ("2001:db8::5/64", Ok("2001:db8::/64")),
            ("10.0.0.0", INVALID),
            ("10.0.0.0/", INVALID),
            ("0.0.0.0/0", Ok("0.0.0.0/0")),
            // Go's ParseCIDRSloppy trims nothing: white space anywhere makes a CIDR invalid
            // (the caller trims loadBalancerSourceRanges, as kube-proxy does).
            (" 10.0.0.1/8 ", INVALID),
            ("10.0.0.1/8 ", INVALID),
            ("\t10.0.0.1/8", INVALID),
            ("10.0.0.0 /8", INVALID),
            ("10.0.0.0/ 8", INVALID),
            ("10.0.0.0/8\n", INVALID),
            ("10.0.0. 0/8", INVALID),
            (" 2001:db8::/64", INVALID),
            ("2001:db8:: /64", INVALID),
            ("2001:db8::/ 64", INVALID),
            ("fd00:100::10%eth0/128", INVALID),
            ("::ffff:192.168.100.0/120", Ok("192.168.100.0/24")),
            ("::ffff:192.168.100.7/128", Ok("192.168.100.7/32")),
            ("::ffff:192.168.100.7/96", Ok("0.0.0.0/0")),
            ("::ffff:192.168.100.0/95", MAPPED),
            ("::ffff:0.0.0.0/64", MAPPED),
            ("::ffff:192.168.100.0/129", INVALID),
        ];
        for (input, want) in cases {
            match (parse_cidr_sloppy(input), want) {
                (Ok(net), Ok(want)) => assert_eq!(net.to_string(), *want, "input {input:?}"),
                (Err(e), Err(want)) => {
                    let text = e.to_string();
                    assert!(text.contains(want), "input {input:?}: {text}");
                    assert!(text.contains(&format!("{input:?}")), "{text}");
                }
                (got, want) => panic!("input {input:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn flags_keep_host_bits_and_unmap() {
        let cases: &[(&str, Result<&str, ()>)] = &[
            ("10.0.0.1/8", Ok("10.0.0.1/8")),
            ("fd00::1/64", Ok("fd00::1/64")),
            ("::ffff:10.0.0.1/104", Ok("10.0.0.1/8")),
            ("::ffff:10.0.0.1/88", Err(())),
        ];
        for (input, want) in cases {
            let net: IpNet = input.parse().expect("a CIDR");
            let got = unmap_cidr(net, input).ok().map(|n| n.to_string());
            assert_eq!(got.as_deref(), want.ok(), "{input}");
        }
    }
}
