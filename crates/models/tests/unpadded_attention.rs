//! Rows padded to one text length run without their padding ([`unpadded_velocity`]): for every
//! family whose denoiser masks padded text, grouped by token count, trimmed and unmasked, the
//! velocities equal the masked forward's (f32, within 1e-6 of their
//! largest value), and the groups are what ran.

use std::cell::RefCell;

use flowtune_fixtures::scratch;
use flowtune_models::{
    family_named, load_pipeline, unpadded_velocity, Denoiser, ExampleShape, ModelError,
    PipelineOptions, TextConditioning, TrainableDenoiser, Unpadding,
};
use tch::{Device, Kind, Tensor};

/// A forward's rows, text tokens and whether its text was masked.
type Forward = (i64, i64, bool);

/// The denoiser, recording each forward.
struct Spy<'a> {
    inner: &'a dyn TrainableDenoiser,
    seen: RefCell<Vec<Forward>>,
}

impl Denoiser for Spy<'_> {
    fn velocity(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        text: &TextConditioning,
    ) -> Result<Tensor, ModelError> {
        let (rows, len) = (text.embeds.size()[0], text.embeds.size()[1]);
        self.seen.borrow_mut().push((rows, len, text.mask.is_some()));
        self.inner.velocity(latents, timestep, text)
    }

    fn unpadding(&self) -> Unpadding {
        self.inner.unpadding()
    }
}

/// `text` with row i keeping its first `lengths[i]` tokens: the rest is noise the mask hides.
fn padded(text: &TextConditioning, lengths: &[i64]) -> TextConditioning {
    let l = text.embeds.size()[1];
    let positions = Tensor::arange(l, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let mask = positions.lt_tensor(&Tensor::from_slice(lengths).unsqueeze(1)).to_kind(Kind::Int64);
    let mut out = text.map_rows(Tensor::shallow_clone);
    out.mask = Some(mask);
    out.lengths = None;
    out
}

fn check(family: &str, unpadding: Unpadding) {
    let dir = scratch(family);
    (family_named(family).unwrap().write_tiny)(&dir, 7).unwrap();
    let pipe = load_pipeline(&dir, &PipelineOptions::new(Device::Cpu)).unwrap();
    let model = pipe.denoiser();
    assert_eq!(model.unpadding(), unpadding, "{family}");
    tch::manual_seed(5);
    let shape = ExampleShape { batch: 4, frames: 1, height: 4, width: 4, text_len: 7 };
    let inputs = model.example_inputs(shape);
    let (x, t) = (&inputs.latents, &inputs.timestep);
    let spy = Spy { inner: model, seen: RefCell::new(vec![]) };
    let regroup = unpadding == Unpadding::Regroup;
    let cases: [(&[i64], &[Forward]); 3] = [
        (
            &[7, 4, 7, 5],
            if regroup { &[(2, 7, false), (1, 4, false), (1, 5, false)] } else { &[(4, 7, true)] },
        ),
        (&[3, 3, 3, 3], if regroup { &[(4, 3, false)] } else { &[(4, 7, true)] }),
        (&[7, 7, 7, 7], &[(4, 7, false)]),
    ];
    for (lengths, forwards) in cases {
        let masked = padded(&inputs.text, lengths);
        let reference = tch::no_grad(|| model.velocity(x, t, &masked)).unwrap();
        let text = TextConditioning::stack(vec![masked.map_rows(Tensor::shallow_clone)]).unwrap();
        assert_eq!(text.lengths.as_deref(), Some(lengths), "{family}: host token counts");
        spy.seen.borrow_mut().clear();
        let v = tch::no_grad(|| unpadded_velocity(&spy, x, t, &text)).unwrap();
        assert_eq!(spy.seen.borrow().as_slice(), forwards, "{family} {lengths:?}: forwards run");
        // Against the masked forward of the same batches (another split of the rows rounds f32
        // differently: a few 1e-6 in Z-Image's tiny stack), and of the whole batch.
        let same_split = match regroup {
            true => by_groups(model, x, t, &masked, lengths),
            false => reference.shallow_clone(),
        };
        let error = largest_difference(&same_split, &v);
        assert!(error <= 1e-6, "{family} {lengths:?}: {error:e} of the largest value");
        let error = largest_difference(&reference, &v);
        assert!(
            error <= 1e-5,
            "{family} {lengths:?}: {error:e} of the largest value (whole batch)"
        );
        // Switched off, the masked forward runs as before.
        model.set_unpadded_attention(false);
        spy.seen.borrow_mut().clear();
        let kept = tch::no_grad(|| unpadded_velocity(&spy, x, t, &text)).unwrap();
        assert_eq!(spy.seen.borrow().as_slice(), &[(4, 7, true)], "{family}: switched off");
        assert!(kept.equal(&reference), "{family}: the masked path changed");
        model.set_unpadded_attention(true);
    }
}

/// The masked forward run on the rows of each token count apart, in the rows' order.
fn by_groups(
    model: &dyn TrainableDenoiser,
    x: &Tensor,
    t: &Tensor,
    masked: &TextConditioning,
    lengths: &[i64],
) -> Tensor {
    let mut out = x.zeros_like();
    for len in lengths {
        let rows: Vec<i64> =
            (0..lengths.len() as i64).filter(|&r| lengths[r as usize] == *len).collect();
        let index = Tensor::from_slice(&rows);
        let v = tch::no_grad(|| {
            model.velocity(
                &x.index_select(0, &index),
                &t.index_select(0, &index),
                &masked.rows_at(&rows),
            )
        })
        .unwrap();
        out = out.index_copy(0, &index, &v);
    }
    out
}

/// The largest elementwise difference, over the largest value of `reference`.
fn largest_difference(reference: &Tensor, other: &Tensor) -> f64 {
    let largest = |t: &Tensor| t.abs().max().double_value(&[]);
    largest(&(reference - other)) / largest(reference)
}

#[test]
fn qwen_image_rows_run_without_padding() {
    check("qwen_image", Unpadding::Regroup);
}

#[test]
fn qwen_image21_rows_run_without_padding() {
    check("qwen_image21", Unpadding::FullRows);
}

#[test]
fn z_image_rows_run_without_padding() {
    check("z_image", Unpadding::Regroup);
}
