//! `shapes_geneval`: GenEval-style correctness on shapes-world prompts (`flowtune_shapes`).

use flowtune_shapes::{detect, evaluate, Color, ColorCounts, Task};

use crate::{Reward, RewardError, Sample, Score};

/// Finds the shapes in the image and checks the prompt's requirements: 1 when all hold, else 0
/// (or, with `partial`, the fraction of checks passed). The task is `extra_info.task` (a `Task`
/// as a JSON object or string) when present, else parsed from the prompt. Each score carries
/// `acc` and `<category>/acc` (1 / 0, also in partial mode), so batch means are the accuracy
/// overall and per category; where the prompt names no colour and objects were found, also
/// `free_color/<colour>`, the share of the objects in each colour (how varied the colours are
/// that the model picks itself).
pub struct ShapesGeneval {
    pub partial: bool,
}

impl ShapesGeneval {
    fn task(&self, sample: &Sample<'_>) -> Result<Task, RewardError> {
        let fail = |message: String| RewardError::Failed { reward: self.name().into(), message };
        let stored = match &sample.extra_info["task"] {
            serde_json::Value::Null => {
                return Task::parse(sample.prompt)
                    .map_err(|e| fail(format!("{e}, and the sample has no extra_info.task")));
            }
            serde_json::Value::String(json) => serde_json::from_str(json),
            value => serde_json::from_value(value.clone()),
        };
        stored.map_err(|e| fail(format!("extra_info.task of prompt {:?}: {e}", sample.prompt)))
    }
}

impl Reward for ShapesGeneval {
    fn name(&self) -> &str {
        "shapes_geneval"
    }

    fn score(&self, samples: &[Sample<'_>]) -> Result<Vec<Score>, RewardError> {
        samples
            .iter()
            .map(|sample| {
                let task = self.task(sample)?;
                let detections = detect(sample.image);
                let evaluation = evaluate(&task, &detections);
                let correct = f64::from(u8::from(evaluation.correct));
                let mut extras: std::collections::BTreeMap<String, f64> = [
                    ("acc".to_string(), correct),
                    (format!("{}/acc", task.category.name()), correct),
                ]
                .into();
                let mut free = ColorCounts::default();
                free.add(&task, &detections);
                if free.total() > 0 {
                    for (color, share) in Color::ALL.into_iter().zip(free.shares()) {
                        extras.insert(format!("free_color/{}", color.name()), share);
                    }
                }
                Ok(Score { value: if self.partial { evaluation.partial } else { correct }, extras })
            })
            .collect()
    }
}
