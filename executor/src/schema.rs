//! What a node type declares about itself: the typed inputs and widgets it takes, the
//! outputs it produces, and how ComfyUI's `/object_info` shows it.
//!
//! Modelled on ComfyUI's V3 schema (`io.Schema`): each input is either a socket of some IO
//! type or a widget (INT, FLOAT, STRING, BOOLEAN, COMBO) with its default and limits. A widget
//! can still be fed by a link of its own type, as in ComfyUI's "convert widget to input".

use serde_json::{json, Map, Value as Json};

use crate::value::IoType;

/// The kind of an input, with the limits validation checks.
#[derive(Clone, Debug, PartialEq)]
pub enum InputKind {
    /// A socket that only a link can fill.
    Link(IoType),
    Int(IntWidget),
    Float(FloatWidget),
    String(StringWidget),
    Boolean(BoolWidget),
    Combo(ComboWidget),
}

#[derive(Clone, Debug, PartialEq)]
pub struct IntWidget {
    pub default: i128,
    // i128 so both i64::MIN and ComfyUI's u64::MAX seed limit fit.
    pub min: i128,
    pub max: i128,
    pub step: i128,
    /// The frontend adds a "fixed/increment/decrement/randomize" widget after this one,
    /// whose value appears in the UI format's `widgets_values`.
    pub control_after_generate: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FloatWidget {
    pub default: f64,
    pub min: f64,
    pub max: f64,
    pub step: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StringWidget {
    pub default: String,
    pub multiline: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BoolWidget {
    pub default: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ComboWidget {
    pub options: Vec<String>,
    pub default: Option<String>,
}

impl InputKind {
    /// The IO type a link into this input must carry.
    pub fn io_type(&self) -> IoType {
        match self {
            InputKind::Link(t) => t.clone(),
            InputKind::Int(_) => IoType::INT,
            InputKind::Float(_) => IoType::FLOAT,
            InputKind::String(_) => IoType::STRING,
            InputKind::Boolean(_) => IoType::BOOLEAN,
            InputKind::Combo(_) => IoType::COMBO,
        }
    }

    pub fn is_widget(&self) -> bool {
        !matches!(self, InputKind::Link(_))
    }
}

/// One declared input.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    pub name: String,
    pub kind: InputKind,
    pub optional: bool,
    pub tooltip: Option<String>,
    /// Further options shown in `/object_info` as they are (`display`, `round`,
    /// `image_upload`, `forceInput`, ...); the executor does not interpret them.
    pub extra: Map<String, Json>,
}

impl InputSpec {
    fn with_kind(name: impl Into<String>, kind: InputKind) -> Self {
        InputSpec {
            name: name.into(),
            kind,
            optional: false,
            tooltip: None,
            extra: Map::new(),
        }
    }

    /// A socket of the given type.
    pub fn link(name: impl Into<String>, io_type: IoType) -> Self {
        Self::with_kind(name, InputKind::Link(io_type))
    }

    /// An INT widget with ComfyUI's default limits (±2^63-1, step 1).
    pub fn int(name: impl Into<String>, default: i64) -> Self {
        Self::with_kind(
            name,
            InputKind::Int(IntWidget {
                default: default.into(),
                min: i64::MIN.into(),
                max: i64::MAX.into(),
                step: 1,
                control_after_generate: false,
            }),
        )
    }

    /// A seed: INT from 0 to 2^64-1 with the frontend's control widget, as KSampler's.
    pub fn seed(name: impl Into<String>) -> Self {
        Self::int(name, 0)
            .int_range(0, u64::MAX.into())
            .control_after_generate()
    }

    pub fn float(name: impl Into<String>, default: f64) -> Self {
        Self::with_kind(
            name,
            InputKind::Float(FloatWidget {
                default,
                min: f64::MIN,
                max: f64::MAX,
                step: 0.1,
            }),
        )
    }

    pub fn string(name: impl Into<String>, default: impl Into<String>) -> Self {
        Self::with_kind(
            name,
            InputKind::String(StringWidget {
                default: default.into(),
                multiline: false,
            }),
        )
    }

    pub fn boolean(name: impl Into<String>, default: bool) -> Self {
        Self::with_kind(name, InputKind::Boolean(BoolWidget { default }))
    }

    pub fn combo<I, S>(name: impl Into<String>, options: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_kind(
            name,
            InputKind::Combo(ComboWidget {
                options: options.into_iter().map(Into::into).collect(),
                default: None,
            }),
        )
    }

    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    pub fn tooltip(mut self, text: impl Into<String>) -> Self {
        self.tooltip = Some(text.into());
        self
    }

    pub fn extra(mut self, key: impl Into<String>, value: Json) -> Self {
        self.extra.insert(key.into(), value);
        self
    }

    /// Sets an INT widget's limits; ignored for other kinds.
    pub fn int_range(mut self, min: i128, max: i128) -> Self {
        if let InputKind::Int(w) = &mut self.kind {
            w.min = min;
            w.max = max;
        }
        self
    }

    pub fn int_step(mut self, step: i128) -> Self {
        if let InputKind::Int(w) = &mut self.kind {
            w.step = step;
        }
        self
    }

    pub fn control_after_generate(mut self) -> Self {
        if let InputKind::Int(w) = &mut self.kind {
            w.control_after_generate = true;
        }
        self
    }

    /// Sets a FLOAT widget's limits; ignored for other kinds.
    pub fn float_range(mut self, min: f64, max: f64) -> Self {
        if let InputKind::Float(w) = &mut self.kind {
            w.min = min;
            w.max = max;
        }
        self
    }

    pub fn float_step(mut self, step: f64) -> Self {
        if let InputKind::Float(w) = &mut self.kind {
            w.step = step;
        }
        self
    }

    pub fn multiline(mut self) -> Self {
        if let InputKind::String(w) = &mut self.kind {
            w.multiline = true;
        }
        self
    }

    /// Sets a COMBO widget's default; ignored for other kinds.
    pub fn combo_default(mut self, default: impl Into<String>) -> Self {
        if let InputKind::Combo(w) = &mut self.kind {
            w.default = Some(default.into());
        }
        self
    }

    /// The widget's default value as it appears in workflow JSON; `None` for sockets.
    pub fn default_json(&self) -> Option<Json> {
        match &self.kind {
            InputKind::Link(_) => None,
            InputKind::Int(w) => Some(int_json(w.default)),
            InputKind::Float(w) => Some(json!(w.default)),
            InputKind::String(w) => Some(json!(w.default)),
            InputKind::Boolean(w) => Some(json!(w.default)),
            InputKind::Combo(w) => w
                .default
                .clone()
                .or_else(|| w.options.first().cloned())
                .map(Json::String),
        }
    }

    /// `[TYPE, {options}]` or `[[choices...], {options}]`, as in ComfyUI's `/object_info`.
    pub fn object_info(&self) -> Json {
        let mut opts = Map::new();
        let first = match &self.kind {
            InputKind::Link(t) => json!(t.as_str()),
            InputKind::Int(w) => {
                opts.insert("default".into(), int_json(w.default));
                opts.insert("min".into(), int_json(w.min));
                opts.insert("max".into(), int_json(w.max));
                opts.insert("step".into(), int_json(w.step));
                if w.control_after_generate {
                    opts.insert("control_after_generate".into(), json!(true));
                }
                json!("INT")
            }
            InputKind::Float(w) => {
                opts.insert("default".into(), json!(w.default));
                opts.insert("min".into(), json!(w.min));
                opts.insert("max".into(), json!(w.max));
                opts.insert("step".into(), json!(w.step));
                json!("FLOAT")
            }
            InputKind::String(w) => {
                opts.insert("default".into(), json!(w.default));
                opts.insert("multiline".into(), json!(w.multiline));
                json!("STRING")
            }
            InputKind::Boolean(w) => {
                opts.insert("default".into(), json!(w.default));
                json!("BOOLEAN")
            }
            InputKind::Combo(w) => {
                if let Some(d) = &w.default {
                    opts.insert("default".into(), json!(d));
                }
                json!(w.options)
            }
        };
        if let Some(t) = &self.tooltip {
            opts.insert("tooltip".into(), json!(t));
        }
        for (k, v) in &self.extra {
            opts.insert(k.clone(), v.clone());
        }
        if opts.is_empty() {
            json!([first])
        } else {
            json!([first, opts])
        }
    }
}

/// An integer as a JSON number; values beyond i64 (u64 seeds) stay exact.
pub(crate) fn int_json(v: i128) -> Json {
    if let Ok(i) = i64::try_from(v) {
        json!(i)
    } else if let Ok(u) = u64::try_from(v) {
        json!(u)
    } else {
        // Outside both ranges JSON numbers cannot be exact; clamp to the nearest end.
        if v < 0 {
            json!(i64::MIN)
        } else {
            json!(u64::MAX)
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct OutputSpec {
    pub name: String,
    pub io_type: IoType,
    pub is_list: bool,
    pub tooltip: Option<String>,
}

/// The full declaration of a node type.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSchema {
    /// The class name workflows use (`class_type`), e.g. `KSampler`.
    pub name: String,
    pub display_name: String,
    pub category: String,
    pub description: String,
    /// In declaration order; this order maps the UI format's `widgets_values`.
    pub inputs: Vec<InputSpec>,
    pub outputs: Vec<OutputSpec>,
    /// Output nodes are the roots of execution: only their ancestors run.
    pub output_node: bool,
}

impl NodeSchema {
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        NodeSchema {
            display_name: name.clone(),
            name,
            category: String::new(),
            description: String::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            output_node: false,
        }
    }

    pub fn display_name(mut self, s: impl Into<String>) -> Self {
        self.display_name = s.into();
        self
    }

    pub fn category(mut self, s: impl Into<String>) -> Self {
        self.category = s.into();
        self
    }

    pub fn description(mut self, s: impl Into<String>) -> Self {
        self.description = s.into();
        self
    }

    pub fn input(mut self, input: InputSpec) -> Self {
        self.inputs.push(input);
        self
    }

    pub fn output(mut self, name: impl Into<String>, io_type: IoType) -> Self {
        self.outputs.push(OutputSpec {
            name: name.into(),
            io_type,
            is_list: false,
            tooltip: None,
        });
        self
    }

    pub fn output_node(mut self) -> Self {
        self.output_node = true;
        self
    }

    pub fn find_input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// This node's entry in ComfyUI's `/object_info`.
    pub fn object_info(&self) -> Json {
        let mut required = Map::new();
        let mut optional = Map::new();
        let mut required_order = Vec::new();
        let mut optional_order = Vec::new();
        for input in &self.inputs {
            if input.optional {
                optional.insert(input.name.clone(), input.object_info());
                optional_order.push(input.name.clone());
            } else {
                required.insert(input.name.clone(), input.object_info());
                required_order.push(input.name.clone());
            }
        }
        let mut input = Map::new();
        input.insert("required".into(), Json::Object(required));
        let mut input_order = Map::new();
        input_order.insert("required".into(), json!(required_order));
        if !optional.is_empty() {
            input.insert("optional".into(), Json::Object(optional));
            input_order.insert("optional".into(), json!(optional_order));
        }
        let mut info = json!({
            "input": input,
            "input_order": input_order,
            "output": self.outputs.iter().map(|o| o.io_type.as_str()).collect::<Vec<_>>(),
            "output_is_list": self.outputs.iter().map(|o| o.is_list).collect::<Vec<_>>(),
            "output_name": self.outputs.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(),
            "name": self.name,
            "display_name": self.display_name,
            "description": self.description,
            "python_module": "sdflow",
            "category": self.category,
            "output_node": self.output_node,
        });
        if self.outputs.iter().any(|o| o.tooltip.is_some()) {
            info["output_tooltips"] = self
                .outputs
                .iter()
                .map(|o| json!(o.tooltip.clone().unwrap_or_default()))
                .collect();
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_inputs_tooltips_and_extras_in_object_info() {
        let schema = NodeSchema::new("Demo")
            .input(InputSpec::link("image", IoType::IMAGE).tooltip("the picture"))
            .input(InputSpec::string("text", "").multiline().optional())
            .input(
                InputSpec::combo("file", ["a.png"])
                    .extra("image_upload", json!(true))
                    .optional(),
            )
            .output("IMAGE", IoType::IMAGE);
        let info = schema.object_info();
        assert_eq!(
            info["input"]["required"]["image"],
            json!(["IMAGE", {"tooltip": "the picture"}])
        );
        assert_eq!(
            info["input"]["optional"]["text"],
            json!(["STRING", {"default": "", "multiline": true}])
        );
        assert_eq!(
            info["input"]["optional"]["file"],
            json!([["a.png"], {"image_upload": true}])
        );
        assert_eq!(
            info["input_order"],
            json!({"required": ["image"], "optional": ["text", "file"]})
        );
    }

    #[test]
    fn defaults_as_json() {
        assert_eq!(InputSpec::seed("seed").default_json(), Some(json!(0)));
        assert_eq!(
            InputSpec::combo("c", ["x", "y"]).default_json(),
            Some(json!("x"))
        );
        assert_eq!(InputSpec::link("m", IoType::MODEL).default_json(), None);
        assert_eq!(int_json(u64::MAX as i128), json!(u64::MAX));
    }
}
