//! The algorithm registry: a recipe's `algorithm: NAME` selects an advantage estimator and a loss.
//! One table, listed in one place, so `flowtune list` prints what exists.

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
}

/// One registered algorithm.
#[derive(Debug)]
pub struct Algorithm {
    pub name: &'static str,
    pub objective: Objective,
    pub rollout: RolloutNeed,
    /// One line for `flowtune list`.
    pub summary: &'static str,
}

/// Every algorithm flowtune runs.
pub const ALGORITHMS: &[Algorithm] = &[
    Algorithm {
        name: "flow_grpo",
        objective: Objective::Policy(PolicyLoss::Clipped),
        rollout: RolloutNeed::Any,
        summary: "Flow-GRPO: SDE rollouts, group advantages, PPO-clipped step log-prob ratios",
    },
    Algorithm {
        name: "dance_grpo",
        objective: Objective::Policy(PolicyLoss::Clipped),
        rollout: RolloutNeed::DanceSde,
        summary: "DanceGRPO: flow_grpo's loss on dance_sde rollouts",
    },
    Algorithm {
        name: "mix_grpo",
        objective: Objective::Policy(PolicyLoss::Clipped),
        rollout: RolloutNeed::SdeWindow,
        summary: "MixGRPO: flow_grpo's loss on an SDE window, ODE steps outside it",
    },
    Algorithm {
        name: "grpo_guard",
        objective: Objective::Policy(PolicyLoss::Guard),
        rollout: RolloutNeed::Any,
        summary: "GRPO-Guard: ratio re-centred by the mean shift, step-normalised",
    },
    Algorithm {
        name: "flow_dppo",
        objective: Objective::Policy(PolicyLoss::Dppo),
        rollout: RolloutNeed::Any,
        summary: "Flow-DPPO: unclipped ratio with a divergence mask",
    },
    Algorithm {
        name: "dpo",
        objective: Objective::Dpo,
        rollout: RolloutNeed::Any,
        summary: "Diffusion-DPO: best vs worst of each group (online) or dataset pairs (offline)",
    },
    Algorithm {
        name: "diffusion_nft",
        objective: Objective::Nft,
        rollout: RolloutNeed::Any,
        summary: "DiffusionNFT: forward-process positive/negative velocity loss, ODE rollouts",
    },
    Algorithm {
        name: "diffusion_opd",
        objective: Objective::Distill,
        rollout: RolloutNeed::Any,
        summary: "DiffusionOPD: on-policy distillation, the student's SDE steps scored by frozen teachers",
    },
    Algorithm {
        name: "dgpo",
        objective: Objective::Dgpo,
        rollout: RolloutNeed::Any,
        summary: "DGPO: ODE rollouts, group-level preference weights on forward-process errors",
    },
    Algorithm {
        name: "gardo",
        objective: Objective::Gardo,
        rollout: RolloutNeed::Any,
        summary: "GARDO: Flow-GRPO with diversity-shaped advantages and a gated KL to a resettable anchor",
    },
];

/// The algorithm registered under `name`; the error lists the known names.
pub fn algorithm(name: &str) -> Result<&'static Algorithm, ObjectiveError> {
    ALGORITHMS.iter().find(|a| a.name == name).ok_or_else(|| ObjectiveError::UnknownAlgorithm {
        name: name.to_string(),
        known: ALGORITHMS.iter().map(|a| a.name).collect::<Vec<_>>().join(", "),
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
        let err = algorithm("ppo").unwrap_err().to_string();
        assert!(err.contains("`ppo`") && err.contains("flow_grpo, dance_grpo"), "{err}");
    }
}
