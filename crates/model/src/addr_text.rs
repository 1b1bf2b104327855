//! Upstream's endpoint order without a heap allocation per endpoint.
//!
//! kube-proxy sorts a Service port's endpoints by their `IP:port` string, and so do we (the
//! order decides which endpoint gets which slot). Formatting that string into a `String` for
//! every endpoint of every port was a visible part of a cold start at 30k Services; an
//! [`AddrText`] is the same text written into a fixed buffer on the stack, IPv4 by hand.

use std::fmt::{self, Write};
use std::net::{IpAddr, SocketAddr};

/// Longest `IP:port` text: `[` + 39 characters of IPv6 + `]:` + 5 digits.
const MAX_LEN: usize = 47;

/// The `IP:port` text of an address (`[v6]:port` for IPv6), exactly as `SocketAddr`'s
/// `Display` writes it, held inline. Ordered and compared as that string would be.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddrText {
    len: u8,
    buf: [u8; MAX_LEN],
}

impl AddrText {
    /// The text of `ip:port`.
    pub fn of(ip: IpAddr, port: u16) -> AddrText {
        let mut text = AddrText {
            len: 0,
            buf: [0; MAX_LEN],
        };
        match ip {
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    text.push_decimal(u32::from(octet));
                }
            }
            IpAddr::V6(_) => {
                // The rare family takes std's formatting (its `::` compression rules), still
                // into the inline buffer; it always fits.
                let _ = write!(text, "{}", SocketAddr::new(ip, port));
                return text;
            }
        }
        text.push(b':');
        text.push_decimal(u32::from(port));
        text
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits, dots, colons, brackets and hex letters are ever written.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }

    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.buf.get_mut(usize::from(self.len)) {
            *slot = byte;
            self.len += 1;
        }
    }

    fn push_decimal(&mut self, mut n: u32) {
        let mut digits = [0u8; 10];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for &d in &digits[i..] {
            self.push(d);
        }
    }
}

impl Write for AddrText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if usize::from(self.len) + s.len() > MAX_LEN {
            return Err(fmt::Error);
        }
        for b in s.bytes() {
            self.push(b);
        }
        Ok(())
    }
}

impl Ord for AddrText {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for AddrText {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for AddrText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDRESSES: &[(&str, u16)] = &[
        ("0.0.0.0", 0),
        ("10.0.0.2", 80),
        ("10.0.0.12", 80),
        ("10.0.0.1", 8080),
        ("10.0.0.1", 65535),
        ("255.255.255.255", 9),
        ("192.168.1.100", 443),
        ("::", 0),
        ("::1", 53),
        ("fd00::a", 80),
        ("fd00::a:0:0:1", 8080),
        ("2001:db8:85a3:1234:5678:8a2e:370:7334", 65535),
        ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 65535),
        ("::ffff:10.0.0.1", 80),
    ];

    #[test]
    fn the_text_is_what_socket_addr_displays() {
        for (ip, port) in ADDRESSES {
            let ip: IpAddr = ip.parse().expect("address");
            let want = SocketAddr::new(ip, *port).to_string();
            assert_eq!(AddrText::of(ip, *port).as_str(), want);
        }
    }

    #[test]
    fn the_order_is_the_strings_order() {
        for (a, pa) in ADDRESSES {
            for (b, pb) in ADDRESSES {
                let (a, b): (IpAddr, IpAddr) = (a.parse().expect("a"), b.parse().expect("b"));
                let strings = SocketAddr::new(a, *pa)
                    .to_string()
                    .cmp(&SocketAddr::new(b, *pb).to_string());
                assert_eq!(AddrText::of(a, *pa).cmp(&AddrText::of(b, *pb)), strings);
            }
        }
    }
}
