//! An algorithm that only this test registers: it shrinks the trained weights (one optimizer step
//! a training step on `c·Σθ²`), keeps a lagging copy of them (`old`) and counts its steps in its
//! checkpoint state. It trains through the unchanged trainer — the registry and the recipe
//! loader's checks, the shared optimisation pass, checkpoints of its copy and its state, resume
//! bit for bit — which is what adding an algorithm has to cost: its module plus one registry line.

mod common;

use std::collections::BTreeMap;

use common::{load_recipe, scratch, tensors};
use flowtune_objectives::losses::LossOutput;
use flowtune_objectives::{Algorithm as Entry, Metrics, Needs, Objective};
use flowtune_trainer::algorithm::{
    optimize, register_algorithm, Algorithm, Batching, Learner, Run, SlotLoss, Source, Stateful,
    Step,
};
use flowtune_trainer::optim::Ema;
use flowtune_trainer::{train, TrainError};
use tch::{Device, Kind, Tensor};

/// Its registry row: no rollout, no reference, no groups; a copy of the weights.
static SHRINK: Entry = Entry {
    name: "test_shrink",
    objective: Objective::Registered,
    needs: Needs {
        sampling: flowtune_objectives::Sampling::Any,
        rollout: flowtune_objectives::RolloutNeed::Any,
        groups: None,
        rollout_log_probs: false,
        old_means: false,
        reference: flowtune_objectives::ReferenceNeed::Never,
        old_policy: true,
        own_kl: None,
        distills: flowtune_objectives::Distills::Never,
        pairs: false,
        whole_groups: false,
        diversity: false,
        adapters: false,
    },
    summary: "test only: shrinks the trained weights",
};

/// The strength of the pull towards 0.
const PULL: f64 = 1e-2;

#[derive(Default)]
struct Shrink {
    old: Option<Ema>,
    steps: u64,
}

/// Its step count, to show an algorithm's own state checkpoints and resumes.
impl Stateful for Shrink {
    fn state(&self) -> serde_json::Value {
        serde_json::json!({ "steps": self.steps })
    }

    fn restore(&mut self, state: &serde_json::Value) -> Result<(), TrainError> {
        self.steps = state["steps"].as_u64().unwrap_or(0);
        Ok(())
    }
}

impl Algorithm for Shrink {
    fn start(&mut self, params: &BTreeMap<String, Tensor>, host: bool) {
        self.old = Some(Ema::new("old", 0.5, params, host));
    }

    fn shadows(&self) -> Vec<&Ema> {
        self.old.iter().collect()
    }
    fn step(
        &mut self,
        run: &Run<'_>,
        learner: &mut Learner,
        _source: &mut Source,
        step: &mut Step,
    ) -> Result<usize, TrainError> {
        let params: Vec<Tensor> =
            learner.optimizer.params.values().map(Tensor::shallow_clone).collect();
        let batching = Batching { items: 1, owned: vec![true], mini: 1, micro: 1 };
        let (number, lr) = (step.number, step.lr);
        step.metrics.extend(optimize(learner, run, batching, number, lr, |_, pass| {
            pass.slots(1, |_| {
                let squares = params.iter().map(|p| p.square().sum(Kind::Float));
                let loss = squares
                    .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |a, b| a + b)
                    * PULL;
                Ok(SlotLoss {
                    what: "the weights' squares".into(),
                    output: LossOutput { loss, metrics: Metrics::new() },
                })
            })
        })?);
        let old = self.old.as_mut().expect("started");
        old.update(&learner.optimizer.params);
        self.steps += 1;
        step.metrics.insert("test/steps".into(), self.steps as f64);
        Ok(0)
    }
}

fn registered() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| register_algorithm(&SHRINK, || Box::new(Shrink::default())));
}

/// Trains `test_shrink` on the tiny pipeline into `out` until `steps`, saving every step.
fn run(out: &std::path::Path, steps: u64) -> Vec<Metrics> {
    let overrides = [
        "algorithm=test_shrink".to_string(),
        format!("trainer.total_steps={steps}"),
        "trainer.save_freq=1".into(),
        "trainer.keep_last=5".into(),
    ];
    let recipe = load_recipe("flow_grpo_tiny.yaml", out, &overrides).expect("recipe");
    train(&recipe, Device::Cpu).expect("train").metrics
}

#[test]
fn a_registered_algorithm_trains_checkpoints_its_state_and_resumes_bit_for_bit() {
    registered();
    let (straight, resumed) =
        (scratch("test-algorithm-straight"), scratch("test-algorithm-resumed"));
    let lines = run(&straight, 3);
    // It trains: the loss Σθ² falls step by step, and its state counts the steps.
    let loss: Vec<f64> = lines.iter().map(|m| m["actor/loss"]).collect();
    assert!(loss[0] > loss[1] && loss[1] > loss[2], "{loss:?}");
    assert_eq!(lines.last().unwrap()["test/steps"], 3.0);
    let state = |out: &std::path::Path, step: u64| -> serde_json::Value {
        let file = out.join(format!("checkpoints/step_{step:06}/state.json"));
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
    };
    assert_eq!(state(&straight, 2)["algorithm"], serde_json::json!({ "steps": 2 }));
    let optimizer =
        |out: &std::path::Path| tensors(&out.join("checkpoints/step_000003/optimizer.safetensors"));
    let olds = optimizer(&straight).into_keys().filter(|n| n.starts_with("old.")).count();
    assert!(olds > 0, "its copy of the weights is in the checkpoint");
    // Resumed at step 2 (a new process would start with steps = 0 and a fresh copy): the same.
    run(&resumed, 2);
    let resumed_lines = run(&resumed, 3);
    assert_eq!(resumed_lines.len(), 1);
    assert_eq!(resumed_lines[0]["test/steps"], 3.0, "the state came back");
    assert_eq!(resumed_lines[0]["actor/loss"], lines[2]["actor/loss"]);
    let (a, b) = (optimizer(&straight), optimizer(&resumed));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, t) in &a {
        assert!(t.equal(&b[name]), "{name} differs after the resume");
    }
    let lora = |out: &std::path::Path| tensors(&out.join("lora/pytorch_lora_weights.safetensors"));
    let (a, b) = (lora(&straight), lora(&resumed));
    for (name, t) in &a {
        assert!(t.equal(&b[name]), "{name} differs after the resume");
    }
}

#[test]
fn the_recipe_loader_checks_a_registered_algorithm_by_its_needs() {
    registered();
    let out = scratch("test-algorithm-needs");
    let err = load_recipe(
        "flow_grpo_tiny.yaml",
        &out,
        &["algorithm=test_shrink".into(), "actor.use_distill_loss=true".into()],
    )
    .unwrap_err();
    assert!(err.contains("actor.use_distill_loss") && err.contains("test_shrink"), "{err}");
    let err =
        load_recipe("flow_grpo_tiny.yaml", &out, &["algorithm=test_shrnk".into()]).unwrap_err();
    assert!(err.contains("test_shrink"), "the known names include it: {err}");
}
