//! The LAION aesthetic predictor's head: a stack of linear layers (no activations, dropout only in
//! training) on the L2-normalised CLIP image embedding, read from safetensors with the keys of the
//! original `nn.Sequential` (`layers.0`, `layers.2`, `layers.4`, `layers.6`, `layers.7`).

use std::path::Path;

use safetensors::SafeTensors;
use tch::{Device, Kind, Tensor};

use crate::ModelError;

/// The head's linear layers in order, as (weight out × in, bias).
pub struct AestheticHead {
    layers: Vec<(Tensor, Tensor)>,
}

impl AestheticHead {
    /// Reads `path`: every `layers.N.weight` / `layers.N.bias` pair, in order of N; widths must
    /// chain and end in one output.
    pub fn load(path: &Path, device: Device) -> Result<Self, ModelError> {
        let fail =
            |message: String| ModelError::Format { path: path.display().to_string(), message };
        let bytes = std::fs::read(path).map_err(|e| ModelError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| fail(format!("not a safetensors file: {e}")))?;
        let mut indices: Vec<usize> = vec![];
        for name in file.names() {
            let index = name
                .strip_prefix("layers.")
                .and_then(|rest| {
                    rest.strip_suffix(".weight").or_else(|| rest.strip_suffix(".bias"))
                })
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| {
                    fail(format!(
                        "unexpected tensor {name}; expected layers.N.weight / layers.N.bias"
                    ))
                })?;
            indices.push(index);
        }
        indices.sort_unstable();
        indices.dedup();
        if indices.is_empty() {
            return Err(fail("no layers.N.weight tensors".into()));
        }
        let tensor = |name: String| -> Result<Tensor, ModelError> {
            let view = file.tensor(&name).map_err(|_| fail(format!("missing tensor {name}")))?;
            if view.dtype() != safetensors::Dtype::F32 {
                return Err(fail(format!("{name} is {:?}; expected F32", view.dtype())));
            }
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            Ok(Tensor::f_from_data_size(view.data(), &shape, Kind::Float)?.to_device(device))
        };
        let mut layers = vec![];
        for i in indices {
            let (w, b) =
                (tensor(format!("layers.{i}.weight"))?, tensor(format!("layers.{i}.bias"))?);
            let (out, input) =
                w.size2().map_err(|_| fail(format!("layers.{i}.weight is not 2-D")))?;
            if b.size() != [out] {
                return Err(fail(format!(
                    "layers.{i}.bias has shape {:?}; expected [{out}]",
                    b.size()
                )));
            }
            if let Some((prev, _)) = layers.last() {
                let prev: &Tensor = prev;
                if prev.size()[0] != input {
                    return Err(fail(format!(
                        "layers.{i}.weight takes {input} inputs but the layer before gives {}",
                        prev.size()[0]
                    )));
                }
            }
            layers.push((w, b));
        }
        if layers.last().map(|(w, _)| w.size()[0]) != Some(1) {
            return Err(fail("the last layer must have one output".into()));
        }
        Ok(Self { layers })
    }

    /// Width of the embedding the head takes.
    pub fn input_width(&self) -> i64 {
        self.layers[0].0.size()[1]
    }

    /// Scores (B,) of image embeddings (B, D), normalised here.
    pub fn forward(&self, image_embeds: &Tensor) -> Tensor {
        let x = image_embeds.to_kind(Kind::Float);
        let mut x = &x / x.norm_scalaropt_dim(2, [-1], true);
        for (w, b) in &self.layers {
            x = x.linear(w, Some(b));
        }
        x.squeeze_dim(-1)
    }
}
