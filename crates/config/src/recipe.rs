//! The typed recipe: one struct per section, defaults from the public recipes.

use std::path::Path;

use flowtune_objectives::{AdvantageConfig, CorrectionConfig, LossConfig, ObjectiveError};
use flowtune_rewards::RewardConfig;
use flowtune_sampling::{SamplerConfig, SamplingError};
use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use flowtune_models::Dtype;

use crate::suggest::nearest_name;
use crate::{
    AutoSizes, ConfigError, DataSection, Finetune, ModelSection, Override, Sharding, StateOffload,
    TrainerSection,
};

/// A resolved training recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Recipe {
    /// A registered algorithm (`flowtune list`): selects the advantage estimator and the loss.
    pub algorithm: String,
    /// Base seed: rollout row seeds derive from it and the training step.
    pub seed: u64,
    pub model: ModelSection,
    pub data: DataSection,
    pub rollout: SamplerConfig,
    pub advantage: AdvantageConfig,
    pub actor: LossConfig,
    /// Importance weights and rejection between rollout and recomputed old log-probs.
    pub rollout_correction: CorrectionConfig,
    pub reward: RewardConfig,
    pub trainer: TrainerSection,
    /// The sizes given as `auto`, still to be fitted to the device's memory (their fields hold
    /// stand-ins until then).
    #[serde(skip)]
    #[schemars(skip)]
    pub auto: AutoSizes,
}

impl Default for Recipe {
    fn default() -> Self {
        Self {
            algorithm: "flow_grpo".into(),
            seed: 42,
            model: ModelSection::default(),
            data: DataSection::default(),
            rollout: SamplerConfig::default(),
            advantage: AdvantageConfig::default(),
            actor: LossConfig::default(),
            rollout_correction: CorrectionConfig::default(),
            reward: RewardConfig::default(),
            trainer: TrainerSection::default(),
            auto: AutoSizes::default(),
        }
    }
}

impl Recipe {
    /// Reads `path`, applies `overrides` (`a.b.c=value`) and validates the result. Relative
    /// input paths in the file are taken from its folder; those in overrides from the working
    /// directory.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { path: file.clone(), message: e.to_string() })?;
        Self::parse(&text, &file, path.parent(), overrides)
    }

    /// As [`Self::load`], from YAML text; `file` names it in errors, and its relative paths are
    /// taken from the working directory.
    pub fn from_yaml(text: &str, file: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        Self::parse(text, file, None, overrides)
    }

    fn parse(
        text: &str,
        file: &str,
        folder: Option<&Path>,
        overrides: &[String],
    ) -> Result<Self, ConfigError> {
        let parse_error = |e: &dyn std::fmt::Display| ConfigError::Parse {
            file: file.into(),
            message: nearest_name(&e.to_string()),
        };
        let mut tree: Value = serde_yaml::from_str(text).map_err(|e| parse_error(&e))?;
        if tree.is_null() {
            tree = Value::Mapping(Default::default());
        }
        // Old keys read as their new ones (a file with some is checked from the tree below).
        let migrated = crate::renamed::migrate(&mut tree);
        // `auto` sizes stand in as numbers until the device's memory is known.
        let rewritten = migrated || AutoSizes::take(&mut tree.clone()).any();
        let stand_ins = |tree: &Value| {
            let mut tree = tree.clone();
            AutoSizes::take(&mut tree);
            tree
        };
        // The file alone first, straight from the text, so errors carry the key path, line and
        // column (serde_yaml writes both into its message).
        if !rewritten && !tree.as_mapping().is_some_and(|m| m.is_empty()) {
            serde_yaml::from_str::<Self>(text).map_err(|e| parse_error(&e))?;
        }
        if let Some(folder) = folder {
            crate::paths::rebase(&mut tree, folder);
        }
        let file_alone = stand_ins(&tree);
        if rewritten {
            serde_path_to_error::deserialize::<_, Self>(file_alone.clone()).map_err(|e| {
                let message = nearest_name(&e.inner().to_string());
                parse_error(&format!("{}: {message}", key_of(e.path())))
            })?;
        }
        let mut overrides =
            overrides.iter().map(|o| Override::parse(o)).collect::<Result<Vec<_>, _>>()?;
        for o in &mut overrides {
            if let Some(path) = crate::renamed::renamed_path(&o.path) {
                o.path = path;
            }
        }
        for o in &overrides {
            o.apply(&mut tree)?;
        }
        let auto = AutoSizes::take(&mut tree);
        let mut recipe: Self = serde_path_to_error::deserialize(tree).map_err(|e| {
            let key = key_of(e.path());
            let culprit = related(&overrides, &key);
            ConfigError::Override {
                text: culprit.map_or_else(|| overrides_text(&overrides), |o| o.text.clone()),
                message: format!("{key}: {}", nearest_name(&e.inner().to_string())),
            }
        })?;
        recipe.auto = auto;
        recipe.validate().map_err(|(key, message)| {
            // The file is at fault when it fails the same way alone; else the override that set
            // the key (or a section above or below it).
            let file_fails = serde_yaml::from_value::<Self>(file_alone)
                .ok()
                .and_then(|alone| alone.validate().err())
                .is_some_and(|(alone_key, _)| alone_key == key);
            match related(&overrides, &key).filter(|_| !file_fails) {
                Some(o) => ConfigError::Override {
                    text: o.text.clone(),
                    message: format!("{key}: {message}"),
                },
                None => ConfigError::Invalid { file: file.into(), key, message },
            }
        })?;
        Ok(recipe)
    }

    /// `trainer.sharding`, or its default for `model.finetune`: the Adam moments under full
    /// fine-tuning, nothing under LoRA.
    pub fn sharding(&self) -> Sharding {
        self.trainer.sharding.unwrap_or(match self.model.finetune {
            Finetune::Full => Sharding::Optimizer,
            Finetune::Lora => Sharding::None,
        })
    }

    /// Cross-checks settings against the registries and their allowed ranges; the error is the
    /// dotted key and what is wrong with its value.
    fn validate(&self) -> Result<(), (String, String)> {
        let algorithm = flowtune_objectives::algorithm(&self.algorithm)
            .map_err(|e| ("algorithm".to_string(), e.to_string()))?;
        self.rollout.validate().map_err(|e| match e {
            SamplingError::Setting { key, value, expected } => {
                (format!("rollout.{key}"), format!("{value} is not allowed; expected {expected}"))
            }
            other => ("rollout".to_string(), other.to_string()),
        })?;
        self.actor.validate().map_err(|e| match e {
            ObjectiveError::Invalid { key, value, expected } => {
                (format!("actor.{key}"), format!("{value} is not allowed; expected {expected}"))
            }
            other => ("actor".to_string(), other.to_string()),
        })?;
        self.rollout_correction.validate().map_err(|e| match e {
            ObjectiveError::Invalid { key, value, expected } => (
                format!("rollout_correction.{key}"),
                format!("{value} is not allowed; expected {expected}"),
            ),
            other => ("rollout_correction".to_string(), other.to_string()),
        })?;
        flowtune_rewards::validate(&self.reward)
            .map_err(|e| ("reward".to_string(), e.to_string()))?;
        self.trainer.validate()?;
        if self.trainer.f32_master_weights
            && (self.model.finetune != Finetune::Full || self.model.dtype == Dtype::F32)
        {
            return Err((
                "trainer.f32_master_weights".into(),
                "keeps f32 copies of weights trained in bf16 or f16; it needs model.finetune: \
                 full and model.dtype bf16 or f16 (LoRA adapters are f32 already)"
                    .into(),
            ));
        }
        if self.trainer.sharding == Some(Sharding::Full) && self.model.finetune != Finetune::Full {
            return Err((
                "trainer.sharding".into(),
                "full shards the trained weights of full fine-tuning; it needs model.finetune: \
                 full (for LoRA use frozen)"
                    .into(),
            ));
        }
        if self.trainer.sharding == Some(Sharding::Frozen) && self.model.finetune != Finetune::Lora
        {
            return Err((
                "trainer.sharding".into(),
                "frozen shards the frozen base weights under LoRA; it needs model.finetune: lora \
                 (for full fine-tuning use optimizer or full)"
                    .into(),
            ));
        }
        if self.trainer.offload == StateOffload::All
            && !matches!(self.sharding(), Sharding::Frozen | Sharding::Full)
        {
            return Err((
                "trainer.offload".into(),
                "all also puts the sharded blocks' weight slices on the host; it needs \
                 trainer.sharding: frozen (LoRA) or full (full fine-tuning); without sharding use \
                 optimizer"
                    .into(),
            ));
        }
        if self.model.num_frames == Some(0) {
            return Err(("model.num_frames".into(), "0 is not allowed; expected ≥ 1 frame".into()));
        }
        if let Some(d) = self.trainer.device.as_deref().filter(|d| !valid_device(d)) {
            return Err(("trainer.device".into(), format!("`{d}`: expected cpu, cuda or cuda:N")));
        }
        if let Some(r) = self.model.output_resolution.filter(|r| *r < 32) {
            return Err(("model.output_resolution".into(), format!("{r}: expected ≥ 32 pixels")));
        }
        self.check_needs(algorithm)
    }

    /// The resolved recipe as YAML (a size still open reads `auto`).
    pub fn to_yaml(&self) -> String {
        let mut tree = serde_yaml::to_value(self).expect("a recipe always serialises");
        self.auto.mark(&mut tree);
        serde_yaml::to_string(&tree).expect("a recipe always serialises")
    }
}

fn key_of(path: &serde_path_to_error::Path) -> String {
    let p = path.to_string();
    if p == "." {
        "(top level)".into()
    } else {
        p
    }
}

/// The last override that set `key`, a section holding it, or a key inside it.
fn related<'a>(overrides: &'a [Override], key: &str) -> Option<&'a Override> {
    let key: Vec<&str> = key.split(['.', '[']).collect();
    overrides.iter().rev().find(|o| {
        let shared = o.path.iter().zip(&key).take_while(|(a, b)| a == *b).count();
        shared == o.path.len().min(key.len())
    })
}

fn overrides_text(overrides: &[Override]) -> String {
    overrides.iter().map(|o| o.text.as_str()).collect::<Vec<_>>().join(" ")
}

/// `cpu`, `cuda` or `cuda:N`.
fn valid_device(d: &str) -> bool {
    matches!(d, "cpu" | "cuda")
        || d.strip_prefix("cuda:").is_some_and(|n| n.parse::<usize>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowtune_sampling::SdeType;

    const RECIPE: &str = "algorithm: grpo_guard\nrollout:\n  steps: 6\n  noise_level: 0.9\n";

    fn load(text: &str, overrides: &[&str]) -> Result<Recipe, String> {
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        Recipe::from_yaml(text, "r.yaml", &o).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_file_and_overrides_compose() {
        let r = load(RECIPE, &["rollout.sde_type=cps", "actor.clip_ratio=2e-6"]).unwrap();
        assert_eq!(r.algorithm, "grpo_guard");
        assert_eq!(r.rollout.steps, 6);
        assert_eq!(r.rollout.noise_level, 0.9);
        assert_eq!(r.rollout.sde_type, SdeType::Cps);
        assert_eq!(r.actor.clip_ratio, 2e-6);
        assert_eq!(r.rollout.eval_steps, 40, "untouched keys keep their defaults");
        assert_eq!(load("", &[]).unwrap(), Recipe::default());
        let round = load(&r.to_yaml(), &[]).unwrap();
        assert_eq!(round, r, "config show output loads back to the same recipe");
    }

    #[test]
    fn unknown_key_names_line_and_nearest_key() {
        let err = load("rollout:\n  stepz: 4\n", &[]).unwrap_err();
        assert_eq!(
            err,
            "r.yaml: rollout: unknown field `stepz` at line 2 column 3; did you mean `steps`?"
        );
        let err = load(RECIPE, &["trainer.lerning_rate=1e-4"]).unwrap_err();
        assert!(
            err.ends_with("unknown field `lerning_rate`; did you mean `lr`?")
                || err.contains("the keys here are"),
            "{err}"
        );
        let err = load("rollout:\n  zzzzz: 4\n", &[]).unwrap_err();
        assert!(err.contains("the keys here are") && err.contains("`noise_level`"), "{err}");
    }

    #[test]
    fn a_bad_reward_in_an_override_names_the_override() {
        let err = load(RECIPE, &["reward.functions=[{name: brightnes}]"]).unwrap_err();
        assert!(
            err.starts_with("override `reward.functions=[{name: brightnes}]`: reward: reward config: unknown reward `brightnes`"),
            "{err}"
        );
        let bad_file = "reward:\n  functions: [{name: brightnes}]\n";
        let err = load(bad_file, &["reward.on_error=skip_sample"]).unwrap_err();
        assert!(
            err.starts_with("r.yaml: reward: reward config: unknown"),
            "the file fails alone: {err}"
        );
    }

    #[test]
    fn bad_values_name_key_and_choices() {
        let err = load("rollout:\n  sde_type: foo\n", &[]).unwrap_err();
        assert!(
            err.contains("rollout.sde_type") && err.contains("`sde`, `cps`, `dance_sde`"),
            "{err}"
        );
        let err = load(RECIPE, &["rollout.steps=ten"]).unwrap_err();
        assert!(
            err.starts_with("override `rollout.steps=ten`: rollout.steps: invalid type"),
            "{err}"
        );
        let err = load(RECIPE, &["rollout.noise_level=-0.5"]).unwrap_err();
        assert_eq!(
            err,
            "override `rollout.noise_level=-0.5`: rollout.noise_level: -0.5 is not allowed; \
             expected a finite number ≥ 0"
        );
        let err = load("actor:\n  clip_ratio: 0\n", &[]).unwrap_err();
        assert_eq!(err, "r.yaml: actor.clip_ratio: 0 is not allowed; expected a finite number > 0");
        let err = load("algorithm: ppo\n", &[]).unwrap_err();
        assert!(err.contains("unknown algorithm `ppo`; known: flow_grpo"), "{err}");
        let err = load("reward:\n  functions: [{name: hpsv2}]\n", &[]).unwrap_err();
        assert!(err.contains("r.yaml: reward: reward config: unknown reward `hpsv2`"), "{err}");
        let err = load("reward:\n  functions: [{name: aesthetic}]\n", &[]).unwrap_err();
        assert!(err.contains("reward `aesthetic` needs `clip: {model:"), "{err}");
        let err = load(RECIPE, &["trainer.betas=[1.0, 0.999]"]).unwrap_err();
        assert!(
            err.contains(
                "trainer.betas: [1.0, 0.999] is not allowed; expected two numbers in [0, 1)"
            ),
            "{err}"
        );
        let err = load(RECIPE, &["actor.nope=1"]).unwrap_err();
        assert!(
            err.starts_with("override `actor.nope=1`") && err.contains("`clip_ratio`"),
            "{err}"
        );
    }

    #[test]
    fn dtypes_and_resume_are_typed_when_the_recipe_loads() {
        use crate::Resume;
        use flowtune_models::Dtype;
        let r = load("model:\n  dtype: bf16\n", &["trainer.resume=none"]).unwrap();
        assert_eq!((r.model.dtype, r.model.frozen_dtype), (Dtype::Bf16, Dtype::F32));
        assert_eq!(r.trainer.resume, Resume::None);
        let r = load("trainer:\n  resume: runs/x/checkpoints/step_000002\n", &[]).unwrap();
        assert_eq!(r.trainer.resume, Resume::Path("runs/x/checkpoints/step_000002".into()));
        assert_eq!(load(&r.to_yaml(), &[]).unwrap(), r, "a resume path round-trips");
        assert_eq!(load("", &[]).unwrap().trainer.resume, Resume::Auto);
        let err = load("model:\n  frozen_dtype: f64\n", &[]).unwrap_err();
        assert!(
            err.contains("model.frozen_dtype")
                && err.contains("unknown variant `f64`, expected one of `f32`, `bf16`, `f16`"),
            "{err}"
        );
        let err = load("trainer:\n  resume: ''\n", &[]).unwrap_err();
        assert!(err.contains("trainer.resume") && err.contains("expected auto, none"), "{err}");
    }

    #[test]
    fn state_offload_of_all_needs_sharded_blocks() {
        assert_eq!(load("", &[]).unwrap().trainer.offload, StateOffload::None);
        let r = load("", &["trainer.offload=optimizer"]).unwrap();
        assert_eq!(r.trainer.offload, StateOffload::Optimizer);
        let err = load("", &["trainer.offload=all"]).unwrap_err();
        assert!(err.contains("trainer.offload") && err.contains("trainer.sharding"), "{err}");
        let r = load("", &["trainer.offload=all", "trainer.sharding=frozen"]).unwrap();
        assert_eq!(r.trainer.offload, StateOffload::All);
        let err = load("", &["trainer.offload=gpu"]).unwrap_err();
        assert!(err.contains("trainer.offload") && err.contains("`optimizer`"), "{err}");
    }

    #[test]
    fn a_group_of_one_is_refused_where_advantages_are_relative_to_the_group() {
        for algorithm in ["flow_grpo", "grpo_guard", "gardo"] {
            let err = load(&format!("algorithm: {algorithm}\n"), &["rollout.n=1"]).unwrap_err();
            assert!(err.contains("rollout.n: 1: "), "{algorithm}: {err}");
            assert!(err.contains("set rollout.n ≥ 2"), "{algorithm}: {err}");
        }
    }

    #[test]
    fn dmd2_refuses_what_its_two_adapters_cannot_train_by_name() {
        let dmd2 = "algorithm: dmd2\nrollout: {n: 1}\n";
        assert_eq!(load(dmd2, &[]).unwrap().actor.dmd2.fake_update_ratio, 2);
        for (overrides, key, why) in [
            (&["model.finetune=full"][..], "model.finetune", "set model.finetune: lora"),
            (&["trainer.ppo_epochs=2"], "trainer.ppo_epochs", "one optimizer step per update"),
            (&["actor.dmd2.fake_update_ratio=0"], "actor.dmd2.fake_update_ratio", "≥ 1"),
            (&["actor.dmd2.student_shift=0.5"], "actor.dmd2.student_shift", "≥ 1"),
            (&["actor.use_kl_loss=true"], "actor.use_kl_loss", "distribution-matching"),
        ] {
            let err = load(dmd2, overrides).unwrap_err();
            assert!(err.contains(key) && err.contains(why), "{overrides:?}: {err}");
        }
    }

    #[test]
    fn num_frames_is_optional_and_positive() {
        assert_eq!(load("", &[]).unwrap().model.num_frames, None);
        assert_eq!(load("model:\n  num_frames: 49\n", &[]).unwrap().model.num_frames, Some(49));
        let err = load("", &["model.num_frames=0"]).unwrap_err();
        assert!(err.contains("model.num_frames: 0 is not allowed; expected ≥ 1 frame"), "{err}");
    }

    #[test]
    fn algorithm_settings_fail_at_config_time_naming_the_setting() {
        let err =
            load("algorithm: grpo_guard\ntrainer:\n  old_log_prob: bypass\n", &[]).unwrap_err();
        assert!(
            err.contains("trainer.old_log_prob")
                && err.contains("set trainer.old_log_prob: recompute"),
            "{err}"
        );
        let err = load("algorithm: dance_grpo\n", &[]).unwrap_err();
        assert!(err.contains("rollout.sde_type") && err.contains("dance_sde"), "{err}");
        let err = load("algorithm: mix_grpo\n", &[]).unwrap_err();
        assert!(err.contains("rollout.sde_window_size"), "{err}");
        let err = load("algorithm: dpo\n", &["rollout.n=1"]).unwrap_err();
        assert!(err.contains("rollout.n"), "{err}");
        let err = load(
            "trainer:\n  old_log_prob: bypass\nrollout_correction:\n  rollout_is: token\n",
            &[],
        )
        .unwrap_err();
        assert!(err.contains("rollout_correction") && err.contains("recompute"), "{err}");
        let err = load("rollout_correction:\n  rollout_is: geometric\n", &[]).unwrap_err();
        assert!(err.contains("rollout_correction.rollout_is"), "{err}");
        assert!(load("algorithm: diffusion_nft\nrollout:\n  noise_level: 0\n", &[]).is_ok());
        let err = load("rollout:\n  noise_level: 0\n", &[]).unwrap_err();
        assert!(err.contains("rollout.noise_level"), "{err}");
        assert_eq!(load("", &["trainer.off_policy_lag=1"]).unwrap().trainer.off_policy_lag, 1);
        let err = load("", &["trainer.off_policy_lag=2"]).unwrap_err();
        assert!(err.contains("trainer.off_policy_lag: 2 is not allowed; expected 0 or 1"), "{err}");
        let nft = "algorithm: diffusion_nft\nrollout:\n  noise_level: 0\n";
        let err = load(nft, &["trainer.off_policy_lag=1"]).unwrap_err();
        assert!(err.contains("trainer.off_policy_lag") && err.contains("diffusion_nft"), "{err}");
    }

    #[test]
    fn gardo_needs_features_and_a_proxy_among_the_rewards() {
        let gardo = "algorithm: gardo\nactor:\n  gardo_features: clip\n  gardo_proxy_rewards: [aesthetic]\nreward:\n  functions:\n    - name: brightness\n    - name: aesthetic\n      weight: 0\n      clip: {model: clip, head: h}\n";
        let old_keys = load(gardo, &[]).unwrap();
        // The same in GARDO's own section of `actor`, where its knobs live now.
        let section = gardo.replace(
            "  gardo_features: clip\n  gardo_proxy_rewards: [aesthetic]\n",
            "  gardo: {features: clip, proxy_rewards: [aesthetic]}\n",
        );
        assert_eq!(load(&section, &[]).unwrap(), old_keys);
        assert_eq!(old_keys.actor.gardo.proxy_rewards, ["aesthetic"]);
        let err = load("algorithm: gardo\n", &[]).unwrap_err();
        assert!(err.contains("actor.gardo.features"), "{err}");
        let err = load(gardo, &["actor.gardo_proxy_rewards=[]"]).unwrap_err();
        assert!(
            err.contains("actor.gardo_proxy_rewards") && err.contains("reward.functions"),
            "{err}"
        );
        let err = load(gardo, &["actor.gardo_proxy_rewards=[pickscore]"]).unwrap_err();
        assert!(
            err.contains("`pickscore` is not one of reward.functions (brightness, aesthetic)"),
            "{err}"
        );
        let err = load(gardo, &["actor.use_kl_loss=true"]).unwrap_err();
        assert!(err.contains("actor.use_kl_loss"), "{err}");
    }

    #[test]
    fn teachers_go_with_distillation() {
        let opd = "algorithm: diffusion_opd\nmodel:\n  teacher_path: t\n";
        assert!(load(opd, &[]).is_ok());
        let many = [
            "model.teacher_path=null",
            "model.teachers=[{path: a, data_source: ocr}, {path: b, weight: 2}]",
        ];
        let r = load(opd, &many).unwrap();
        assert_eq!(r.model.all_teachers().len(), 2);
        let err = load(opd, &["model.teachers=[{path: a}]"]).unwrap_err();
        assert!(err.contains("not both"), "{err}");
        let err = load("algorithm: diffusion_opd\n", &[]).unwrap_err();
        assert!(err.contains("model.teacher_path"), "{err}");
        let err = load("model:\n  teacher_path: t\n", &[]).unwrap_err();
        assert!(err.contains("nothing distils"), "{err}");
        assert!(load("model:\n  teacher_path: t\nactor:\n  use_distill_loss: true\n", &[]).is_ok());
        let err = load(opd, &["model.teacher_path=null", "model.teachers=[{path: a, weight: 0}]"])
            .unwrap_err();
        assert!(err.contains("model.teachers[0].weight"), "{err}");
    }

    #[test]
    fn dgpo_needs_ode_rollouts_and_whole_groups_per_micro_batch() {
        let dgpo = "algorithm: dgpo\nrollout:\n  n: 4\n  noise_level: 0\ntrainer:\n  micro_batch_size: 8\n";
        assert!(load(dgpo, &[]).is_ok());
        let err = load(dgpo, &["trainer.micro_batch_size=6"]).unwrap_err();
        assert!(err.contains("trainer.micro_batch_size") && err.contains("rollout.n 4"), "{err}");
        let err = load(dgpo, &["rollout.noise_level=0.7"]).unwrap_err();
        assert!(err.contains("rollout.noise_level"), "{err}");
        let err = load(dgpo, &["actor.train_timestep_range=[3, 3]"]).unwrap_err();
        assert!(err.contains("actor.train_timestep_range"), "{err}");
    }
}
