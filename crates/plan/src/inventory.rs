//! A model as a list of its linear layers (named, for LoRA targets) and a count of everything
//! else: parameter totals and adapter sizes come from the same list.

/// One linear layer, `count` times (the same layer in consecutive blocks).
#[derive(Debug, Clone)]
pub struct Linear {
    /// The dotted module name of the first copy; its first numeric segment is the block index.
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

    /// Adapter parameters: r·(in + out) on each layer that `rank_of` gives a rank r, by name.
    pub fn lora_params(&self, rank_of: impl Fn(&str) -> Option<u64>) -> u64 {
        let params = |l: &Linear| l.names().filter_map(|n| rank_of(&n)).sum::<u64>();
        self.linears.iter().map(|l| params(l) * (l.fan_in + l.fan_out)).sum()
    }

    /// The names of every linear layer.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.linears.iter().flat_map(Linear::names)
    }
}

impl Linear {
    /// The module names of its copies: the block index counts up from the first copy's.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        let mut parts: Vec<String> = self.name.split('.').map(str::to_string).collect();
        let block = parts.iter().enumerate().find_map(|(i, p)| Some((i, p.parse::<u64>().ok()?)));
        (0..self.count).map(move |k| match block {
            Some((i, first)) => {
                parts[i] = (first + k).to_string();
                parts.join(".")
            }
            None => self.name.clone(),
        })
    }
}
