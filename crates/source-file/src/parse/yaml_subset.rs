//! The YAML fast path: documents written in the plain YAML that people and `kubectl` write
//! (block mappings and sequences, one-line flow collections such as `{name: a, port: 80}`,
//! plain and quoted one-line scalars, `|` block scalars, comments) are read here into a JSON
//! value, about ten times faster than by the YAML parser (30 µs per Service document there).
//!
//! This path only saves time, so it must read a document exactly as serde-saphyr reads it, or
//! not at all: everything outside the subset it recognises with certainty returns `None`, and
//! the document then takes the YAML parser, which also words any error. That covers anchors and
//! aliases, tags, folded (`>`) scalars, multi-line plain or quoted scalars, multi-line flow
//! collections, tabs, directives, duplicate keys, and every plain scalar whose type YAML
//! dialects disagree on or that serde-saphyr reads specially (`yes`, `True`, `0x1F`, `1_000`,
//! `1e3`, `.inf`, `12:30`, dates). The tests compare both readings on every document they take.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::iter::Peekable;

use serde_json::{Map, Value};

/// The document as a JSON value, or `None` when it is not entirely inside the subset.
pub(super) fn document(doc: &str) -> Option<Value> {
    if doc.contains(['\t', '\r', '\u{feff}']) {
        return None;
    }
    let mut parser = Parser {
        depth: 0,
        lines: Lines {
            raw: doc.lines().peekable(),
            queue: VecDeque::new(),
            outside: false,
        },
    };
    parser.lines.peek()?;
    let value = parser.node()?;
    let at_end = parser.lines.peek().is_none();
    (at_end && !parser.lines.outside).then_some(value)
}

/// One line of the document after its `- ` markers are split off: a `- a: 1` line gives a
/// [`Content::Dash`] and then an inline [`Content::Entry`] two columns further right, which is
/// where YAML places that compact mapping.
struct Line<'a> {
    /// The column the content starts at.
    indent: usize,
    /// Whether the content follows a `- ` on the same line (it then belongs to that item).
    inline: bool,
    content: Content<'a>,
}

enum Content<'a> {
    /// A sequence item's `-`.
    Dash,
    /// `key: rest`; `rest` is empty when the value is on the following lines. A `|` block
    /// scalar's text is read with its line, since its lines are not YAML structure.
    Entry {
        key: Cow<'a, str>,
        rest: &'a str,
        block: Option<String>,
    },
    /// A value alone on its line.
    Value(&'a str),
}

/// The document's lines, read as the parser asks for them (a whole document's lines at once
/// would double the memory a large `kind: List` takes while it is read).
struct Lines<'a> {
    raw: Peekable<std::str::Lines<'a>>,
    /// The lines of the current raw line (a `- - a` line gives three).
    queue: VecDeque<Line<'a>>,
    /// A line outside the subset was met: the document is not read here, whatever the parser
    /// made of the lines before it.
    outside: bool,
}

impl<'a> Lines<'a> {
    /// The current line; `None` at the end, or once a line was outside the subset.
    fn peek(&mut self) -> Option<&mut Line<'a>> {
        while self.queue.is_empty() && !self.outside {
            let line = self.raw.next()?;
            if self.split(line).is_none() {
                self.outside = true;
            }
        }
        if self.outside {
            return None;
        }
        self.queue.front_mut()
    }

    fn advance(&mut self) {
        self.queue.pop_front();
    }

    /// Queues the lines of one raw line (none for a blank or comment line); `None` when it is
    /// outside the subset.
    fn split(&mut self, line: &'a str) -> Option<()> {
        let mut text = line.trim_start_matches(' ');
        if text.is_empty() || text.starts_with('#') {
            return Some(());
        }
        if text.starts_with('%') {
            return None;
        }
        let mut indent = line.len() - text.len();
        let mut inline = false;
        while text == "-" || text.starts_with("- ") {
            self.queue.push_back(Line {
                indent,
                inline,
                content: Content::Dash,
            });
            let rest = &text[1..];
            let after = rest.trim_start_matches(' ');
            indent += 1 + rest.len() - after.len();
            text = after;
            inline = true;
        }
        if text.is_empty() || text.starts_with('#') {
            return Some(());
        }
        let content = match entry(text)? {
            Some((key, rest)) => {
                let block = match rest {
                    "|" | "|-" | "|+" => Some(block_scalar(rest, &mut self.raw, indent)?),
                    _ => None,
                };
                Content::Entry { key, rest, block }
            }
            None => Content::Value(text),
        };
        self.queue.push_back(Line {
            indent,
            inline,
            content,
        });
        Some(())
    }
}

/// Splits `key: rest` (`Some(None)`: the line is a value, not an entry; `None`: outside the
/// subset). A comment after the colon leaves `rest` empty.
fn entry(text: &str) -> Option<Option<(Cow<'_, str>, &str)>> {
    let (key, after) = match text.as_bytes().first()? {
        b'"' | b'\'' => {
            let (key, after) = quoted(text)?;
            match after.strip_prefix(':') {
                Some(after) if after.is_empty() || after.starts_with(' ') => {
                    (Cow::Owned(key), after)
                }
                _ => return Some(None),
            }
        }
        b'[' | b'{' => return Some(None),
        _ => {
            let region = text.find(" #").map_or(text, |end| &text[..end]);
            let colon = region
                .match_indices(':')
                .map(|(at, _)| at)
                .find(|&at| matches!(region.as_bytes().get(at + 1), None | Some(b' ')));
            let Some(colon) = colon else {
                return Some(None);
            };
            let key = &text[..colon];
            if !plain_key(key) {
                return None;
            }
            (Cow::Borrowed(key), &text[colon + 1..])
        }
    };
    let rest = after.trim_start_matches(' ');
    let rest = if rest.starts_with('#') { "" } else { rest };
    Some(Some((key, rest)))
}

/// A plain mapping key that every YAML reading takes as this same string.
fn plain_key(key: &str) -> bool {
    let Some(first) = key.bytes().next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || matches!(first, b'_' | b'.' | b'/'))
        && !key.ends_with(' ')
        && !is_special_word(key)
}

/// The text of a `|`, `|-` or `|+` block scalar whose key sits at column `indent`, from the
/// lines after it (`raw` moves past them).
fn block_scalar(
    indicator: &str,
    raw: &mut Peekable<std::str::Lines<'_>>,
    indent: usize,
) -> Option<String> {
    let mut content_indent = None;
    let mut lines: Vec<&str> = Vec::new();
    while let Some(&line) = raw.peek() {
        let text = line.trim_start_matches(' ');
        let spaces = line.len() - text.len();
        if text.is_empty() {
            // A blank line: empty in the text, unless it holds more than the indentation
            // (left to the YAML parser, which has rules for those).
            if spaces > content_indent.unwrap_or(0) {
                return None;
            }
            lines.push("");
            raw.next();
            continue;
        }
        if spaces <= indent {
            break;
        }
        let at = *content_indent.get_or_insert(spaces);
        if spaces < at {
            return None;
        }
        lines.push(&line[at..]);
        raw.next();
    }
    content_indent?;
    let mut kept = lines.len();
    if indicator != "|+" {
        while kept > 0 && lines[kept - 1].is_empty() {
            kept -= 1;
        }
    }
    let mut text = lines[..kept].join("\n");
    if indicator != "|-" {
        text.push('\n');
    }
    Some(text)
}

/// How deep the subset reader nests, block and flow together. Manifests nest about 15 deep
/// (`managedFields`); serde-saphyr refuses anything beyond 64 (its budget's `max_depth`), so a
/// deeper document is left to it, to be refused there with its place. The readers recurse once
/// per level: without a limit, a 20 KB line of `[` overflowed a 2 MiB stack at 10,000 levels.
const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    lines: Lines<'a>,
    /// How many nodes the current one is inside.
    depth: usize,
}

impl Parser<'_> {
    /// The node whose first line is the current one; `None` beyond [`MAX_DEPTH`].
    fn node(&mut self) -> Option<Value> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        let value = self.node_within_depth();
        self.depth -= 1;
        value
    }

    fn node_within_depth(&mut self) -> Option<Value> {
        let line = self.lines.peek()?;
        let indent = line.indent;
        match &line.content {
            Content::Dash => self.sequence(indent),
            Content::Entry { .. } => self.mapping(indent),
            Content::Value(text) => {
                let text = *text;
                self.lines.advance();
                // This node is the value: it counts once, in the flow reader.
                let value = inline_value(text, self.depth.saturating_sub(1))?;
                // A following line as far right would continue a multi-line scalar.
                let continued = matches!(self.lines.peek(), Some(next) if next.indent >= indent);
                (!continued).then_some(value)
            }
        }
    }

    fn sequence(&mut self, indent: usize) -> Option<Value> {
        let mut items = Vec::new();
        while matches!(self.lines.peek(),
            Some(line) if line.indent == indent && matches!(line.content, Content::Dash))
        {
            self.lines.advance();
            let nested = matches!(self.lines.peek(),
                Some(next) if next.inline || next.indent > indent);
            items.push(if nested { self.node()? } else { Value::Null });
        }
        Some(Value::Array(items))
    }

    fn mapping(&mut self, indent: usize) -> Option<Value> {
        let mut map = Map::new();
        while let Some(line) = self.lines.peek() {
            if line.indent != indent || (line.inline && !map.is_empty()) {
                break;
            }
            let Content::Entry { key, rest, block } = &mut line.content else {
                break;
            };
            // Each line is read once: its key and block text move into the value.
            let (key, rest, block) = (std::mem::take(key).into_owned(), *rest, block.take());
            self.lines.advance();
            let value = if let Some(text) = block {
                Value::String(text)
            } else if rest.is_empty() {
                let next = self
                    .lines
                    .peek()
                    .map(|next| (next.indent, matches!(next.content, Content::Dash)));
                match next {
                    Some((at, _)) if at > indent => self.node()?,
                    // `key:` with its sequence at the key's own column, as kubectl writes it.
                    Some((at, true)) if at == indent => self.sequence(indent)?,
                    _ => Value::Null,
                }
            } else {
                let value = inline_value(rest, self.depth)?;
                if matches!(self.lines.peek(), Some(next) if next.indent > indent) {
                    return None;
                }
                value
            };
            if map.insert(key, value).is_some() {
                return None;
            }
        }
        Some(Value::Object(map))
    }
}

/// A value written on one line after its key or dash: a quoted or plain scalar or a flow
/// collection, with an optional comment after it. `depth`: how many nodes it is inside.
fn inline_value(text: &str, depth: usize) -> Option<Value> {
    match text.as_bytes().first()? {
        b'"' | b'\'' => {
            let (text, after) = quoted(text)?;
            ends_cleanly(after).then_some(Value::String(text))
        }
        b'[' | b'{' => {
            let mut flow = Flow {
                text,
                pos: 0,
                depth,
            };
            let value = flow.node()?;
            ends_cleanly(&text[flow.pos..]).then_some(value)
        }
        b'|' | b'>' | b'&' | b'*' | b'!' | b'%' | b'@' | b'`' | b'?' | b',' | b']' | b'}'
        | b'#' | b':' => None,
        b'-' if matches!(text.as_bytes().get(1), None | Some(b' ')) => None,
        _ => {
            let text = text.find(" #").map_or(text, |end| &text[..end]);
            let text = text.trim_end_matches(' ');
            if text.contains(": ") || text.ends_with(':') {
                return None;
            }
            plain(text)
        }
    }
}

/// Whether only spaces and a comment follow a value.
fn ends_cleanly(after: &str) -> bool {
    after.is_empty()
        || (after.starts_with(' ') && {
            let rest = after.trim_start_matches(' ');
            rest.is_empty() || rest.starts_with('#')
        })
}

/// Words that some YAML reading takes as a boolean, a null or a non-finite number (lower case).
const SPECIAL_WORDS: [&str; 12] = [
    "true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf", "infinity",
];

fn is_special_word(text: &str) -> bool {
    let bare = text.trim_start_matches(['-', '+']).trim_start_matches('.');
    SPECIAL_WORDS
        .iter()
        .any(|word| bare.eq_ignore_ascii_case(word))
}

/// A plain scalar's value, as serde-saphyr types it; `None` when YAML readings may differ.
fn plain(text: &str) -> Option<Value> {
    match text {
        "true" => return Some(Value::Bool(true)),
        "false" => return Some(Value::Bool(false)),
        "null" | "~" => return Some(Value::Null),
        _ => {}
    }
    if is_special_word(text) {
        return None;
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    let bytes = unsigned.as_bytes();
    let first = *bytes.first()?;
    let numeric_start =
        first.is_ascii_digit() || (first == b'.' && bytes.get(1).is_some_and(u8::is_ascii_digit));
    if !numeric_start {
        return Some(Value::String(text.to_string()));
    }
    if let Some(number) = decimal(text) {
        return Some(Value::from(number));
    }
    if ["0x", "0o", "0b"].iter().any(|p| unsigned.starts_with(p)) {
        return None;
    }
    // Digits with only the characters of numbers, dates and times between them: an address is
    // a string in every reading; any other such text is left to the YAML parser.
    let number_like = unsigned
        .bytes()
        .all(|b| b.is_ascii_digit() || b"_.:eE+-".contains(&b));
    if number_like && !is_address(text) {
        return None;
    }
    // Other letters (a UID such as `5f3a…`, `10s`): no YAML number has them.
    Some(Value::String(text.to_string()))
}

/// A decimal integer without sign or leading zeros that fits an `i64` (`-` allowed).
fn decimal(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain_digits = !digits.is_empty()
        && digits.len() <= 18
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if plain_digits {
        text.parse().ok()
    } else {
        None
    }
}

/// An IP address or a CIDR (`10.0.0.0/8`).
fn is_address(text: &str) -> bool {
    let (address, prefix) = text.split_once('/').unwrap_or((text, "0"));
    address.parse::<std::net::IpAddr>().is_ok()
        && !prefix.is_empty()
        && prefix.bytes().all(|b| b.is_ascii_digit())
}

/// A quoted scalar at the start of `text` (which starts with its quote) and what follows it;
/// `None` when it does not end on this line or uses an escape outside the common ones.
fn quoted(text: &str) -> Option<(String, &str)> {
    let quote = *text.as_bytes().first()?;
    let mut out = String::new();
    let mut chars = text.char_indices().skip(1);
    while let Some((at, c)) = chars.next() {
        match c {
            '\'' if quote == b'\'' => {
                if text[at + 1..].starts_with('\'') {
                    chars.next();
                    out.push('\'');
                } else {
                    return Some((out, &text[at + 1..]));
                }
            }
            '"' if quote == b'"' => return Some((out, &text[at + 1..])),
            '\\' if quote == b'"' => {
                let (_, escape) = chars.next()?;
                let hex = |digits: usize, chars: &mut dyn Iterator<Item = (usize, char)>| {
                    let code: String = chars.take(digits).map(|(_, c)| c).collect();
                    (code.len() == digits)
                        .then(|| u32::from_str_radix(&code, 16).ok())
                        .flatten()
                        .and_then(char::from_u32)
                };
                out.push(match escape {
                    '\\' => '\\',
                    '"' => '"',
                    '/' => '/',
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'x' => hex(2, &mut chars)?,
                    'u' => hex(4, &mut chars)?,
                    _ => return None,
                });
            }
            c if c.is_control() => return None,
            c => out.push(c),
        }
    }
    None
}

/// A one-line flow collection (`[a, b]`, `{name: a, port: 80}`), read from `pos`.
struct Flow<'a> {
    text: &'a str,
    pos: usize,
    /// How many nodes the current one is inside (block nodes around the collection too).
    depth: usize,
}

impl<'a> Flow<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn skip_spaces(&mut self) {
        self.pos = self.text.len() - self.rest().trim_start_matches(' ').len();
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.rest().as_bytes().first() == Some(&byte);
        if found {
            self.pos += 1;
        }
        found
    }

    /// The node at `pos`; `None` beyond [`MAX_DEPTH`].
    fn node(&mut self) -> Option<Value> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        let value = self.node_within_depth();
        self.depth -= 1;
        value
    }

    fn node_within_depth(&mut self) -> Option<Value> {
        self.skip_spaces();
        match self.rest().as_bytes().first()? {
            b'[' => self.sequence(),
            b'{' => self.mapping(),
            b'"' | b'\'' => {
                let (text, after) = quoted(self.rest())?;
                self.pos = self.text.len() - after.len();
                Some(Value::String(text))
            }
            b'|' | b'>' | b'&' | b'*' | b'!' | b'%' | b'@' | b'`' | b'?' | b',' | b']' | b'}'
            | b'#' | b':' => None,
            b'-' if matches!(
                self.rest().as_bytes().get(1),
                None | Some(b' ' | b',' | b']' | b'}')
            ) =>
            {
                None
            }
            _ => {
                let bytes = self.rest().as_bytes();
                let mut end = 0;
                while let Some(&byte) = bytes.get(end) {
                    match byte {
                        b',' | b']' | b'}' => break,
                        // Comments, quotes inside plain text and a colon that could separate a
                        // key (`[a: b]`, `{a:}`) are left to the YAML parser.
                        b'#' | b'\'' | b'"' => return None,
                        b':' if matches!(
                            bytes.get(end + 1),
                            None | Some(b' ' | b',' | b']' | b'}')
                        ) =>
                        {
                            return None;
                        }
                        _ => end += 1,
                    }
                }
                let text = self.rest()[..end].trim_end_matches(' ');
                self.pos += end;
                if text.is_empty() {
                    return None;
                }
                plain(text)
            }
        }
    }

    fn sequence(&mut self) -> Option<Value> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_spaces();
        if self.eat(b']') {
            return Some(Value::Array(items));
        }
        loop {
            items.push(self.node()?);
            self.skip_spaces();
            if self.eat(b']') {
                return Some(Value::Array(items));
            }
            if !self.eat(b',') {
                return None;
            }
            self.skip_spaces();
            if self.rest().starts_with(']') {
                return None;
            }
        }
    }

    fn mapping(&mut self) -> Option<Value> {
        self.pos += 1;
        let mut map = Map::new();
        self.skip_spaces();
        if self.eat(b'}') {
            return Some(Value::Object(map));
        }
        loop {
            self.skip_spaces();
            let key = self.key()?;
            let value = self.node()?;
            if map.insert(key, value).is_some() {
                return None;
            }
            self.skip_spaces();
            if self.eat(b'}') {
                return Some(Value::Object(map));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// A key and its `: ` separator.
    fn key(&mut self) -> Option<String> {
        let key = if self.rest().starts_with(['"', '\'']) {
            let (key, after) = quoted(self.rest())?;
            self.pos = self.text.len() - after.len();
            key
        } else {
            let end = self.rest().find(": ")?;
            let key = &self.rest()[..end];
            if !plain_key(key) || key.contains([',', '[', ']', '{', '}', '#', '\'', '"']) {
                return None;
            }
            self.pos += end;
            key.to_string()
        };
        self.rest().starts_with(": ").then(|| {
            self.pos += 2;
            key
        })
    }
}

#[cfg(test)]
mod tests;
