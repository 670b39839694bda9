//! A model as a list of its linear layers (named, for LoRA targets) and a count of everything
//! else: parameter totals and adapter sizes come from the same list.

/// One linear layer, `count` times (the same layer in every block).
#[derive(Debug, Clone)]
pub struct Linear {
    /// A representative dotted module name (block index 0), matched as LoRA targets match.
    pub name: String,
    pub fan_in: u64,
    pub fan_out: u64,
    pub count: u64,
}

/// A model's parameters: its linear layers and the rest.
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    pub linears: Vec<Linear>,
    /// Parameters outside linear layers (convolutions, norms, embeddings, tables).
    pub other: u64,
    /// Floating-point buffers saved with the weights (SD3's position table).
    pub buffers: u64,
}

impl Inventory {
    /// Adds `count` linear layers named `name`; `bias` adds `fan_out` each.
    pub fn linear(&mut self, count: u64, name: &str, fan_in: u64, fan_out: u64, bias: bool) {
        self.linears.push(Linear { name: name.into(), fan_in, fan_out, count });
        if bias {
            self.other += count * fan_out;
        }
    }

    /// Adds parameters that no adapter can target.
    pub fn add(&mut self, params: u64) {
        self.other += params;
    }

    /// Every parameter (not buffers).
    pub fn params(&self) -> u64 {
        self.other + self.linears.iter().map(|l| l.count * l.fan_in * l.fan_out).sum::<u64>()
    }

    /// Adapter parameters of rank `rank` on the layers `targets` selects: r·(in + out) each.
    pub fn lora_params(&self, rank: u64, targets: impl Fn(&str) -> bool) -> u64 {
        self.linears
            .iter()
            .filter(|l| targets(&l.name))
            .map(|l| l.count * rank * (l.fan_in + l.fan_out))
            .sum()
    }
}

/// Whether `module` is a target of `targets`, as flowtune's LoRA matches (PEFT's rule): a target
/// equals the name or its dotted suffix; `all-linear` takes every linear layer.
pub fn lora_targets(targets: &[String], module: &str) -> bool {
    targets.iter().any(|t| t == "all-linear" || module == t || module.ends_with(&format!(".{t}")))
}
