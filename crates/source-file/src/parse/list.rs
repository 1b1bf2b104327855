//! A `kind: List` document read one item at a time.
//!
//! `kubectl get svc,endpointslices,nodes -A -o yaml` prints one document: a `kind: List` whose
//! `items` hold every object. Read whole, it becomes one JSON value of every object with every
//! field (managed fields, annotations) before the first is converted: at 30k Services × 4
//! endpoints (a 91 MB dump) kpng peaked at 845 MB while loading it. Here the block sequence
//! under a top-level `items:` is cut into its items by indentation, and each item is read and
//! converted on its own, so only one item's value exists at a time.
//!
//! Cutting by indentation is only safe for plain block YAML, so anything unusual (a comment or
//! a line left of an item's content, a bare `-` line, no top-level `items:` sequence) returns
//! `None`, and the caller reads the document whole as before.

/// A List document cut into its parts.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Split<'a> {
    /// The document without its items (`items: []` in their place): the List's own keys.
    pub(super) head: String,
    lines: Vec<&'a str>,
    /// Each item's lines.
    items: Vec<std::ops::Range<usize>>,
    /// The column the items' content starts at (after `- `).
    content: usize,
}

impl Split<'_> {
    /// Each item as a document of its own (its lines moved left to column 0), built as asked
    /// for, so that one item's text exists at a time.
    pub(super) fn items(&self) -> impl Iterator<Item = String> + '_ {
        self.items.iter().map(|range| {
            let mut item = String::new();
            for line in &self.lines[range.clone()] {
                item.push_str(line.get(self.content..).unwrap_or_default());
                item.push('\n');
            }
            item
        })
    }
}

/// `doc` cut into its List head and its items, or `None` when it has no top-level block
/// sequence under `items:` or is not plain enough to cut safely.
pub(super) fn split(doc: &str) -> Option<Split<'_>> {
    let lines: Vec<&str> = doc.lines().collect();
    let at = lines.iter().position(|l| is_key(l, "items"))?;
    // The first line after `items:` that holds something opens the sequence.
    let first = (at + 1..lines.len()).find(|&i| !lines[i].trim().is_empty())?;
    let dash = indent(lines[first]);
    if !lines[first][dash..].starts_with("- ") {
        return None;
    }
    let content = dash + 2;
    let mut items: Vec<std::ops::Range<usize>> = Vec::new();
    let mut end = lines.len();
    for (i, line) in lines.iter().enumerate().skip(first) {
        let column = indent(line);
        if line.trim().is_empty() || column >= content {
            // A blank line, or the current item's content.
        } else if column == dash && line[dash..].starts_with("- ") {
            items.push(i..i);
        } else if column == 0 && !line.starts_with('#') {
            // A top-level key: the sequence has ended.
            end = i;
            break;
        } else {
            // A comment or a line left of an item's content: not cut here.
            return None;
        }
        items.last_mut()?.end = i + 1;
    }
    // The List's other top-level keys, before and after the sequence.
    let mut head = String::new();
    for line in lines[..at]
        .iter()
        .chain(std::iter::once(&"items: []"))
        .chain(&lines[end..])
    {
        head.push_str(line);
        head.push('\n');
    }
    Some(Split {
        head,
        lines,
        items,
        content,
    })
}

/// Whether `line` is the top-level key `key` with nothing after it (`items:`, maybe a comment).
fn is_key(line: &str, key: &str) -> bool {
    line.strip_prefix(key)
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|rest| {
            let rest = rest.trim();
            rest.is_empty() || rest.starts_with('#')
        })
}

/// The column a line's content starts at (spaces only: the subset reader refuses tabs).
fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head and the items a document is cut into.
    type Cut<'a> = Option<(&'a str, &'a [&'a str])>;

    /// (case, document, the head and the items when it is cut)
    #[test]
    fn a_list_is_cut_into_its_items_only_when_that_is_safe() {
        let cases: [(&str, &str, Cut); 8] = [
            (
                "kubectl's layout: items at column 0",
                "apiVersion: v1\nitems:\n- kind: A\n  x: 1\n- kind: B\n  y:\n  - 2\nkind: List\n",
                Some((
                    "apiVersion: v1\nitems: []\nkind: List\n",
                    &["kind: A\nx: 1\n", "kind: B\ny:\n- 2\n"],
                )),
            ),
            (
                "items indented, blank lines and a block scalar",
                "kind: List\nitems:\n  - kind: A\n\n    note: |\n      - not an item\n  - kind: B\n",
                Some((
                    "kind: List\nitems: []\n",
                    &["kind: A\n\nnote: |\n  - not an item\n", "kind: B\n"],
                )),
            ),
            (
                "a comment left of an item's content",
                "kind: List\nitems:\n- kind: A\n# note\n  x: 1\n",
                None,
            ),
            ("a bare dash", "kind: List\nitems:\n-\n  kind: A\n", None),
            ("a flow sequence", "kind: List\nitems: [a, b]\n", None),
            ("no items key", "kind: Service\nmetadata: {name: a}\n", None),
            (
                "items nested under another key",
                "spec:\n  items:\n  - a\n",
                None,
            ),
            (
                "a line between the dash and the content column",
                "kind: List\nitems:\n  - kind: A\n   x: 1\n",
                None,
            ),
        ];
        for (case, doc, want) in cases {
            let got = split(doc).map(|s| (s.head.clone(), s.items().collect::<Vec<_>>()));
            let want = want.map(|(head, items)| {
                (
                    head.to_string(),
                    items.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
                )
            });
            assert_eq!(got, want, "{case}");
        }
    }
}
