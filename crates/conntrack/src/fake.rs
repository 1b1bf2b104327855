//! An in-memory conntrack table with the kernel's dump-filter and delete semantics, for
//! tests of the reconciler and of its callers (no root, no netlink).

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use kpng_model::Family;

use crate::Error;
use crate::flow::Flow;
use crate::reconciler::{FlowTable, TableSize};
use crate::socket::DeleteOutcome;
use crate::wire::DumpFilter;

/// A shared, inspectable fake table: clones see the same entries, so a test keeps one clone
/// and hands another to the reconciler.
#[derive(Debug, Clone, Default)]
pub struct FakeTable {
    state: Arc<Mutex<FakeState>>,
}

/// What the fake holds and what was asked of it.
#[derive(Debug, Default)]
pub struct FakeState {
    /// The entries.
    pub flows: Vec<Flow>,
    /// The node's addresses.
    pub local: Vec<IpAddr>,
    /// Every dump requested, in order.
    pub dumps: Vec<(Family, DumpFilter)>,
    /// Every delete request, in order.
    pub deletes: Vec<Vec<Flow>>,
    /// When set, every operation fails (a broken socket, missing permissions).
    pub failing: bool,
    /// The size reported to the dump planner (`None`: unknown).
    pub size: Option<TableSize>,
}

impl FakeTable {
    /// A table holding `flows`, on a node with addresses `local`.
    pub fn new(flows: Vec<Flow>, local: Vec<IpAddr>) -> FakeTable {
        let table = FakeTable::default();
        {
            let mut s = table.state();
            s.flows = flows;
            s.local = local;
        }
        table
    }

    /// Locks the state for inspection or changes.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the current entries.
    pub fn flows(&self) -> Vec<Flow> {
        self.state().flows.clone()
    }

    fn fail_if_set(&self) -> Result<(), Error> {
        if self.state().failing {
            return Err(Error::Io {
                op: "fake conntrack table",
                source: io::Error::from_raw_os_error(1),
            });
        }
        Ok(())
    }
}

impl FlowTable for FakeTable {
    fn dump(
        &mut self,
        family: Family,
        filter: &DumpFilter,
        each: &mut dyn FnMut(&Flow),
    ) -> Result<(), Error> {
        self.fail_if_set()?;
        let matching: Vec<Flow> = {
            let mut s = self.state();
            s.dumps.push((family, *filter));
            s.flows
                .iter()
                .filter(|f| f.family() == family && filter.matches(f))
                .copied()
                .collect()
        };
        for flow in &matching {
            each(flow);
        }
        Ok(())
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<DeleteOutcome, Error> {
        self.fail_if_set()?;
        let mut s = self.state();
        s.deletes.push(flows.to_vec());
        let mut outcome = DeleteOutcome::default();
        for flow in flows {
            let at = s.flows.iter().position(|f| {
                f.protocol == flow.protocol
                    && f.original == flow.original
                    && f.zone == flow.zone
                    && (flow.id.is_none() || f.id == flow.id)
            });
            match at {
                Some(i) => {
                    s.flows.remove(i);
                    outcome.deleted += 1;
                }
                None => outcome.gone += 1,
            }
        }
        Ok(outcome)
    }

    fn size(&mut self) -> Option<TableSize> {
        self.state().size
    }

    fn local_addresses(&mut self, family: Family) -> Result<Vec<IpAddr>, Error> {
        self.fail_if_set()?;
        Ok(self
            .state()
            .local
            .iter()
            .copied()
            .filter(|ip| Family::of(ip) == family)
            .collect())
    }
}
