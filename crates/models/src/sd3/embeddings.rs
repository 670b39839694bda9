//! Input embeddings: patches with a centre-cropped positional table, and timestep + pooled text.

use tch::Tensor;

use crate::nn::{timestep_features, Conv2d, Mlp, Scope, TIMESTEP_CHANNELS};

/// `PatchEmbed`: a stride-p convolution to tokens plus the centre crop of a
/// `pos_embed_max_size²` sin-cos table (stored in the checkpoint as `pos_embed.pos_embed`).
pub struct PatchEmbed {
    pub proj: Conv2d,
    pub pos_embed: Tensor,
    pub patch_size: i64,
    pub max_size: i64,
}

impl PatchEmbed {
    pub fn new(
        scope: &Scope<'_>,
        in_channels: i64,
        dim: i64,
        patch_size: i64,
        max_size: i64,
    ) -> Self {
        Self {
            proj: (scope / "proj").conv2d(in_channels, dim, patch_size, patch_size, 0),
            pos_embed: scope.var("pos_embed", &[1, max_size * max_size, dim]),
            patch_size,
            max_size,
        }
    }

    /// (B, C, H, W) → (B, H/p · W/p, D).
    pub fn forward(&self, latent: &Tensor) -> Tensor {
        let (h, w) = (latent.size()[2] / self.patch_size, latent.size()[3] / self.patch_size);
        let tokens = self.proj.forward(latent).flatten(2, 3).transpose(1, 2);
        let dim = *self.pos_embed.size().last().expect("3-d table");
        let (top, left) = ((self.max_size - h) / 2, (self.max_size - w) / 2);
        let table = self.pos_embed.reshape([1, self.max_size, self.max_size, dim]);
        let crop = table.narrow(1, top, h).narrow(2, left, w).reshape([1, h * w, dim]);
        (tokens + crop).to_kind(latent.kind()).contiguous()
    }
}

/// `CombinedTimestepTextProjEmbeddings`: the conditioning vector of every AdaLN.
pub struct TimeTextEmbed {
    pub timestep_embedder: Mlp,
    pub text_embedder: Mlp,
}

impl TimeTextEmbed {
    pub fn new(scope: &Scope<'_>, dim: i64, pooled_dim: i64) -> Self {
        Self {
            timestep_embedder: Mlp::new(&(scope / "timestep_embedder"), TIMESTEP_CHANNELS, dim),
            text_embedder: Mlp::new(&(scope / "text_embedder"), pooled_dim, dim),
        }
    }

    pub fn forward(&self, timestep: &Tensor, pooled: &Tensor) -> Tensor {
        let t = timestep_features(timestep, TIMESTEP_CHANNELS, 1.0).to_kind(pooled.kind());
        self.timestep_embedder.forward(&t) + self.text_embedder.forward(pooled)
    }
}
