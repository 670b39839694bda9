//! ONNX Runtime, loaded at run time from the `libonnxruntime.so` of the PyPI wheel, and one
//! model session on it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::environment::Environment;
use ort::session::Session;
use ort::value::Tensor;

/// The process's one ONNX Runtime environment and the library it came from (a failed load is
/// not kept, so a later call with a corrected path can succeed).
static RUNTIME: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

fn environment(library: &Path) -> Result<Environment, String> {
    let mut runtime = RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((loaded, env)) = runtime.as_ref() {
        if loaded != library {
            return Err(format!(
                "ONNX Runtime is already loaded from {} in this process; cannot load {} too",
                loaded.display(),
                library.display()
            ));
        }
        return Ok(env.clone());
    }
    if !library.is_file() {
        return Err(format!(
            "ONNX Runtime library {} not found; run scripts/setup-rewards.sh or set ocr.runtime / ORT_DYLIB_PATH",
            library.display()
        ));
    }
    let env = ort::init_from(library)
        .map_err(|e| format!("loading ONNX Runtime from {}: {e}", library.display()))?
        .with_name("flowtune-ocr")
        .build()
        .map_err(|e| format!("starting ONNX Runtime: {e}"))?;
    *runtime = Some((library.to_path_buf(), env.clone()));
    Ok(env)
}

/// One ONNX model: a session with a bounded thread pool, run by one caller at a time.
pub struct Model {
    session: Mutex<Session>,
    path: PathBuf,
}

impl Model {
    /// Loads `path` on the runtime at `library`, using at most `threads` threads per run, on the
    /// CPU or (with `cuda_device`) on that GPU through the CUDA execution provider.
    pub fn load(
        library: &Path,
        path: &Path,
        threads: usize,
        cuda_device: Option<i32>,
    ) -> Result<Self, String> {
        if !path.is_file() {
            return Err(format!(
                "OCR model {} not found; run scripts/setup-rewards.sh or set ocr.models",
                path.display()
            ));
        }
        let env = environment(library)?;
        let fail = |e: ort::Error| format!("loading {}: {e}", path.display());
        let mut builder = Session::builder(&env).map_err(fail)?;
        if let Some(device) = cuda_device {
            let cuda = ort::ep::CUDA::default().with_device_id(device).build().error_on_failure();
            builder = builder.with_execution_providers([cuda]).map_err(|e| {
                format!(
                    "{}: the ONNX Runtime at {} cannot run on cuda:{device} ({e}); point ocr.runtime at the libonnxruntime.so of the onnxruntime-gpu wheel, with the CUDA libraries on LD_LIBRARY_PATH",
                    path.display(),
                    library.display()
                )
            })?;
        }
        let session = builder
            .with_intra_threads(threads.max(1))
            .map_err(|e| fail(e.into()))?
            .with_inter_threads(1)
            .map_err(|e| fail(e.into()))?
            .commit_from_file(path)
            .map_err(fail)?;
        Ok(Self { session: Mutex::new(session), path: path.to_path_buf() })
    }

    /// A custom metadata entry of the model.
    pub fn metadata(&self, key: &str) -> Result<Option<String>, String> {
        let session = self.session.lock().map_err(|_| "an OCR session panicked".to_string())?;
        let meta = session
            .metadata()
            .map_err(|e| format!("{}: reading metadata: {e}", self.path.display()))?;
        Ok(meta.custom(key))
    }

    /// Runs the model on one f32 input, returning its first output's shape and values.
    pub fn run(&self, shape: &[usize], data: Vec<f32>) -> Result<(Vec<usize>, Vec<f32>), String> {
        let fail = |e: ort::Error| format!("{}: {e}", self.path.display());
        let input = Tensor::from_array((shape.to_vec(), data)).map_err(fail)?;
        let mut session = self.session.lock().map_err(|_| "an OCR session panicked".to_string())?;
        let outputs = session.run(ort::inputs![input]).map_err(fail)?;
        let (shape, values) = outputs[0].try_extract_tensor::<f32>().map_err(fail)?;
        Ok((shape.iter().map(|&d| d as usize).collect(), values.to_vec()))
    }
}
