//! `--service-node-port-range`: the node ports the API server may allocate.
//!
//! The API server never allocates a node port outside its range, so a Service carrying one
//! comes from a hand-written manifest or a misconfigured cluster. Programming it anyway would let
//! one manifest take a port the node itself serves (SSH, kpng's own health port) on every node,
//! so the model drops such node ports with a warning and keeps the rest of the Service.

use std::fmt;
use std::str::FromStr;

use crate::event::{Kind, ObjectRef};
use crate::records::{ServiceInfo, Warning};

/// An inclusive range of node ports (`30000-32767` by default, the API server's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePortRange {
    first: u16,
    last: u16,
}

/// Why a `--service-node-port-range` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a port range: {why} (expected FIRST-LAST, FIRST+COUNT or one PORT, e.g. 30000-32767)"
)]
pub struct PortRangeError {
    /// The value given.
    pub input: String,
    /// What is wrong with it.
    pub why: String,
}

impl NodePortRange {
    /// The API server's default, `30000-32767`.
    pub const DEFAULT: NodePortRange = NodePortRange {
        first: 30000,
        last: 32767,
    };

    /// The range `first..=last`; `None` when `first > last` or `first` is 0.
    pub fn new(first: u16, last: u16) -> Option<NodePortRange> {
        (first > 0 && first <= last).then_some(NodePortRange { first, last })
    }

    /// Whether `port` may be a node port.
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
}

impl Default for NodePortRange {
    fn default() -> NodePortRange {
        NodePortRange::DEFAULT
    }
}

impl fmt::Display for NodePortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for NodePortRange {
    type Err = PortRangeError;

    /// Parses the API server's and kube-proxy's spellings: `FIRST-LAST`, `FIRST+OFFSET` (the
    /// last port is `FIRST + OFFSET`, both ends inclusive) and a single `PORT`.
    fn from_str(s: &str) -> Result<NodePortRange, PortRangeError> {
        let fail = |why: &str| PortRangeError {
            input: s.to_string(),
            why: why.to_string(),
        };
        let number = |part: &str| -> Result<u32, PortRangeError> {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(fail(&format!("{part:?} is not a number")));
            }
            part.parse::<u32>()
                .map_err(|_| fail(&format!("{part} is too large")))
        };
        let (first, last) = if let Some((a, b)) = s.split_once('-') {
            (number(a)?, number(b)?)
        } else if let Some((a, b)) = s.split_once('+') {
            let first = number(a)?;
            (first, first.saturating_add(number(b)?))
        } else {
            let port = number(s)?;
            (port, port)
        };
        if first == 0 {
            return Err(fail("port 0 is not a node port"));
        }
        if last > u32::from(u16::MAX) {
            return Err(fail(&format!("{last} is above 65535")));
        }
        if first > last {
            return Err(fail(&format!("{first} is above {last}")));
        }
        // Both fit in u16: checked above.
        let narrow = |v: u32| u16::try_from(v).map_err(|_| fail("out of range"));
        Ok(NodePortRange {
            first: narrow(first)?,
            last: narrow(last)?,
        })
    }
}

/// Drops the node ports of `info` (`spec.ports[].nodePort`, `spec.healthCheckNodePort`) outside
/// `range` and returns one warning per dropped port; the rest of the Service is untouched.
pub(crate) fn drop_out_of_range(info: &mut ServiceInfo, range: NodePortRange) -> Vec<Warning> {
    let object = ObjectRef {
        kind: Kind::Service,
        namespace: info.key.namespace.clone(),
        name: info.key.name.clone(),
    };
    let warning = |field: String, port: u16, what: &str| Warning {
        object: object.clone(),
        field,
        message: format!(
            "{port} is outside --service-node-port-range {range}; the {what} is not programmed"
        ),
    };
    let mut warnings = Vec::new();
    for (i, port) in info.ports.iter_mut().enumerate() {
        if let Some(np) = port.node_port.filter(|np| !range.contains(*np)) {
            warnings.push(warning(
                format!("spec.ports[{i}].nodePort"),
                np,
                "node port",
            ));
            port.node_port = None;
        }
    }
    if let Some(np) = info
        .health_check_node_port
        .filter(|np| !range.contains(*np))
    {
        warnings.push(warning(
            "spec.healthCheckNodePort".into(),
            np,
            "health check node port",
        ));
        info.health_check_node_port = None;
    }
    warnings
}
