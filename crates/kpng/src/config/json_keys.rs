//! The keys a JSON configuration file gives twice, with their lines.
//!
//! Why a scanner of its own: serde_json keeps a repeated key's last value without a word and
//! tells no line, while kube-proxy's strict decoding refuses the file and its lenient one
//! keeps the last value, logging it; kpng warns as it does for YAML, naming key and line. The
//! text has already been parsed by serde_json, so the scanner only walks valid JSON.

use std::collections::BTreeSet;

/// One open container while walking the text.
enum Frame {
    /// An object: the keys seen so far, and the last one (the path of its value).
    Object {
        keys: BTreeSet<String>,
        current: Option<String>,
    },
    /// An array: the index of the item being read.
    Array { index: usize },
}

/// Each key given twice in the valid JSON `text`, as a dotted path (`conntrack.min`, an array
/// item `[0]`) and the 1-based line of the repeat, in the order of the text.
pub fn duplicate_keys(text: &str) -> Vec<(String, u64)> {
    let bytes = text.as_bytes();
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = Vec::new();
    let mut line = 1u64;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => line += 1,
            b'{' => stack.push(Frame::Object {
                keys: BTreeSet::new(),
                current: None,
            }),
            b'[' => stack.push(Frame::Array { index: 0 }),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => {
                if let Some(Frame::Array { index }) = stack.last_mut() {
                    *index += 1;
                }
            }
            b'"' => {
                let end = string_end(bytes, i);
                let expects_key = matches!(
                    stack.last(),
                    Some(Frame::Object { .. }) if next_token(bytes, end) == Some(b':')
                );
                if expects_key {
                    let name: String = serde_json::from_str(&text[i..end]).unwrap_or_default();
                    let path = path_to(&stack, &name);
                    if let Some(Frame::Object { keys, current }) = stack.last_mut() {
                        if !keys.insert(name.clone()) {
                            out.push((path, line));
                        }
                        *current = Some(name);
                    }
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The index just past the string that starts with the quote at `start`.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The first byte at or after `from` that is not JSON whitespace.
fn next_token(bytes: &[u8], from: usize) -> Option<u8> {
    bytes[from.min(bytes.len())..]
        .iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// The dotted path of key `name` in the innermost object of `stack`.
fn path_to(stack: &[Frame], name: &str) -> String {
    let mut path = String::new();
    // Every frame but the innermost contributes the place of the value being read in it.
    // Written as the YAML reader writes them: `list.[1].name`.
    for frame in &stack[..stack.len().saturating_sub(1)] {
        if !path.is_empty() {
            path.push('.');
        }
        match frame {
            Frame::Object { current, .. } => path.push_str(current.as_deref().unwrap_or_default()),
            Frame::Array { index } => path.push_str(&format!("[{index}]")),
        }
    }
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_keys_are_named_with_their_path_and_line() {
        /// What a case expects: each repeated key's path and line.
        type Repeats<'a> = &'a [(&'a str, u64)];
        let cases: [(&str, &str, Repeats); 6] = [
            ("none", r#"{"a": 1, "b": {"a": 2}}"#, &[]),
            ("top level", "{\n\"a\": 1,\n\"a\": 2\n}", &[("a", 3)]),
            (
                "nested",
                "{\"conntrack\": {\n  \"min\": 1,\n  \"min\": 2}}",
                &[("conntrack.min", 3)],
            ),
            (
                "a value that looks like a key is not one",
                r#"{"a": "a", "b": ["a", "a"], "c": "x\":"}"#,
                &[],
            ),
            (
                "in an array's object",
                r#"{"l": [{"x": 1}, {"y": 1, "y": 2}]}"#,
                &[("l.[1].y", 1)],
            ),
            (
                "escaped names",
                r#"{"a\"b": 1, "a\u0022b": 2}"#,
                &[("a\"b", 1)],
            ),
        ];
        for (what, text, want) in cases {
            let want: Vec<(String, u64)> = want.iter().map(|(p, l)| (p.to_string(), *l)).collect();
            assert_eq!(duplicate_keys(text), want, "{what}");
        }
    }
}
