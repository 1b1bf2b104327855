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

/// The page's answer as JSON; `None` when the node's loop does not answer.
pub async fn answer(handle: &AdminHandle, query: PageQuery) -> Option<serde_json::Value> {
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
    // The pages must come from one generation of the model, as `kpng status`'s: a sync in
    // between starts over (twice at most).
    let mut attempts = 0;
    let scanned = loop {
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
        if scanned.one_generation || last_attempt {
            break scanned;
        }
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
    let mut kept = Vec::new();
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
        for (port, problems) in std::mem::take(&mut page.services).into_iter().zip(problems) {
            counts.add(&problems);
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
