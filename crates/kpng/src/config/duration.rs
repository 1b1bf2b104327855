//! Go's duration syntax (`time.ParseDuration`, `Duration.String`), as `metav1.Duration` fields of
//! a KubeProxyConfiguration are written: `30s`, `1m0s`, `15m0s`, `1.5h`, `250ms`, `0`.
//!
//! kube-proxy's flags and its configuration file use this syntax, so kpng reads it in both and
//! writes it back the way kube-proxy does (`--write-config-to`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative duration read from and written in Go's syntax.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

/// Nanoseconds per unit, longest suffix first so that `ms` is not read as `m`.
const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// A duration that may be negative, for the fields kube-proxy checks only in a mode kpng does
/// not run (the `ipvs` section, validated in ipvs mode only): a file carrying `-1s` there must
/// load, as it does in kube-proxy in any other mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignedGoDuration {
    /// The duration without its sign.
    pub magnitude: Duration,
    /// Whether it is below zero.
    pub negative: bool,
}

impl SignedGoDuration {
    /// A non-negative duration.
    pub const fn from(magnitude: Duration) -> SignedGoDuration {
        SignedGoDuration {
            magnitude,
            negative: false,
        }
    }

    /// Whether it is zero.
    pub fn is_zero(&self) -> bool {
        self.magnitude.is_zero()
    }
}

impl fmt::Display for SignedGoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.negative { "-" } else { "" };
        write!(f, "{sign}{}", format(self.magnitude))
    }
}

impl Serialize for SignedGoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SignedGoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Reads the text, sign allowed.
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = SignedGoDuration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"30s\" or \"1m0s\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<SignedGoDuration, E> {
                parse_signed(text)
                    .map(|(negative, magnitude)| SignedGoDuration {
                        magnitude,
                        negative: negative && !magnitude.is_zero(),
                    })
                    .map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Text)
    }
}

/// Parses Go's duration syntax: a sequence of decimal numbers, each with an optional fraction
/// and a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g. `1h30m`, `1.5s`; a bare `0` is zero.
/// Negative durations are rejected: no duration kpng reads may be negative (but see
/// [`SignedGoDuration`]).
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("{text:?} is not a duration ({why}; e.g. 30s, 1m0s, 1.5h)");
    match parse_signed(text)? {
        (true, d) if !d.is_zero() => Err(bad("negative")),
        (_, d) => Ok(d),
    }
}

/// Go's duration syntax with its sign: (negative, magnitude).
fn parse_signed(text: &str) -> Result<(bool, Duration), String> {
    let s = text.trim();
    let bad = |why: &str| format!("{text:?} is not a duration ({why}; e.g. 30s, 1m0s, 1.5h)");
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if s == "0" {
        return Ok((negative, Duration::ZERO));
    }
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(f) => {
                let len = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(len)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(bad("expected a number"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, ns)| *ns)
            .ok_or_else(|| {
                if unit.is_empty() {
                    bad("missing unit")
                } else {
                    bad(&format!("unknown unit {unit:?}"))
                }
            })?;
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| bad("number too large"))?
        };
        let mut nanos = whole.checked_mul(scale).ok_or_else(|| bad("too large"))?;
        // The fraction, to nanosecond precision (Go truncates the same way).
        let mut place = scale;
        for digit in frac_part.bytes() {
            place /= 10;
            if place == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * place;
        }
        total = total.checked_add(nanos).ok_or_else(|| bad("too large"))?;
        rest = after;
    }
    // Go's limit is i64 nanoseconds (about 292 years).
    let total = u64::try_from(total)
        .ok()
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or_else(|| bad("too large"))?;
    Ok((negative, Duration::from_nanos(total)))
}

/// Formats like Go's `Duration.String`: `0s`, `250ms`, `1.5s`, `30s`, `1m0s`, `24h0m0s`.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = match nanos {
            n if n < 1_000 => ("ns", 1),
            n if n < 1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let hours = nanos / 3_600_000_000_000;
    let minutes = (nanos / 60_000_000_000) % 60;
    let seconds = decimal(nanos % 60_000_000_000, 1_000_000_000);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// `value / scale` as a decimal without trailing zeros (`1500, 1000` → `1.5`).
fn decimal(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format(self.0))
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// Says what a duration looks like when the value is of another type (`30` is not
        /// one: Go wants the unit).
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = GoDuration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration such as \"30s\" or \"1m0s\"")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<GoDuration, E> {
                parse(text).map(GoDuration).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_syntax() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        for (text, want) in [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("30s", s(30)),
            ("1m0s", s(60)),
            ("15m0s", s(900)),
            ("24h0m0s", s(86_400)),
            ("1h30m", s(5_400)),
            ("1.5s", ms(1_500)),
            (".5s", ms(500)),
            ("1.s", s(1)),
            ("250ms", ms(250)),
            ("2us", Duration::from_micros(2)),
            ("2µs", Duration::from_micros(2)),
            ("3ns", Duration::from_nanos(3)),
            ("1h1m1s1ms", s(3_661) + ms(1)),
            ("+5s", s(5)),
            (" 5s ", s(5)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_what_go_rejects_and_negatives() {
        for (text, why) in [
            ("", "empty"),
            ("30", "missing unit"),
            ("1d", "unknown unit \"d\""),
            ("s", "expected a number"),
            ("1.5.5s", "missing unit"),
            ("-1s", "negative"),
            ("9999999999h", "too large"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn formats_like_go() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(3), "3ns"),
            (Duration::from_micros(2), "2µs"),
            (ms(250), "250ms"),
            (Duration::from_micros(1_500), "1.5ms"),
            (s(1), "1s"),
            (ms(1_500), "1.5s"),
            (s(30), "30s"),
            (s(60), "1m0s"),
            (s(900), "15m0s"),
            (s(3_600), "1h0m0s"),
            (s(5_430), "1h30m30s"),
            (s(86_400), "24h0m0s"),
        ] {
            assert_eq!(format(d), want, "{d:?}");
            assert_eq!(parse(want), Ok(d), "round trip of {want}");
        }
    }
}
