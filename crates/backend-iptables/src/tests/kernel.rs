//! A fake kernel for the conformance harness: it replays the restore inputs the backend
//! committed (only those that succeeded) into chains of rules per family and table, and follows
//! a new connection through them, so that [`Harness::dispatch`] answers from what was
//! committed, not from what the backend was asked to do.
//!
//! The rule evaluator knows the matches and targets of kpng's own rules; an option it does not
//! know fails the test. Random choices (`statistic`) may or may not match: the answer is every
//! endpoint a connection may reach. Affinity checks (`recent --rcheck`) match the clients the
//! `recent` lists hold, which only connections made with [`Kernel::connect`] fill
//! (`recent --set`); such a connection takes its random choices in turn.
//!
//! [`Harness::dispatch`]: kpng_backend_kit::conformance::Harness::dispatch

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use kpng_backend_kit::conformance::{Client, Dispatch, Frontend, NODE_IPS};
use kpng_model::Family;

use crate::exec::{ExecError, Iptables, Recorder};
use crate::rules::Table;

/// Chains (with their rules, each after `-A CHAIN `) per family and table.
#[derive(Debug, Default)]
pub struct Kernel {
    chains: BTreeMap<(Family, &'static str, String), Vec<String>>,
    /// The `recent` lists (`--name`): the clients their `--set` saw, per family.
    recent: BTreeMap<(Family, String), BTreeSet<IpAddr>>,
    /// Connections made so far: the next one's random choice.
    connections: usize,
}

/// The recorder as the backend's iptables, applying each restore that succeeds to a
/// [`Kernel`].
#[derive(Clone, Default)]
pub struct FakeKernel {
    /// Every restore, failed ones too; fails on demand.
    pub recorder: Recorder,
    /// What was committed.
    pub kernel: Arc<Mutex<Kernel>>,
}

impl Iptables for FakeKernel {
    fn restore(&mut self, family: Family, input: &str) -> Result<(), ExecError> {
        self.recorder.restore(family, input)?;
        self.kernel.lock().expect("kernel").apply(family, input);
        Ok(())
    }
    /// What was committed to `table` (cleanup and full syncs read it back).
    fn save(&mut self, family: Family, table: Table) -> Result<String, ExecError> {
        Ok(self.kernel.lock().expect("kernel").save(family, table))
    }
    /// The recorder's canaries (an intact node), else what was committed.
    fn list_chain(
        &mut self,
        family: Family,
        table: Table,
        chain: &str,
    ) -> Result<Option<String>, ExecError> {
        if let Some(listed) = self.recorder.list_chain(family, table, chain)? {
            return Ok(Some(listed));
        }
        let kernel = self.kernel.lock().expect("kernel");
        let rules = kernel.chains.get(&(family, table.name(), chain.to_owned()));
        Ok(rules.map(|rules| {
            let mut out = format!("-N {chain}\n");
            for spec in rules {
                out.push_str(&format!("-A {chain} {spec}\n"));
            }
            out
        }))
    }
    fn enable_route_localnet(&mut self) -> Result<(), ExecError> {
        self.recorder.enable_route_localnet()
    }
    fn describe(&self) -> String {
        self.recorder.describe()
    }
    fn watcher(&self) -> Option<Box<dyn Iptables>> {
        self.recorder.watcher()
    }
    fn chains_per_restore(&self) -> Option<usize> {
        self.recorder.chains_per_restore()
    }
}

fn table_name(name: &str) -> &'static str {
    Table::ALL
        .iter()
        .map(|t| t.name())
        .find(|n| *n == name)
        .unwrap_or_else(|| panic!("no table {name}"))
}

/// The built-in chains this fake knows (they exist without a declaration).
const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

impl Kernel {
    /// Applies one committed restore input (`--noflush`).
    pub fn apply(&mut self, family: Family, input: &str) {
        let mut table = "";
        for line in input.lines().map(str::trim) {
            let key = |chain: &str| (family, table, chain.to_owned());
            let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
            match op {
                "" | "COMMIT" => {}
                _ if op.starts_with('#') => {}
                _ if op.starts_with('*') => table = table_name(&op[1..]),
                _ if op.starts_with(':') => {
                    // A user chain's declaration creates or flushes it.
                    let rules = self.chains.entry(key(&op[1..])).or_default();
                    if rest.starts_with('-') {
                        rules.clear();
                    }
                }
                "-N" => {
                    self.chains.entry(key(rest)).or_default();
                }
                "-F" => self.chains.entry(key(rest)).or_default().clear(),
                "-X" => {
                    self.chains.remove(&key(rest));
                }
                "-A" | "-I" | "-D" => {
                    let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
                    let rules = self.chains.entry(key(chain)).or_default();
                    match op {
                        "-A" => rules.push(spec.to_owned()),
                        "-I" => {
                            let (at, spec) = match spec.split_once(' ') {
                                Some((n, s)) if n.parse::<usize>().is_ok() => {
                                    (n.parse::<usize>().unwrap_or(1), s)
                                }
                                _ => (1, spec),
                            };
                            rules.insert((at - 1).min(rules.len()), spec.to_owned());
                        }
                        _ => {
                            let at = rules.iter().position(|r| r == spec);
                            let at = at.unwrap_or_else(|| panic!("-D of a missing rule: {line}"));
                            rules.remove(at);
                        }
                    }
                }
                _ => panic!("the fake kernel does not know `{line}`"),
            }
        }
    }

    /// `table` as `iptables-save -t TABLE` prints it.
    pub fn save(&self, family: Family, table: Table) -> String {
        let mut out = format!("*{}\n", table.name());
        let ours = |(f, t, _): &&(Family, &str, String)| *f == family && *t == table.name();
        for (_, _, chain) in self.chains.keys().filter(ours) {
            let policy = if BUILTIN.contains(&chain.as_str()) {
                "ACCEPT"
            } else {
                "-"
            };
            out.push_str(&format!(":{chain} {policy} [0:0]\n"));
        }
        for ((_, _, chain), rules) in self.chains.iter().filter(|(k, _)| ours(k)) {
            for spec in rules {
                out.push_str(&format!("-A {chain} {spec}\n"));
            }
        }
        out.push_str("COMMIT\n");
        out
    }

    /// Follows a new connection from `from` to `to`: nat `PREROUTING`, and, when nothing was
    /// DNATed, the filter chain it meets next (`INPUT` for an address of the node, `FORWARD`
    /// otherwise).
    pub fn dispatch(&self, to: Frontend, from: Client) -> Dispatch {
        self.follow(to, from, None).0
    }

    /// Makes one new connection from `from` to `to` (as [`Kernel::dispatch`] follows it),
    /// with this connection's random choices, and records the client in the `recent` lists
    /// it passes with `--set`.
    pub fn connect(&mut self, to: Frontend, from: Client) -> Dispatch {
        let pick = self.connections;
        self.connections += 1;
        let (dispatch, set) = self.follow(to, from, Some(pick));
        let family = Family::of(&to.ip);
        for name in set {
            self.recent
                .entry((family, name))
                .or_default()
                .insert(from.address(family));
        }
        dispatch
    }

    /// Where a connection goes and the `recent` lists it is to be set in; `pick`: a
    /// connection's random choice, `None` for every choice.
    fn follow(&self, to: Frontend, from: Client, pick: Option<usize>) -> (Dispatch, Vec<String>) {
        let family = Family::of(&to.ip);
        let local = NODE_IPS.iter().any(|a| a.parse() == Ok(to.ip));
        let eval = Eval {
            kernel: self,
            family,
            saddr: from.address(family),
            daddr: to.ip,
            proto: to.protocol.lower(),
            dport: to.port,
            local,
            pick,
            set: RefCell::new(Vec::new()),
        };
        let dispatch = eval.dispatch();
        (dispatch, eval.set.into_inner())
    }
}

impl Eval<'_> {
    fn dispatch(&self) -> Dispatch {
        let (endpoints, _) = self.chain("nat", "PREROUTING", 0);
        if !endpoints.is_empty() {
            return Dispatch::To(endpoints);
        }
        let filter = if self.local { "INPUT" } else { "FORWARD" };
        match self.chain("filter", filter, 0) {
            (_, End::Refused) => Dispatch::Refused,
            _ => Dispatch::Unknown,
        }
    }
}

/// How a chain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Fell through or returned: the caller goes on.
    Continue,
    /// DNAT, ACCEPT: the table is done with the packet.
    Done,
    /// DROP or REJECT.
    Refused,
}

/// Whether a rule's matches hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hit {
    No,
    Yes,
    /// A random choice or an affinity check: some connections.
    Maybe,
}

struct Eval<'k> {
    kernel: &'k Kernel,
    family: Family,
    saddr: IpAddr,
    daddr: IpAddr,
    proto: &'static str,
    dport: u16,
    local: bool,
    /// A connection's random choice (`None`: every choice, as [`Hit::Maybe`]).
    pick: Option<usize>,
    /// The `recent` lists a connection made with `pick` is set in.
    set: RefCell<Vec<String>>,
}

impl Eval<'_> {
    /// The endpoints a connection may be DNATed to in `chain`, and how the chain ends.
    fn chain(&self, table: &str, chain: &str, depth: usize) -> (BTreeSet<SocketAddr>, End) {
        assert!(depth < 16, "chain loop at {chain}");
        let key = (self.family, table_name(table), chain.to_owned());
        let rules = match self.kernel.chains.get(&key) {
            Some(rules) => rules.as_slice(),
            None if BUILTIN.contains(&chain) => &[],
            None => panic!("a rule jumps to {table} chain {chain}, which does not exist"),
        };
        let mut endpoints = BTreeSet::new();
        // A connection's choice among the chain's random rules (and the rule after the last).
        let random = |r: &&String| r.contains("--probability");
        let choices = rules.iter().filter(random).count() + 1;
        let mut nth_random = 0;
        for rule in rules {
            let chance = match self.pick {
                None => Hit::Maybe,
                Some(pick) if pick % choices == nth_random => Hit::Yes,
                Some(_) => Hit::No,
            };
            if random(&rule) {
                nth_random += 1;
            }
            let (hit, target, to, set) = self.rule(rule, chance);
            if hit == Hit::No {
                continue;
            }
            if let Some(name) = set.filter(|_| self.pick.is_some()) {
                self.set.borrow_mut().push(name);
            }
            let end = match target.as_str() {
                "DNAT" => {
                    let to = to.unwrap_or_else(|| panic!("DNAT without destination: {rule}"));
                    endpoints.insert(to.parse().expect("DNAT destination"));
                    End::Done
                }
                "DROP" | "REJECT" => End::Refused,
                "ACCEPT" => End::Done,
                "RETURN" => End::Continue,
                "MARK" | "MASQUERADE" | "" => continue,
                chain => {
                    let (found, end) = self.chain(table, chain, depth + 1);
                    endpoints.extend(found);
                    end
                }
            };
            if hit == Hit::Yes && (end != End::Continue || target == "RETURN") {
                return (endpoints, end);
            }
        }
        (endpoints, End::Continue)
    }

    /// A rule's matches (`chance`: what a random one does), its target, the DNAT destination
    /// and the `recent` list it sets.
    fn rule(&self, rule: &str, chance: Hit) -> (Hit, String, Option<String>, Option<String>) {
        let words = split(rule);
        let mut hit = Hit::Yes;
        let (mut target, mut to) = (String::new(), None);
        let (mut name, mut set) = (String::new(), None);
        let mut negate = false;
        let mut i = 0;
        let mut fold = |this: Hit| {
            hit = match (hit, this) {
                (Hit::No, _) | (_, Hit::No) => Hit::No,
                (Hit::Maybe, _) | (_, Hit::Maybe) => Hit::Maybe,
                _ => Hit::Yes,
            };
        };
        while i < words.len() {
            let arg = words.get(i + 1).map(String::as_str).unwrap_or("");
            let mut test = |holds: bool| {
                let holds = holds != negate;
                fold(if holds { Hit::Yes } else { Hit::No });
            };
            let step = match words[i].as_str() {
                "!" => {
                    negate = true;
                    i += 1;
                    continue;
                }
                "-m" | "--comment" | "--seconds" | "--set-xmark" | "--or-mark" | "--xor-mark"
                | "--reject-with" | "--mode" => 2,
                "--name" => {
                    name = arg.to_owned();
                    2
                }
                "--set" => {
                    set = Some(name.clone());
                    1
                }
                "--rcheck" => {
                    let key = (self.family, name.clone());
                    test(
                        self.kernel
                            .recent
                            .get(&key)
                            .is_some_and(|clients| clients.contains(&self.saddr)),
                    );
                    1
                }
                "--reap" | "--random-fully" => 1,
                "-p" => {
                    test(arg == self.proto);
                    2
                }
                "--dport" => {
                    test(arg == self.dport.to_string());
                    2
                }
                "-s" => {
                    test(contains(arg, self.saddr));
                    2
                }
                "-d" => {
                    test(contains(arg, self.daddr));
                    2
                }
                "--src-type" => {
                    // The clients are never the node itself.
                    test(false);
                    2
                }
                "--dst-type" => {
                    test(self.local || self.daddr.is_loopback());
                    2
                }
                "--ctstate" => {
                    test(arg.split(',').any(|s| s == "NEW"));
                    2
                }
                "--mark" => {
                    // Nothing marks the packets before the filter table here.
                    test(false);
                    2
                }
                "--probability" => {
                    fold(chance);
                    2
                }
                "-j" => {
                    target = arg.to_owned();
                    2
                }
                "--to-destination" => {
                    to = Some(arg.to_owned());
                    2
                }
                other => panic!("the fake kernel does not know `{other}` in `{rule}`"),
            };
            negate = false;
            i += step;
        }
        (hit, target, to, set)
    }
}

/// Whether `addr` is in `spec` (an address or a network).
fn contains(spec: &str, addr: IpAddr) -> bool {
    match (spec.parse::<IpNet>(), spec.parse::<IpAddr>()) {
        (Ok(net), _) => net.contains(&addr),
        (_, Ok(a)) => a == addr,
        _ => panic!("not an address: {spec}"),
    }
}

/// A rule's words, a double-quoted comment as one.
fn split(rule: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = rule.trim();
    while !rest.is_empty() {
        let (word, after) = match rest.strip_prefix('"') {
            Some(quoted) => quoted.split_once('"').unwrap_or((quoted, "")),
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        out.push(word.to_owned());
        rest = after.trim_start();
    }
    out
}
