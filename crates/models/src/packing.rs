//! 2×2 (p×p) latent packing of the token-based image transformers (Qwen-Image, FLUX.1): latents
//! stay `(B, C, H, W)` everywhere else and are packed only around the transformer.

use tch::Tensor;

/// (B, C, H, W) latents → (B, (H/p)(W/p), C·p²) tokens, row-major over the patch grid.
pub fn pack(latents: &Tensor, p: i64) -> Tensor {
    let (b, c, h, w) = latents.size4().expect("4-d latents");
    latents.view([b, c, h / p, p, w / p, p]).permute([0, 2, 4, 1, 3, 5]).reshape([
        b,
        (h / p) * (w / p),
        c * p * p,
    ])
}

/// The inverse of [`pack`] for (B, S, C·p²) tokens of an `h × w` latent.
pub fn unpack(tokens: &Tensor, h: i64, w: i64, p: i64) -> Tensor {
    let (b, _, cp) = tokens.size3().expect("3-d tokens");
    let c = cp / (p * p);
    tokens.view([b, h / p, w / p, c, p, p]).permute([0, 3, 1, 4, 2, 5]).reshape([b, c, h, w])
}
