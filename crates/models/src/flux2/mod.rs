//! FLUX.2 in the diffusers layout, from text and from reference images: [klein]
//! (`Flux2KleinPipeline`: a double- then single-stream MMDiT with shared modulations, a Qwen3 text
//! encoder, `AutoencoderKLFlux2`) and [dev] (`Flux2Pipeline`: the same blocks with a distilled
//! guidance embedding, Mistral Small 3's language model as text encoder).

mod block;
mod config;
mod family;
mod pipeline;
mod reference;
mod tiny;
mod transformer;
mod vae;

pub use config::{Flux2TransformerConfig, AXES};
pub use family::FAMILY;
pub use pipeline::{
    Flux2Pipeline, Flux2PromptEncoder, Flux2TextModel, CHAT_TEMPLATE, MISTRAL_TEXT_LAYERS,
    SYSTEM_MESSAGE, TEXT_LAYERS,
};
pub use reference::{condition_sizes, reference_tokens};
pub use tiny::{write_tiny_flux2, TinyFlux2Spec};
pub use transformer::{grid_ids, text_ids, Flux2Transformer, REFERENCE_IDS, REFERENCE_TOKENS};
pub use vae::{Flux2Vae, Flux2VaeConfig};

/// LoRA targets of the FLUX.2 recipes, as diffusers/PEFT name them: the double blocks' attention
/// projections and SwiGLU layers, and the single blocks' fused input projection.
pub const FLUX2_TARGETS: [&str; 13] = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "attn.to_qkv_mlp_proj",
    "ff.linear_in",
    "ff.linear_out",
    "ff_context.linear_in",
    "ff_context.linear_out",
];
