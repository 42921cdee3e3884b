//! Python's `re` module, as ComfyUI's regex nodes call it, on top of `fancy-regex`.
//!
//! `fancy-regex` rather than the `regex` crate (both are in the lockfile already): Python
//! patterns use backreferences (`(\w)\1`, `(?P=name)`), look-around and conditionals,
//! which only a backtracking engine can run; `fancy-regex` hands the parts without them
//! to `regex` anyway, and its backtracking is bounded ([`BACKTRACK_LIMIT`]) so a
//! catastrophic pattern fails with an error instead of hanging the worker.
//!
//! Python's syntax is translated first where the two differ:
//! - `$` without MULTILINE also matches before a newline that ends the text; `\Z` is the
//!   very end (`\z` here);
//! - `{` that does not start a valid quantifier is a literal; `{,n}` means `{0,n}`;
//! - `\0`, `\012` and `\141` are octal escapes; `\1`..`\99` backreferences; `\x`, `\u`,
//!   `\U` take exactly 2, 4 and 8 hex digits; `\a`, `\v` are controls; `\b` in a class is a
//!   backspace; `\s` also matches U+001C..U+001F (as `str.isspace`);
//! - `(?P=name)`, `(?(name)…)` and `(?#comment)` are Python-only forms;
//! - in classes, `[`, `&&`, `--` and `~~` are literals (nested classes and set operations
//!   in the `regex` crate), whitespace is kept under VERBOSE;
//! - escapes of ASCII letters Python does not know (`\z`, `\p`, `\h`, `\K`, `\G`, `\k`, ...)
//!   are errors, as in Python, and escaped punctuation is always a literal (`\<` is a word
//!   boundary in `regex`).
//!
//! Not supported, with an error rather than a different result: the ASCII and LOCALE
//! flags (`(?a)`, `(?L)`) and named Unicode escapes (`\N{...}`). Left as they are: Unicode
//! tables of the Rust engine (`\w`, `\d`, case folding) where they differ from Python's for
//! rare characters, and one corner of Python's empty-match rule (after an empty match
//! Python's engine may take a longer alternative at the same place; here the search moves
//! one character on).

use fancy_regex::{Captures, Regex, RegexBuilder};

/// Backtracking steps one search may take before it is abandoned with an error.
pub const BACKTRACK_LIMIT: usize = 1_000_000;

/// Longest pattern accepted: patterns are typed by people, and the compiled program grows
/// with the pattern.
pub const MAX_PATTERN_CHARS: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum PyReError {
    #[error("bad escape {escape} at position {at}")]
    BadEscape { escape: String, at: usize },
    #[error("{what} at position {at} is not supported (Python's re has it, this engine does not)")]
    Unsupported { what: String, at: usize },
    #[error("{message} at position {at}")]
    Syntax { message: String, at: usize },
    #[error("the pattern is longer than {MAX_PATTERN_CHARS} characters")]
    TooLong,
    #[error("{0}")]
    Compile(String),
    #[error("invalid group reference {0} in the replacement")]
    GroupReference(String),
    #[error("bad escape {0} in the replacement")]
    TemplateEscape(String),
    #[error("matching failed: {0}")]
    Runtime(String),
}

/// The `re` flags ComfyUI's nodes pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags {
    pub ignore_case: bool,
    pub multiline: bool,
    pub dotall: bool,
}

/// A compiled Python pattern.
#[derive(Debug)]
pub struct PyRegex {
    re: Regex,
    /// The same pattern with `$` read as the end of the text, for texts that do not end in
    /// a newline (where Python's `$` means just that): without the look-ahead it stays a
    /// plain `regex` pattern, linear in the text instead of backtracking. `None` when the
    /// pattern has no such `$`.
    at_end: Option<Regex>,
    groups: usize,
}

/// One match: the span and the text of each group (`None`: the group did not take part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyMatch {
    pub start: usize,
    pub end: usize,
    pub groups: Vec<Option<String>>,
}

impl PyMatch {
    fn from_captures(c: &Captures<'_>, n: usize) -> Self {
        let m = c.get(0).expect("group 0 is always set on a match");
        PyMatch { start: m.start(), end: m.end(), groups: (0..=n).map(|i| c.get(i).map(|g| g.as_str().to_string())).collect() }
    }

    /// Group `i` (0: the whole match).
    pub fn group(&self, i: usize) -> Option<&str> {
        self.groups.get(i).and_then(|g| g.as_deref())
    }
}

impl PyRegex {
    pub fn new(pattern: &str, flags: Flags) -> Result<Self, PyReError> {
        if pattern.chars().count() > MAX_PATTERN_CHARS {
            return Err(PyReError::TooLong);
        }
        let mut prefix = String::new();
        for (on, letter) in [(flags.ignore_case, 'i'), (flags.dotall, 's'), (flags.multiline, 'm')] {
            if on {
                prefix.push_str(&format!("(?{letter})"));
            }
        }
        let build = |body: String| RegexBuilder::new(&(prefix.clone() + &body)).backtrack_limit(BACKTRACK_LIMIT).build().map_err(|e| PyReError::Compile(e.to_string()));
        let (exact, plain) = (translate(pattern, flags.multiline, DOLLAR)?, translate(pattern, flags.multiline, "\\z")?);
        let at_end = if plain != exact { Some(build(plain)?) } else { None };
        let re = build(exact)?;
        let groups = re.captures_len().saturating_sub(1);
        Ok(PyRegex { re, at_end, groups })
    }

    fn engine(&self, text: &str) -> &Regex {
        match &self.at_end {
            Some(r) if !text.ends_with('\n') => r,
            _ => &self.re,
        }
    }

    /// Python's `pattern.groups`.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// `re.search`: the leftmost match at or after `pos`.
    pub fn search(&self, text: &str, pos: usize) -> Result<Option<PyMatch>, PyReError> {
        let caps = self.engine(text).captures_from_pos(text, pos).map_err(|e| PyReError::Runtime(e.to_string()))?;
        Ok(caps.map(|c| PyMatch::from_captures(&c, self.groups)))
    }

    /// `re.finditer`: successive matches, an empty match allowed right after a non-empty
    /// one (Python 3.7+) but never twice at the same place.
    pub fn find_all(&self, text: &str, limit: usize) -> Result<Vec<PyMatch>, PyReError> {
        let mut out = Vec::new();
        let mut pos = 0;
        let mut last_empty_at = None;
        while pos <= text.len() && (limit == 0 || out.len() < limit) {
            let Some(m) = self.search(text, pos)? else { break };
            if m.start == m.end && last_empty_at == Some(m.start) {
                // An empty match where the previous one ended empty: look one character on.
                match text[pos..].chars().next() {
                    Some(c) => {
                        pos += c.len_utf8();
                        continue;
                    }
                    None => break,
                }
            }
            last_empty_at = (m.start == m.end).then_some(m.end);
            pos = m.end;
            out.push(m);
        }
        Ok(out)
    }

    /// `re.sub(pattern, template, text, count)` with Python's template syntax
    /// (`\1`, `\g<name>`, `\g<0>`, `\n`, ...); `count` 0 replaces every match.
    pub fn sub(&self, text: &str, template: &str, count: usize) -> Result<String, PyReError> {
        let pieces = parse_template(template, self)?;
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for m in self.find_all(text, count)? {
            out.push_str(&text[last..m.start]);
            for p in &pieces {
                match p {
                    Piece::Text(s) => out.push_str(s),
                    Piece::Group(i) => out.push_str(m.group(*i).unwrap_or("")),
                }
            }
            last = m.end;
        }
        out.push_str(&text[last..]);
        Ok(out)
    }

    fn group_index(&self, name: &str) -> Option<usize> {
        self.re.capture_names().position(|n| n == Some(name))
    }
}

/// The characters the `regex` crate treats as syntax (and lets be escaped).
fn is_meta(c: char) -> bool {
    "\\.+*?()|[]{}^$#&-~".contains(c)
}

/// `c` as a literal in the translated pattern.
fn literal(c: char) -> String {
    if is_meta(c) {
        format!("\\{c}")
    } else if c.is_whitespace() || c.is_control() {
        // VERBOSE would drop whitespace; a hex escape survives it.
        format!("\\x{{{:X}}}", c as u32)
    } else {
        c.to_string()
    }
}

fn code_point(v: u32, at: usize, escape: &str) -> Result<String, PyReError> {
    match char::from_u32(v) {
        Some(c) => Ok(format!("\\x{{{:X}}}", c as u32)),
        None => Err(PyReError::BadEscape { escape: escape.to_string(), at }),
    }
}

/// Python's `$` without MULTILINE: the end, or before a newline that ends the text.
const DOLLAR: &str = "(?=\\n?\\z)";

/// Python's pattern → the `fancy-regex` pattern with the same meaning, `$` without
/// MULTILINE written as `dollar`.
fn translate(pattern: &str, multiline: bool, dollar: &str) -> Result<String, PyReError> {
    let p: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 16);
    // MULTILINE of each open group (scoped flags change it), and of the pattern itself.
    let mut stack: Vec<bool> = Vec::new();
    let mut ml = multiline;
    let mut verbose = false;
    let mut i = 0;
    let mut at_start = true;
    while i < p.len() {
        let c = p[i];
        let starting = at_start;
        at_start = false;
        match c {
            '\\' => {
                let (text, next) = escape(&p, i, false)?;
                out.push_str(&text);
                i = next;
            }
            '[' => {
                let (text, next) = class(&p, i)?;
                out.push_str(&text);
                i = next;
            }
            '$' => {
                out.push_str(if ml { "(?m:$)" } else { dollar });
                i += 1;
            }
            '{' => {
                let (text, next) = brace(&p, i);
                out.push_str(&text);
                i = next;
            }
            '}' => {
                out.push_str("\\}");
                i += 1;
            }
            '#' if verbose => {
                while i < p.len() && p[i] != '\n' {
                    out.push(p[i]);
                    i += 1;
                }
            }
            ')' => {
                ml = stack.pop().unwrap_or(ml);
                out.push(')');
                i += 1;
            }
            '(' if p.get(i + 1) == Some(&'?') => {
                let rest: String = p[i + 2..].iter().take(3).collect();
                if rest.starts_with('#') {
                    let close = p[i..].iter().position(|&x| x == ')').ok_or(PyReError::Syntax { message: "missing ), unterminated comment".into(), at: i })?;
                    i += close + 1;
                    at_start = starting;
                } else if rest.starts_with("P<") {
                    stack.push(ml);
                    out.push_str("(?P<");
                    i += 4;
                } else if rest.starts_with("P=") {
                    let close = p[i..].iter().position(|&x| x == ')').ok_or(PyReError::Syntax { message: "missing ), unterminated name".into(), at: i })?;
                    let name: String = p[i + 4..i + close].iter().collect();
                    out.push_str(&format!("\\k<{name}>"));
                    i += close + 1;
                } else if rest.starts_with('P') {
                    return Err(PyReError::Syntax { message: "unknown extension ?P".into(), at: i });
                } else if rest.starts_with('(') {
                    // Python's (?(1)…) and (?(name)…); fancy-regex wants a name in <>.
                    let close = p[i + 3..].iter().position(|&x| x == ')').ok_or(PyReError::Syntax { message: "missing ), unterminated name".into(), at: i })?;
                    let id: String = p[i + 3..i + 3 + close].iter().collect();
                    stack.push(ml);
                    if id.chars().all(|d| d.is_ascii_digit()) {
                        out.push_str(&format!("(?({id})"));
                    } else {
                        out.push_str(&format!("(?(<{id}>)"));
                    }
                    i += 3 + close + 1;
                } else if rest.starts_with(':') || rest.starts_with('=') || rest.starts_with('!') || rest.starts_with('>') || rest.starts_with("<=") || rest.starts_with("<!") {
                    stack.push(ml);
                    out.push_str("(?");
                    i += 2;
                } else {
                    let (text, next, scoped, new_ml, x) = flag_group(&p, i, ml, starting)?;
                    out.push_str(&text);
                    if scoped {
                        stack.push(ml);
                    } else {
                        at_start = true;
                    }
                    ml = new_ml;
                    verbose |= x;
                    i = next;
                }
            }
            '(' => {
                stack.push(ml);
                out.push('(');
                i += 1;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// `(?flags)` (global, only at the start in Python 3.11+) or `(?flags-flags:` (scoped):
/// the translated text, where parsing goes on, whether it opened a group, the MULTILINE
/// state after it and whether it turned VERBOSE on.
fn flag_group(p: &[char], i: usize, ml: bool, at_start: bool) -> Result<(String, usize, bool, bool, bool), PyReError> {
    let mut j = i + 2;
    let (mut on, mut off) = (String::new(), String::new());
    let mut negative = false;
    while j < p.len() && p[j] != ')' && p[j] != ':' {
        match p[j] {
            '-' if !negative => negative = true,
            'i' | 'm' | 's' | 'x' => {
                if negative {
                    off.push(p[j]);
                } else {
                    on.push(p[j]);
                }
            }
            'u' if !negative => {}
            'a' | 'L' => return Err(PyReError::Unsupported { what: format!("the {} flag (?{})", if p[j] == 'a' { "ASCII" } else { "LOCALE" }, p[j]), at: i }),
            other => return Err(PyReError::Syntax { message: format!("unknown extension ?{other}"), at: i }),
        }
        j += 1;
    }
    let Some(&end) = p.get(j) else {
        return Err(PyReError::Syntax { message: "missing -, : or )".into(), at: i });
    };
    let scoped = end == ':';
    if !scoped && (negative || !at_start) {
        return Err(PyReError::Syntax { message: if negative { "missing :".into() } else { "global flags not at the start of the expression".into() }, at: i });
    }
    let new_ml = if off.contains('m') { false } else { ml || on.contains('m') };
    let mut text = String::from("(?");
    text.push_str(&on);
    if !off.is_empty() {
        text.push('-');
        text.push_str(&off);
    }
    if scoped {
        text.push(':');
    } else if on.is_empty() {
        // `(?u)` alone: nothing left to say.
        return Ok((String::new(), j + 1, false, new_ml, false));
    } else {
        text.push(')');
    }
    Ok((text, j + 1, scoped, new_ml, on.contains('x')))
}

/// A `{` at `i`: a quantifier when Python reads one (`{m}`, `{m,}`, `{,n}`, `{m,n}`),
/// otherwise a literal brace.
fn brace(p: &[char], i: usize) -> (String, usize) {
    let mut j = i + 1;
    let digits = |j: &mut usize| {
        let s = *j;
        while *j < p.len() && p[*j].is_ascii_digit() {
            *j += 1;
        }
        p[s..*j].iter().collect::<String>()
    };
    let lo = digits(&mut j);
    let (hi, comma) = if p.get(j) == Some(&',') {
        j += 1;
        (digits(&mut j), true)
    } else {
        (lo.clone(), false)
    };
    if p.get(j) != Some(&'}') || (j == i + 1) {
        return ("\\{".into(), i + 1);
    }
    let lo = if lo.is_empty() { "0".to_string() } else { lo };
    let text = if comma { format!("{{{lo},{hi}}}") } else { format!("{{{lo}}}") };
    (text, j + 1)
}

/// Hex digits `p[i..i+n]` as a number, when all are there.
fn hex(p: &[char], i: usize, n: usize) -> Option<u32> {
    if i + n > p.len() {
        return None;
    }
    let s: String = p[i..i + n].iter().collect();
    if s.chars().all(|c| c.is_ascii_hexdigit()) {
        u32::from_str_radix(&s, 16).ok()
    } else {
        None
    }
}

fn is_octal(c: Option<&char>) -> bool {
    matches!(c, Some('0'..='7'))
}

/// The escape at `p[i]` (a backslash), inside a class or not: its translation and where
/// parsing goes on.
fn escape(p: &[char], i: usize, in_class: bool) -> Result<(String, usize), PyReError> {
    let Some(&d) = p.get(i + 1) else {
        return Err(PyReError::BadEscape { escape: "\\ (end of pattern)".into(), at: i });
    };
    let bad = || PyReError::BadEscape { escape: format!("\\{d}"), at: i };
    let simple = |s: &str| Ok((s.to_string(), i + 2));
    match d {
        'd' | 'D' | 'w' | 'W' => simple(&format!("\\{d}")),
        's' if in_class => simple("\\s\\x1C-\\x1F"),
        'S' if in_class => simple("[^\\s\\x1C-\\x1F]"),
        's' => simple("[\\s\\x1C-\\x1F]"),
        'S' => simple("[^\\s\\x1C-\\x1F]"),
        'b' if in_class => simple("\\x08"),
        'A' | 'b' | 'B' if !in_class => simple(&format!("\\{d}")),
        'Z' if !in_class => simple("\\z"),
        'a' => simple("\\x07"),
        'f' => simple("\\x0C"),
        'n' => simple("\\n"),
        'r' => simple("\\r"),
        't' => simple("\\t"),
        'v' => simple("\\x0B"),
        'x' | 'u' | 'U' => {
            let n = match d {
                'x' => 2,
                'u' => 4,
                _ => 8,
            };
            let v = hex(p, i + 2, n).ok_or_else(|| PyReError::BadEscape { escape: format!("incomplete escape \\{d}"), at: i })?;
            Ok((code_point(v, i, &format!("\\{d}"))?, i + 2 + n))
        }
        'N' => Err(PyReError::Unsupported { what: "a named Unicode escape \\N{...}".into(), at: i }),
        '0' => {
            let mut j = i + 2;
            while j < i + 4 && is_octal(p.get(j)) {
                j += 1;
            }
            let v = if j > i + 2 { u32::from_str_radix(&p[i + 2..j].iter().collect::<String>(), 8).unwrap_or(0) } else { 0 };
            Ok((code_point(v, i, "\\0")?, j))
        }
        '1'..='9' => {
            let three_octal = is_octal(p.get(i + 1)) && is_octal(p.get(i + 2)) && is_octal(p.get(i + 3));
            if three_octal || in_class {
                if !is_octal(Some(&d)) {
                    return Err(bad());
                }
                let mut j = i + 1;
                while j < i + 4 && is_octal(p.get(j)) {
                    j += 1;
                }
                let v = u32::from_str_radix(&p[i + 1..j].iter().collect::<String>(), 8).unwrap_or(0);
                if v > 0o377 {
                    return Err(PyReError::Syntax { message: format!("octal escape value \\{:o} outside of range 0-0o377", v), at: i });
                }
                return Ok((code_point(v, i, "\\")?, j));
            }
            let two = p.get(i + 2).is_some_and(char::is_ascii_digit);
            let n: String = p[i + 1..i + if two { 3 } else { 2 }].iter().collect();
            Ok((format!("\\k<{n}>"), i + 1 + n.len()))
        }
        c if c.is_ascii_alphabetic() => Err(bad()),
        c => Ok((literal(c), i + 2)),
    }
}

/// The class opening at `p[i]`: its translation and where parsing goes on.
fn class(p: &[char], i: usize) -> Result<(String, usize), PyReError> {
    let mut out = String::from("[");
    let mut j = i + 1;
    if p.get(j) == Some(&'^') {
        out.push('^');
        j += 1;
    }
    // A `]` first is a literal, as in Python.
    if p.get(j) == Some(&']') {
        out.push_str("\\]");
        j += 1;
    }
    let mut prev_dash = false;
    loop {
        let Some(&c) = p.get(j) else {
            return Err(PyReError::Syntax { message: "unterminated character set".into(), at: i });
        };
        let dash = c == '-' && !prev_dash;
        match c {
            ']' => {
                out.push(']');
                return Ok((out, j + 1));
            }
            '\\' => {
                let (text, next) = escape(p, j, true)?;
                out.push_str(&text);
                j = next;
            }
            // A range, unless it would read as `regex`'s `--` difference.
            '-' if dash => {
                out.push('-');
                j += 1;
            }
            c => {
                out.push_str(&literal(c));
                j += 1;
            }
        }
        prev_dash = dash;
    }
}

enum Piece {
    Text(String),
    Group(usize),
}

/// Python's `re._parse_template`: literal text, `\1`..`\99`, `\g<n>`, `\g<name>`, the
/// character escapes; octal `\0`, `\012`; other ASCII-letter escapes are errors and the
/// rest stay as written (backslash included).
fn parse_template(t: &str, re: &PyRegex) -> Result<Vec<Piece>, PyReError> {
    let c: Vec<char> = t.chars().collect();
    let mut pieces = Vec::new();
    let mut text = String::new();
    let group = |pieces: &mut Vec<Piece>, text: &mut String, g: usize| -> Result<(), PyReError> {
        if g > re.groups {
            return Err(PyReError::GroupReference(g.to_string()));
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(text)));
        }
        pieces.push(Piece::Group(g));
        Ok(())
    };
    let mut i = 0;
    while i < c.len() {
        if c[i] != '\\' {
            text.push(c[i]);
            i += 1;
            continue;
        }
        let Some(&d) = c.get(i + 1) else {
            return Err(PyReError::TemplateEscape("\\ (end of replacement)".into()));
        };
        i += 2;
        match d {
            'g' => {
                let close = (c.get(i) == Some(&'<')).then(|| c[i..].iter().position(|&x| x == '>')).flatten().ok_or_else(|| PyReError::TemplateEscape("\\g without <name>".into()))?;
                let name: String = c[i + 1..i + close].iter().collect();
                i += close + 1;
                let g = if !name.is_empty() && name.chars().all(|x| x.is_ascii_digit()) {
                    name.parse::<usize>().map_err(|_| PyReError::GroupReference(name.clone()))?
                } else {
                    re.group_index(&name).ok_or_else(|| PyReError::GroupReference(format!("<{name}> (unknown group name)")))?
                };
                group(&mut pieces, &mut text, g)?;
            }
            '0' => {
                let mut j = i;
                while j < i + 2 && is_octal(c.get(j)) {
                    j += 1;
                }
                let v = u32::from_str_radix(&c[i..j].iter().collect::<String>(), 8).unwrap_or(0);
                text.push(char::from_u32(v).unwrap_or('\0'));
                i = j;
            }
            '1'..='9' => {
                if c.get(i).is_some_and(char::is_ascii_digit) {
                    if is_octal(Some(&d)) && is_octal(c.get(i)) && is_octal(c.get(i + 1)) {
                        let v = u32::from_str_radix(&c[i - 1..i + 2].iter().collect::<String>(), 8).unwrap_or(0);
                        if v > 0o377 {
                            return Err(PyReError::TemplateEscape(format!("octal escape value \\{v:o} outside of range 0-0o377")));
                        }
                        text.push(char::from_u32(v).unwrap_or('\0'));
                        i += 2;
                    } else {
                        let g = (d as usize - '0' as usize) * 10 + (c[i] as usize - '0' as usize);
                        i += 1;
                        group(&mut pieces, &mut text, g)?;
                    }
                } else {
                    group(&mut pieces, &mut text, d as usize - '0' as usize)?;
                }
            }
            'a' => text.push('\x07'),
            'b' => text.push('\x08'),
            'f' => text.push('\x0C'),
            'n' => text.push('\n'),
            'r' => text.push('\r'),
            't' => text.push('\t'),
            'v' => text.push('\x0B'),
            '\\' => text.push('\\'),
            d if d.is_ascii_alphabetic() => return Err(PyReError::TemplateEscape(format!("\\{d}"))),
            d => {
                text.push('\\');
                text.push(d);
            }
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn re(p: &str) -> PyRegex {
        PyRegex::new(p, Flags::default()).unwrap()
    }

    #[test]
    fn translation_of_python_only_syntax() {
        assert_eq!(translate("a{,3}b{2,}c{x}{}", false, DOLLAR).unwrap(), "a{0,3}b{2,}c\\{x\\}\\{\\}");
        assert_eq!(translate(r"[]a&&b--c~~[]", false, DOLLAR).unwrap(), r"[\]a\&\&b-\-c\~\~\[]");
        assert_eq!(translate(r"\Z\101\0", false, DOLLAR).unwrap(), r"\z\x{41}\x{0}");
        assert_eq!(translate("(?P<x>a)(?P=x)", false, DOLLAR).unwrap(), r"(?P<x>a)\k<x>");
        assert_eq!(translate("a$", true, DOLLAR).unwrap(), "a(?m:$)");
        assert_eq!(translate("(?m)a$(?-m:b$)", false, DOLLAR).unwrap(), "(?m)a(?m:$)(?-m:b(?=\\n?\\z))");
        assert!(matches!(translate(r"\z", false, DOLLAR), Err(PyReError::BadEscape { .. })));
        assert!(matches!(translate(r"(?a)x", false, DOLLAR), Err(PyReError::Unsupported { .. })));
        assert!(matches!(translate(r"x(?i)", false, DOLLAR), Err(PyReError::Syntax { .. })));
        assert!(matches!(translate(r"[abc", false, DOLLAR), Err(PyReError::Syntax { .. })));
    }

    #[test]
    fn python_semantics() {
        assert!(re("abc$").search("abc\n", 0).unwrap().is_some(), "$ before a final newline");
        assert!(re(r"abc\Z").search("abc\n", 0).unwrap().is_none());
        assert_eq!(re("x*").sub("abxd", "-", 0).unwrap(), "-a-b--d-");
        assert_eq!(re(r"(\w)(\d)").sub("a1 b2", r"\2\g<1>\n", 0).unwrap(), "1a\n 2b\n");
        assert_eq!(re(r"(?P<w>o)").sub("foo", r"[\g<w>]", 1).unwrap(), "f[o]o");
        assert!(matches!(re("(a)").sub("a", r"\2", 0), Err(PyReError::GroupReference(_))));
        assert!(matches!(re("(a)").sub("a", r"\q", 0), Err(PyReError::TemplateEscape(_))));
        assert_eq!(re(r"(a)|b").sub("ab", r"<\1>", 0).unwrap(), "<a><>", "unmatched groups are empty");
        assert_eq!(re(r"(\w)\1").search("abccd", 0).unwrap().unwrap().group(0), Some("cc"));
    }
}
