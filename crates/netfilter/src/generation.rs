//! The nf_tables generation id and a table's rule handles, read straight from the kernel.
//!
//! Why: while a backend commits its own transactions the notification monitor has left its
//! group ([`crate::monitor`]), so someone else's commit landing then is not notified. The
//! kernel's generation id moves by one per committed transaction in the network namespace (a
//! refused one does not move it), so reading it before and after, against the backend's own
//! count of commits, tells that someone else committed meanwhile; a dump of the rule handles of
//! the backend's table (a few hundred rules, no element) then tells whether its rules changed.

use std::io;

use crate::attr::{self, NFNL_SUBSYS_NFTABLES, NLM_F_REQUEST, NLMSG_ERROR, string_attr, u16_at};
use crate::dump;
use crate::socket::Socket;

/// `NFT_MSG_NEWRULE`: what each rule of a dump arrives as.
const NFT_MSG_NEWRULE: u16 = 6;
/// `NFT_MSG_GETRULE`.
const NFT_MSG_GETRULE: u16 = 7;
/// `NFT_MSG_NEWGEN`: the answer to a generation request.
const NFT_MSG_NEWGEN: u16 = 15;
/// `NFT_MSG_GETGEN`.
const NFT_MSG_GETGEN: u16 = 16;
/// `NFTA_GEN_ID`.
const NFTA_GEN_ID: u16 = 1;
/// `NFTA_RULE_TABLE`.
const NFTA_RULE_TABLE: u16 = 1;
/// `NFTA_RULE_CHAIN`.
const NFTA_RULE_CHAIN: u16 = 2;
/// `NFTA_RULE_HANDLE`.
const NFTA_RULE_HANDLE: u16 = 3;

/// Reads the nf_tables generation id and a table's rule handles over one long-lived socket.
///
/// Why long-lived: a backend reads the generation before and after every sync. Closing a
/// netfilter socket that has sent something makes nf_tables finish its deferred destroy work,
/// which waits for an RCU grace period (2–15 ms measured) whenever the sync just deleted
/// something: a socket per read made a one-Service change 5–40× slower (docs/nftables.md,
/// "Talking to the kernel"). Until 2026-12-07 each read opened its own.
///
/// The socket is opened at the first read, in the calling thread's network namespace (the
/// thread that syncs, as the element writer's), and kept until the reader is dropped; after a
/// failed read (replies may still be queued) the next read opens a fresh one.
#[derive(Debug, Default)]
pub struct KernelReader {
    socket: Option<Socket>,
    /// Reused receive buffer.
    buf: Vec<u8>,
}

impl KernelReader {
    /// A reader that opens its socket at its first read.
    pub fn new() -> KernelReader {
        KernelReader::default()
    }

    /// The socket, opened on first use.
    fn socket(&mut self) -> io::Result<&Socket> {
        if self.socket.is_none() {
            self.socket = Some(Socket::open()?);
        }
        self.socket
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// Keeps the socket after `result` unless replies may still be queued on it.
    fn settle<T>(&mut self, result: io::Result<T>) -> io::Result<T> {
        match &result {
            Ok(_) => {}
            // The kernel's refusal of a dump ends it: nothing is left queued.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) => self.socket = None,
        }
        result
    }

    /// The network namespace's nf_tables generation id (one `NFT_MSG_GETGEN` request).
    ///
    /// # Errors
    /// The socket fails or the kernel refuses.
    pub fn generation(&mut self) -> io::Result<u32> {
        let result = self.read_generation();
        self.settle(result)
    }

    fn read_generation(&mut self) -> io::Result<u32> {
        let mut request = Vec::with_capacity(32);
        let start = attr::msg_start(
            &mut request,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN,
            NLM_F_REQUEST,
            1,
            libc::AF_UNSPEC as u8,
            0,
        );
        attr::msg_end(&mut request, start);
        if self.buf.len() < 8 * 1024 {
            self.buf.resize(8 * 1024, 0);
        }
        let mut buf = std::mem::take(&mut self.buf);
        let answer = (|| {
            let socket = self.socket()?;
            socket.send(&[request])?;
            loop {
                let n = socket.recv(&mut buf, false)?;
                if let Some(answer) = parse_generation(&buf[..n]) {
                    return answer;
                }
            }
        })();
        self.buf = buf;
        answer
    }

    /// Every rule of table `table` of `family` (`ip`, `ip6`) as (chain, handle), sorted:
    /// empty when there is no such table. One rule dump: no set element is read.
    ///
    /// # Errors
    /// The socket fails or the kernel refuses the dump.
    pub fn rule_handles(&mut self, family: &str, table: &str) -> io::Result<Vec<(String, u64)>> {
        self.rule_handles_where(family, table, |_, _| true)
    }

    /// The rules of [`KernelReader::rule_handles`] that `keep` keeps, given each rule's chain
    /// and attributes as sent (its expressions hold the name of a chain it jumps to: see
    /// [`attr::names`]).
    ///
    /// Why: in a table shared with other programs (iptables-nft's `nat`, `filter`, `mangle`,
    /// which Docker and CNIs write too) only the backend's own chains and the rules that jump
    /// to them are its to compare; the others' commits must not look like a change of its
    /// rules.
    ///
    /// # Errors
    /// The socket fails or the kernel refuses the dump.
    pub fn rule_handles_where(
        &mut self,
        family: &str,
        table: &str,
        keep: impl Fn(&str, &[u8]) -> bool,
    ) -> io::Result<Vec<(String, u64)>> {
        let request = dump::table_request(NFT_MSG_GETRULE, family, &[(NFTA_RULE_TABLE, table)])?;
        let mut rules = Vec::new();
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE;
        let result = self.socket().and_then(|socket| {
            dump::run_on(socket, request, kind, |msg| {
                rules.extend(rule_of_table(msg, table).filter(|(chain, _)| keep(chain, msg)))
            })
        });
        match self.settle(result) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(Vec::new()),
            other => other?,
        }
        rules.sort();
        Ok(rules)
    }
}

/// The answer to a generation request, once a datagram holds it.
fn parse_generation(datagram: &[u8]) -> Option<io::Result<u32>> {
    for msg in attr::messages(datagram) {
        match u16_at(msg, 4)? {
            NLMSG_ERROR => {
                let errno = dump::errno_of(msg);
                return Some(Err(io::Error::from_raw_os_error(if errno == 0 {
                    libc::EPROTO
                } else {
                    errno
                })));
            }
            k if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN => {
                let id = attr::nf_attrs(msg)
                    .find(|(ty, _)| *ty == NFTA_GEN_ID)
                    .and_then(|(_, p)| p.get(..4))
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                return Some(id.ok_or_else(|| io::Error::from_raw_os_error(libc::EPROTO)));
            }
            _ => {}
        }
    }
    None
}

/// The chain and handle of one `NFT_MSG_NEWRULE` message, when it belongs to `table` (older
/// kernels dump every table's rules whatever the request says).
fn rule_of_table(msg: &[u8], table: &str) -> Option<(String, u64)> {
    let (mut of_table, mut chain, mut handle) = (None, None, None);
    for (ty, payload) in attr::nf_attrs(msg) {
        match ty {
            NFTA_RULE_TABLE => of_table = Some(string_attr(payload)),
            NFTA_RULE_CHAIN => chain = Some(string_attr(payload)),
            NFTA_RULE_HANDLE => {
                handle = payload
                    .get(..8)
                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                    .map(u64::from_be_bytes)
            }
            _ => {}
        }
    }
    (of_table? == table).then_some((chain?, handle?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_answer_is_read_and_an_error_is_one() {
        let mut buf = Vec::new();
        let start = attr::msg_start(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN,
            0,
            1,
            0,
            0,
        );
        attr::put_attr(&mut buf, NFTA_GEN_ID, &7u32.to_be_bytes());
        attr::msg_end(&mut buf, start);
        assert_eq!(parse_generation(&buf).map(|r| r.ok()), Some(Some(7)));
        assert!(parse_generation(&[]).is_none());
    }

    #[test]
    fn a_rule_of_another_table_is_skipped() {
        let rule = |table: &str| {
            let mut buf = Vec::new();
            let start = attr::msg_start(
                &mut buf,
                (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE,
                0,
                1,
                libc::NFPROTO_IPV4 as u8,
                0,
            );
            attr::put_str(&mut buf, NFTA_RULE_TABLE, table);
            attr::put_str(&mut buf, NFTA_RULE_CHAIN, "services");
            attr::put_attr(&mut buf, NFTA_RULE_HANDLE, &42u64.to_be_bytes());
            attr::msg_end(&mut buf, start);
            buf
        };
        assert_eq!(
            rule_of_table(&rule("kpng"), "kpng"),
            Some(("services".to_string(), 42))
        );
        assert_eq!(rule_of_table(&rule("filter"), "kpng"), None);
    }
}
