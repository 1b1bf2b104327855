//! The status page's answer (`/status/status.json`): the status `kpng status` reads, with what
//! `kpng status` computes in Rust for its table added to it.
//!
//! Why: the page showed the traffic policies in its own words and had no problem count, so the
//! on-call engineer read one story in the terminal and another in the browser. Rather than a
//! second copy of the POLICY cell, its legend and the problem rules in JavaScript, the answer
//! carries them, computed by the same functions as the CLI's table: per port `policyCell`,
//! `policyDetails` and `problems`; `policyLegend` and `problemsLine` for the page. The page
//! asks for at most a few hundred ports, but the count is of every port of its selection (as
//! `kpng status` counts): the ports are read from the node's loop a page at a time, so the
//! answer never holds them all at once.
//!
//! Counting reads every port of the selection, 0.6 s of the node agent's time at 30k Services
//! × 4; the page refreshes every 5 s. So the count of a selection is kept ([`CountCache`])
//! with where its ports with a problem are, and a refresh that finds the model as it was
//! (same generation, same matching ports, same rejected objects, dropped values and unserved
//! health checks, counted less than [`COUNT_MAX_AGE`] ago) reads only the ports it shows.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::Uri;
use kpng_runner::admin::{AdminHandle, PortStatus, Status, StatusQuery};
use serde::Deserialize;

use crate::status_problems::{self, PortProblem, ProblemCounts};

/// Ports read from the node's loop per question while the answer counts problems: the page
/// size `kpng status` reads with.
const SCAN_PAGE: usize = 2000;

/// What the page asks: the [`StatusQuery`] the node agent answers `kpng status` with (the page
/// sends `service=NAMESPACE/` for its namespace filter, `q` for its text filter, `limit` and
/// `offset`), and whether it shows only the ports with a problem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageQuery {
    /// The ports asked for, read by the runner's own [`StatusQuery`], so that the page's
    /// parameters and `kpng status`'s cannot drift apart.
    pub status: StatusQuery,
    /// Only the ports with a problem (`kpng status --problems`); `matchingPorts` then counts
    /// them.
    pub problems: bool,
}

/// The page's one parameter that [`StatusQuery`] does not have.
#[derive(Deserialize)]
struct ProblemsParam {
    #[serde(default)]
    problems: bool,
}

impl PageQuery {
    /// Reads the page's query string: once as a [`StatusQuery`], once for `problems` (each
    /// reading ignores the other's parameters). Not one struct with `#[serde(flatten)]`: the
    /// URL-encoded reader then hands `limit`, `offset` and `problems` over as strings, which a
    /// number or a boolean refuses.
    pub fn from_uri(uri: &Uri) -> Result<Self, QueryRejection> {
        let Query(status) = Query::<StatusQuery>::try_from_uri(uri)?;
        let Query(ProblemsParam { problems }) = Query::<ProblemsParam>::try_from_uri(uri)?;
        Ok(Self { status, problems })
    }
}

/// How long a kept count is used at most: a port's health check can change its answer (or
/// start refusing probes) without a sync, which the generation would not tell.
pub const COUNT_MAX_AGE: Duration = Duration::from_secs(30);

/// The last selection's problem count, kept between the page's refreshes (one per metrics
/// server, shared by its requests).
#[derive(Clone, Default)]
pub struct CountCache(Arc<Mutex<Option<Arc<Counted>>>>);

/// One selection's count, as a full reading found it.
struct Counted {
    /// What the node's answer said when it was counted.
    key: CountKey,
    /// When.
    at: Instant,
    /// The problems of every port of the selection.
    counts: ProblemCounts,
    /// Where (the position among the selection's ports) each port with a problem is.
    positions: Vec<usize>,
}

/// What must be as it was for a kept count to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CountKey {
    /// The selection (`service=`, `q=`).
    service: Option<String>,
    text: Option<String>,
    /// The model's generation, and how many ports the selection holds.
    generation: u64,
    matching: usize,
    /// A digest of what beside the ports the problems depend on: rejected objects, dropped
    /// values (also the brain's) and health checks not served.
    others: u64,
}

impl CountKey {
    fn of(status: &Status, service: Option<&str>, text: Option<&str>) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_string(&(
            &status.rejected,
            &status.dropped,
            &status.health_checks_not_served,
            &status.brain_reports,
        ))
        .unwrap_or_default()
        .hash(&mut hasher);
        Self {
            service: service.map(str::to_string),
            text: text.map(str::to_string),
            generation: status.generation,
            matching: status.matching_ports,
            others: hasher.finish(),
        }
    }
}

impl CountCache {
    /// The count kept for this selection, if it is young enough.
    fn get(&self, service: Option<&str>, text: Option<&str>) -> Option<Arc<Counted>> {
        let kept = self.0.lock().ok()?.clone()?;
        (kept.key.service.as_deref() == service
            && kept.key.text.as_deref() == text
            && kept.at.elapsed() < COUNT_MAX_AGE)
            .then_some(kept)
    }

    fn put(&self, counted: Counted) {
        if let Ok(mut kept) = self.0.lock() {
            *kept = Some(Arc::new(counted));
        }
    }
}

/// The page's answer as JSON; `None` when the node's loop does not answer. `cache`: the
/// count of the last selection, used when the model is as it was and replaced when not.
pub async fn answer(
    handle: &AdminHandle,
    cache: &CountCache,
    query: PageQuery,
) -> Option<serde_json::Value> {
    let service = query
        .status
        .service
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let (limit, offset) = (
        query.status.limit.unwrap_or(usize::MAX),
        query.status.offset.unwrap_or_default(),
    );
    let text = query.status.text.as_deref();
    let remembered = match cache.get(service.as_deref(), text) {
        Some(counted) => read_counted(handle, &counted, service.as_deref(), &query).await,
        None => None,
    };
    // The pages must come from one generation of the model, as `kpng status`'s: a sync in
    // between starts over (twice at most).
    let mut attempts = 0;
    let scanned = match remembered {
        Some(scanned) => scanned,
        None => loop {
            attempts += 1;
            let last_attempt = attempts >= 3;
            let scanned = scan(
                handle,
                service.as_deref(),
                &query,
                offset,
                limit,
                last_attempt,
            )
            .await?;
            if scanned.one_generation {
                cache.put(Counted {
                    key: CountKey::of(&scanned.first, service.as_deref(), text),
                    at: Instant::now(),
                    counts: scanned.counts.clone(),
                    positions: scanned.positions.clone(),
                });
            }
            if scanned.one_generation || last_attempt {
                break scanned;
            }
        },
    };
    let Scanned {
        first: mut status,
        counts,
        kept,
        selected,
        ..
    } = scanned;
    if query.problems {
        status.matching_ports = selected;
    }
    // About one namespace or Service, the rejections and dropped values of others are left
    // out, as `kpng status NAMESPACE/` leaves them out.
    let not_shown = service.as_deref().map_or(0, |filter| {
        crate::status_filter::keep_rejections_of(&mut status, filter)
    });
    let (ports, problems): (Vec<PortStatus>, Vec<Vec<PortProblem>>) = kept.into_iter().unzip();
    status.services = ports;
    let mut value = serde_json::to_value(&status).ok()?;
    if let Some(rows) = value.get_mut("services").and_then(|s| s.as_array_mut()) {
        for ((row, port), problems) in rows.iter_mut().zip(&status.services).zip(&problems) {
            row["policyCell"] = crate::status_policy::cell(port).into();
            row["policyDetails"] = crate::status_policy::details(port).into();
            row["problems"] = problems
                .iter()
                .map(|p| p.words())
                .collect::<Vec<_>>()
                .into();
        }
    }
    // The page shows each cell's detail under it: the legend needs no pointer to it.
    if let Some(legend) = crate::status_policy::legend(&status.services, true) {
        value["policyLegend"] = legend.into();
    }
    if let Some(line) = problems_line(&counts, query.problems) {
        value["problemsLine"] = line.into();
    }
    value["problemPorts"] = counts.ports().into();
    if not_shown > 0 {
        value["rejectedNotShown"] = not_shown.into();
    }
    Some(value)
}

/// What one reading of the selection's pages found.
struct Scanned {
    /// The first page's answer (its header; its data-plane probe runs for that page only),
    /// its ports taken out.
    first: Status,
    /// The problems of every port of the selection.
    counts: ProblemCounts,
    /// The ports the page gets, with their problems.
    kept: Vec<(PortStatus, Vec<PortProblem>)>,
    /// How many ports the page's selection (with `problems`) holds.
    selected: usize,
    /// Whether every page came from the first page's generation of the model.
    one_generation: bool,
    /// Where each port with a problem is among the selection's ports.
    positions: Vec<usize>,
}

/// The page's ports read with a kept count: only the ports shown are read from the node's
/// loop. `None` when the model is not as it was counted (the caller counts again).
async fn read_counted(
    handle: &AdminHandle,
    counted: &Counted,
    service: Option<&str>,
    query: &PageQuery,
) -> Option<Scanned> {
    let text = query.status.text.as_deref();
    let ask = |offset: usize, limit: usize| {
        handle.status(StatusQuery {
            service: service.map(str::to_string),
            text: query.status.text.clone(),
            limit: Some(limit),
            offset: Some(offset),
        })
    };
    let (limit, offset) = (
        query.status.limit.unwrap_or(usize::MAX),
        query.status.offset.unwrap_or_default(),
    );
    let with_problems = |port: PortStatus, first: &Status| {
        let problems = status_problems::of_port(&port, first);
        (port, problems)
    };
    // The first page of every port is the header too (the data-plane probe runs for the
    // first page only): one question.
    if !query.problems && offset == 0 {
        let mut first = ask(0, limit).await?;
        if CountKey::of(&first, service, text) != counted.key {
            return None;
        }
        let ports = std::mem::take(&mut first.services);
        let kept = ports
            .into_iter()
            .map(|p| with_problems(p, &first))
            .collect();
        return Some(Scanned {
            selected: first.matching_ports,
            first,
            counts: counted.counts.clone(),
            kept,
            one_generation: true,
            positions: Vec::new(),
        });
    }
    let first = ask(0, 0).await?;
    if CountKey::of(&first, service, text) != counted.key {
        return None;
    }
    // The positions to read: the page's ports, or the span of its ports with a problem.
    let (from, to, selected) = if query.problems {
        let rest = counted.positions.get(offset..).unwrap_or_default();
        let shown = rest.get(..limit.min(rest.len())).unwrap_or_default();
        match (shown.first(), shown.last()) {
            (Some(a), Some(b)) => (*a, b + 1, counted.positions.len()),
            _ => (0, 0, counted.positions.len()),
        }
    } else {
        let to = offset.saturating_add(limit).min(first.matching_ports);
        (offset, to, first.matching_ports)
    };
    let mut kept = Vec::new();
    let mut at = from;
    while at < to && kept.len() < limit {
        let mut page = ask(at, SCAN_PAGE.min(to - at)).await?;
        if page.generation != first.generation {
            return None;
        }
        let read = page.services.len();
        for port in std::mem::take(&mut page.services) {
            let (port, problems) = with_problems(port, &first);
            if (query.problems && problems.is_empty()) || kept.len() >= limit {
                continue;
            }
            kept.push((port, problems));
        }
        if read == 0 {
            break;
        }
        at += read;
    }
    Some(Scanned {
        first,
        counts: counted.counts.clone(),
        kept,
        selected,
        one_generation: true,
        positions: Vec::new(),
    })
}

/// Reads the ports `service` and `query` select, [`SCAN_PAGE`] at a time, counting their
/// problems and keeping `limit` of them from `offset` on (of those with a problem, when
/// `query.problems`); `None` when the node's loop does not answer. A page of another
/// generation than the first ends the reading, unless this is the `last_attempt`.
async fn scan(
    handle: &AdminHandle,
    service: Option<&str>,
    query: &PageQuery,
    offset: usize,
    limit: usize,
    last_attempt: bool,
) -> Option<Scanned> {
    let mut first: Option<Status> = None;
    let mut counts = ProblemCounts::default();
    let (mut kept, mut positions) = (Vec::new(), Vec::new());
    let (mut selected, mut read_so_far, mut one_generation) = (0, 0, true);
    loop {
        let mut page = handle
            .status(StatusQuery {
                service: service.map(str::to_string),
                text: query.status.text.clone(),
                limit: Some(SCAN_PAGE),
                offset: Some(read_so_far),
            })
            .await?;
        let problems: Vec<Vec<PortProblem>> = page
            .services
            .iter()
            .map(|p| status_problems::of_port(p, &page))
            .collect();
        let read = page.services.len();
        let ports = std::mem::take(&mut page.services).into_iter().zip(problems);
        for (position, (port, problems)) in (read_so_far..).zip(ports) {
            counts.add(&problems);
            if !problems.is_empty() {
                positions.push(position);
            }
            if query.problems && problems.is_empty() {
                continue;
            }
            if selected >= offset && kept.len() < limit {
                kept.push((port, problems));
            }
            selected += 1;
        }
        read_so_far += read;
        let done = read < SCAN_PAGE || read_so_far >= page.matching_ports;
        match &first {
            Some(f) if f.generation != page.generation => {
                // Read on to the end on the last attempt: a count over mixed pages beats none.
                one_generation = false;
                if !last_attempt {
                    break;
                }
            }
            Some(_) => {}
            None => first = Some(page),
        }
        if done {
            break;
        }
    }
    Some(Scanned {
        first: first?,
        counts,
        kept,
        selected,
        one_generation,
        positions,
    })
}

/// The page's problem line: `kpng status`'s, without the command (the page's toggle is the
/// command); when only the ports with a problem are asked for and none has one, says so.
fn problems_line(counts: &ProblemCounts, problems_only: bool) -> Option<String> {
    match counts.summary() {
        Some(line) => Some(line),
        None if problems_only => Some("no Service port has a problem".to_string()),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page's line is the CLI's without its command, and says when the toggle finds none.
    #[test]
    fn the_problem_line_reads_as_the_clis() {
        let mut counts = ProblemCounts::default();
        counts.add(&[]);
        assert_eq!(problems_line(&counts, false), None);
        assert_eq!(
            problems_line(&counts, true).as_deref(),
            Some("no Service port has a problem")
        );
        counts.add(&[PortProblem::NoEndpoints, PortProblem::DroppedValues]);
        counts.add(&[PortProblem::DroppedValues]);
        let want = "PROBLEMS: 2 of 3 Service ports (1 without endpoints, 2 values dropped)";
        assert_eq!(problems_line(&counts, false).as_deref(), Some(want));
        assert_eq!(problems_line(&counts, true).as_deref(), Some(want));
    }

    /// The page's query reads as the page sends it.
    #[test]
    fn the_page_query_reads_its_parameters() {
        let uri: axum::http::Uri =
            "/status/status.json?limit=500&q=web&service=shop%2F&problems=true"
                .parse()
                .expect("a URI");
        let q = PageQuery::from_uri(&uri).expect("a query");
        assert_eq!(
            q,
            PageQuery {
                status: StatusQuery {
                    service: Some("shop/".into()),
                    text: Some("web".into()),
                    limit: Some(500),
                    offset: None,
                },
                problems: true,
            }
        );
    }
}
