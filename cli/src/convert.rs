//! `sdflow convert`: sd-cli's `-M convert`. Reads any model file sdflow reads and writes
//! GGUF or safetensors (by the output's extension) with `--type` and
//! `--tensor-type-rules` applied, by the same rules as conversion at load.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use sdflow_core::io::{self, read_as, Format, TensorBytes, TypeRules};

#[derive(Args, Debug, Clone)]
pub struct ConvertArgs {
    /// Path to the model to convert.
    #[arg(short = 'm', long, value_name = "string")]
    pub model: PathBuf,
    /// Path to write the converted model to: `.gguf` or `.safetensors`.
    #[arg(short = 'o', long, value_name = "string")]
    pub output: PathBuf,
    /// Weight type (examples: f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K).
    /// If not specified, the default is the type of the weight file.
    #[arg(long = "type", value_name = "TYPE", default_value = "")]
    pub wtype: String,
    /// Weight type per tensor pattern (example: "^vae\.=f16,model\.=q8_0").
    #[arg(long, value_name = "string", default_value = "")]
    pub tensor_type_rules: String,
    /// Print extra info.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Convert tensor names (refused: names are kept as they are).
    #[arg(long)]
    pub convert_name: bool,
}

pub fn convert_command(a: ConvertArgs) -> anyhow::Result<()> {
    if a.convert_name {
        bail!("not supported yet: --convert-name (tensor names are written as the source has them)");
    }
    let format = match a.output.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("gguf") => Format::Gguf,
        Some("safetensors") => Format::Safetensors,
        _ => bail!("-o {}: the output must end in .gguf or .safetensors", a.output.display()),
    };
    let rules = TypeRules::parse(&a.wtype, &a.tensor_type_rules)?;
    let src = io::open(&a.model).with_context(|| format!("opening {}", a.model.display()))?;
    let mut tensors: Vec<(String, sdflow_core::dtype::DType, Vec<usize>, TensorBytes<'_>)> = Vec::with_capacity(src.tensors().len());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for info in src.tensors() {
        let (dtype, bytes) = read_as(src.as_ref(), &info.name, &rules)?;
        *counts.entry(dtype.name().to_string()).or_default() += 1;
        tensors.push((info.name.clone(), dtype, info.shape.clone(), bytes));
    }
    let items = tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), &b[..]));
    // Written beside the target and renamed, so a failed conversion leaves no half file.
    let partial = a.output.with_extension(format!("{}.partial", a.output.extension().and_then(|e| e.to_str()).unwrap_or("")));
    let written = match format {
        Format::Gguf => {
            let kv = if src.format() == Format::Gguf { io::gguf::read_kv(&a.model)? } else { Vec::new() };
            io::gguf::write(&partial, &kv, items)
        }
        _ => io::safetensors::write(&partial, items, src.metadata()),
    };
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e).with_context(|| format!("writing {}", a.output.display()));
    }
    std::fs::rename(&partial, &a.output).with_context(|| format!("writing {}", a.output.display()))?;
    let summary: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    println!("convert '{}' to '{}': {} tensors ({})", a.model.display(), a.output.display(), tensors.len(), summary.join(", "));
    Ok(())
}
