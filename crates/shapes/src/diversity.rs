//! How varied the colours of a model's pictures are where the prompt leaves them free: RL on a
//! GenEval-style reward can collapse them to the one colour the scorer forgives most often.

use crate::{Color, Detection, Task};

/// Detected objects per colour, over pictures whose prompt names no colour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColorCounts {
    counts: [u64; Color::ALL.len()],
}

impl ColorCounts {
    /// Counts the colours of `detections` when `task` names no colour (and nothing otherwise).
    pub fn add(&mut self, task: &Task, detections: &[Detection]) {
        if task.requirements.iter().any(|r| r.color.is_some()) {
            return;
        }
        for d in detections {
            let i = Color::ALL.iter().position(|c| *c == d.color).expect("a palette colour");
            self.counts[i] += 1;
        }
    }

    /// Objects counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Share of the counted objects in each colour of [`Color::ALL`].
    pub fn shares(&self) -> [f64; Color::ALL.len()] {
        let total = self.total().max(1) as f64;
        self.counts.map(|c| c as f64 / total)
    }

    /// Shannon entropy of the colour shares in bits: log2(5) ≈ 2.32 when uniform, 0 when every
    /// object has one colour (and 0 when nothing was counted).
    pub fn entropy(&self) -> f64 {
        entropy_bits(&self.shares())
    }
}

/// Shannon entropy in bits of the distribution proportional to `weights` (0 when all are 0).
pub fn entropy_bits(weights: &[f64]) -> f64 {
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    -weights.iter().map(|w| w / total).filter(|p| *p > 0.0).map(|p| p * p.log2()).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{detect, render, sample_tasks, Category};

    #[test]
    fn ground_truth_scenes_are_nearly_uniform_and_named_colours_are_not_counted() {
        let mut counts = ColorCounts::default();
        for (i, task) in sample_tasks(2, 600).iter().enumerate() {
            counts.add(task, &detect(&render(task, i as u64, 64)));
        }
        // 400 prompts without colours, one to four objects each.
        assert!(counts.total() > 500, "{counts:?}");
        let uniform = (Color::ALL.len() as f64).log2();
        assert!(counts.entropy() > uniform - 0.05 && counts.entropy() <= uniform, "{counts:?}");

        let mut one = ColorCounts::default();
        let task = sample_tasks(0, 6).into_iter().find(|t| t.category == Category::Colors).unwrap();
        one.add(&task, &detect(&render(&task, 0, 64)));
        assert_eq!(one.total(), 0);
        let red = Task::parse("a photo of a circle").unwrap();
        let dets = detect(&render(&Task::parse("a photo of a red circle").unwrap(), 0, 64));
        one.add(&red, &dets);
        one.add(&red, &dets);
        assert_eq!((one.total(), one.entropy()), (2, 0.0));
        assert!((entropy_bits(&[2.0, 2.0, 0.0]) - 1.0).abs() < 1e-12);
        assert_eq!(entropy_bits(&[0.0; 5]), 0.0);
    }
}
