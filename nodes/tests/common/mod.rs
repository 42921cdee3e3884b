//! What the tests that check nodes against ComfyUI's own definitions share.

use serde_json::{json, Map, Value as Json};

/// Each node's `/object_info` entry against ComfyUI's (built by a fixture generator from
/// ComfyUI's schema code): name, display name, category, description, output node,
/// outputs and their names, inputs in order with their types, choices and every option
/// ComfyUI states. Ours may state more: sdflow's schema builder always writes an INT/FLOAT
/// widget's default, limits and step, where ComfyUI's V3 inputs may leave them to the
/// frontend; ComfyUI's V3 combos are `["COMBO", {"options": [...]}]`, ours `[[...], {}]`.
pub fn assert_object_info_matches(registry: &sdflow_executor::Registry, schemas: &Map<String, Json>) {
    for (name, theirs) in schemas {
        let ours = registry.schema(name).unwrap_or_else(|| panic!("{name} is not registered")).object_info();
        for key in ["name", "display_name", "category", "description", "output_node", "output", "output_name", "input_order"] {
            assert_eq!(ours[key], theirs[key], "{name}: {key}");
        }
        for (group, inputs) in theirs["input"].as_object().unwrap() {
            for (input, entry) in inputs.as_object().unwrap() {
                let mine = &ours["input"][group][input];
                let empty = json!({});
                let (t_type, t_opts) = (&entry[0], entry.get(1).unwrap_or(&empty));
                let (m_type, m_opts) = (&mine[0], mine.get(1).unwrap_or(&empty));
                let what = format!("{name}.{input}");
                if t_type == "COMBO" {
                    assert_eq!(m_type, &t_opts["options"], "{what}: choices");
                } else {
                    assert_eq!(m_type, t_type, "{what}: type");
                }
                for (k, v) in t_opts.as_object().unwrap() {
                    if t_type == "COMBO" && (k == "options" || k == "multiselect") {
                        continue;
                    }
                    let m = &m_opts[k];
                    let same = match (v.as_f64(), m.as_f64()) {
                        (Some(a), Some(b)) => a == b,
                        _ => v == m,
                    };
                    assert!(same, "{what}: {k} is {m}, ComfyUI's {v}");
                }
                for k in m_opts.as_object().unwrap().keys() {
                    assert!(t_opts.get(k).is_some() || ["default", "min", "max", "step"].contains(&k.as_str()), "{what}: ComfyUI has no `{k}`");
                }
            }
        }
    }
}
