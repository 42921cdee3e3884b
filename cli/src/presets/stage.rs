//! sd-cli takes file paths (`-m path/to/model.safetensors`); the node graph takes names
//! inside a models folder. The two meet in a staging folder: every file a flag names is
//! linked into it under its kind (`checkpoints/`, `loras/`, ...) and the workflow uses
//! the link's name. A value that is not a path is looked up in `--models-dir` as
//! `sdflow run` would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Model and image files linked into one folder the runtime reads, so paths work where
/// the graph takes names.
pub(super) struct Stage {
    dir: tempfile::TempDir,
    models_dir: PathBuf,
    /// (kind, staged name) -> the real file, to spot two different files of one name.
    linked: BTreeMap<(String, String), PathBuf>,
}

impl Stage {
    pub(super) fn new(models_dir: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("sdflow-stage-").tempdir().context("creating a staging folder")?;
        std::fs::create_dir_all(dir.path().join("input"))?;
        Ok(Stage { dir, models_dir: models_dir.to_path_buf(), linked: BTreeMap::new() })
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(super) fn input_dir(&self) -> PathBuf {
        self.dir.path().join("input")
    }

    /// Links `real` into `kind/` and returns its name there.
    pub(super) fn link(&mut self, kind: &str, real: &Path) -> anyhow::Result<String> {
        self.link_named(kind, real, None)
    }

    /// Links `real` into `kind/` as `name` (default: its own file name), or as
    /// `2_name`, ... when another file already has that name.
    pub(super) fn link_named(&mut self, kind: &str, real: &Path, name: Option<String>) -> anyhow::Result<String> {
        let real = real.canonicalize().with_context(|| format!("{}", real.display()))?;
        let base = name.unwrap_or_else(|| real.file_name().map_or_else(|| "file".to_string(), |n| n.to_string_lossy().into_owned()));
        let mut name = base.clone();
        let mut i = 1;
        while let Some(existing) = self.linked.get(&(kind.to_string(), name.clone())) {
            if *existing == real {
                return Ok(name);
            }
            i += 1;
            name = format!("{i}_{base}");
        }
        let dir = self.dir.path().join(kind);
        std::fs::create_dir_all(&dir)?;
        link_file(&real, &dir.join(&name)).with_context(|| format!("linking {} into the staging folder", real.display()))?;
        self.linked.insert((kind.to_string(), name.clone()), real);
        Ok(name)
    }

    /// The staged name of the model file a flag names: a path, or a name in
    /// `--models-dir` (under `kind/` or at the top).
    pub(super) fn model(&mut self, kind: &str, flag: &str, value: &str) -> anyhow::Result<String> {
        let candidates = [PathBuf::from(value), self.models_dir.join(kind).join(value), self.models_dir.join(value)];
        match candidates.iter().find(|p| p.exists()) {
            Some(p) if !sdflow_nodes::runtime::is_model_path(p) => {
                bail!("{flag} {value}: not a model file (.{} files or a diffusers folder are)", sdflow_nodes::runtime::MODEL_EXTENSIONS.join(", ."))
            }
            Some(p) => self.link(kind, &p.clone()),
            None if !self.models_dir.is_dir() => bail!("{flag} {value}: no such file (and no models folder {})", self.models_dir.display()),
            None => bail!("{flag} {value}: no such file (nor in {})", self.models_dir.join(kind).display()),
        }
    }

    /// `text` with each staged file's path in the staging folder replaced by the file the
    /// user named, so no error speaks of a temporary folder.
    pub(super) fn unstage(&self, text: &str) -> String {
        let mut out = text.to_string();
        for ((kind, name), real) in &self.linked {
            let staged = self.dir.path().join(kind).join(name);
            out = out.replace(&staged.display().to_string(), &real.display().to_string());
        }
        out
    }

    /// `--taesd FILE`: linked as `vae_approx/NAME.EXT`, where VAELoader's entry `name`
    /// (`taesd`, `taesdxl`, `taesd3`, `taef1`: the model's family's) finds it.
    pub(super) fn taesd(&mut self, value: &str, name: &str) -> anyhow::Result<String> {
        let p = PathBuf::from(value);
        let real = if p.is_file() { p } else { self.models_dir.join("vae_approx").join(value) };
        if !real.is_file() {
            bail!("--taesd {value}: no such file (nor in {})", self.models_dir.join("vae_approx").display());
        }
        let ext = real.extension().and_then(|e| e.to_str()).unwrap_or("safetensors").to_string();
        self.link_named("vae_approx", &real, Some(format!("{name}.{ext}")))?;
        Ok(name.into())
    }

    pub(super) fn image(&mut self, flag: &str, value: &str) -> anyhow::Result<String> {
        let p = PathBuf::from(value);
        if !p.is_file() {
            bail!("{flag} {value}: no such file");
        }
        self.link("input", &p)
    }

    /// A LoRA tag's file in `dir`: `NAME` with one of sd.cpp's extensions.
    pub(super) fn lora(&mut self, dir: &Path, name: &str) -> anyhow::Result<String> {
        match find_lora(dir, name) {
            Some(p) => self.link("loras", &p),
            None => bail!("<lora:{name}:...>: no {name}.safetensors/.ckpt/.pt/.gguf in --lora-model-dir {}", dir.display()),
        }
    }

    pub(super) fn embeddings(&mut self, dir: &Path) -> anyhow::Result<()> {
        if !dir.is_dir() {
            bail!("--embd-dir {}: not a directory", dir.display());
        }
        link_file(&dir.canonicalize()?, &self.dir.path().join("embeddings")).context("linking the embeddings folder")
    }
}

pub(super) fn find_lora(dir: &Path, name: &str) -> Option<PathBuf> {
    ["", ".safetensors", ".ckpt", ".pt", ".gguf", ".bin"].iter().map(|ext| dir.join(format!("{name}{ext}"))).find(|p| p.is_file())
}

#[cfg(unix)]
pub(super) fn link_file(real: &Path, at: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(real, at)
}

#[cfg(not(unix))]
pub(super) fn link_file(real: &Path, at: &Path) -> std::io::Result<()> {
    if real.is_dir() {
        return Err(std::io::Error::other("linking folders needs a Unix system"));
    }
    std::fs::hard_link(real, at).or_else(|_| std::fs::copy(real, at).map(|_| ()))
}

/// The name a flag's value has in a printed workflow: a path's file name, else the value.
pub(super) fn shown_name(value: &str) -> String {
    Path::new(value).file_name().map_or_else(|| value.to_string(), |n| n.to_string_lossy().into_owned())
}

/// How a command resolves the files its flags name.
pub(super) enum Names<'a> {
    /// For printing: file names only, nothing checked.
    Shown,
    Staged(&'a mut Stage),
}

impl Names<'_> {
    pub(super) fn model(&mut self, kind: &str, flag: &str, v: &Option<String>) -> anyhow::Result<Option<String>> {
        match (self, v) {
            (_, None) => Ok(None),
            (Names::Shown, Some(v)) => Ok(Some(shown_name(v))),
            (Names::Staged(s), Some(v)) => s.model(kind, flag, v).map(Some),
        }
    }

    /// A folder the graph reads from the input folder (PhotoMaker's ID images).
    pub(super) fn folder(&mut self, flag: &str, v: &Option<String>) -> anyhow::Result<Option<String>> {
        match (self, v) {
            (_, None) => Ok(None),
            (Names::Shown, Some(v)) => Ok(Some(shown_name(v.trim_end_matches('/')))),
            (Names::Staged(s), Some(v)) => {
                let p = PathBuf::from(v);
                if !p.is_dir() {
                    bail!("{flag} {v}: no such folder");
                }
                s.link("input", &p).map(Some)
            }
        }
    }

    pub(super) fn image(&mut self, flag: &str, v: &Option<String>) -> anyhow::Result<Option<String>> {
        match (self, v) {
            (_, None) => Ok(None),
            (Names::Shown, Some(v)) => Ok(Some(shown_name(v))),
            (Names::Staged(s), Some(v)) => s.image(flag, v).map(Some),
        }
    }
}
