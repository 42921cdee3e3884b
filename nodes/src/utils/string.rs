//! ComfyUI's string nodes (`comfy_extras/nodes_string.py`), with Python's `str` semantics:
//! lengths and slices count code points, `strip` removes what `str.isspace` calls space,
//! `capitalize`/`title` titlecase (not uppercase) the first letter, and the regex nodes
//! run Python's `re` syntax ([`super::pyre`]).

use super::pyre::{Flags, PyReError, PyRegex};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, OutputSpec, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    for n in [
        StringNode::Concatenate,
        StringNode::Substring,
        StringNode::Length,
        StringNode::CaseConverter,
        StringNode::Trim,
        StringNode::Replace,
        StringNode::Contains,
        StringNode::Compare,
        StringNode::RegexMatch,
        StringNode::RegexExtract,
        StringNode::RegexReplace,
    ] {
        registry.register(Arc::new(n));
    }
}

/// Python's `str.isspace`: Unicode White_Space plus the four information separators
/// (U+001C..U+001F), which Python counts as space (bidirectional class B/S).
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s[start:end]` on code points, negative indices counting from the end.
pub fn py_slice(s: &str, start: i64, end: i64) -> String {
    let len = s.chars().count() as i64;
    let norm = |i: i64| if i < 0 { (i + len).max(0) } else { i.min(len) };
    let (a, b) = (norm(start), norm(end));
    if b <= a {
        return String::new();
    }
    s.chars().skip(a as usize).take((b - a) as usize).collect()
}

/// Letters of general category Lt (titlecase), which Python counts as cased.
fn is_titlecase_letter(c: char) -> bool {
    matches!(c as u32, 0x1C5 | 0x1C8 | 0x1CB | 0x1F2 | 0x1F88..=0x1F8F | 0x1F98..=0x1F9F | 0x1FA8..=0x1FAF | 0x1FBC | 0x1FCC | 0x1FFC)
}

/// Python's `_PyUnicode_IsCased`: Lowercase, Uppercase or Lt.
fn is_cased(c: char) -> bool {
    c.is_lowercase() || c.is_uppercase() || is_titlecase_letter(c)
}

/// Titlecase mappings that differ from the uppercase ones (Unicode's UnicodeData and
/// SpecialCasing, as Python's `str.title` applies them); other characters titlecase to
/// their uppercase.
fn titlecase(c: char) -> String {
    let u = c as u32;
    let one = |v: u32| char::from_u32(v).map(String::from).unwrap_or_default();
    let many = |v: &[u32]| v.iter().filter_map(|&x| char::from_u32(x)).collect::<String>();
    match u {
        // Georgian Mkhedruli: titlecase is the letter itself (uppercase is Mtavruli).
        0x10D0..=0x10FA | 0x10FD..=0x10FF => c.to_string(),
        0x1C4..=0x1C6 => one(0x1C5),
        0x1C7..=0x1C9 => one(0x1C8),
        0x1CA..=0x1CC => one(0x1CB),
        0x1F1..=0x1F3 => one(0x1F2),
        0x1F80..=0x1FAF => one(u | 0x8),
        0x1FB3 | 0x1FBC => one(0x1FBC),
        0x1FC3 | 0x1FCC => one(0x1FCC),
        0x1FF3 | 0x1FFC => one(0x1FFC),
        0xDF => "Ss".into(),
        0x587 => many(&[0x535, 0x582]),
        0x1FB2 => many(&[0x1FBA, 0x345]),
        0x1FB4 => many(&[0x386, 0x345]),
        0x1FB7 => many(&[0x391, 0x342, 0x345]),
        0x1FC2 => many(&[0x1FCA, 0x345]),
        0x1FC4 => many(&[0x389, 0x345]),
        0x1FC7 => many(&[0x397, 0x342, 0x345]),
        0x1FF2 => many(&[0x1FFA, 0x345]),
        0x1FF4 => many(&[0x38F, 0x345]),
        0x1FF7 => many(&[0x3A9, 0x342, 0x345]),
        0xFB00 => "Ff".into(),
        0xFB01 => "Fi".into(),
        0xFB02 => "Fl".into(),
        0xFB03 => "Ffi".into(),
        0xFB04 => "Ffl".into(),
        0xFB05 | 0xFB06 => "St".into(),
        0xFB13 => many(&[0x544, 0x576]),
        0xFB14 => many(&[0x544, 0x565]),
        0xFB15 => many(&[0x544, 0x56B]),
        0xFB16 => many(&[0x54E, 0x576]),
        0xFB17 => many(&[0x544, 0x56D]),
        _ => c.to_uppercase().collect(),
    }
}

/// Each character of `s` lowercased, with capital sigma taking its final form where the
/// whole string's context says so (as `str.lower` decides it).
fn lower_each(s: &str) -> Vec<String> {
    let whole = s.to_lowercase();
    let mut at = 0;
    s.chars()
        .map(|c| {
            let l: String = if c == 'Σ' { whole[at..].chars().next().map(String::from).unwrap_or_else(|| "σ".into()) } else { c.to_lowercase().collect() };
            at += l.len();
            l
        })
        .collect()
}

/// Python's `str.capitalize` (3.8+): the first character titlecased, the rest lowercased.
pub fn py_capitalize(s: &str) -> String {
    let lower = lower_each(s);
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => titlecase(first) + &lower[1..].concat(),
        None => String::new(),
    }
}

/// Python's `str.title`: a character after a cased one is lowercased, any other
/// titlecased ("they're" → "They'Re").
pub fn py_title(s: &str) -> String {
    let lower = lower_each(s);
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for (c, l) in s.chars().zip(&lower) {
        if previous_cased {
            out.push_str(l);
        } else {
            out.push_str(&titlecase(c));
        }
        previous_cased = is_cased(c);
    }
    out
}

#[derive(Clone, Copy, Debug)]
enum StringNode {
    Concatenate,
    Substring,
    Length,
    CaseConverter,
    Trim,
    Replace,
    Contains,
    Compare,
    RegexMatch,
    RegexExtract,
    RegexReplace,
}

const CASE_MODES: [&str; 4] = ["UPPERCASE", "lowercase", "Capitalize", "Title Case"];
const TRIM_MODES: [&str; 3] = ["Both", "Left", "Right"];
const COMPARE_MODES: [&str; 3] = ["Starts With", "Ends With", "Equal"];
const EXTRACT_MODES: [&str; 4] = ["First Match", "All Matches", "First Group", "All Groups"];

fn text(name: &str) -> InputSpec {
    InputSpec::string(name, "").multiline()
}

fn regex_flags(s: NodeSchema, optional: bool) -> NodeSchema {
    let opt = |i: InputSpec| if optional { i.optional() } else { i };
    let dotall = InputSpec::boolean("dotall", false);
    let dotall = if optional { dotall.tooltip("When enabled, the dot (.) character will match any character including newline characters. When disabled, dots won't match newlines.") } else { dotall };
    s.input(opt(InputSpec::boolean("case_insensitive", true))).input(opt(InputSpec::boolean("multiline", false))).input(opt(dotall))
}

/// An output whose name is not its type (ComfyUI's `display_name` on an output).
fn named_output(s: NodeSchema, name: &str, io_type: IoType) -> NodeSchema {
    let mut s = s;
    s.outputs.push(OutputSpec { name: name.into(), io_type, is_list: false, tooltip: None });
    s
}

fn combo(inputs: &Inputs, name: &str, options: &[&str]) -> Result<usize, NodeError> {
    let v = inputs.string(name)?;
    options.iter().position(|o| *o == v).ok_or_else(|| NodeError::InvalidInput { input: name.into(), message: format!("`{v}` is not one of {}", options.join(", ")) })
}

fn compile(inputs: &Inputs) -> Result<PyRegex, NodeError> {
    // RegexReplace's flags are optional inputs with these defaults.
    let flag = |n: &str, d: bool| if inputs.contains(n) { inputs.boolean(n) } else { Ok(d) };
    let flags = Flags { ignore_case: flag("case_insensitive", true)?, multiline: flag("multiline", false)?, dotall: flag("dotall", false)? };
    PyRegex::new(inputs.string("regex_pattern")?, flags).map_err(|e| pattern_error(&e))
}

fn pattern_error(e: &PyReError) -> NodeError {
    let input = match e {
        PyReError::GroupReference(_) | PyReError::TemplateEscape(_) => "replace",
        PyReError::Runtime(_) => "string",
        _ => "regex_pattern",
    };
    NodeError::InvalidInput { input: input.into(), message: e.to_string() }
}

impl StringNode {
    fn id(self) -> (&'static str, &'static str) {
        match self {
            StringNode::Concatenate => ("StringConcatenate", "Concatenate"),
            StringNode::Substring => ("StringSubstring", "Substring"),
            StringNode::Length => ("StringLength", "Length"),
            StringNode::CaseConverter => ("CaseConverter", "Case Converter"),
            StringNode::Trim => ("StringTrim", "Trim"),
            StringNode::Replace => ("StringReplace", "Replace"),
            StringNode::Contains => ("StringContains", "Contains"),
            StringNode::Compare => ("StringCompare", "Compare"),
            StringNode::RegexMatch => ("RegexMatch", "Regex Match"),
            StringNode::RegexExtract => ("RegexExtract", "Regex Extract"),
            StringNode::RegexReplace => ("RegexReplace", "Regex Replace"),
        }
    }
}

impl Node for StringNode {
    fn schema(&self) -> NodeSchema {
        let (id, display) = self.id();
        let s = NodeSchema::new(id).display_name(display).category("utils/string");
        let string_out = |s: NodeSchema| s.output("STRING", IoType::STRING);
        match self {
            StringNode::Concatenate => string_out(s.input(text("string_a")).input(text("string_b")).input(InputSpec::string("delimiter", ""))),
            StringNode::Substring => string_out(s.input(text("string")).input(InputSpec::int("start", 0)).input(InputSpec::int("end", 0))),
            StringNode::Length => named_output(s.input(text("string")), "length", IoType::INT),
            StringNode::CaseConverter => string_out(s.input(text("string")).input(InputSpec::combo("mode", CASE_MODES))),
            StringNode::Trim => string_out(s.input(text("string")).input(InputSpec::combo("mode", TRIM_MODES))),
            StringNode::Replace => string_out(s.input(text("string")).input(text("find")).input(text("replace"))),
            StringNode::Contains => named_output(s.input(text("string")).input(text("substring")).input(InputSpec::boolean("case_sensitive", true)), "contains", IoType::BOOLEAN),
            StringNode::Compare => s
                .input(text("string_a"))
                .input(text("string_b"))
                .input(InputSpec::combo("mode", COMPARE_MODES))
                .input(InputSpec::boolean("case_sensitive", true))
                .output("BOOLEAN", IoType::BOOLEAN),
            StringNode::RegexMatch => named_output(regex_flags(s.input(text("string")).input(text("regex_pattern")), false), "matches", IoType::BOOLEAN),
            StringNode::RegexExtract => string_out(
                regex_flags(s.input(text("string")).input(text("regex_pattern")).input(InputSpec::combo("mode", EXTRACT_MODES)), false).input(InputSpec::int("group_index", 1).int_range(0, 100)),
            ),
            StringNode::RegexReplace => string_out(
                regex_flags(s.description("Find and replace text using regex patterns.").input(text("string")).input(text("regex_pattern")).input(text("replace")), true).input(
                    InputSpec::int("count", 0)
                        .int_range(0, 100)
                        .optional()
                        .tooltip("Maximum number of replacements to make. Set to 0 to replace all occurrences (default). Set to 1 to replace only the first match, 2 for the first two matches, etc."),
                ),
            ),
        }
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let string = |n: &str| inputs.string(n);
        let out = |v: Value| Ok(Outputs::new(vec![v]));
        match self {
            StringNode::Concatenate => out(Value::string([string("string_a")?, string("string_b")?].join(string("delimiter")?))),
            StringNode::Substring => out(Value::string(py_slice(string("string")?, inputs.int("start")?, inputs.int("end")?))),
            StringNode::Length => out(Value::int(string("string")?.chars().count() as i64)),
            StringNode::CaseConverter => {
                let s = string("string")?;
                out(Value::string(match combo(inputs, "mode", &CASE_MODES)? {
                    0 => s.to_uppercase(),
                    1 => s.to_lowercase(),
                    2 => py_capitalize(s),
                    _ => py_title(s),
                }))
            }
            StringNode::Trim => {
                let s = string("string")?;
                out(Value::string(match combo(inputs, "mode", &TRIM_MODES)? {
                    0 => s.trim_matches(py_isspace),
                    1 => s.trim_start_matches(py_isspace),
                    _ => s.trim_end_matches(py_isspace),
                }))
            }
            StringNode::Replace => out(Value::string(string("string")?.replace(string("find")?, string("replace")?))),
            StringNode::Contains => {
                let (s, sub) = (string("string")?, string("substring")?);
                let found = if inputs.boolean("case_sensitive")? { s.contains(sub) } else { s.to_lowercase().contains(&sub.to_lowercase()) };
                out(Value::boolean(found))
            }
            StringNode::Compare => {
                let (a, b) = (string("string_a")?, string("string_b")?);
                let (a, b) = if inputs.boolean("case_sensitive")? { (a.to_string(), b.to_string()) } else { (a.to_lowercase(), b.to_lowercase()) };
                out(Value::boolean(match combo(inputs, "mode", &COMPARE_MODES)? {
                    0 => a.starts_with(&b),
                    1 => a.ends_with(&b),
                    _ => a == b,
                }))
            }
            StringNode::RegexMatch => {
                let re = compile(inputs)?;
                out(Value::boolean(re.search(string("string")?, 0).map_err(|e| pattern_error(&e))?.is_some()))
            }
            StringNode::RegexExtract => out(Value::string(regex_extract(inputs)?)),
            StringNode::RegexReplace => {
                let re = compile(inputs)?;
                let count = if inputs.contains("count") { inputs.int("count")? } else { 0 };
                let count = usize::try_from(count).map_err(|_| NodeError::InvalidInput { input: "count".into(), message: format!("must be >= 0, got {count}") })?;
                out(Value::string(re.sub(string("string")?, string("replace")?, count).map_err(|e| pattern_error(&e))?))
            }
        }
    }
}

/// RegexExtract's four modes, joined by newlines where there are several results.
/// "All Matches" is `re.findall`'s view: the whole match without groups, group 1 with
/// any. A group that took no part in a "First Group" match gives "" (ComfyUI returns
/// Python's None there); in "All Groups" it is an error, as ComfyUI's `join` fails on it.
fn regex_extract(inputs: &Inputs) -> Result<String, NodeError> {
    let re = compile(inputs)?;
    let s = inputs.string("string")?;
    let mode = combo(inputs, "mode", &EXTRACT_MODES)?;
    let index = inputs.int("group_index")?;
    let index = usize::try_from(index).map_err(|_| NodeError::InvalidInput { input: "group_index".into(), message: format!("must be >= 0, got {index}") })?;
    let run = |e: PyReError| pattern_error(&e);
    Ok(match mode {
        0 => re.search(s, 0).map_err(run)?.and_then(|m| m.group(0).map(str::to_string)).unwrap_or_default(),
        1 => {
            let g = usize::from(re.groups() > 0);
            re.find_all(s, 0).map_err(run)?.iter().map(|m| m.group(g).unwrap_or("").to_string()).collect::<Vec<_>>().join("\n")
        }
        2 => match re.search(s, 0).map_err(run)? {
            Some(m) if re.groups() >= index => m.group(index).unwrap_or("").to_string(),
            _ => String::new(),
        },
        _ => {
            let mut parts = Vec::new();
            if re.groups() > 0 && re.groups() >= index {
                for m in re.find_all(s, 0).map_err(run)? {
                    parts.push(m.group(index).ok_or_else(|| NodeError::InvalidInput { input: "group_index".into(), message: format!("group {index} took no part in the match at {}", m.start) })?.to_string());
                }
            }
            parts.join("\n")
        }
    })
}
