//! The scorer against rendered scenes: right on the task they were drawn for (every category, at
//! 32 and 64 px), wrong on noise, on blank images and on a task the scene cannot satisfy.
//! `cargo test --release -p flowtune-shapes -- --nocapture` prints the accuracies.

use flowtune_shapes::{
    render, sample_tasks, score, Category, Relation, RgbImage, Shape, Task, BACKGROUND,
};
use image::imageops;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` tasks of `category`, each with its render seed.
fn tasks(category: Category, seed: u64, n: usize) -> Vec<(Task, u64)> {
    sample_tasks(seed, n * Category::ALL.len())
        .into_iter()
        .filter(|t| t.category == category)
        .zip(seed * 10_000..)
        .collect()
}

/// The fraction of `(task, image)` pairs scored correct; prints the first two that are not
/// scored `expected`.
fn accuracy(label: &str, expected: bool, pairs: impl Iterator<Item = (Task, RgbImage)>) -> f64 {
    let (mut n, mut right, mut surprises) = (0, 0, 0);
    for (task, image) in pairs {
        let evaluation = score(&task, &image);
        n += 1;
        right += usize::from(evaluation.correct);
        if evaluation.correct != expected {
            surprises += 1;
            if surprises <= 2 {
                println!("  {label}: {:?} scored {evaluation:?}", task.prompt);
            }
        }
    }
    let accuracy = right as f64 / n as f64;
    println!("{label:<28} {:>6.1} % of {n}", 100.0 * accuracy);
    accuracy
}

#[test]
fn rendered_scenes_score_right_in_every_category() {
    for resolution in [32, 64] {
        for category in Category::ALL {
            let label = format!("right {} @{resolution}", category.name());
            let pairs = tasks(category, 1, 200).into_iter().map(|(t, s)| {
                let image = render(&t, s, resolution);
                (t, image)
            });
            let acc = accuracy(&label, true, pairs);
            assert!(acc >= 0.99, "{label}: {acc}");
        }
    }
}

#[test]
fn slightly_blurred_scenes_still_score_right() {
    for resolution in [32, 64] {
        let sigma = resolution as f32 / 32.0;
        for category in Category::ALL {
            let label = format!("blurred {} @{resolution}", category.name());
            let pairs = tasks(category, 2, 100).into_iter().map(|(t, s)| {
                let image = imageops::blur(&render(&t, s, resolution), sigma);
                (t, image)
            });
            let acc = accuracy(&label, true, pairs);
            assert!(acc >= 0.97, "{label}: {acc}");
        }
    }
}

#[test]
fn noise_and_blank_images_score_wrong() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for resolution in [32, 64] {
        let all = sample_tasks(4, 300);
        let noise = all.iter().map(|t| {
            let image = RgbImage::from_fn(resolution, resolution, |_, _| image::Rgb(rng.random()));
            (t.clone(), image)
        });
        let acc = accuracy(&format!("noise @{resolution}"), false, noise);
        assert!(acc <= 0.02, "noise: {acc}");
        let blank = RgbImage::from_pixel(resolution, resolution, BACKGROUND);
        let acc = accuracy(
            &format!("blank @{resolution}"),
            false,
            all.iter().map(|t| (t.clone(), blank.clone())),
        );
        assert!(acc <= 0.02, "blank: {acc}");
    }
}

/// A task of the same category that the scene drawn for `task` cannot satisfy, since a scene
/// holds exactly the objects its task names: another shape (single_object); the absent third
/// shape (two_object); another count (counting is exact); another colour (colors); the opposite
/// relation (the pair is drawn ≥ 0.3 apart the other way); the colours swapped (color_attr).
fn unsatisfiable(task: &Task) -> Task {
    let r = &task.requirements;
    let other_shape = |s: Shape| Shape::ALL[(s as usize + 1) % Shape::ALL.len()];
    let prompt = match task.category {
        Category::SingleObject => format!("a photo of a {}", other_shape(r[0].shape)),
        Category::TwoObject => {
            let absent = Shape::ALL.into_iter().find(|s| *s != r[0].shape && *s != r[1].shape);
            format!("a photo of a {} and a {}", absent.unwrap(), r[0].shape)
        }
        Category::Counting => {
            let count = r[0].count % 4 + 1;
            let number = ["one", "two", "three", "four"][count as usize - 1];
            format!("a photo of {number} {}", r[0].shape.noun(count))
        }
        Category::Colors => {
            let color = r[0].color.unwrap();
            let other = flowtune_shapes::Color::ALL.into_iter().find(|c| *c != color).unwrap();
            format!("a photo of a {other} {}", r[0].shape)
        }
        Category::Position => {
            let opposite = match r[0].position.unwrap().relation {
                Relation::LeftOf => Relation::RightOf,
                Relation::RightOf => Relation::LeftOf,
                Relation::Above => Relation::Below,
                Relation::Below => Relation::Above,
            };
            format!("a photo of a {} {} a {}", r[0].shape, opposite.words(), r[1].shape)
        }
        Category::ColorAttr => format!(
            "a photo of a {} {} and a {} {}",
            r[1].color.unwrap(),
            r[0].shape,
            r[0].color.unwrap(),
            r[1].shape
        ),
    };
    let wrong = Task::parse(&prompt).unwrap();
    assert_eq!(wrong.category, task.category);
    wrong
}

#[test]
fn scenes_score_wrong_on_a_task_they_cannot_satisfy() {
    for resolution in [32, 64] {
        for category in Category::ALL {
            let label = format!("wrong {} @{resolution}", category.name());
            let pairs = tasks(category, 5, 100)
                .into_iter()
                .map(|(t, s)| (unsatisfiable(&t), render(&t, s, resolution)));
            let acc = accuracy(&label, false, pairs);
            assert!(acc <= 0.05, "{label}: {acc}");
        }
    }
}
