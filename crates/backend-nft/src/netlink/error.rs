//! Why the netlink element path failed.

use std::fmt::Write as _;
use std::io;

use crate::sets::Field;

use super::batch::Operation;

/// Why [`super::ElementWriter`] failed. Whatever the variant, a transaction is all or nothing:
/// after an error the kernel holds none of it.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// A socket call failed (opening, sizing buffers, sending, receiving).
    #[error("netlink {context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// An element does not fit its set's declaration; nothing was sent.
    #[error("set {set}: cannot encode `{element}`: {reason}")]
    Encode {
        /// The set or map (or the table, for a bad table name).
        set: String,
        /// The element (`key : value`).
        element: String,
        /// What is wrong with it.
        reason: EncodeError,
    },
    /// The kernel rejected the transaction, which it then aborted as a whole.
    #[error("{}", rejected_text(*.operation, .set, .element, *.errno, .message, *.more))]
    Rejected {
        /// What the first failing message did.
        operation: Operation,
        /// Its set (`None` for an error of the batch as a whole).
        set: Option<String>,
        /// The element the kernel pointed at (`key : value`), when it did.
        element: Option<String>,
        /// The kernel's error number (`ENOENT`, `EEXIST`, …).
        errno: i32,
        /// The kernel's extended-ACK message, when it gave one.
        message: Option<String>,
        /// How many further messages of the batch failed too.
        more: usize,
    },
    /// The kernel answered something we did not ask for, or not at all.
    #[error("netlink protocol: {0}")]
    Protocol(String),
    /// The fake writer was told to fail (tests).
    #[error("{0}")]
    Injected(String),
}

/// Why one element (or name) cannot be encoded. Typed elements rule out malformed text; what
/// is left is a value that does not fit the set's declaration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The key or value has other fields than the set declares.
    #[error("fields {found:?} where the set declares {declared:?}")]
    Shape {
        /// What the set declares.
        declared: &'static [Field],
        /// What the element has.
        found: Vec<Field>,
    },
    /// An address of the other family than the table's.
    #[error("{0} is not an address of this table's family")]
    Family(String),
    /// A prefix in a set without `flags interval`.
    #[error("prefix {0} in a set without `flags interval`")]
    Range(String),
    /// A map element without a value.
    #[error("a map element needs a value")]
    MissingValue,
    /// A set element with a value.
    #[error("a set element has no value")]
    UnexpectedValue,
    /// A verdict in a data map, or data in a verdict map.
    #[error("the value's kind does not match the map's")]
    ValueKind,
    /// A key or value over `NFT_DATA_VALUE_MAXLEN`.
    #[error("longer than {0} bytes")]
    TooLong(usize),
    /// A table, set or chain name nft cannot have.
    #[error("name `{0}` is empty, too long or contains NUL")]
    Name(String),
}

fn rejected_text(
    operation: Operation,
    set: &Option<String>,
    element: &Option<String>,
    errno: i32,
    message: &Option<String>,
    more: usize,
) -> String {
    let mut s = format!("kernel rejected the transaction: {operation}");
    if let Some(set) = set {
        let _ = write!(s, " {set}");
    }
    if let Some(e) = element {
        let _ = write!(s, ", element `{e}`");
    }
    let _ = write!(s, ": {}", io::Error::from_raw_os_error(errno));
    if let Some(m) = message {
        let _ = write!(s, " ({m})");
    }
    if more > 0 {
        let _ = write!(s, "; {more} more message(s) of the batch failed too");
    }
    s
}

/// Wraps a system error with what we were doing.
pub(super) fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> NetlinkError {
    let context = context.into();
    move |source| NetlinkError::Io { context, source }
}
