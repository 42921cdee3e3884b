//! `sdflow metadata IMAGE`: what a PNG, JPEG or WebP says about how it was made, read
//! from the file alone (no model is loaded, the image is not decoded).

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct MetadataArgs {
    /// The image to read.
    #[arg(value_name = "IMAGE", required_unless_present = "init_img", conflicts_with = "init_img")]
    pub image: Option<PathBuf>,
    /// The image to read (sd-cli's spelling).
    #[arg(short = 'i', long, value_name = "string")]
    pub init_img: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_name = "FORMAT", value_parser = ["text", "json"], default_value = "text")]
    pub metadata_format: String,
}

pub fn metadata_command(a: MetadataArgs) -> anyhow::Result<()> {
    let Some(path) = a.image.or(a.init_img) else { anyhow::bail!("no image given") };
    let meta = match sdflow_workflows::metadata::read_metadata(&path) {
        Ok(m) => m,
        // That error names the file already.
        Err(e @ sdflow_workflows::metadata::MetadataError::Io { .. }) => return Err(e.into()),
        Err(e) => return Err(anyhow::Error::new(e).context(path.display().to_string())),
    };
    if a.metadata_format == "json" {
        let mut j = meta.to_json();
        j["file"] = serde_json::json!(path.display().to_string());
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print!("file: {}\n{}", path.display(), meta.to_text());
    }
    Ok(())
}
