//! `sdflow run` (being written).
use clap::Args;

#[derive(Args)]
pub struct RunArgs {
    /// Workflow file.
    pub workflow: std::path::PathBuf,
}

pub fn run_command(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("not supported yet: sdflow run")
}
