//! A fake kernel for the conformance harness: it replays the nft scripts the backend committed
//! (only those that succeeded) into tables of chains and set elements, and follows a new
//! connection through them, so that [`Harness::dispatch`] answers from what was committed, not
//! from what the backend was asked to do.
//!
//! The rule evaluator knows the vocabulary of kpng's own ruleset (address, protocol and port
//! matches, set lookups, verdict maps, `goto`/`jump`, `dnat … map`, the conntrack mark's
//! affinity id); a line of a script it does not know fails the test, and an expression it
//! cannot evaluate (the IPv6 affinity key's `jhash`) makes its rule not match. The affinity
//! map the packet path fills (`update @affinity`) is filled by the connections made with
//! [`Kernel::connect`], which take their random choices (`numgen`) in turn.
//!
//! [`Harness::dispatch`]: kpng_backend_kit::conformance::Harness::dispatch

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use kpng_backend_kit::conformance::{Client, Dispatch, Frontend, NODE_IPS};
use kpng_backend_kit::exec::{ExecError, Recorder, ScriptExec};
use kpng_model::Family;

/// One table: chains with their rules, sets and maps with their elements (key → value text,
/// empty for sets).
#[derive(Debug, Default)]
struct Table {
    chains: BTreeMap<String, Vec<String>>,
    sets: BTreeMap<String, BTreeMap<String, String>>,
}

/// The tables, by `family name` (`ip kpng`).
#[derive(Debug, Default)]
pub struct Kernel {
    tables: BTreeMap<String, Table>,
    /// Connections made so far: the next one's random choice.
    connections: usize,
}

/// The recorder as the backend's executor, applying each script that succeeds to a [`Kernel`].
#[derive(Clone, Default)]
pub struct FakeKernel {
    /// Every script, failed ones too; fails on demand.
    pub recorder: Recorder,
    /// What was committed.
    pub kernel: Arc<Mutex<Kernel>>,
}

impl ScriptExec for FakeKernel {
    fn run(&mut self, script: &str) -> Result<(), ExecError> {
        self.recorder.run(script)?;
        self.kernel.lock().expect("kernel").apply(script);
        Ok(())
    }
}

/// Where a block of lines goes while a script is read.
enum Block {
    None,
    Table(String),
    Chain(String, String),
    Elements(String, String, bool),
}

impl Kernel {
    fn table(&mut self, name: &str) -> &mut Table {
        self.tables.entry(name.to_owned()).or_default()
    }

    /// Applies one committed script.
    pub fn apply(&mut self, script: &str) {
        let mut block = Block::None;
        for line in script.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            match &block {
                Block::Elements(table, set, add) => {
                    if line == "}" {
                        block = Block::None;
                    } else {
                        let (table, set, add) = (table.clone(), set.clone(), *add);
                        let element = line.trim_end_matches(',');
                        let (left, value) = element.split_once(" : ").unwrap_or((element, ""));
                        let key = left.split(" comment \"").next().unwrap_or(left);
                        let elements = self.table(&table).sets.entry(set).or_default();
                        if add {
                            elements.insert(key.to_owned(), value.to_owned());
                        } else {
                            elements.remove(key);
                        }
                    }
                    continue;
                }
                Block::Chain(table, chain) => {
                    if line == "}" {
                        block = Block::Table(table.clone());
                    } else if !line.starts_with("type ") && !line.starts_with("comment ") {
                        let (table, chain) = (table.clone(), chain.clone());
                        let rules = self.table(&table).chains.entry(chain).or_default();
                        rules.push(line.to_owned());
                    }
                    continue;
                }
                Block::Table(table) => {
                    let table = table.clone();
                    match words.as_slice() {
                        ["}"] => block = Block::None,
                        ["comment", ..] => {}
                        ["set" | "map", name, ..] => {
                            self.table(&table)
                                .sets
                                .entry((*name).to_owned())
                                .or_default();
                        }
                        ["chain", name, "{"] => {
                            self.table(&table)
                                .chains
                                .entry((*name).to_owned())
                                .or_default();
                            block = Block::Chain(table, (*name).to_owned());
                        }
                        _ => panic!("the fake kernel does not know `{line}` in a table"),
                    }
                    continue;
                }
                Block::None => {}
            }
            match words.as_slice() {
                ["add", "table", f, t] => {
                    self.table(&format!("{f} {t}"));
                }
                ["delete", "table", f, t] => {
                    self.tables.remove(&format!("{f} {t}"));
                }
                ["flush", "table", f, t] => {
                    let table = self.table(&format!("{f} {t}"));
                    table.chains.values_mut().for_each(Vec::clear);
                    table.sets.values_mut().for_each(BTreeMap::clear);
                }
                ["table", f, t, "{"] => block = Block::Table(format!("{f} {t}")),
                ["add", "chain", f, t, c] => {
                    self.table(&format!("{f} {t}"))
                        .chains
                        .entry((*c).to_owned())
                        .or_default();
                }
                ["flush", "chain", f, t, c] => {
                    if let Some(rules) = self.table(&format!("{f} {t}")).chains.get_mut(*c) {
                        rules.clear();
                    }
                }
                ["delete", "chain", f, t, c] => {
                    self.table(&format!("{f} {t}")).chains.remove(*c);
                }
                ["add", "rule", f, t, c, rule @ ..] => {
                    self.table(&format!("{f} {t}"))
                        .chains
                        .entry((*c).to_owned())
                        .or_default()
                        .push(rule.join(" "));
                }
                [op @ ("add" | "delete"), "element", f, t, set, "{"] => {
                    block = Block::Elements(format!("{f} {t}"), (*set).to_owned(), *op == "add");
                }
                _ => panic!("the fake kernel does not know `{line}`"),
            }
        }
    }

    /// Follows a new connection from `from` to `to`: the NAT prerouting hook (firewall, then
    /// dispatch), and, when nothing was DNATed, the filter hook it meets next (input for an
    /// address of the node, forward otherwise).
    pub fn dispatch(&self, to: Frontend, from: Client) -> Dispatch {
        self.follow(to, from, None).0
    }

    /// Makes one new connection from `from` to `to` (as [`Kernel::dispatch`] follows it), with
    /// this connection's random choice; a DNATed one then passes the filter hook, whose
    /// `update` statements fill the affinity map as the kernel's packet path does.
    pub fn connect(&mut self, to: Frontend, from: Client) -> Dispatch {
        let pick = self.connections;
        self.connections += 1;
        let (dispatch, updates) = self.follow(to, from, Some(pick));
        for (table, set, key, value) in updates {
            let elements = self.table(&table).sets.entry(set).or_default();
            elements.insert(key, value);
        }
        dispatch
    }

    /// Where a connection goes, and the updates its packet path makes (`table`, `set`, key,
    /// value); `pick`: a connection's random choice, `None` for every choice.
    fn follow(&self, to: Frontend, from: Client, pick: Option<usize>) -> (Dispatch, Updates) {
        let family = Family::of(&to.ip);
        let prefix = match family {
            Family::V4 => "ip ",
            Family::V6 => "ip6 ",
        };
        let Some((name, table)) = self
            .tables
            .iter()
            .find(|(name, _)| name.starts_with(prefix))
        else {
            return (Dispatch::Unknown, Vec::new());
        };
        let packet = Packet {
            saddr: from.address(family),
            daddr: to.ip,
            proto: to.protocol.lower(),
            dport: to.port,
        };
        let eval = Eval::new(table, packet, pick);
        let dispatch = eval.dispatch(to);
        let updates = eval.updates.into_inner();
        let updates = updates
            .into_iter()
            .map(|(set, key, value)| (name.clone(), set, key, value))
            .collect();
        (dispatch, updates)
    }
}

/// Updates of a set by the packet path: (table, set, key, value).
type Updates = Vec<(String, String, String, String)>;

impl Eval<'_> {
    fn new(table: &Table, packet: Packet, pick: Option<usize>) -> Eval<'_> {
        Eval {
            table,
            packet,
            pick,
            mark: Cell::new(0),
            dnat: false,
            updates: RefCell::new(Vec::new()),
        }
    }

    /// The NAT prerouting hook, then for a connection (`pick`) that was DNATed the filter
    /// forward hook it meets next (an endpoint is a pod, never an address of the node), or for
    /// one that was not the filter hook it meets next.
    fn dispatch(&self, to: Frontend) -> Dispatch {
        match self.chain("nat-prerouting", 0) {
            Step::To(endpoints) => {
                if let (Some(_), Some(endpoint)) = (self.pick, endpoints.first()) {
                    let after = Eval {
                        table: self.table,
                        packet: Packet {
                            daddr: endpoint.ip(),
                            dport: endpoint.port(),
                            ..self.packet
                        },
                        pick: self.pick,
                        mark: self.mark.clone(),
                        dnat: true,
                        updates: RefCell::new(Vec::new()),
                    };
                    after.chain("filter-forward", 0);
                    self.updates.borrow_mut().extend(after.updates.into_inner());
                }
                return Dispatch::To(endpoints);
            }
            Step::Refused => return Dispatch::Refused,
            Step::Continue => {}
        }
        let local = NODE_IPS.iter().any(|a| a.parse() == Ok(to.ip));
        let filter = if local {
            "filter-input"
        } else {
            "filter-forward"
        };
        match self.chain(filter, 0) {
            Step::Refused => Dispatch::Refused,
            Step::To(endpoints) => Dispatch::To(endpoints),
            Step::Continue => Dispatch::Unknown,
        }
    }
}

/// The first packet of a connection.
#[derive(Clone, Copy)]
struct Packet {
    saddr: IpAddr,
    daddr: IpAddr,
    proto: &'static str,
    dport: u16,
}

/// What a chain (or a rule) decided.
#[derive(Debug)]
enum Step {
    /// Nothing: the packet goes on.
    Continue,
    /// Dropped or rejected.
    Refused,
    /// DNATed to one of these.
    To(BTreeSet<SocketAddr>),
}

struct Eval<'t> {
    table: &'t Table,
    packet: Packet,
    /// A connection's random choice (`None`: every choice).
    pick: Option<usize>,
    /// The conntrack mark, as the rules set it.
    mark: Cell<u32>,
    /// Whether the packet was DNATed (`ct status dnat`).
    dnat: bool,
    /// What the packet path's `update` statements put in sets: (set, key, value).
    updates: RefCell<Vec<(String, String, String)>>,
}

const VERDICTS: [&str; 7] = ["vmap", "goto", "jump", "drop", "reject", "dnat", "accept"];

impl Eval<'_> {
    fn chain(&self, name: &str, depth: usize) -> Step {
        assert!(depth < 16, "chain loop at {name}");
        let Some(rules) = self.table.chains.get(name) else {
            panic!("a rule goes to chain {name}, which does not exist");
        };
        for rule in rules {
            if let Some(step) = self.rule(rule, depth) {
                return step;
            }
        }
        Step::Continue
    }

    /// `None`: the rule did not match (or only changed marks); the chain goes on.
    fn rule(&self, rule: &str, depth: usize) -> Option<Step> {
        let t: Vec<&str> = rule.split_whitespace().collect();
        if !t.iter().any(|w| VERDICTS.contains(w)) {
            self.statement(&t);
            return None;
        }
        let mut i = 0;
        while i < t.len() {
            match t[i] {
                "drop" | "reject" => return Some(Step::Refused),
                "accept" => return Some(Step::Continue),
                "goto" => return Some(self.chain(t.get(i + 1)?, depth + 1)),
                "jump" => {
                    return match self.chain(t.get(i + 1)?, depth + 1) {
                        Step::Continue => None,
                        step => Some(step),
                    };
                }
                "dnat" => return self.dnat(&t[i + 1..]),
                "fib" => {
                    // `fib saddr|daddr type local`: the clients are never the node itself.
                    let local = match t.get(i + 1) {
                        Some(&"daddr") => {
                            NODE_IPS.iter().any(|a| a.parse() == Ok(self.packet.daddr))
                        }
                        _ => false,
                    };
                    if !local {
                        return None;
                    }
                    i += 4;
                }
                _ => {
                    let (keys, next) = self.expr(&t, i)?;
                    i = next;
                    match t.get(i).copied() {
                        Some("vmap") => {
                            let set = t.get(i + 1)?.strip_prefix('@')?;
                            let value = keys.iter().find_map(|k| self.lookup(set, k))?;
                            return self.rule(value, depth);
                        }
                        Some("!=") => {
                            let (hit, next) = self.matches(&keys, t.get(i + 1)?, &t, i + 1);
                            if hit {
                                return None;
                            }
                            i = next;
                        }
                        Some(word) => {
                            let (hit, next) = self.matches(&keys, word, &t, i);
                            if !hit {
                                return None;
                            }
                            i = next;
                        }
                        None => return None,
                    }
                }
            }
        }
        None
    }

    /// A rule without a verdict: the conntrack mark's affinity id (`ct mark set ct mark & M`,
    /// `KEY @set ct mark set ct mark | BIT`) and, for a connection, the affinity map's
    /// `update`s (those whose key it can evaluate). Anything else changes nothing here.
    fn statement(&self, t: &[&str]) {
        let set_at = t.windows(3).position(|w| w == ["ct", "mark", "set"]);
        if let Some(at) = set_at {
            if at > 0 {
                let Some((keys, i)) = self.expr(t, 0) else {
                    return;
                };
                let Some(word) = t.get(i) else { return };
                if !self.matches(&keys, word, t, i).0 {
                    return;
                }
            }
            // `ct mark set ct mark & X` or `ct mark set ct mark | X`.
            let (op, value) = (t.get(at + 5).copied(), t.get(at + 6).and_then(|v| hex(v)));
            match (op, value) {
                (Some("&"), Some(v)) => self.mark.set(self.mark.get() & v),
                (Some("|"), Some(v)) => self.mark.set(self.mark.get() | v),
                _ => panic!("the fake kernel does not know `{}`", t.join(" ")),
            }
            return;
        }
        if self.pick.is_none() {
            return;
        }
        let mut i = 0;
        while t.get(i) == Some(&"update") {
            let Some(set) = t.get(i + 1).and_then(|s| s.strip_prefix('@')) else {
                return;
            };
            let Some((keys, after_key)) = self.expr(t, i + 3) else {
                return;
            };
            // `timeout Ns : VALUE }`
            let Some((values, after_value)) = self.expr(t, after_key + 3) else {
                return;
            };
            if let ([key], [value]) = (keys.as_slice(), values.as_slice()) {
                self.updates
                    .borrow_mut()
                    .push((set.to_owned(), key.clone(), value.clone()));
            }
            i = after_value + 1;
        }
    }

    /// Whether one of `keys` matches the operand at `t[i]` (a `@set`, a `{ … }` list or one
    /// value), and the index after the operand.
    fn matches(&self, keys: &[String], word: &str, t: &[&str], i: usize) -> (bool, usize) {
        if let Some(set) = word.strip_prefix('@') {
            let hit = keys.iter().any(|k| {
                self.table
                    .sets
                    .get(set)
                    .is_some_and(|elements| elements.keys().any(|e| key_matches(e, k)))
            });
            return (hit, i + 1);
        }
        if word == "{" {
            let end = t[i..]
                .iter()
                .position(|w| *w == "}")
                .map_or(t.len(), |p| i + p);
            let hit = t[i + 1..end]
                .iter()
                .any(|v| keys.iter().any(|k| key_matches(v.trim_end_matches(','), k)));
            return (hit, end + 1);
        }
        (keys.iter().any(|k| key_matches(word, k)), i + 1)
    }

    /// An expression (terms joined by `.`) at `t[i]`: its possible values (more than one for
    /// `numgen random mod N`), and the index after it; `None` for a term it cannot evaluate.
    fn expr(&self, t: &[&str], mut i: usize) -> Option<(Vec<String>, usize)> {
        let mut keys = vec![String::new()];
        loop {
            let term = t.get(i)?.trim_start_matches('(');
            let values: Vec<String> = match (term, t.get(i + 1).copied()) {
                ("ip" | "ip6", Some("saddr")) => vec![self.packet.saddr.to_string()],
                ("ip" | "ip6", Some("daddr")) => vec![self.packet.daddr.to_string()],
                ("meta", Some("l4proto")) => vec![self.packet.proto.to_owned()],
                ("th" | "tcp" | "udp" | "sctp", Some("dport")) => {
                    vec![self.packet.dport.to_string()]
                }
                ("ct", Some("state")) => vec!["new".to_owned()],
                ("ct", Some("status")) => {
                    vec![if self.dnat { "dnat" } else { "none" }.to_owned()]
                }
                ("ct", Some("mark")) => {
                    // `ct mark & X`, `ct mark & X | Y`: the affinity id, as the set elements
                    // write it (`0x1000`).
                    let mut value = self.mark.get();
                    if t.get(i + 2) == Some(&"&") {
                        value &= hex(t.get(i + 3)?)?;
                        i += 2;
                        if t.get(i + 2) == Some(&"|") {
                            value |= hex(t.get(i + 3)?)?;
                            i += 2;
                        }
                    }
                    vec![format!("{value:#x}")]
                }
                ("numgen", Some("random")) => {
                    let n: usize = t.get(i + 3)?.parse().ok()?;
                    i += 2;
                    match self.pick {
                        Some(pick) => vec![(pick % n.max(1)).to_string()],
                        None => (0..n).map(|s| s.to_string()).collect(),
                    }
                }
                _ => return None,
            };
            i += 2;
            keys = keys
                .iter()
                .flat_map(|k| {
                    values.iter().map(move |v| {
                        if k.is_empty() {
                            v.clone()
                        } else {
                            format!("{k} . {v}")
                        }
                    })
                })
                .collect();
            if t.get(i) != Some(&".") {
                return Some((keys, i));
            }
            i += 1;
        }
    }

    /// `dnat ip to EXPR map @M`: every endpoint of `M` one of the expression's values finds.
    fn dnat(&self, t: &[&str]) -> Option<Step> {
        let (keys, i) = self.expr(t, 2)?;
        if t.get(i) != Some(&"map") {
            return None;
        }
        let set = t.get(i + 1)?.strip_prefix('@')?;
        let endpoints: BTreeSet<SocketAddr> = keys
            .iter()
            .filter_map(|k| self.lookup(set, k))
            .filter_map(|v| {
                let (ip, port) = v.split_once(" . ")?;
                Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
            })
            .collect();
        (!endpoints.is_empty()).then_some(Step::To(endpoints))
    }

    fn lookup(&self, set: &str, key: &str) -> Option<&str> {
        let elements = self.table.sets.get(set)?;
        elements
            .iter()
            .find(|(e, _)| key_matches(e, key))
            .map(|(_, v)| v.as_str())
    }
}

/// The value of a `0x…` word (a closing parenthesis after it ignored).
fn hex(word: &str) -> Option<u32> {
    let digits = word.trim_end_matches(')').strip_prefix("0x")?;
    u32::from_str_radix(digits, 16).ok()
}

/// Whether the element (or literal) `element` matches the packet's `key`, field by field: a
/// field that is a network contains an address.
fn key_matches(element: &str, key: &str) -> bool {
    let (e, k): (Vec<&str>, Vec<&str>) =
        (element.split(" . ").collect(), key.split(" . ").collect());
    e.len() == k.len()
        && e.iter().zip(&k).all(|(e, k)| {
            e == k
                || match (e.parse::<IpNet>(), k.parse::<IpAddr>()) {
                    (Ok(net), Ok(addr)) => net.contains(&addr),
                    _ => false,
                }
        })
}
