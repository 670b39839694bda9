//! The seeded prompt loader: each epoch a fresh permutation (seed + epoch), `prompts_per_step`
//! prompts per training step, each repeated `n` times with its copies adjacent. Its position is a
//! small serialisable state, so a resumed run continues with the same prompts.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::{DataError, PromptDataset, PromptRecord};

/// Where the loader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct LoaderState {
    pub epoch: u64,
    /// Prompts of this epoch already served.
    pub cursor: usize,
}

/// One batch row: a prompt copy.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Index of the prompt in the dataset.
    pub prompt: usize,
    /// One uid per prompt and step, shared by its `n` copies (the advantage group).
    pub uid: String,
    /// Which copy (0‥n).
    pub copy: usize,
}

pub struct PromptLoader {
    pub dataset: PromptDataset,
    pub prompts_per_step: usize,
    pub n: usize,
    pub shuffle: bool,
    pub drop_last: bool,
    pub seed: u64,
    pub state: LoaderState,
}

impl PromptLoader {
    pub fn new(
        dataset: PromptDataset,
        prompts_per_step: usize,
        n: usize,
        seed: u64,
    ) -> Result<Self, DataError> {
        if prompts_per_step == 0 || n == 0 {
            return Err(DataError::Invalid(format!(
                "data.prompts_per_step ({prompts_per_step}) and rollout.n ({n}) must be ≥ 1"
            )));
        }
        if prompts_per_step > dataset.records.len() {
            return Err(DataError::Invalid(format!(
                "data.prompts_per_step is {prompts_per_step}, but the dataset has only {} prompts",
                dataset.records.len()
            )));
        }
        Ok(Self {
            dataset,
            prompts_per_step,
            n,
            shuffle: true,
            drop_last: true,
            seed,
            state: LoaderState::default(),
        })
    }

    /// The prompt order of `epoch`.
    fn order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.dataset.records.len()).collect();
        if self.shuffle {
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(self.seed.wrapping_add(epoch)));
        }
        order
    }

    /// The next step's rows (`prompts_per_step × n`, copies adjacent), advancing the state. With
    /// `drop_last`, an epoch's incomplete tail is skipped; without, the last step is shorter.
    pub fn next_step(&mut self) -> Vec<Row> {
        let total = self.dataset.records.len();
        // A resumed state from a larger dataset starts the next epoch.
        let remaining = total.saturating_sub(self.state.cursor);
        if remaining == 0 || (self.drop_last && remaining < self.prompts_per_step) {
            self.state = LoaderState { epoch: self.state.epoch + 1, cursor: 0 };
        }
        let order = self.order(self.state.epoch);
        let take = self.prompts_per_step.min(total - self.state.cursor);
        let picked = &order[self.state.cursor..self.state.cursor + take];
        let step_id = format!("{}-{}", self.state.epoch, self.state.cursor);
        self.state.cursor += take;
        picked
            .iter()
            .flat_map(|&p| (0..self.n).map(move |copy| (p, copy)))
            .map(|(prompt, copy)| Row { prompt, uid: format!("{step_id}-{prompt}"), copy })
            .collect()
    }

    /// The record of a row.
    pub fn record(&self, row: &Row) -> &PromptRecord {
        &self.dataset.records[row.prompt]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset(n: usize) -> PromptDataset {
        let records = (0..n)
            .map(|i| PromptRecord {
                prompt: format!("p{i}"),
                negative_prompt: None,
                data_source: "t".into(),
                ground_truth: None,
                extra_info: serde_json::Value::Null,
                images: vec![],
            })
            .collect();
        PromptDataset { records }
    }

    #[test]
    fn copies_are_adjacent_with_one_uid_per_prompt() {
        let mut loader = PromptLoader::new(dataset(5), 2, 3, 7).unwrap();
        let rows = loader.next_step();
        assert_eq!(rows.len(), 6);
        for group in rows.chunks(3) {
            assert!(group.iter().all(|r| r.prompt == group[0].prompt && r.uid == group[0].uid));
            assert_eq!(group.iter().map(|r| r.copy).collect::<Vec<_>>(), [0, 1, 2]);
        }
        assert_ne!(rows[0].uid, rows[3].uid);
    }

    #[test]
    fn epochs_cover_every_prompt_and_drop_the_tail() {
        let mut loader = PromptLoader::new(dataset(5), 2, 1, 7).unwrap();
        let mut first_epoch: Vec<usize> =
            (0..2).flat_map(|_| loader.next_step()).map(|r| r.prompt).collect();
        let third = loader.next_step();
        assert_eq!(loader.state.epoch, 1, "the 1-prompt tail of epoch 0 is dropped");
        first_epoch.sort_unstable();
        first_epoch.dedup();
        assert_eq!(first_epoch.len(), 4);
        assert_eq!(third.len(), 2);
        let mut keep = PromptLoader::new(dataset(5), 2, 1, 7).unwrap();
        keep.drop_last = false;
        let sizes: Vec<usize> = (0..3).map(|_| keep.next_step().len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
    }

    #[test]
    fn resuming_from_the_state_continues_identically() {
        let mut a = PromptLoader::new(dataset(9), 2, 2, 3).unwrap();
        for _ in 0..3 {
            a.next_step();
        }
        let mut b = PromptLoader::new(dataset(9), 2, 2, 3).unwrap();
        b.state = a.state;
        for _ in 0..5 {
            assert_eq!(a.next_step(), b.next_step());
        }
        let fresh = PromptLoader::new(dataset(9), 2, 2, 4).unwrap().order(0);
        assert_ne!(fresh, a.order(0), "another seed shuffles differently");
    }
}
