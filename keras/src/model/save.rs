//! Saving and loading a [`Model`]: weights alone (`save_weights`/`load_weights`) and the
//! whole model (`save`/`load`, crash-safe generations; the file formats are in
//! `crate::saving`).

use std::path::Path;

use ferroflow_tensor::{Error, Result, Tensor};
use serde_json::{json, Value};

use super::Model;
use crate::saving;

impl Model {
    /// Writes every weight to a safetensors file, named by path (`"dense/kernel"`).
    pub fn save_weights(&self, path: impl AsRef<Path>) -> Result<()> {
        self.require_built("save_weights")?;
        let tensors: Vec<(String, Tensor)> = self
            .network
            .named_weights()
            .into_iter()
            .map(|(n, v)| (n, v.peek()))
            .collect();
        saving::save_tensors(path, &tensors)
    }
    /// Loads weights written by [`Model::save_weights`]: all or nothing, the error naming
    /// the first weight that does not match.
    pub fn load_weights(&mut self, path: impl AsRef<Path>) -> Result<()> {
        self.require_built("load_weights")?;
        let path = path.as_ref();
        let saved = saving::load_tensors(path)?;
        saving::assign_weights(
            &path.display().to_string(),
            &self.network.named_weights(),
            saved,
        )
    }
    /// Saves the whole model into folder `dir` (Keras' `model.save`): `config.json` (the
    /// network's Keras config, its input shapes and, once compiled, the training config:
    /// optimizer, loss and metric names), the weights in `model-<generation>.safetensors`,
    /// and the optimizer's state in `optimizer-<generation>.safetensors`, so a loaded model
    /// resumes training where this one stopped.
    ///
    /// Crash-safe, as TF's checkpoints are: the new generation's weight files are written
    /// (each moved into place whole) before `config.json`, which names them, replaces the
    /// old one in one rename; only then are the previous generation's files removed. A
    /// process killed at any moment leaves a folder that loads as the previous save or the
    /// new one, never a mix.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.require_built("save")?;
        let dir = dir.as_ref();
        let network_config = self.network.config();
        if let Some(why) = network_config["config"]["unserializable"].as_str() {
            return Err(Error::invalid("Model.save", why.to_string()));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, &e))?;
        let training_config = match &self.compiled {
            Some(c) => json!({
                "optimizer": ferroflow_optim::get_config(c.optimizer.as_ref())?,
                "loss": c.loss.get_config(),
                "metrics": c.metrics.iter().chain(c.per_output.first().map(|o| &o.metrics).into_iter().flatten())
                    .map(|m| m.name().to_string()).collect::<Vec<_>>(),
            }),
            None => Value::Null,
        };
        let config_path = dir.join("config.json");
        let generation = std::fs::read_to_string(&config_path)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["generation"].as_u64())
            .unwrap_or(0)
            + 1;
        let weights_file = format!("model-{generation}.safetensors");
        self.save_weights(dir.join(&weights_file))?;
        let optimizer_file = match &self.compiled {
            Some(c) => {
                let name = format!("optimizer-{generation}.safetensors");
                saving::save_tensors(dir.join(&name), &c.optimizer.get_weights()?)?;
                Some(name)
            }
            None => None,
        };
        let config = json!({
            "format": "ferroflow-keras-model",
            "version": 2,
            "generation": generation,
            "weights_file": weights_file,
            "optimizer_file": optimizer_file,
            "config": network_config,
            "build_input_shapes": self.build_input_shapes,
            "training_config": training_config,
        });
        let text = serde_json::to_string_pretty(&config).expect("JSON values serialize");
        ferroflow_tensor::fs::write_atomic(&config_path, text.as_bytes())?;
        // The new generation is in place: earlier generations' files (and version 1's
        // fixed names) are garbage now.
        let keep = [Some(weights_file), optimizer_file];
        let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, &e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = ["model", "optimizer"].iter().any(|stem| {
                name.strip_prefix(stem)
                    .and_then(|r| r.strip_suffix(".safetensors"))
                    .is_some_and(|g| {
                        g.is_empty()
                            || g.strip_prefix('-').is_some_and(|d| {
                                !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
                            })
                    })
            });
            if ours && !keep.iter().flatten().any(|k| *k == name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
    /// The least [`Model::load`] allows one tensor to take while it builds the model from
    /// `config.json` (256 MiB; more when the weight files are larger).
    pub const LOAD_TENSOR_BYTES: u64 = 256 << 20;

    /// Loads a model saved by [`Model::save`] (Keras' `load_model`): compiled with the saved
    /// optimizer (its state restored), loss and metrics when it was saved compiled.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model> {
        Model::load_with(dir, true)
    }

    /// [`Model::load`] with Keras' `compile` flag: `false` ignores the training config and
    /// returns an uncompiled model.
    ///
    /// The config's shapes are claims of a file: while the model is built, no tensor may
    /// be larger than the weight files hold together (or [`Model::LOAD_TENSOR_BYTES`],
    /// whichever is more), so a hostile `config.json` is an error, not an allocation bomb.
    pub fn load_with(dir: impl AsRef<Path>, compile: bool) -> Result<Model> {
        let dir = dir.as_ref();
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, &e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
        if v["format"] != "ferroflow-keras-model" {
            return Err(Error::format(
                path.display().to_string(),
                "not a ferroflow Keras model config",
            ));
        }
        let network = crate::layers::deserialize(&v["config"])?;
        let shapes: Vec<Vec<usize>> = serde_json::from_value(v["build_input_shapes"].clone())
            .map_err(|e| {
                Error::format(
                    path.display().to_string(),
                    format!("build_input_shapes: {e}"),
                )
            })?;
        // Version 1 folders used fixed names; version 2 names each generation's files.
        let file_named = |key: &str, v1_name: &str| -> Result<Option<std::path::PathBuf>> {
            match &v[key] {
                Value::Null if v["version"] == 1 => Ok(Some(dir.join(v1_name))),
                Value::Null => Ok(None),
                Value::String(name) if is_plain_file_name(name) => Ok(Some(dir.join(name))),
                other => Err(Error::format(
                    path.display().to_string(),
                    format!("{key} must be a file name inside the folder, got {other}"),
                )),
            }
        };
        let weights_path = file_named("weights_file", "model.safetensors")?
            .ok_or_else(|| Error::format(path.display().to_string(), "weights_file is missing"))?;
        let optimizer_path = file_named("optimizer_file", "optimizer.safetensors")?;
        let file_bytes = [Some(&weights_path), optimizer_path.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum::<u64>();
        let mut model = Model::from_boxed(network);
        {
            let _limit = ferroflow_tensor::device::tensor_limit_scope(
                file_bytes.max(Model::LOAD_TENSOR_BYTES),
            );
            model.build_multi(&shapes)?;
        }
        model.load_weights(&weights_path)?;
        let training = &v["training_config"];
        if compile && !training.is_null() {
            let what = |e: Error| {
                Error::format(path.display().to_string(), format!("training_config: {e}"))
            };
            let optimizer = ferroflow_optim::from_config(&training["optimizer"]).map_err(what)?;
            let loss = crate::losses::deserialize(&training["loss"]).map_err(what)?;
            let metrics = training["metrics"]
                .as_array()
                .map(|names| {
                    names
                        .iter()
                        .map(|n| crate::metrics::get(n.as_str().unwrap_or_default()))
                        .collect::<Result<Vec<_>>>()
                })
                .transpose()
                .map_err(|e| {
                    what(Error::invalid(
                        "Model.load",
                        format!("{e}; load with compile = false and compile the model again"),
                    ))
                })?
                .unwrap_or_default();
            model.compile_with(optimizer, loss, metrics)?;
            let optimizer_path = optimizer_path.ok_or_else(|| {
                Error::format(
                    path.display().to_string(),
                    "the model was saved compiled but optimizer_file is missing",
                )
            })?;
            let state = saving::load_tensors(optimizer_path)?;
            model.compiled("load")?.optimizer.set_weights(state)?;
        }
        Ok(model)
    }
}

/// A name that stays inside the folder it is joined to (no separators, not `.`/`..`).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && Path::new(name).file_name() == Some(std::ffi::OsStr::new(name))
}
