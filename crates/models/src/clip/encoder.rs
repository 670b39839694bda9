//! The transformer encoder both CLIP towers share: pre-LN layers of self-attention and an MLP
//! (`encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.fc1, mlp.fc2}`).

use tch::Tensor;

use crate::nn::{attention, LayerNorm, Linear, Scope};
use crate::ModelError;

/// The sizes of one tower's encoder.
#[derive(Debug, Clone)]
pub struct EncoderShape {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: usize,
    pub num_attention_heads: i64,
    pub layer_norm_eps: f64,
    pub hidden_act: String,
}

struct Layer {
    layer_norm1: LayerNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// The encoder under `scope / "encoder"`.
pub struct Encoder {
    layers: Vec<Layer>,
    heads: i64,
    quick_gelu: bool,
}

/// What the encoder leaves: the last layer's output and the last layer's input.
pub struct EncoderOutput {
    pub last: Tensor,
    pub penultimate: Tensor,
}

impl Encoder {
    pub fn new(scope: &Scope<'_>, shape: &EncoderShape) -> Result<Self, ModelError> {
        let quick_gelu = match shape.hidden_act.as_str() {
            "quick_gelu" => true,
            "gelu" => false,
            other => {
                return Err(ModelError::Input(format!(
                    "CLIP hidden_act `{other}` is not supported; expected quick_gelu or gelu"
                )))
            }
        };
        let (d, eps) = (shape.hidden_size, shape.layer_norm_eps);
        let layers = (0..shape.num_hidden_layers)
            .map(|i| {
                let s = &(&(scope / "encoder") / "layers") / i;
                let (attn, mlp) = (&s / "self_attn", &s / "mlp");
                Layer {
                    layer_norm1: LayerNorm::new(&(&s / "layer_norm1"), d, eps),
                    q_proj: (&attn / "q_proj").linear(d, d, true),
                    k_proj: (&attn / "k_proj").linear(d, d, true),
                    v_proj: (&attn / "v_proj").linear(d, d, true),
                    out_proj: (&attn / "out_proj").linear(d, d, true),
                    layer_norm2: LayerNorm::new(&(&s / "layer_norm2"), d, eps),
                    fc1: (&mlp / "fc1").linear(d, shape.intermediate_size, true),
                    fc2: (&mlp / "fc2").linear(shape.intermediate_size, d, true),
                }
            })
            .collect();
        Ok(Self { layers, heads: shape.num_attention_heads, quick_gelu })
    }

    fn act(&self, x: &Tensor) -> Tensor {
        if self.quick_gelu {
            x * (x * 1.702).sigmoid()
        } else {
            x.gelu("none")
        }
    }

    /// Runs the layers over `x` (B, L, D); `causal` masks later positions (the text tower).
    pub fn forward(&self, x: Tensor, causal: bool) -> EncoderOutput {
        let (b, l) = (x.size()[0], x.size()[1]);
        let mut x = x;
        let mut penultimate = x.shallow_clone();
        for (i, layer) in self.layers.iter().enumerate() {
            if i + 1 == self.layers.len() {
                penultimate = x.shallow_clone();
            }
            let h = layer.layer_norm1.forward(&x);
            let split = |t: Tensor| t.view([b, l, self.heads, -1]).transpose(1, 2);
            let (q, k, v) = (
                split(layer.q_proj.forward(&h)),
                split(layer.k_proj.forward(&h)),
                split(layer.v_proj.forward(&h)),
            );
            let attn = attention(&q, &k, &v, None, causal, None);
            x = &x + layer.out_proj.forward(&attn.transpose(1, 2).reshape([b, l, -1]));
            let h = layer.layer_norm2.forward(&x);
            x = &x + layer.fc2.forward(&self.act(&layer.fc1.forward(&h)));
        }
        EncoderOutput { last: x, penultimate }
    }
}
