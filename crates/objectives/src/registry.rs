//! The algorithm registry: a recipe's `algorithm: NAME` selects an advantage estimator and a loss,
//! and its row says what the algorithm needs of a recipe ([`Needs`]). One table of the built-in
//! algorithms, listed in one place so `flowtune list` prints what exists, plus those registered
//! at run time (a test's, a plug-in's) with [`register`].

use std::sync::RwLock;

use crate::losses::PolicyLoss;
use crate::ObjectiveError;

/// What an algorithm asks of the rollout sampler besides its loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutNeed {
    /// Any sampler settings.
    Any,
    /// Rollouts with the DanceGRPO SDE (`rollout.sde_type: dance_sde`).
    DanceSde,
    /// An SDE window with ODE steps outside it (`rollout.sde_window_size ≥ 1`).
    SdeWindow,
}

/// What is minimised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// A policy-gradient loss over recorded SDE steps.
    Policy(PolicyLoss),
    /// Diffusion-DPO on noised pairs.
    Dpo,
    /// DiffusionNFT on noised clean samples.
    Nft,
    /// DiffusionOPD: the KL of each recorded SDE step to frozen teachers', no reward in the loss.
    Distill,
    /// DGPO: group-weighted flow-matching errors of re-noised clean samples.
    Dgpo,
    /// GARDO: a diversity-shaped, std-weighted clipped ratio and a gated KL to a resettable anchor.
    Gardo,
    /// DMD2: a few-step student matched to the base model's guided distribution through a fake
    /// score; no reward in the loss.
    Dmd2,
    /// An algorithm registered at run time, whose step the trainer knows by its name.
    Registered,
}

/// How an algorithm's rollouts sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// Either way.
    Any,
    /// Stochastic steps to train on (`rollout.noise_level > 0`).
    Sde,
    /// The ODE sampler (`rollout.noise_level: 0`).
    Ode,
}

/// When the trainer keeps the reference policy (the base model) for an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceNeed {
    Always,
    /// For `actor.use_kl_loss` only.
    WithKlLoss,
    Never,
}

/// Whether an algorithm distils from frozen teachers (`model.teacher_path` / `model.teachers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distills {
    /// It is distillation: it needs a teacher.
    Always,
    /// With `actor.use_distill_loss` (a policy-gradient loss plus the distillation KL).
    Optionally,
    Never,
}

/// What an algorithm needs of a recipe and of the trainer, in one row: the recipe loader checks
/// it generically, the planner and the trainer read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    pub sampling: Sampling,
    pub rollout: RolloutNeed,
    /// Compares the samples of a prompt group online (`rollout.n ≥ 2`); the reason, which the
    /// error puts right after the algorithm's name.
    pub groups: Option<&'static str>,
    /// Trains on the rollout's log-probs, so `rollout_correction` applies (else it is refused).
    pub rollout_log_probs: bool,
    /// Reads the old policy's transition means, which `trainer.old_log_prob: bypass` does not
    /// compute.
    pub old_means: bool,
    pub reference: ReferenceNeed,
    /// Keeps an old policy (or an anchor): a copy of the trained weights beside them.
    pub old_policy: bool,
    /// Refuses `actor.use_kl_loss` for its own regulariser, named here.
    pub own_kl: Option<&'static str>,
    pub distills: Distills,
    /// Also trains on offline pairs (`data.preference_files`).
    pub pairs: bool,
    /// Every prompt group sits whole in one micro-batch (`trainer.micro_batch_size` a multiple
    /// of `rollout.n`).
    pub whole_groups: bool,
    /// A diversity model (`actor.gardo.features`) and proxy rewards (`actor.gardo.proxy_rewards`).
    pub diversity: bool,
    /// Trains several LoRA adapters on one shared base (`model.finetune: lora`), each with one
    /// optimizer step per update (`trainer.ppo_epochs: 1`).
    pub adapters: bool,
}

impl Needs {
    /// Whether the trainer keeps the reference policy, with `actor.use_kl_loss` as given.
    pub fn keeps_reference(&self, use_kl_loss: bool) -> bool {
        match self.reference {
            ReferenceNeed::Always => true,
            ReferenceNeed::WithKlLoss => use_kl_loss,
            ReferenceNeed::Never => false,
        }
    }
}

/// The needs of a policy-gradient algorithm (Flow-GRPO's family).
const POLICY: Needs = Needs {
    sampling: Sampling::Sde,
    rollout: RolloutNeed::Any,
    groups: Some("'s advantages are rewards minus their prompt group's mean"),
    rollout_log_probs: true,
    old_means: false,
    reference: ReferenceNeed::WithKlLoss,
    old_policy: false,
    own_kl: None,
    distills: Distills::Optionally,
    pairs: false,
    whole_groups: false,
    diversity: false,
    adapters: false,
};

/// The needs of an algorithm that trains clean samples against the reference.
const CLEAN: Needs = Needs {
    sampling: Sampling::Any,
    rollout_log_probs: false,
    reference: ReferenceNeed::Always,
    distills: Distills::Never,
    ..POLICY
};

/// One registered algorithm.
#[derive(Debug)]
pub struct Algorithm {
    pub name: &'static str,
    pub objective: Objective,
    pub needs: Needs,
    /// One line for `flowtune list`.
    pub summary: &'static str,
}

/// Every algorithm flowtune runs.
pub const ALGORITHMS: &[Algorithm] = &[
    Algorithm {
        name: "flow_grpo",
        objective: Objective::Policy(PolicyLoss::Clipped),
        needs: POLICY,
        summary: "Flow-GRPO: SDE rollouts, group advantages, PPO-clipped step log-prob ratios",
    },
    Algorithm {
        name: "dance_grpo",
        objective: Objective::Policy(PolicyLoss::Clipped),
        needs: Needs { rollout: RolloutNeed::DanceSde, ..POLICY },
        summary: "DanceGRPO: flow_grpo's loss on dance_sde rollouts",
    },
    Algorithm {
        name: "mix_grpo",
        objective: Objective::Policy(PolicyLoss::Clipped),
        needs: Needs { rollout: RolloutNeed::SdeWindow, ..POLICY },
        summary: "MixGRPO: flow_grpo's loss on an SDE window, ODE steps outside it",
    },
    Algorithm {
        name: "grpo_guard",
        objective: Objective::Policy(PolicyLoss::Guard),
        needs: Needs { old_means: true, ..POLICY },
        summary: "GRPO-Guard: ratio re-centred by the mean shift, step-normalised",
    },
    Algorithm {
        name: "flow_dppo",
        objective: Objective::Policy(PolicyLoss::Dppo),
        needs: Needs { old_means: true, ..POLICY },
        summary: "Flow-DPPO: unclipped ratio with a divergence mask",
    },
    Algorithm {
        name: "dpo",
        objective: Objective::Dpo,
        needs: Needs { groups: Some(" pairs the best and worst sample of each prompt online"), pairs: true, ..CLEAN },
        summary: "Diffusion-DPO: best vs worst of each group (online) or dataset pairs (offline)",
    },
    Algorithm {
        name: "diffusion_nft",
        objective: Objective::Nft,
        needs: Needs { groups: Some(" compares the samples of a prompt with each other"), old_policy: true, ..CLEAN },
        summary: "DiffusionNFT: forward-process positive/negative velocity loss, ODE rollouts",
    },
    Algorithm {
        name: "diffusion_opd",
        objective: Objective::Distill,
        needs: Needs { groups: None, distills: Distills::Always, ..POLICY },
        summary: "DiffusionOPD: on-policy distillation, the student's SDE steps scored by frozen teachers",
    },
    Algorithm {
        name: "dgpo",
        objective: Objective::Dgpo,
        needs: Needs {
            sampling: Sampling::Ode,
            groups: Some(" compares the samples of a prompt group"),
            old_policy: true,
            own_kl: Some("actor.ref_kl_coef (velocity MSE to the reference)"),
            whole_groups: true,
            ..CLEAN
        },
        summary: "DGPO: ODE rollouts, group-level preference weights on forward-process errors",
    },
    Algorithm {
        name: "gardo",
        objective: Objective::Gardo,
        needs: Needs {
            rollout_log_probs: false,
            reference: ReferenceNeed::Never,
            old_policy: true,
            own_kl: Some("its gated KL to its anchor (weight actor.kl_loss_coef)"),
            distills: Distills::Never,
            diversity: true,
            ..POLICY
        },
        summary: "GARDO: Flow-GRPO with diversity-shaped advantages and a gated KL to a resettable anchor",
    },
    Algorithm {
        name: "dmd2",
        objective: Objective::Dmd2,
        needs: Needs {
            groups: None,
            old_policy: true,
            own_kl: Some("its distribution-matching gradient to the base model (the teacher)"),
            adapters: true,
            ..CLEAN
        },
        summary: "DMD2: distils the base model's guided sampling into a few-step student through a fake score",
    },
];

/// Algorithms registered at run time.
static REGISTERED: RwLock<Vec<&'static Algorithm>> = RwLock::new(Vec::new());

/// Adds an algorithm (its trainer step is registered with the trainer under the same name).
pub fn register(algorithm: &'static Algorithm) {
    REGISTERED.write().expect("registry lock").push(algorithm);
}

/// Every known algorithm: built in first, then registered ones.
pub fn algorithms() -> Vec<&'static Algorithm> {
    let registered = REGISTERED.read().expect("registry lock");
    ALGORITHMS.iter().chain(registered.iter().copied()).collect()
}

/// The algorithm registered under `name`; the error lists the known names.
pub fn algorithm(name: &str) -> Result<&'static Algorithm, ObjectiveError> {
    let all = algorithms();
    let found = all.iter().find(|a| a.name == name).copied();
    found.ok_or_else(|| ObjectiveError::UnknownAlgorithm {
        name: name.to_string(),
        known: all.iter().map(|a| a.name).collect::<Vec<_>>().join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_unknown_name() {
        assert_eq!(
            algorithm("grpo_guard").unwrap().objective,
            Objective::Policy(PolicyLoss::Guard)
        );
        assert_eq!(
            algorithm("dance_grpo").unwrap().objective,
            algorithm("flow_grpo").unwrap().objective
        );
        for a in ALGORITHMS {
            if let Objective::Policy(loss) = a.objective {
                assert_eq!(a.needs.old_means, loss.needs_means(), "{}", a.name);
            }
        }
        let err = algorithm("ppo").unwrap_err().to_string();
        assert!(err.contains("`ppo`") && err.contains("flow_grpo, dance_grpo"), "{err}");
    }
}
