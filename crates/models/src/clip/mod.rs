//! CLIP as transformers lays it out (`CLIPModel`): the vision tower, the text tower of
//! [`crate::text_encoders::clip`], their projections and logit scale; the image processor and
//! the tokenizer that go with it. The reward models (CLIP score, PickScore, aesthetics) build on it.

pub mod aesthetic;
pub mod encoder;
pub mod model;
pub mod processor;
pub mod tokenizer;
pub mod vision;

pub use aesthetic::AestheticHead;
pub use model::{ClipConfig, ClipModel};
pub use processor::ClipImageProcessor;
pub use vision::{ClipVisionConfig, ClipVisionTower};
