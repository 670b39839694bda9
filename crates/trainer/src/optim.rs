//! AdamW over the trainable tensors with its state kept as named tensors (so checkpoints hold it
//! exactly), optionally sharded over the ranks of a job (ZeRO-1), gradient-norm clipping, and the
//! LR schedules.

use std::collections::{BTreeMap, BTreeSet};

use flowtune_config::LrSchedule;
use tch::{Device, Kind, Tensor};

use crate::stateful::{Scope, Stateful};
use crate::TrainError;

/// Decoupled-weight-decay Adam (PyTorch's `AdamW` update).
pub struct AdamW {
    pub params: BTreeMap<String, Tensor>,
    exp_avg: BTreeMap<String, Tensor>,
    exp_avg_sq: BTreeMap<String, Tensor>,
    steps: i64,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
    /// Under a sharded state, the rank that keeps each parameter's moments and updates it; this
    /// rank's `exp_avg`/`exp_avg_sq` then hold only its own parameters.
    owners: Option<BTreeMap<String, usize>>,
    /// f32 copies of the non-f32 parameters this rank updates (`trainer.f32_master_weights`):
    /// the update is applied to them and the parameters take their rounding.
    master: BTreeMap<String, Tensor>,
    /// Parameters that are this rank's slice of sharded blocks (`trainer.sharding: full`):
    /// their gradients are summed over the ranks already, and the ranks' slices together make
    /// the gradient norm.
    local: BTreeSet<String>,
}

impl AdamW {
    /// AdamW over `params`, its state beside each parameter or, with `host`, in host memory
    /// (`trainer.offload`): each step then brings the gradient there, updates in the same
    /// arithmetic, and copies the new value back to the parameter.
    pub fn new(
        params: BTreeMap<String, Tensor>,
        betas: [f64; 2],
        eps: f64,
        weight_decay: f64,
        host: bool,
    ) -> Self {
        let zeros = |p: &BTreeMap<String, Tensor>| {
            let at = |t: &Tensor| if host { Device::Cpu } else { t.device() };
            p.iter()
                .map(|(n, t)| (n.clone(), Tensor::zeros(t.size(), (Kind::Float, at(t)))))
                .collect()
        };
        Self {
            exp_avg: zeros(&params),
            exp_avg_sq: zeros(&params),
            params,
            steps: 0,
            betas,
            eps,
            weight_decay,
            owners: None,
            master: BTreeMap::new(),
            local: BTreeSet::new(),
        }
    }

    /// Keeps an f32 master copy of every non-f32 parameter this rank updates (call after
    /// [`Self::shard`]).
    pub fn keep_f32_masters(&mut self) {
        self.master = self
            .params
            .iter()
            .filter(|(n, p)| p.kind() != Kind::Float && self.exp_avg.contains_key(*n))
            .map(|(n, p)| (n.clone(), p.detach().to_device(self.exp_avg[n].device())))
            .map(|(n, p)| (n, p.to_kind(Kind::Float)))
            .collect();
    }

    /// Keeps only this rank's share of the state: parameters go, largest first, to the rank
    /// holding the fewest elements so far, so every rank keeps about 1/`world` of the moments.
    pub fn shard(&mut self, rank: usize, world: usize) {
        let mut by_size: Vec<(&String, i64)> =
            self.params.iter().map(|(n, p)| (n, p.numel() as i64)).collect();
        by_size.sort_by_key(|&(n, size)| (std::cmp::Reverse(size), n.clone()));
        let mut load = vec![0i64; world];
        let mut owners = BTreeMap::new();
        for (name, size) in by_size {
            let r = (0..world).min_by_key(|&r| (load[r], r)).expect("a job has ranks");
            load[r] += size;
            owners.insert(name.clone(), r);
        }
        self.exp_avg.retain(|n, _| owners[n] == rank);
        self.exp_avg_sq.retain(|n, _| owners[n] == rank);
        self.owners = Some(owners);
    }

    /// L2 norm of all gradients (0 for parameters without one).
    pub fn grad_norm(&self) -> f64 {
        let (whole, local) = self.grad_squares();
        (whole + local).sqrt()
    }

    /// Sums of squared gradients: of the parameters every rank holds whole, and of this rank's
    /// slices ([`Self::local`]).
    pub fn grad_squares(&self) -> (f64, f64) {
        let (mut whole, mut local) = (0.0, 0.0);
        for (name, p) in &self.params {
            let g = p.grad();
            if g.defined() {
                let sq = g.to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[]);
                *if self.local.contains(name) { &mut local } else { &mut whole } += sq;
            }
        }
        (whole, local)
    }

    /// The parameters every rank holds whole (those whose gradients the ranks sum).
    pub fn whole_params(&self) -> BTreeMap<String, Tensor> {
        let whole = self.params.iter().filter(|(n, _)| !self.local.contains(*n));
        whole.map(|(n, p)| (n.clone(), p.shallow_clone())).collect()
    }

    /// Scales gradients so their total norm is at most `max_norm`; returns the norm before.
    pub fn clip_grad_norm(&self, max_norm: f64) -> f64 {
        self.clip_to(self.grad_norm(), max_norm)
    }

    /// Scales gradients whose total norm is `norm` so that it is at most `max_norm`; returns
    /// `norm`.
    pub fn clip_to(&self, norm: f64, max_norm: f64) -> f64 {
        if norm.is_finite() && norm > max_norm {
            let scale = max_norm / (norm + 1e-6);
            for g in self.params.values().map(|p| p.grad()).filter(|g| g.defined()) {
                let _ = g.shallow_clone().f_mul_scalar_(scale);
            }
        }
        norm
    }

    /// One update at learning rate `lr` of the parameters whose state this rank keeps, less
    /// `skip` (those no rank computed a gradient for).
    pub fn step(&mut self, lr: f64, skip: &BTreeSet<String>) {
        self.steps += 1;
        let [b1, b2] = self.betas;
        let (c1, c2) = (1.0 - b1.powi(self.steps as i32), 1.0 - b2.powi(self.steps as i32));
        let _guard = tch::no_grad_guard();
        for (name, p) in &self.params {
            let g = p.grad();
            let (Some(m), Some(v)) = (self.exp_avg.get(name), self.exp_avg_sq.get(name)) else {
                continue;
            };
            if !g.defined() || skip.contains(name) {
                continue;
            }
            // Where the moments live (the device, or the host when offloaded).
            let at = m.device();
            let g = g.to_device(at).to_kind(Kind::Float);
            m.shallow_clone().copy_(&(m * b1 + &g * (1.0 - b1)));
            v.shallow_clone().copy_(&(v * b2 + g.square() * (1.0 - b2)));
            let update = (m / c1) / ((v / c2).sqrt() + self.eps);
            let master = self.master.get(name);
            let current =
                master.map_or_else(|| p.to_device(at).to_kind(Kind::Float), Tensor::shallow_clone);
            let next = current * (1.0 - lr * self.weight_decay) - update * lr;
            if let Some(master) = master {
                master.shallow_clone().copy_(&next);
            }
            p.shallow_clone().copy_(&next.to_kind(p.kind()));
        }
    }

    /// Marks `names` as this rank's slices of sharded blocks (`trainer.sharding: full`).
    pub fn set_local(&mut self, names: BTreeSet<String>) {
        self.local = names;
    }

    /// Under a sharded state, the rank that keeps each parameter's moments and updates it.
    pub fn owners(&self) -> Option<&BTreeMap<String, usize>> {
        self.owners.as_ref()
    }

    /// Whether the moments are sharded over the ranks, each keeping its share (ZeRO-1).
    pub fn shards_state(&self) -> bool {
        self.owners.is_some()
    }

    /// The parameters that are this rank's slices of sharded blocks.
    pub fn local(&self) -> &BTreeSet<String> {
        &self.local
    }

    /// The Adam moments by the prefix checkpoints save them under.
    pub fn moments(&self) -> [(&'static str, &BTreeMap<String, Tensor>); 2] {
        [("exp_avg", &self.exp_avg), ("exp_avg_sq", &self.exp_avg_sq)]
    }

    /// Drops every gradient (PyTorch's default `set_to_none`): a parameter that no backward pass
    /// reaches before the next step has none and does not step (no momentum, no weight decay),
    /// as in a fresh process after a resume.
    pub fn zero_grad(&self) {
        for p in self.params.values() {
            flowtune_recompute::clear_grad(p);
        }
    }
}

/// The learning rate at optimizer-schedule step `step` (0-based).
pub fn learning_rate(schedule: LrSchedule, base: f64, step: u64, warmup: u64, total: u64) -> f64 {
    let warm = if warmup > 0 && step < warmup { (step + 1) as f64 / warmup as f64 } else { 1.0 };
    match schedule {
        LrSchedule::Constant => base,
        LrSchedule::Warmup => base * warm,
        LrSchedule::Cosine => {
            if step < warmup {
                return base * warm;
            }
            let progress = (step - warmup) as f64 / (total.saturating_sub(warmup)).max(1) as f64;
            base * 0.5 * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos())
        }
    }
}

#[cfg(test)]
mod zero_grad_tests {
    use std::collections::{BTreeMap, BTreeSet};

    use tch::{Device, Kind, Tensor};

    use super::AdamW;

    /// A parameter a step's backward does not reach keeps its value (no momentum step), as
    /// `torch.optim.AdamW` with `zero_grad(set_to_none=True)`.
    #[test]
    fn a_parameter_without_a_gradient_does_not_step() {
        let (a, b) = (
            Tensor::ones([2], (Kind::Float, Device::Cpu)),
            Tensor::ones([2], (Kind::Float, Device::Cpu)),
        );
        let (a, b) = (a.set_requires_grad(true), b.set_requires_grad(true));
        let params = BTreeMap::from([
            ("a".to_string(), a.shallow_clone()),
            ("b".to_string(), b.shallow_clone()),
        ]);
        let mut adam = AdamW::new(params, [0.9, 0.999], 1e-8, 0.01, false);
        (&a + &b).sum(Kind::Float).backward();
        adam.step(0.1, &BTreeSet::new());
        adam.zero_grad();
        assert!(!a.grad().defined() && !b.grad().defined(), "gradients dropped");
        let b_before = b.copy();
        a.sum(Kind::Float).backward();
        adam.step(0.1, &BTreeSet::new());
        assert!(b.equal(&b_before), "b had no gradient this step and did not move");
        assert!(a.double_value(&[0]) < 0.85, "a stepped twice: {}", a.double_value(&[0]));
    }
}

#[cfg(test)]
mod master_tests {
    use std::collections::{BTreeMap, BTreeSet};

    use tch::{Device, Kind, Tensor};

    use super::AdamW;

    /// 100 AdamW steps of about 1e-4 on a bf16 weight at 1 (bf16 spacing there: 2⁻⁸ below 1):
    /// rounded away every time without a master copy, 0.99 with one.
    #[test]
    fn f32_masters_keep_steps_below_the_weights_resolution() {
        let run = |masters: bool| run_on(masters, false);
        assert_eq!(run_on(true, true), run(true), "state in host memory: the same numbers");
        assert_eq!(run(false), (1.0, None));
        let (rounded, master) = run(true);
        let master = master.expect("a master copy");
        assert!((master - 0.99).abs() < 1e-5, "{master}");
        assert!((rounded - master).abs() <= 2f64.powi(-9), "{rounded} is {master} in bf16");
    }

    /// 100 steps of the test above; `host`: the optimizer's state in host memory.
    fn run_on(masters: bool, host: bool) -> (f64, Option<f64>) {
        let p = Tensor::ones([4], (Kind::BFloat16, Device::Cpu)).set_requires_grad(true);
        let mut adam = AdamW::new(
            BTreeMap::from([("w".to_string(), p.shallow_clone())]),
            [0.9, 0.999],
            1e-8,
            0.0,
            host,
        );
        if masters {
            adam.keep_f32_masters();
        }
        for _ in 0..100 {
            (&p * 1.0).sum(Kind::Float).backward();
            adam.step(1e-4, &BTreeSet::new());
            adam.zero_grad();
        }
        (
            p.to_kind(Kind::Float).double_value(&[0]),
            adam.master.get("w").map(|m| m.double_value(&[0])),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adamw_matches_the_reference_update() {
        // One step on f(p) = p²/2 from p = 1: g = 1, m̂ = 1, v̂ = 1, p ← p·(1 − lr·wd) − lr·1/(1 + eps).
        let p = Tensor::from_slice(&[1.0f32]).set_requires_grad(true);
        let mut opt = AdamW::new(
            BTreeMap::from([("p".to_string(), p.shallow_clone())]),
            [0.9, 0.999],
            1e-8,
            0.1,
            false,
        );
        (&p * &p / 2.0).sum(Kind::Float).backward();
        opt.step(0.01, &Default::default());
        let want = 1.0 * (1.0 - 0.01 * 0.1) - 0.01 / (1.0 + 1e-8);
        assert!((p.double_value(&[0]) - want).abs() < 1e-7);
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let p = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        let opt = AdamW::new(
            BTreeMap::from([("p".to_string(), p.shallow_clone())]),
            [0.9, 0.999],
            1e-8,
            0.0,
            false,
        );
        (&p * &p / 2.0).sum(Kind::Float).backward();
        assert!((opt.clip_grad_norm(1.0) - 5.0).abs() < 1e-6);
        assert!((opt.grad_norm() - 1.0).abs() < 1e-5);
    }

    #[test]
    fn schedules() {
        assert_eq!(learning_rate(LrSchedule::Constant, 1.0, 5, 10, 100), 1.0);
        assert_eq!(learning_rate(LrSchedule::Warmup, 1.0, 4, 10, 100), 0.5);
        assert_eq!(learning_rate(LrSchedule::Cosine, 1.0, 10, 10, 110), 1.0);
        assert!((learning_rate(LrSchedule::Cosine, 1.0, 60, 10, 110) - 0.5).abs() < 1e-12);
        assert!(learning_rate(LrSchedule::Cosine, 1.0, 110, 10, 110).abs() < 1e-12);
    }
}

/// The Adam state a checkpoint keeps: the update count (in `state.json`), this rank's moments of
/// the parameters every rank holds whole (`exp_avg.<name>`, `exp_avg_sq.<name>`) and the f32
/// masters (`master.<name>`); a master the checkpoint lacks starts at its parameter.
impl Stateful for AdamW {
    fn state(&self) -> serde_json::Value {
        self.steps.into()
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        self.steps = state.as_i64().ok_or_else(|| {
            TrainError::Invalid(format!("the optimizer's update count is {state}, not a number"))
        })?;
        Ok(())
    }

    fn state_tensors(&self, _scope: &Scope<'_>) -> Vec<(String, Tensor)> {
        let mut named = vec![];
        for (name, t) in self.exp_avg.iter().filter(|(n, _)| !self.local.contains(*n)) {
            named.push((format!("exp_avg.{name}"), t.shallow_clone()));
            named.push((format!("exp_avg_sq.{name}"), self.exp_avg_sq[name].shallow_clone()));
        }
        for (name, t) in &self.master {
            named.push((format!("master.{name}"), t.shallow_clone()));
        }
        named
    }

    fn load_state_tensors(
        &self,
        saved: &BTreeMap<String, Tensor>,
        _scope: &Scope<'_>,
    ) -> Result<(), String> {
        let _guard = tch::no_grad_guard();
        for (name, m) in self.exp_avg.iter().filter(|(n, _)| !self.local.contains(*n)) {
            let (sm, sv) =
                (saved.get(&format!("exp_avg.{name}")), saved.get(&format!("exp_avg_sq.{name}")));
            let (Some(sm), Some(sv)) = (sm, sv) else {
                return Err(format!("no optimizer state for {name}"));
            };
            m.shallow_clone().copy_(sm);
            self.exp_avg_sq[name].shallow_clone().copy_(sv);
        }
        for (name, master) in &self.master {
            let value = saved.get(&format!("master.{name}")).unwrap_or(&self.params[name]);
            master.shallow_clone().copy_(value);
        }
        Ok(())
    }
}

/// An exponential moving average of the trainable tensors, for evaluation:
/// `ema ← d·ema + (1 − d)·θ` after every optimizer step.
pub struct Ema {
    /// The prefix its copies are saved under (`ema`, `old`).
    pub name: &'static str,
    pub decay: f64,
    pub shadow: BTreeMap<String, Tensor>,
}

impl Ema {
    /// A copy of `params` saved as `name`, beside them or, with `host`, in host memory
    /// (`trainer.offload`).
    pub fn new(
        name: &'static str,
        decay: f64,
        params: &BTreeMap<String, Tensor>,
        host: bool,
    ) -> Self {
        // A copy, never the parameter itself (`to_device` to where a tensor is already is not one).
        let copy = |p: &Tensor| {
            let mut t =
                Tensor::empty(p.size(), (p.kind(), if host { Device::Cpu } else { p.device() }));
            t.copy_(&p.detach());
            t
        };
        Self { name, decay, shadow: params.iter().map(|(n, p)| (n.clone(), copy(p))).collect() }
    }

    pub fn update(&mut self, params: &BTreeMap<String, Tensor>) {
        let _guard = tch::no_grad_guard();
        for (name, p) in params {
            let s = &self.shadow[name];
            let p = p.detach().to_device(s.device());
            s.shallow_clone().copy_(&(s * self.decay + p * (1.0 - self.decay)));
        }
    }

    /// Runs `f` with the shadow values in place of the live ones, then puts the live ones back
    /// (also when `f` fails).
    pub fn with_swapped<T>(
        &mut self,
        params: &BTreeMap<String, Tensor>,
        f: impl FnOnce() -> T,
    ) -> T {
        self.swap(params);
        let out = f();
        self.swap(params);
        out
    }

    /// Swaps the shadow values with the live ones (call again to swap back).
    pub fn swap(&mut self, params: &BTreeMap<String, Tensor>) {
        let _guard = tch::no_grad_guard();
        for (name, p) in params {
            let live = p.detach().copy();
            p.shallow_clone().copy_(&self.shadow[name]);
            self.shadow[name].shallow_clone().copy_(&live);
        }
    }
}

/// An EMA's copies, as `<name>.<weight>`; one a checkpoint lacks (from a run without this copy)
/// starts at its parameter.
impl Stateful for Ema {
    fn state_tensors(&self, scope: &Scope<'_>) -> Vec<(String, Tensor)> {
        let kept = self.shadow.iter().filter(|(n, _)| !scope.sliced.contains(*n));
        kept.map(|(n, t)| (format!("{}.{n}", self.name), t.shallow_clone())).collect()
    }

    fn load_state_tensors(
        &self,
        saved: &BTreeMap<String, Tensor>,
        scope: &Scope<'_>,
    ) -> Result<(), String> {
        let _guard = tch::no_grad_guard();
        for (name, value) in self.shadow.iter().filter(|(n, _)| !scope.sliced.contains(*n)) {
            let saved = saved.get(&format!("{}.{name}", self.name));
            value.shallow_clone().copy_(saved.unwrap_or(&scope.params[name]));
        }
        Ok(())
    }
}

#[cfg(test)]
mod ema_tests {
    use super::*;

    #[test]
    fn ema_lags_and_swaps() {
        let p = Tensor::from_slice(&[0.0f32]);
        let params = BTreeMap::from([("p".to_string(), p.shallow_clone())]);
        let mut ema = Ema::new("ema", 0.9, &params, false);
        let _ = p.shallow_clone().fill_(1.0);
        ema.update(&params);
        assert!((ema.shadow["p"].double_value(&[0]) - 0.1).abs() < 1e-7);
        ema.swap(&params);
        assert!(
            (p.double_value(&[0]) - 0.1).abs() < 1e-7 && ema.shadow["p"].double_value(&[0]) == 1.0
        );
        ema.swap(&params);
        assert_eq!(p.double_value(&[0]), 1.0);
    }
}
