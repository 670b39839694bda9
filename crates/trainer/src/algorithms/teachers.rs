//! DiffusionOPD's frozen teachers: full pipelines of the student's family, loaded as the student is
//! (same devices, dtypes and offload; no adapters), each scoring the prompts its `data_source`
//! filter selects by replaying the student's recorded SDE steps.

use flowtune_config::{Recipe, TeacherSection};
use flowtune_models::{FlowPipeline, PipelineOptions};
use flowtune_rollout::{Engine, RolloutBatch, Rows};
use flowtune_sampling::upload;
use tch::{Kind, Tensor};

use crate::replay::replay_all;
use crate::TrainError;

/// One loaded teacher.
pub(crate) struct Teacher {
    pipe: Box<dyn FlowPipeline>,
    section: TeacherSection,
}

/// The teachers' transition means of a step's rows and each row's teacher weight.
pub(crate) struct TeacherMeans {
    /// (rows, W, …) like the rollout's latents.
    pub means: Tensor,
    /// (rows,)
    pub weights: Tensor,
}

/// Loads every teacher of `recipe` with the student's `options` (without adapters); a teacher
/// whose scheduler differs from `student`'s is refused.
pub(crate) fn load(
    recipe: &Recipe,
    options: &PipelineOptions,
    student: &dyn FlowPipeline,
) -> Result<Vec<Teacher>, TrainError> {
    let options = PipelineOptions { lora: None, ..options.clone() };
    let mut teachers = vec![];
    for (i, section) in recipe.model.all_teachers().into_iter().enumerate() {
        let pipe = flowtune_models::load_pipeline(&section.path, &options)?;
        if pipe.scheduler() != student.scheduler() {
            return Err(TrainError::Invalid(format!(
                "model.teachers[{i}] {}: its scheduler differs from model.path's; a teacher replays the student's steps on the student's grid",
                section.path.display()
            )));
        }
        teachers.push(Teacher { pipe, section });
    }
    Ok(teachers)
}

/// The teacher of each row: the first whose filter matches its `data_source`.
pub(crate) fn route(teachers: &[Teacher], sources: &[String]) -> Result<Vec<usize>, TrainError> {
    sources
        .iter()
        .map(|source| {
            teachers
                .iter()
                .position(|t| t.section.data_source.as_ref().is_none_or(|d| d == source))
                .ok_or_else(|| {
                    TrainError::Invalid(format!(
                        "model.teachers: no teacher takes prompts of data_source `{source}`; add one (or one without a data_source filter)"
                    ))
                })
        })
        .collect()
}

/// Replays every window step of `rows` (whose `data_source`s are `sources`) with each row's
/// teacher, without gradient.
pub(crate) fn teacher_means(
    teachers: &[Teacher],
    engine: &Engine<'_>,
    batch: &RolloutBatch,
    rows: &Rows,
    sources: &[String],
    w: i64,
) -> Result<TeacherMeans, TrainError> {
    let routes = route(teachers, sources)?;
    let device = rows.device.device();
    let mut means: Option<Tensor> = None;
    for (t, teacher) in teachers.iter().enumerate() {
        let mine: Vec<i64> =
            routes.iter().enumerate().filter(|(_, r)| **r == t).map(|(i, _)| i as i64).collect();
        if mine.is_empty() {
            continue;
        }
        let picked = rows.select(&mine);
        let at = upload(Tensor::from_slice(&mine), device);
        let out = replay_all(engine, teacher.pipe.denoiser(), batch, &picked, w, true)?;
        let part = out.means.expect("means are kept");
        let all = means.get_or_insert_with(|| {
            let mut shape = part.size();
            shape[0] = routes.len() as i64;
            Tensor::zeros(shape.as_slice(), (part.kind(), part.device()))
        });
        let _ = all.index_copy_(0, &at, &part);
    }
    let weights: Vec<f32> = routes.iter().map(|&t| teachers[t].section.weight as f32).collect();
    Ok(TeacherMeans {
        means: means.expect("every row has a teacher"),
        weights: Tensor::from_slice(&weights).to_device(device).to_kind(Kind::Float),
    })
}
