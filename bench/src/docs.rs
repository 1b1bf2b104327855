//! Generated blocks in hand-edited documents (`--write-docs`).
//!
//! `docs/benchmarks.md` holds dated, hand-written sections beside what a benchmark run
//! generates. Each generator owns one block between `<!-- generated:NAME:begin -->` and
//! `<!-- generated:NAME:end -->` and rewrites only that block; everything outside it is kept
//! byte for byte. A document without the block gets it appended at the end. Markers that do
//! not pair up are an error that names them and their lines: guessing where a block ends
//! could overwrite hand-written text.

use std::fmt;
use std::path::Path;

/// The begin marker of block `name`.
fn begin_marker(name: &str) -> String {
    format!("<!-- generated:{name}:begin -->")
}

/// The end marker of block `name`.
fn end_marker(name: &str) -> String {
    format!("<!-- generated:{name}:end -->")
}

/// Why a generated block could not be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerError {
    /// One marker of the pair is there, the other is not.
    Unpaired {
        /// The marker found.
        found: String,
        /// Its line (1-based).
        line: usize,
        /// The marker missing.
        missing: String,
    },
    /// The end marker comes before the begin marker.
    Reversed {
        /// The block's name.
        name: String,
        /// Line of the begin marker.
        begin: usize,
        /// Line of the end marker.
        end: usize,
    },
    /// A marker appears more than once.
    Repeated {
        /// The marker.
        marker: String,
        /// Every line it is on.
        lines: Vec<usize>,
    },
}

impl fmt::Display for MarkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MarkerError::Unpaired {
                found,
                line,
                missing,
            } => write!(
                f,
                "`{found}` on line {line} has no `{missing}`: add it where the generated block ends, or remove the marker"
            ),
            MarkerError::Reversed { name, begin, end } => write!(
                f,
                "the end marker of the generated block `{name}` (line {end}) comes before its begin marker (line {begin})"
            ),
            MarkerError::Repeated { marker, lines } => write!(
                f,
                "`{marker}` appears {} times (lines {}): keep one pair",
                lines.len(),
                lines
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl std::error::Error for MarkerError {}

/// Byte offsets of every occurrence of `marker` in `doc`, with their 1-based lines.
fn occurrences(doc: &str, marker: &str) -> Vec<(usize, usize)> {
    doc.match_indices(marker)
        .map(|(at, _)| (at, doc[..at].matches('\n').count() + 1))
        .collect()
}

/// The single occurrence of `marker`, if any; an error when there are several.
fn single(doc: &str, marker: &str) -> Result<Option<(usize, usize)>, MarkerError> {
    let found = occurrences(doc, marker);
    match found.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        many => Err(MarkerError::Repeated {
            marker: marker.to_string(),
            lines: many.iter().map(|(_, line)| *line).collect(),
        }),
    }
}

/// `doc` with block `name` holding `content`: the text between the markers replaced, or the
/// block appended at the end when neither marker is there. Text outside the block is kept.
pub fn replace_block(doc: &str, name: &str, content: &str) -> Result<String, MarkerError> {
    let begin = begin_marker(name);
    let end = end_marker(name);
    let block = format!("{begin}\n{}\n{end}", content.trim_matches('\n'));
    match (single(doc, &begin)?, single(doc, &end)?) {
        (None, None) => {
            let mut out = doc.trim_end_matches('\n').to_string();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&block);
            out.push('\n');
            Ok(out)
        }
        (Some((b, b_line)), Some((e, e_line))) => {
            if e < b {
                return Err(MarkerError::Reversed {
                    name: name.to_string(),
                    begin: b_line,
                    end: e_line,
                });
            }
            Ok(format!("{}{block}{}", &doc[..b], &doc[e + end.len()..]))
        }
        (Some((_, line)), None) => Err(MarkerError::Unpaired {
            found: begin,
            line,
            missing: end,
        }),
        (None, Some((_, line))) => Err(MarkerError::Unpaired {
            found: end,
            line,
            missing: begin,
        }),
    }
}

/// Writes block `name` of the document at `path` (created with `title` as its heading when
/// missing). The new text goes to a temporary file renamed over the old one, so a failed
/// write leaves the document as it was.
pub fn write_block(path: &Path, title: &str, name: &str, content: &str) -> Result<(), String> {
    let doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => format!("# {title}\n"),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let new = replace_block(&doc, name, content)
        .map_err(|e| format!("{}: {e}; nothing written", path.display()))?;
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, new).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| format!("renaming {} over {}: {e}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const B: &str = "<!-- generated:all:begin -->";
    const E: &str = "<!-- generated:all:end -->";

    #[test]
    fn replaces_only_its_block_or_appends_it() {
        let hand = "## Start-up (by hand)\n\nfigures 4.2 s\n";
        let cases: Vec<(&str, String, &str, String)> = vec![
            (
                "markers present: only the block changes",
                format!("# T\n\n{B}\nold\ntable\n{E}\n\n{hand}"),
                "new\n",
                format!("# T\n\n{B}\nnew\n{E}\n\n{hand}"),
            ),
            (
                "markers present, block in the middle, text on both sides kept",
                format!("# T\n{hand}{B}\nold\n{E}\ntail without newline"),
                "\n\nnew\n\n",
                format!("# T\n{hand}{B}\nnew\n{E}\ntail without newline"),
            ),
            (
                "empty block filled",
                format!("{B}{E}\n{hand}"),
                "new",
                format!("{B}\nnew\n{E}\n{hand}"),
            ),
            (
                "markers absent: appended after a blank line",
                format!("# T\n\n{hand}\n\n"),
                "new",
                format!("# T\n\n{hand}\n{B}\nnew\n{E}\n"),
            ),
            (
                "empty document",
                String::new(),
                "new",
                format!("{B}\nnew\n{E}\n"),
            ),
            (
                "another block's markers are left alone",
                "<!-- generated:scaling:begin -->\nx\n<!-- generated:scaling:end -->\n".to_string(),
                "new",
                format!(
                    "<!-- generated:scaling:begin -->\nx\n<!-- generated:scaling:end -->\n\n{B}\nnew\n{E}\n"
                ),
            ),
        ];
        for (what, doc, content, want) in cases {
            let got = replace_block(&doc, "all", content).unwrap();
            assert_eq!(got, want, "{what}");
            // Writing the same content again changes nothing.
            assert_eq!(
                replace_block(&got, "all", content).unwrap(),
                got,
                "{what}: again"
            );
        }
    }

    #[test]
    fn malformed_markers_are_errors_naming_them() {
        let cases: Vec<(&str, String, MarkerError, &str)> = vec![
            (
                "begin without end",
                format!("# T\n{B}\nhand-written text\n"),
                MarkerError::Unpaired {
                    found: B.into(),
                    line: 2,
                    missing: E.into(),
                },
                "line 2 has no `<!-- generated:all:end -->`",
            ),
            (
                "end without begin",
                format!("hand\n\n{E}\n"),
                MarkerError::Unpaired {
                    found: E.into(),
                    line: 3,
                    missing: B.into(),
                },
                "has no `<!-- generated:all:begin -->`",
            ),
            (
                "end before begin",
                format!("{E}\nhand\n{B}\n"),
                MarkerError::Reversed {
                    name: "all".into(),
                    begin: 3,
                    end: 1,
                },
                "(line 1) comes before its begin marker (line 3)",
            ),
            (
                "begin twice",
                format!("{B}\na\n{E}\n{B}\n"),
                MarkerError::Repeated {
                    marker: B.into(),
                    lines: vec![1, 4],
                },
                "appears 2 times (lines 1, 4)",
            ),
        ];
        for (what, doc, want, message) in cases {
            let err = replace_block(&doc, "all", "new").unwrap_err();
            assert_eq!(err, want, "{what}");
            assert!(err.to_string().contains(message), "{what}: {err}");
        }
    }

    #[test]
    fn a_malformed_document_is_left_as_it_was() {
        let dir = std::env::temp_dir().join(format!("kpng-bench-docs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("benchmarks.md");
        let doc = format!("# Benchmarks\n{B}\nhand-written, unterminated\n");
        std::fs::write(&path, &doc).unwrap();
        let err = write_block(&path, "Benchmarks", "all", "new").unwrap_err();
        assert!(err.contains("nothing written"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), doc);
        // A good document gets its block; a missing one is created with its title.
        std::fs::write(&path, format!("# Benchmarks\n{B}\nold\n{E}\nhand\n")).unwrap();
        write_block(&path, "Benchmarks", "all", "new").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("# Benchmarks\n{B}\nnew\n{E}\nhand\n")
        );
        let fresh = dir.join("new.md");
        write_block(&fresh, "Benchmarks", "scaling", "s").unwrap();
        assert_eq!(
            std::fs::read_to_string(&fresh).unwrap(),
            "# Benchmarks\n\n<!-- generated:scaling:begin -->\ns\n<!-- generated:scaling:end -->\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
