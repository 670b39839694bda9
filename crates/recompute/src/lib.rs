//! Activation (gradient) checkpointing, as `torch.utils.checkpoint` does it (the reentrant form):
//! a block run through [`checkpointed`] keeps only its inputs; backward runs it again with grad
//! enabled and backpropagates through that fresh graph, which also accumulates its weights'
//! gradients. Memory for activations falls from every block's to one block's at a time, for one
//! more forward per block. Blocks must be deterministic (no dropout), as they are here. A block
//! may fail: its error is the forward's, and fails the backward pass (with its message) when the
//! rerun fails.
//! [`clear_grad`] is the other autograd hook tch lacks: a gradient set back to none.

use std::ffi::{c_char, c_void, CStr};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tch::{Kind, TchError, Tensor};
use torch_sys::C_tensor;

/// Most outputs a checkpointed block may return.
const MAX_OUTPUTS: usize = 8;

/// Blocks run again in backward so far, in this process.
static RECOMPUTED: AtomicU64 = AtomicU64::new(0);

/// How many blocks backward passes have recomputed in this process.
pub fn recomputed_blocks() -> u64 {
    RECOMPUTED.load(Ordering::Relaxed)
}

/// Whether autograd records operations on this thread now.
pub fn grad_enabled() -> bool {
    // SAFETY: reads libtorch's thread-local grad mode.
    unsafe { ftr_grad_enabled() != 0 }
}

/// Drops `t`'s gradient, so `t.grad()` is undefined until a backward pass reaches `t` again
/// (PyTorch's `zero_grad(set_to_none=True)`; tch's `zero_grad` only fills it with zeros).
pub fn clear_grad(t: &Tensor) {
    // SAFETY: a live tensor handle; resetting its grad slot is what `set_to_none` does.
    unsafe { ftr_clear_grad(t.as_ptr() as *mut C_tensor) }
}

/// A block as the graph node owns it: its outputs, or the message of its error.
type BlockFn<'a> = Box<dyn Fn(&[Tensor]) -> Result<Vec<Tensor>, String> + 'a>;

type CallFn = extern "C" fn(i64, *mut *mut C_tensor, i64, *mut c_void) -> *mut c_char;
type DropFn = extern "C" fn(i64);

extern "C" {
    fn ftr_recompute(
        closure: i64,
        call: CallFn,
        drop: DropFn,
        inputs: *mut *mut C_tensor,
        n: i64,
        out: *mut *mut C_tensor,
        capacity: i64,
        n_out: *mut i64,
    ) -> *mut c_char;
    fn ftr_sink_push(sink: *mut c_void, t: *mut C_tensor);
    fn ftr_grad_enabled() -> i32;
    fn ftr_clear_grad(t: *mut C_tensor);
    fn malloc(size: usize) -> *mut c_void;
    fn free(p: *mut c_void);
}

/// `block(inputs)` with its activations recomputed in backward; under no-grad a plain call. The
/// graph node owns `block` and drops it with the graph. The block's error is returned as it is;
/// when the rerun in backward fails, the backward pass fails with its message.
///
/// # Safety
/// Whatever `block` borrows (a model's weights) must outlive the backward pass of the graph
/// built from the outputs, or the graph itself.
pub unsafe fn checkpointed<'a, E>(
    inputs: &[Tensor],
    block: impl Fn(&[Tensor]) -> Result<Vec<Tensor>, E> + 'a,
) -> Result<Vec<Tensor>, E>
where
    E: Display + From<TchError> + 'a,
{
    // SAFETY: reads libtorch's thread-local grad mode.
    if unsafe { ftr_grad_enabled() } == 0 {
        return block(inputs);
    }
    // An input that needs grad, so backward always reaches the block's weights (the reentrant
    // form's known gap when no activation needs grad).
    let anchor = Tensor::zeros([1], (Kind::Float, inputs[0].device())).set_requires_grad(true);
    let mut all: Vec<*mut C_tensor> = inputs.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
    all.push(anchor.as_ptr() as *mut C_tensor);
    // The block's error, kept for this call to return (the shim passes on only its message).
    let error = Arc::new(Mutex::new(None));
    let kept = error.clone();
    let boxed: Box<BlockFn<'a>> = Box::new(Box::new(move |t: &[Tensor]| {
        block(t).map_err(|e| {
            let message = e.to_string();
            *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            message
        })
    }));
    // The caller vouches for the borrows' lifetime; the node frees the box through `drop_block`.
    let closure = Box::into_raw(boxed) as i64;
    let mut out = [std::ptr::null_mut(); MAX_OUTPUTS];
    let mut n_out = 0i64;
    // SAFETY: valid tensor pointers for the call's duration; the shim owns the closure from here
    // and catches every C++ exception.
    let failed = unsafe {
        ftr_recompute(
            closure,
            call_block,
            drop_block,
            all.as_mut_ptr(),
            all.len() as i64,
            out.as_mut_ptr(),
            MAX_OUTPUTS as i64,
            &mut n_out,
        )
    };
    if !failed.is_null() {
        let message = take_message(failed);
        let kept = error.lock().unwrap_or_else(|p| p.into_inner()).take();
        return Err(kept.unwrap_or_else(|| TchError::Torch(message).into()));
    }
    // SAFETY: the shim wrote `n_out` new tensors that we now own.
    Ok(out[..n_out as usize].iter().map(|&p| unsafe { Tensor::from_ptr(p) }).collect())
}

/// The shim's call into a block: owned input copies in (the anchor last), outputs into `sink`.
extern "C" fn call_block(
    closure: i64,
    inputs: *mut *mut C_tensor,
    n: i64,
    sink: *mut c_void,
) -> *mut c_char {
    let run = || -> Result<(), String> {
        // SAFETY: the box made by `checkpointed`, alive until `drop_block`.
        let block = unsafe { &*(closure as *const BlockFn<'static>) };
        // SAFETY: reads libtorch's grad mode: on only for backward's rerun.
        if unsafe { ftr_grad_enabled() } != 0 {
            RECOMPUTED.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: `n` owned tensors from the shim.
        let tensors: Vec<Tensor> =
            (0..n as usize).map(|i| unsafe { Tensor::from_ptr(*inputs.add(i)) }).collect();
        for mut t in block(&tensors[..tensors.len() - 1])? {
            // SAFETY: the shim copies the tensor into its list.
            unsafe { ftr_sink_push(sink, t.as_mut_ptr()) };
        }
        Ok(())
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => message(&e),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a checkpointed block panicked".into());
            message(&what)
        }
    }
}

/// The graph node is gone: frees the block.
extern "C" fn drop_block(closure: i64) {
    // SAFETY: the box made by `checkpointed`, dropped once by the node that owns it.
    drop(unsafe { Box::from_raw(closure as *mut BlockFn<'static>) });
}

/// A malloc'd C string the shim frees.
fn message(text: &str) -> *mut c_char {
    let bytes = text.replace('\0', " ");
    // SAFETY: room for the bytes and the NUL.
    unsafe {
        let p = malloc(bytes.len() + 1) as *mut u8;
        if p.is_null() {
            return p as *mut c_char;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        *p.add(bytes.len()) = 0;
        p as *mut c_char
    }
}

/// Reads and frees a message from the shim.
fn take_message(p: *mut c_char) -> String {
    // SAFETY: a NUL-terminated malloc'd string from the shim.
    unsafe {
        let text = CStr::from_ptr(p).to_string_lossy().into_owned();
        free(p as *mut c_void);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{self, Module};

    /// Two linear layers with a nonlinearity, two inputs and two outputs.
    struct Mlp {
        a: nn::Linear,
        b: nn::Linear,
    }

    impl Mlp {
        fn forward(&self, inputs: &[Tensor]) -> Vec<Tensor> {
            let h = self.a.forward(&inputs[0]).gelu("none") * &inputs[1];
            vec![self.b.forward(&h), h.sum(Kind::Float)]
        }
    }

    fn run(checkpointing: bool) -> (Vec<f64>, Vec<Vec<f32>>) {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let blocks: Vec<Mlp> = (0..3)
            .map(|i| Mlp {
                a: nn::linear(vs.root() / i / "a", 6, 6, Default::default()),
                b: nn::linear(vs.root() / i / "b", 6, 6, Default::default()),
            })
            .collect();
        // The first block's inputs need no grad, as latents entering a LoRA'd transformer.
        let mut x = Tensor::randn([4, 6], (Kind::Float, tch::Device::Cpu));
        let scale = Tensor::randn([4, 6], (Kind::Float, tch::Device::Cpu));
        let mut extra = Tensor::zeros([], (Kind::Float, tch::Device::Cpu));
        for block in &blocks {
            let inputs = [x.shallow_clone(), scale.shallow_clone()];
            let out = if checkpointing {
                // SAFETY: the blocks outlive the backward below.
                unsafe { checkpointed(&inputs, |xs| Ok::<_, TchError>(block.forward(xs))) }.unwrap()
            } else {
                block.forward(&inputs)
            };
            x = out[0].shallow_clone();
            extra += &out[1];
        }
        let loss = x.square().mean(Kind::Float) + extra * 1e-3;
        loss.backward();
        let grads = vs
            .trainable_variables()
            .iter()
            .map(|p| Vec::<f32>::try_from(p.grad().flatten(0, -1)).unwrap())
            .collect();
        (vec![loss.double_value(&[])], grads)
    }

    #[test]
    fn checkpointed_blocks_give_the_same_loss_and_gradients() {
        let (plain_loss, plain) = run(false);
        let (loss, grads) = run(true);
        assert_eq!(plain_loss, loss);
        assert_eq!(plain.len(), grads.len());
        for (g, h) in plain.iter().zip(&grads) {
            assert!(g.iter().any(|v| *v != 0.0), "every weight gets a gradient");
            for (a, b) in g.iter().zip(h) {
                assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn the_graph_owns_the_block_and_drops_it_with_itself() {
        let alive = std::sync::Arc::new(());
        let held = alive.clone();
        let x = Tensor::ones([2], (Kind::Float, tch::Device::Cpu));
        let block = move |xs: &[Tensor]| {
            let _ = &held;
            Ok::<_, TchError>(vec![&xs[0] * 2.0])
        };
        // SAFETY: the block owns what it uses.
        let out = unsafe { checkpointed(&[x], block) }.unwrap();
        assert_eq!(std::sync::Arc::strong_count(&alive), 2, "the node holds the block");
        drop(out);
        assert_eq!(std::sync::Arc::strong_count(&alive), 1, "freed with the graph");
    }

    #[test]
    fn a_panicking_block_is_an_error_not_an_abort() {
        let x = Tensor::ones([2], (Kind::Float, tch::Device::Cpu));
        // SAFETY: borrows nothing.
        let broken = unsafe {
            checkpointed(&[x], |_| -> Result<Vec<Tensor>, TchError> {
                panic!("shape mismatch in block 3")
            })
        };
        let err = broken.unwrap_err().to_string();
        assert!(err.contains("shape mismatch in block 3"), "{err}");
    }

    /// An error of its own, to tell it from the ones libtorch makes.
    #[derive(Debug)]
    enum BlockError {
        Failed(&'static str),
        Torch(TchError),
    }

    impl Display for BlockError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Self::Failed(what) => write!(f, "block failed: {what}"),
                Self::Torch(e) => e.fmt(f),
            }
        }
    }

    impl From<TchError> for BlockError {
        fn from(e: TchError) -> Self {
            Self::Torch(e)
        }
    }

    #[test]
    fn a_failing_block_fails_the_forward_with_its_error_and_the_backward_with_its_message() {
        let x = Tensor::ones([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let fail = |_: &[Tensor]| -> Result<Vec<Tensor>, BlockError> {
            Err(BlockError::Failed("rank 1 is gone"))
        };
        // SAFETY: borrows nothing.
        let err = unsafe { checkpointed(&[x.shallow_clone()], fail) }.unwrap_err();
        assert!(matches!(err, BlockError::Failed("rank 1 is gone")), "{err}");

        // Fails when backward reruns it.
        let runs = std::sync::atomic::AtomicU64::new(0);
        let second_fails = move |xs: &[Tensor]| match runs.fetch_add(1, Ordering::Relaxed) {
            0 => Ok(vec![&xs[0] * 2.0]),
            _ => Err(BlockError::Failed("rank 1 is gone")),
        };
        // SAFETY: owns what it uses.
        let out = unsafe { checkpointed(&[x.shallow_clone()], second_fails) }.unwrap();
        let err = out[0].sum(Kind::Float).f_backward().unwrap_err().to_string();
        assert!(err.contains("block failed: rank 1 is gone"), "{err}");
    }
}
