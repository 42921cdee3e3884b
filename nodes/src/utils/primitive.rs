//! ComfyUI's primitive nodes (`comfy_extras/nodes_primitive.py`): one widget, passed on
//! as the output, so a value can be typed once and linked to many inputs.

use sdflow_executor::{ExecContext, InputSpec, Inputs, IoType, Node, NodeError, NodeSchema, Outputs, Registry, Value};
use std::sync::Arc;

pub fn register(registry: &mut Registry) {
    for p in [Primitive::String, Primitive::StringMultiline, Primitive::Int, Primitive::Float, Primitive::Boolean] {
        registry.register(Arc::new(p));
    }
}

/// Python's `sys.maxsize` on 64-bit builds, the limit ComfyUI gives PrimitiveInt and
/// PrimitiveFloat.
const SYS_MAXSIZE: i64 = i64::MAX;

#[derive(Clone, Copy, Debug)]
enum Primitive {
    String,
    StringMultiline,
    Int,
    Float,
    Boolean,
}

impl Node for Primitive {
    fn schema(&self) -> NodeSchema {
        // ComfyUI's V3 inputs leave `default` out; the frontend then starts at 0, 0.0, ""
        // and false, which is what these builders state explicitly.
        let (id, display, input, output) = match self {
            Primitive::String => ("PrimitiveString", "String", InputSpec::string("value", ""), IoType::STRING),
            Primitive::StringMultiline => ("PrimitiveStringMultiline", "String (Multiline)", InputSpec::string("value", "").multiline(), IoType::STRING),
            Primitive::Int => ("PrimitiveInt", "Int", InputSpec::int("value", 0).int_range(-(SYS_MAXSIZE as i128), SYS_MAXSIZE as i128).control_after_generate(), IoType::INT),
            Primitive::Float => ("PrimitiveFloat", "Float", InputSpec::float("value", 0.0).float_range(-(SYS_MAXSIZE as f64), SYS_MAXSIZE as f64), IoType::FLOAT),
            Primitive::Boolean => ("PrimitiveBoolean", "Boolean", InputSpec::boolean("value", false), IoType::BOOLEAN),
        };
        let name = output.as_str().to_string();
        NodeSchema::new(id).display_name(display).category("utils/primitive").input(input).output(name, output)
    }

    fn execute(&self, _ctx: &mut ExecContext<'_>, inputs: &Inputs) -> Result<Outputs, NodeError> {
        let v = match self {
            Primitive::String | Primitive::StringMultiline => Value::string(inputs.string("value")?),
            Primitive::Int => Value::int(inputs.int("value")?),
            Primitive::Float => Value::float(inputs.float("value")?),
            Primitive::Boolean => Value::boolean(inputs.boolean("value")?),
        };
        Ok(Outputs::new(vec![v]))
    }
}
