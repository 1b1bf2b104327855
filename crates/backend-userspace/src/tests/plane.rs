//! Where a new connection goes, for the conformance harness: read from the capture entries
//! the backend committed (the recording capture: which listener, or refused, in the order the
//! Linux capture matches them) and from the endpoint list the running listener's proxy picks
//! from, never from the Service ports the scenario handed the backend.

use std::net::IpAddr;

use kpng_backend_kit::conformance::{Client, Dispatch, Frontend};
use kpng_model::{Family, Protocol};

use crate::UserspaceBackend;
use crate::entries::{Action, Entry, EntryKey};
use crate::routing::Scope;

/// Where `entries` (the committed capture) and `backend`'s listeners send a connection from
/// `from` to `to`.
pub fn dispatch(
    backend: &UserspaceBackend,
    entries: &[Entry],
    to: Frontend,
    from: Client,
) -> Dispatch {
    route(backend, entries, to, from, false)
}

/// Makes one connection from `from` to `to`: the capture as for [`dispatch`], then the
/// listener's proxy picks its endpoint (recording the client's affinity).
pub fn connect(
    backend: &UserspaceBackend,
    entries: &[Entry],
    to: Frontend,
    from: Client,
) -> Dispatch {
    route(backend, entries, to, from, true)
}

/// [`dispatch`], or with `connect` [`connect`].
fn route(
    backend: &UserspaceBackend,
    entries: &[Entry],
    to: Frontend,
    from: Client,
    connect: bool,
) -> Dispatch {
    let family = Family::of(&to.ip);
    let saddr = from.address(family);
    let (ip, protocol, port) = (to.ip, to.protocol, to.port);
    let has = |key: &EntryKey| entries.iter().any(|e| e.key == *key);
    let any = |f: &dyn Fn(&EntryKey) -> bool| entries.iter().any(|e| f(&e.key));
    let node_port_address =
        any(&|k| matches!(k, EntryKey::NodePortAddresses(n) if n.contains(&ip)));
    let from_pod = any(&|k| matches!(k, EntryKey::PodCidr(n) if n.contains(&saddr)));
    if has(&EntryKey::FirewallVip { ip, protocol, port })
        && !any(&|k| allows(k, ip, protocol, port, saddr))
    {
        return Dispatch::Refused;
    }
    let mut keys = Vec::new();
    if from_pod {
        keys.push(EntryKey::VipShortCircuit { ip, protocol, port });
        if node_port_address {
            keys.push(EntryKey::NodePortShortCircuit {
                family,
                protocol,
                port,
            });
        }
    }
    keys.push(EntryKey::Vip { ip, protocol, port });
    if node_port_address {
        keys.push(EntryKey::NodePort {
            family,
            protocol,
            port,
        });
    }
    let action = keys.iter().find_map(|key| {
        entries
            .iter()
            .find(|e| e.key == *key && e.action != Action::Member)
            .map(|e| e.action)
    });
    match action {
        Some(Action::Redirect(listener)) => {
            listener_endpoints(backend, (family, protocol, listener), saddr, connect)
        }
        Some(Action::Refuse | Action::Drop) => Dispatch::Refused,
        Some(Action::Member) | None => {
            let in_cidr = any(&|k| matches!(k, EntryKey::ServiceCidr(n) if n.contains(&ip)));
            if has(&EntryKey::ClusterIp(ip)) || in_cidr {
                Dispatch::Refused
            } else {
                Dispatch::Unknown
            }
        }
    }
}

fn allows(key: &EntryKey, ip: IpAddr, protocol: Protocol, port: u16, saddr: IpAddr) -> bool {
    matches!(key, EntryKey::FirewallAllow { ip: i, protocol: p, port: q, source }
        if *i == ip && *p == protocol && *q == port && source.contains(&saddr))
}

/// The endpoints of the listener on `listener`: the list its proxy picks from for `client`
/// for the way in the listener serves (with `connect`, the one it picks for a new
/// connection). A port nothing listens on refuses the connection.
fn listener_endpoints(
    backend: &UserspaceBackend,
    (family, protocol, listener): (Family, Protocol, u16),
    client: IpAddr,
    connect: bool,
) -> Dispatch {
    for (key, proxy) in &backend.ports {
        if key.family != family || key.protocol != protocol {
            continue;
        }
        let ways = [
            (Some(&proxy.internal), Scope::Internal),
            (proxy.external.as_ref(), Scope::External),
            (proxy.short_circuit.as_ref(), Scope::ShortCircuit),
        ];
        for (l, scope) in ways {
            if l.is_some_and(|l| l.port == listener) {
                let endpoints = if connect {
                    proxy.shared.connect(scope, client).into_iter().collect()
                } else {
                    proxy.shared.endpoints(scope, client)
                };
                if endpoints.is_empty() {
                    return Dispatch::Refused;
                }
                return Dispatch::To(endpoints.into_iter().collect());
            }
        }
    }
    Dispatch::Refused
}
