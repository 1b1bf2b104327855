//! The API server's checks on the values kpng turns into rules, made again where objects are
//! converted.
//!
//! A real API server refuses a Service whose port name holds a newline or a `"`, a namespace
//! with a `/`, an EndpointSlice of 50,000 endpoints or one whose endpoint is 127.0.0.1. kpng's
//! `file` source and API servers that do not validate (`kpng-fake-apiserver`, aggregated or
//! patched servers) hand such objects over as written, and every one of them reached the
//! rules: a port name's newline wrote a rule of the tenant's choice into iptables-restore's
//! input, a `"` made every restore fail, `a`/`b/c` and `a/b`/`c` shared one chain, a slice
//! with 50,000 endpoints stalled every other Service. One tenant's object must never break or
//! hijack another's, so the conversion checks what the API server checks, with upstream's
//! rules (`k8s.io/apimachinery/pkg/util/validation`, `pkg/apis/core/validation`,
//! `pkg/apis/discovery/validation`), and names the object and the field when it refuses one.
//!
//! Each function returns `Err(message)` naming the value (escaped, `{:?}`) and the rule; the
//! caller names the object and the field.

use std::net::IpAddr;

/// Upstream's `maxEndpoints` (`pkg/apis/discovery/validation`): an EndpointSlice holds at most
/// this many endpoints.
pub const MAX_SLICE_ENDPOINTS: usize = 1000;
/// Upstream's `maxPorts` (`pkg/apis/discovery/validation`): an EndpointSlice has at most this
/// many ports.
pub const MAX_SLICE_PORTS: usize = 100;

/// Longest DNS-1123 or DNS-1035 label (`DNS1123LabelMaxLength`) and label value
/// (`LabelValueMaxLength`).
const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (`DNS1123SubdomainMaxLength`).
const SUBDOMAIN_MAX: usize = 253;

fn lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, any length (the callers bound it).
fn is_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            lower_alnum(*first)
                && lower_alnum(*last)
                && b.iter().all(|c| lower_alnum(*c) || *c == b'-')
        }
        _ => false,
    }
}

/// `s` quoted and escaped for a message, its first 100 characters only: a name of megabytes
/// would otherwise be repeated in every log line and status answer about it.
fn shown(s: &str) -> String {
    const SHOWN: usize = 100;
    match s.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
        None => format!("{s:?}"),
    }
}

fn too_long(s: &str, max: usize) -> Option<String> {
    (s.len() > max).then(|| format!("must be no more than {max} characters"))
}

/// Upstream's `IsDNS1123Label`: namespaces, Service and EndpointSlice port names.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if !is_label_shape(s) {
        return Err(format!(
            "{} is not a DNS-1123 label: it must consist of lower case alphanumeric \
             characters or '-', and must start and end with an alphanumeric character",
            shown(s)
        ));
    }
    if let Some(why) = too_long(s, LABEL_MAX) {
        return Err(format!("{} is not a DNS-1123 label: {why}", shown(s)));
    }
    Ok(())
}

/// Upstream's `IsDNS1035Label`: a DNS-1123 label that starts with a letter (Service names,
/// unless the API server runs with `RelaxedServiceNameValidation`).
pub fn dns1035_label(s: &str) -> Result<(), String> {
    dns1123_label(s).map_err(|e| e.replace("DNS-1123", "DNS-1035"))?;
    if !s.as_bytes().first().is_some_and(u8::is_ascii_lowercase) {
        return Err(format!(
            "{} is not a DNS-1035 label: it must start with a lower case letter",
            shown(s)
        ));
    }
    Ok(())
}

/// A Service's name: a DNS-1035 label, or a DNS-1123 label (a leading digit), which API
/// servers with the `RelaxedServiceNameValidation` feature gate (Kubernetes 1.34) accept.
/// Either way only lower case letters, digits and '-': what matters here is that no name
/// holds a `/`, a space, a quote or a control character.
pub fn service_name(s: &str) -> Result<(), String> {
    dns1123_label(s)
}

/// Upstream's `IsDNS1123Subdomain`: EndpointSlice names.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if !s.split('.').all(is_label_shape) {
        return Err(format!(
            "{} is not a DNS-1123 subdomain: it must consist of lower case alphanumeric \
             characters, '-' or '.', and must start and end with an alphanumeric character",
            shown(s)
        ));
    }
    if let Some(why) = too_long(s, SUBDOMAIN_MAX) {
        return Err(format!("{} is not a DNS-1123 subdomain: {why}", shown(s)));
    }
    Ok(())
}

/// Upstream's `IsValidLabelValue`: empty, or `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?` of at
/// most 63 characters (the `kubernetes.io/service-name` label).
pub fn label_value(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let ok = match (b.first(), b.last()) {
        (None, _) | (_, None) => true,
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
    };
    if !ok {
        return Err(format!(
            "{} is not a valid label value: it must consist of alphanumeric characters, \
             '-', '_' or '.', and must start and end with an alphanumeric character",
            shown(s)
        ));
    }
    if let Some(why) = too_long(s, LABEL_MAX) {
        return Err(format!("{} is not a valid label value: {why}", shown(s)));
    }
    Ok(())
}

/// Upstream's `ValidateEndpointIP` (EndpointSlice addresses and, for historical reasons,
/// `spec.externalIPs`; `ValidateNonSpecialIP` before 1.33 checked the same): the addresses
/// that make no sense as a destination or belong to the node itself. Unspecified (0.0.0.0,
/// ::), loopback (127.0.0.0/8, ::1), link-local unicast (169.254.0.0/16, the cloud metadata
/// service; fe80::/10) and link-local multicast (224.0.0.0/24, ff02::/16 and its flag
/// variants, as Go's `IsLinkLocalMulticast`). IPv4-mapped IPv6 addresses are checked as
/// IPv4, as Go does.
pub fn special_ip(ip: IpAddr) -> Result<(), String> {
    let ip = ip.to_canonical();
    let why = match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Some("may not be unspecified (0.0.0.0)"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("may not be unspecified (::)"),
        IpAddr::V4(v4) if v4.is_loopback() => {
            Some("may not be in the loopback range (127.0.0.0/8, ::1/128)")
        }
        IpAddr::V6(v6) if v6.is_loopback() => {
            Some("may not be in the loopback range (127.0.0.0/8, ::1/128)")
        }
        IpAddr::V4(v4) if v4.is_link_local() => {
            Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
        }
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
        }
        IpAddr::V4(v4) if v4.octets()[..3] == [224, 0, 0] => {
            Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
        }
        IpAddr::V6(v6) if v6.octets()[0] == 0xff && v6.octets()[1] & 0x0f == 0x02 => {
            Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
        }
        _ => None,
    };
    match why {
        Some(why) => Err(format!("{ip} {why}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's own examples (`validation_test.go` of apimachinery) and the auditor's.
    #[test]
    fn names_follow_upstream() {
        let label_ok = [
            "a",
            "ab",
            "abc",
            "a1",
            "a-1",
            "a--1--2--b",
            "0",
            "01",
            "0-0",
            "1abc",
        ];
        let label_bad = [
            "",
            "A",
            "ABC",
            "aBc",
            "A1",
            "a-",
            "-a",
            "a_b",
            "a.b",
            "a/b",
            "a b",
            "a\"b",
            "a\\b",
            "a\n-I KUBE-SERVICES 1",
            "é",
        ];
        for s in label_ok {
            assert_eq!(dns1123_label(s), Ok(()), "{s:?}");
            assert_eq!(service_name(s), Ok(()), "{s:?}");
        }
        for s in label_bad {
            assert!(dns1123_label(s).is_err(), "{s:?}");
            assert!(service_name(s).is_err(), "{s:?}");
            assert!(dns1035_label(s).is_err(), "{s:?}");
        }
        assert_eq!(dns1123_label(&"a".repeat(63)), Ok(()));
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert_eq!(dns1035_label("a-1"), Ok(()));
        for s in ["0", "1abc", "0-0"] {
            assert!(dns1035_label(s).is_err(), "{s:?}");
        }

        for s in ["a", "a.b", "a-b.c-d", "kubernetes", "web-1.x", "0.a"] {
            assert_eq!(dns1123_subdomain(s), Ok(()), "{s:?}");
        }
        for s in [
            "", ".", "a.", ".a", "a..b", "A.b", "a/b", "a_b", "a b", "a\nb",
        ] {
            assert!(dns1123_subdomain(s).is_err(), "{s:?}");
        }
        assert_eq!(dns1123_subdomain(&"a".repeat(253)), Ok(()));
        assert!(dns1123_subdomain(&"a".repeat(254)).is_err());

        for s in ["", "a", "A", "a_b", "a.b-C", "1", "web"] {
            assert_eq!(label_value(s), Ok(()), "{s:?}");
        }
        for s in ["-a", "a-", "_a", "a/b", "b/c", "a b", "a\"b", "a\nb"] {
            assert!(label_value(s).is_err(), "{s:?}");
        }
        assert!(label_value(&"a".repeat(64)).is_err());
    }

    /// The messages name the value escaped (a newline in it cannot forge a log line), and
    /// say what is wrong with its characters before its length.
    #[test]
    fn messages_escape_the_value() {
        let long = format!("a\n-I KUBE-SERVICES{}", "x".repeat(64));
        let e = dns1123_label(&long).expect_err("refused");
        assert!(e.starts_with("\"a\\n-I KUBE-SERVICES"), "{e}");
        assert!(e.contains("lower case alphanumeric"), "{e}");
        assert!(!e.contains('\n'));
        assert!(
            dns1123_label(&"a".repeat(64))
                .expect_err("refused")
                .contains("no more than 63")
        );
        let huge = dns1123_label(&"A".repeat(1_000_000)).expect_err("refused");
        assert!(
            huge.len() < 400 && huge.contains("… (1000000 bytes)"),
            "{huge}"
        );
    }

    #[test]
    fn special_addresses_are_upstreams() {
        for bad in [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "127.255.0.9",
            "::1",
            "169.254.169.254",
            "fe80::1",
            "febf::1",
            "224.0.0.1",
            "224.0.0.255",
            "ff02::1",
            "ff12::2",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            let ip: IpAddr = bad.parse().expect("test address");
            assert!(special_ip(ip).is_err(), "{bad}");
        }
        for good in [
            "10.244.1.2",
            "192.168.77.1",
            "224.0.1.1",
            "239.1.1.1",
            "fd00::1",
            "fec0::1",
            "ff05::1",
            "2001:db8::1",
            "1.1.1.1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = good.parse().expect("test address");
            assert_eq!(special_ip(ip), Ok(()), "{good}");
        }
    }
}
