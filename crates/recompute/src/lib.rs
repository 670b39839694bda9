//! Activation (gradient) checkpointing, as `torch.utils.checkpoint` does it (the reentrant form):
//! a [`Block`] run through [`checkpointed`] keeps only its inputs; backward runs it again with
//! grad enabled and backpropagates through that fresh graph, which also accumulates its weights'
//! gradients. Memory for activations falls from every block's to one block's at a time, for one
//! more forward per block. Blocks must be deterministic (no dropout), as they are here.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use tch::{Kind, TchError, Tensor};
use torch_sys::C_tensor;

/// A transformer block seen as a function of tensors.
pub trait Block {
    /// The block on `inputs` (in the order its caller passes them), returning its outputs.
    fn forward_tensors(&self, inputs: &[Tensor]) -> Vec<Tensor>;
}

/// Most outputs a checkpointed block may return.
const MAX_OUTPUTS: usize = 8;

type BlockFn = extern "C" fn(i64, i64, *mut *mut C_tensor, i64, *mut c_void) -> *mut c_char;

extern "C" {
    fn ftr_recompute(
        callback: i64,
        data: i64,
        vtable: i64,
        inputs: *mut *mut C_tensor,
        n: i64,
        out: *mut *mut C_tensor,
        capacity: i64,
        n_out: *mut i64,
    ) -> *mut c_char;
    fn ftr_sink_push(sink: *mut c_void, t: *mut C_tensor);
    fn ftr_grad_enabled() -> i32;
    fn malloc(size: usize) -> *mut c_void;
    fn free(p: *mut c_void);
}

/// `block(inputs)` with its activations recomputed in backward. Under no-grad it is a plain call.
/// The block must outlive the backward pass of the graph built here (it lives in the model).
pub fn checkpointed(block: &dyn Block, inputs: &[Tensor]) -> Result<Vec<Tensor>, TchError> {
    // SAFETY: reads libtorch's thread-local grad mode.
    if unsafe { ftr_grad_enabled() } == 0 {
        return Ok(block.forward_tensors(inputs));
    }
    // An input that needs grad, so backward always reaches the block's weights (the reentrant
    // form's known gap when no activation needs grad).
    let anchor = Tensor::zeros([1], (Kind::Float, inputs[0].device())).set_requires_grad(true);
    let mut all: Vec<*mut C_tensor> = inputs.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
    all.push(anchor.as_ptr() as *mut C_tensor);
    // SAFETY: a `&dyn Block` is two words; the C++ side hands them back unchanged to `call`.
    let [data, vtable]: [i64; 2] = unsafe { std::mem::transmute(block) };
    let mut out = [std::ptr::null_mut(); MAX_OUTPUTS];
    let mut n_out = 0i64;
    // SAFETY: valid tensor pointers for the call's duration; the shim catches C++ exceptions.
    let error = unsafe {
        ftr_recompute(
            call as BlockFn as i64,
            data,
            vtable,
            all.as_mut_ptr(),
            all.len() as i64,
            out.as_mut_ptr(),
            MAX_OUTPUTS as i64,
            &mut n_out,
        )
    };
    if !error.is_null() {
        return Err(TchError::Torch(take_message(error)));
    }
    // SAFETY: the shim wrote `n_out` new tensors that we now own.
    Ok(out[..n_out as usize].iter().map(|&p| unsafe { Tensor::from_ptr(p) }).collect())
}

/// The C++ side's call into a block: owned input copies in, outputs pushed to `sink`.
extern "C" fn call(
    data: i64,
    vtable: i64,
    inputs: *mut *mut C_tensor,
    n: i64,
    sink: *mut c_void,
) -> *mut c_char {
    let run = || {
        // SAFETY: the two words of the `&dyn Block` given to `checkpointed`, whose block lives on.
        let block: &dyn Block = unsafe { std::mem::transmute([data, vtable]) };
        // SAFETY: `n` owned tensors from the shim; the last is the anchor, not the block's.
        let tensors: Vec<Tensor> =
            (0..n as usize).map(|i| unsafe { Tensor::from_ptr(*inputs.add(i)) }).collect();
        let outputs = block.forward_tensors(&tensors[..tensors.len() - 1]);
        for mut t in outputs {
            // SAFETY: the shim copies the tensor into its list.
            unsafe { ftr_sink_push(sink, t.as_mut_ptr()) };
        }
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(()) => std::ptr::null_mut(),
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

    impl Block for Mlp {
        fn forward_tensors(&self, inputs: &[Tensor]) -> Vec<Tensor> {
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
            let out = if checkpointing {
                checkpointed(block, &[x.shallow_clone(), scale.shallow_clone()]).unwrap()
            } else {
                block.forward_tensors(&[x.shallow_clone(), scale.shallow_clone()])
            };
            x = out[0].shallow_clone();
            extra = extra + &out[1];
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
    fn a_panicking_block_is_an_error_not_an_abort() {
        struct Broken;
        impl Block for Broken {
            fn forward_tensors(&self, _: &[Tensor]) -> Vec<Tensor> {
                panic!("shape mismatch in block 3")
            }
        }
        let x = Tensor::ones([2], (Kind::Float, tch::Device::Cpu));
        let err = checkpointed(&Broken, &[x]).unwrap_err().to_string();
        assert!(err.contains("shape mismatch in block 3"), "{err}");
    }
}
