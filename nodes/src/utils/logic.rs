//! ComfyUI's Switch (`comfy_extras/nodes_logic.py`) and Preview Any
//! (`comfy_extras/nodes_preview_any.py`): nodes that pass or show a value of any type.

use crate::sampling::Sigmas;
use crate::values::{Image, Latent, Mask};
use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, OutputSpec, Outputs, Registry, Value};
use serde_json::json;
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    registry.register(Arc::new(Switch));
    registry.register(Arc::new(PreviewAny));
}

/// ComfyUI's "Switch" (`ComfySwitchNode`): `on_true` when `switch` is set, else `on_false`;
/// with only one of them linked, that one whatever `switch` says.
///
/// ComfyUI declares both inputs lazy, so only the chosen branch runs. This executor has no
/// lazy inputs: every linked branch runs before the switch decides, and an error in the
/// branch not taken fails the run. The inputs are optional as in ComfyUI's latest
/// version, and typed `*` where ComfyUI matches the two inputs and the output to one type
/// in the frontend (`COMFY_MATCHTYPE_V3`).
struct Switch;

impl Node for Switch {
    fn schema(&self) -> NodeSchema {
        let mut s = NodeSchema::new("ComfySwitchNode")
            .display_name("Switch")
            .category("logic")
            .input(InputSpec::boolean("switch", false))
            .input(InputSpec::link("on_false", IoType::ANY).optional())
            .input(InputSpec::link("on_true", IoType::ANY).optional());
        s.outputs.push(OutputSpec { name: "output".into(), io_type: IoType::ANY, is_list: false, tooltip: None });
        s
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let switch = inputs.boolean("switch")?;
        let pick = match (inputs.contains("on_true"), inputs.contains("on_false")) {
            (true, true) if switch => "on_true",
            (true, true) => "on_false",
            (true, false) => "on_true",
            (false, true) => "on_false",
            (false, false) => return Err(NodeError::MissingInput { input: "on_true and on_false (at least one must be linked)".into() }),
        };
        Ok(Outputs::new(vec![inputs.value(pick)?.clone()]))
    }
}

/// ComfyUI's "Preview Any": the value as text in the node's UI output,
/// `{"text": [value]}`. Strings as they are; numbers and booleans as Python's `str`
/// writes them (`1.0`, `1e-05`, `True`). ComfyUI shows anything else as `json.dumps` or
/// torch's `str` of it; here tensors and models are summarised by type and shape
/// instead, since torch's number formatting is not reproduced.
struct PreviewAny;

impl Node for PreviewAny {
    fn schema(&self) -> NodeSchema {
        NodeSchema::new("PreviewAny").display_name("Preview Any").category("utils").input(InputSpec::link("source", IoType::ANY)).output_node()
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let text = preview_text(inputs.value("source")?);
        Ok(Outputs::none().with_ui(json!({"text": [text]})))
    }
}

/// What Preview Any shows for a value.
pub fn preview_text(v: &Value) -> String {
    if let Some(s) = v.downcast_ref::<String>() {
        return s.clone();
    }
    if let Some(i) = v.downcast_ref::<i64>() {
        return i.to_string();
    }
    if let Some(f) = v.downcast_ref::<f64>() {
        return py_float_repr(*f);
    }
    if let Some(b) = v.downcast_ref::<bool>() {
        return if *b { "True" } else { "False" }.into();
    }
    if let Some(i) = v.downcast_ref::<Image>() {
        return format!("IMAGE [{}, {}, {}, {}]", i.n, i.height, i.width, i.channels);
    }
    if let Some(m) = v.downcast_ref::<Mask>() {
        return format!("MASK [{}, {}, {}]", m.n, m.height, m.width);
    }
    if let Some(l) = v.downcast_ref::<Latent>() {
        let [w, h, c, n] = l.shape;
        return format!("LATENT [{n}, {c}, {h}, {w}]");
    }
    if let Some(s) = v.downcast_ref::<Sigmas>() {
        return format!("SIGMAS [{}]", s.0.iter().map(|&x| py_float_repr(x as f64)).collect::<Vec<_>>().join(", "));
    }
    format!("{} ({})", v.io_type(), v.payload_type_name())
}

/// Python's `repr(float)`: the shortest digits that read back as the same number, in
/// fixed notation for exponents -4..16 and scientific (`1e-05`, `1.5e+16`) beyond.
pub fn py_float_repr(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` also gives the shortest round-trip digits.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let sign = if mantissa.starts_with('-') { "-" } else { "" };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if (-4..16).contains(&exp) {
        if exp < 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize))
        } else {
            let point = exp as usize + 1;
            let int: String = if digits.len() >= point { digits[..point].to_string() } else { format!("{digits:0<point$}") };
            let frac = if digits.len() > point { &digits[point..] } else { "0" };
            format!("{sign}{int}.{frac}")
        }
    } else {
        let frac = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
        format!("{sign}{}{frac}e{}{:02}", &digits[..1], if exp < 0 { '-' } else { '+' }, exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::py_float_repr;

    #[test]
    fn float_repr_as_python() {
        for (v, want) in [(1.0, "1.0"), (0.1, "0.1"), (-0.0, "-0.0"), (1e-5, "1e-05"), (1e16, "1e+16"), (123.456, "123.456"), (1.5e300, "1.5e+300"), (0.0001, "0.0001"), (9999999999999998.0, "9999999999999998.0")] {
            assert_eq!(py_float_repr(v), want, "{v}");
        }
    }
}
