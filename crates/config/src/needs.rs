//! An algorithm's needs (its row in the registry, [`Needs`]) checked against a recipe, the same
//! way for every algorithm: each error names the setting to change and why the algorithm needs it.

use flowtune_objectives::{Algorithm, Distills, Needs, RolloutNeed, Sampling};
use flowtune_sampling::SdeType;

use crate::{OldLogProb, Recipe};

type Checked = Result<(), (String, String)>;

fn fail(key: &str, message: String) -> Checked {
    Err((key.to_string(), message))
}

impl Recipe {
    /// Checks the recipe against `algorithm`'s needs.
    pub(crate) fn check_needs(&self, algorithm: &Algorithm) -> Checked {
        let (name, needs) = (algorithm.name, &algorithm.needs);
        let pairs = !self.data.preference_files.is_empty();
        if let (Some(why), false) = (needs.groups, pairs) {
            if self.rollout.n < 2 {
                let n = self.rollout.n;
                let offline =
                    if needs.pairs { " (or data.preference_files for offline pairs)" } else { "" };
                return fail("rollout.n", format!("{n}: {name}{why}, so a group of one sample trains nothing; set rollout.n ≥ 2{offline}"));
            }
        }
        self.check_sampling(name, needs)?;
        self.check_log_probs(name, needs)?;
        if let (Some(own), true) = (needs.own_kl, self.actor.use_kl_loss) {
            return fail(
                "actor.use_kl_loss",
                format!("{name} regularises with {own}; set use_kl_loss: false"),
            );
        }
        let (micro, n) = (self.trainer.micro_batch_size, self.rollout.n);
        if needs.whole_groups && micro % n != 0 {
            return fail("trainer.micro_batch_size", format!("{micro} is not a multiple of rollout.n {n}; {name} scores each prompt group as a whole, so every group must sit in one micro-batch on one rank"));
        }
        if pairs && !needs.pairs {
            return fail(
                "data.preference_files",
                format!("preference pairs train only algorithm: dpo, not {name}"),
            );
        }
        if needs.adapters && self.model.finetune != crate::Finetune::Lora {
            return fail("model.finetune", format!("{name} trains its student and its fake score as two LoRA adapters on one shared base; set model.finetune: lora"));
        }
        if needs.adapters && self.trainer.ppo_epochs != 1 {
            let epochs = self.trainer.ppo_epochs;
            return fail("trainer.ppo_epochs", format!("{epochs}: {name} makes one optimizer step per update (the student's, then each fake score's, each on fresh prompts); set 1"));
        }
        self.check_teachers(name, needs)?;
        if needs.diversity {
            self.check_diversity(name)?;
        }
        Ok(())
    }

    /// The sampler: stochastic or ODE steps, the DanceGRPO SDE, an SDE window.
    fn check_sampling(&self, name: &str, needs: &Needs) -> Checked {
        let eta = self.rollout.noise_level;
        match needs.sampling {
            Sampling::Sde if eta == 0.0 => {
                return fail(
                    "rollout.noise_level",
                    format!("0 leaves {name} no stochastic step to train; set it > 0 (e.g. 0.7)"),
                );
            }
            Sampling::Ode if eta != 0.0 => {
                return fail("rollout.noise_level", format!("{eta} is not allowed; {name} samples with the ODE sampler, set rollout.noise_level: 0"));
            }
            _ => {}
        }
        if needs.rollout == RolloutNeed::DanceSde && self.rollout.sde_type != SdeType::DanceSde {
            return fail(
                "rollout.sde_type",
                format!("{name} samples with the DanceGRPO SDE; set rollout.sde_type: dance_sde"),
            );
        }
        if needs.rollout == RolloutNeed::SdeWindow && self.rollout.sde_window_size == 0 {
            return fail("rollout.sde_window_size", format!("{name} trains an SDE window and takes ODE steps outside it; set rollout.sde_window_size ≥ 1"));
        }
        Ok(())
    }

    /// Old log-probs: what bypass mode leaves out, and rollout correction and the off-policy lag,
    /// which weigh the rollout's log-probs.
    fn check_log_probs(&self, name: &str, needs: &Needs) -> Checked {
        let (bypass, corrects) =
            (self.trainer.old_log_prob == OldLogProb::Bypass, self.rollout_correction.enabled());
        if needs.old_means && bypass {
            return fail("trainer.old_log_prob", format!("{name} needs the old policy's transition means, which bypass mode does not compute; set trainer.old_log_prob: recompute"));
        }
        let (lag, split) = (self.trainer.off_policy_lag, self.trainer.rollout_ranks);
        let lags = needs.rollout_log_probs && !needs.old_policy;
        if lag > 0 && !lags {
            return fail("trainer.off_policy_lag", format!("{lag}: {name} does not sample with the trained weights and weigh their log-probs, so a lagged sampler has nothing to correct; set 0 (the lag applies to flow_grpo's family and diffusion_opd)"));
        }
        if split > 0 && !lags {
            return fail("trainer.rollout_ranks", format!("{split}: {name} does not sample with the trained weights alone; set 0 (rollout ranks serve flow_grpo's family and diffusion_opd)"));
        }
        match (needs.rollout_log_probs, corrects) {
            (true, true) if bypass => fail("rollout_correction", "corrects rollout log-probs towards recomputed old ones, but bypass mode uses the rollout's as the old ones; set trainer.old_log_prob: recompute or turn rollout_is / rollout_rs off".into()),
            (false, true) => fail("rollout_correction", format!("{name} does not train on rollout log-probs; turn rollout_is / rollout_rs off")),
            _ => Ok(()),
        }
    }

    /// Teachers go with distillation: each distilling algorithm needs one, no teacher stays
    /// unused, and every teacher's weight is positive.
    fn check_teachers(&self, name: &str, needs: &Needs) -> Checked {
        let m = &self.model;
        if m.teacher_path.is_some() && !m.teachers.is_empty() {
            return fail(
                "model.teachers",
                "set model.teacher_path (one teacher) or model.teachers (several), not both".into(),
            );
        }
        let teachers = m.all_teachers();
        let distils = needs.distills == Distills::Always || self.actor.use_distill_loss;
        if self.actor.use_distill_loss && needs.distills != Distills::Optionally {
            return fail("actor.use_distill_loss", format!("adds the distillation KL to a policy-gradient loss (flow_grpo, …), not to {name}'s; use algorithm: diffusion_opd for distillation alone"));
        }
        if distils && teachers.is_empty() {
            return fail(
                "model.teacher_path",
                "distillation needs a frozen teacher: set model.teacher_path or model.teachers"
                    .into(),
            );
        }
        if !distils && !teachers.is_empty() {
            return fail("model.teacher_path", "a teacher is set but nothing distils; use algorithm: diffusion_opd or actor.use_distill_loss: true".into());
        }
        for (i, t) in teachers.iter().enumerate() {
            if !(t.weight > 0.0 && t.weight.is_finite()) {
                return Err((
                    format!("model.teachers[{i}].weight"),
                    format!("{} is not allowed; expected a finite number > 0", t.weight),
                ));
            }
        }
        Ok(())
    }

    /// A diversity model and at least one proxy reward among the reward functions (GARDO).
    fn check_diversity(&self, name: &str) -> Checked {
        let a = &self.actor;
        if a.gardo.features.is_none() {
            return fail("actor.gardo.features", format!("{name} needs a transformers CLIPModel folder whose image embeddings measure diversity"));
        }
        if a.gardo.proxy_rewards.is_empty() {
            return fail("actor.gardo.proxy_rewards", format!("{name} gates its KL by how a sample's trained-reward rank departs from its proxy rewards' ranks; name at least one of reward.functions (weight 0 keeps it out of the trained reward)"));
        }
        let names: Vec<&str> = self.reward.functions.iter().map(|f| f.name.as_str()).collect();
        if let Some(missing) = a.gardo.proxy_rewards.iter().find(|p| !names.contains(&p.as_str())) {
            return fail(
                "actor.gardo.proxy_rewards",
                format!("`{missing}` is not one of reward.functions ({})", names.join(", ")),
            );
        }
        Ok(())
    }
}
