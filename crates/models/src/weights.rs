//! Loading safetensors checkpoints (single file or sharded with `*.safetensors.index.json`) into
//! a model's variables, memory-mapped, with the dtype and device chosen at load time.
//!
//! Exact loading: a model's variables are created in their final dtype on their final device and
//! left unfilled ([`store`], [`crate::nn::Scope::var`]); each checkpoint tensor is copied straight
//! from the mapped file into its variable (converted on the way when the dtypes differ), in slices
//! of at most 64 MiB whose file pages are handed back once copied. Loading holds the weights once,
//! plus about one slice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::{Dtype, SafeTensors};
use tch::{nn::VarStore, Device, Kind, Tensor};

use crate::ModelError;

/// How a component's weights are read.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Convert every floating tensor to this kind (None: keep the variables' kind).
    pub kind: Option<Kind>,
    /// Checkpoint tensors whose names end so are skipped (buffers a model does not keep).
    pub ignored_suffixes: &'static [&'static str],
    /// Checkpoint tensors whose names start so are skipped (parts of a checkpoint a model does
    /// not use, e.g. a vision tower beside a language model).
    pub ignored_prefixes: &'static [&'static str],
    /// `(checkpoint prefix, model prefix)`: a checkpoint name starting with the first is read as
    /// if it started with the second (another library version's module names).
    pub renamed_prefixes: &'static [(&'static str, &'static str)],
}

/// An empty store on `device` whose variables will be created as `kind`.
pub fn store(device: Device, kind: Kind) -> VarStore {
    let mut store = VarStore::new(device);
    store.set_kind(kind);
    store
}

fn io(path: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Io { path: path.display().to_string(), message: e.to_string() }
}

/// The safetensors files of a component directory: the shards named by an index file, or the one
/// `*.safetensors` file. None under [`crate::random::with_random_weights`], which needs no files.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    if crate::random::active_seed().is_some() {
        return Ok(vec![]);
    }
    let entries = std::fs::read_dir(dir).map_err(|e| io(dir, e))?;
    let mut singles = vec![];
    let mut indexes = vec![];
    for entry in entries {
        let path = entry.map_err(|e| io(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name.ends_with(".safetensors.index.json") {
            indexes.push(path);
        } else if name.ends_with(".safetensors") {
            singles.push(path);
        }
    }
    match (indexes.as_slice(), singles.as_slice()) {
        ([index], _) => {
            #[derive(serde::Deserialize)]
            struct Index {
                weight_map: BTreeMap<String, String>,
            }
            let parsed: Index = crate::read_config(index)?;
            let shards: BTreeSet<String> = parsed.weight_map.into_values().collect();
            Ok(shards.into_iter().map(|s| dir.join(s)).collect())
        }
        ([], [single]) => Ok(vec![single.clone()]),
        ([], []) => Err(ModelError::Format {
            path: dir.display().to_string(),
            message: "no *.safetensors checkpoint in this directory".into(),
        }),
        ([], _) => Err(ModelError::Format {
            path: dir.display().to_string(),
            message: format!(
                "{} *.safetensors files and no *.safetensors.index.json to say which to use",
                singles.len()
            ),
        }),
        _ => Err(ModelError::Format {
            path: dir.display().to_string(),
            message: "more than one *.safetensors.index.json".into(),
        }),
    }
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F64 => Kind::Double,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I16 => Kind::Int16,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

/// Copies every variable of `vs` from the checkpoint files, failing on a missing, unexpected or
/// misshaped tensor. Floating variables are converted to `options.kind` first, if given (free when
/// the store was built in that kind, as every model's is). Under
/// [`crate::random::with_random_weights`] the variables are filled with seeded values instead.
pub fn load_weights(
    vs: &mut VarStore,
    files: &[PathBuf],
    options: LoadOptions,
) -> Result<(), ModelError> {
    if let Some(kind) = options.kind {
        vs.set_kind(kind);
    }
    if let Some(seed) = crate::random::active_seed() {
        return crate::random::fill(vs, seed);
    }
    visit(vs, files, options, |_, var, stored| {
        copy_from_map(var, &stored.map, stored.data(), stored.kind, SLICE_BYTES)
    })
}

/// Where one checkpoint tensor's values lie: a byte range of a mapped file, stored as `kind`.
#[derive(Clone)]
pub(crate) struct Stored {
    pub map: Arc<memmap2::Mmap>,
    pub range: std::ops::Range<usize>,
    pub kind: Kind,
}

impl Stored {
    fn data(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }

    /// Copies elements `start..start + dest.numel()` of the flat stored values into the flat,
    /// contiguous `dest` (any kind and device), in slices whose pages are handed back.
    pub fn read_into(&self, start: i64, dest: &Tensor) -> Result<(), ModelError> {
        let size = self.kind.elt_size_in_bytes();
        let (from, n) = (start as usize * size, dest.numel() * size);
        copy_from_map(dest, &self.map, &self.data()[from..from + n], self.kind, SLICE_BYTES)
    }
}

/// Matches the checkpoint files' tensors to the variables of `vs` by name (after
/// `options.renamed_prefixes`) and shape, calling `each(name, variable, stored)` for each; a
/// missing, unexpected or misshaped tensor fails, naming the file.
pub(crate) fn visit(
    vs: &VarStore,
    files: &[PathBuf],
    options: LoadOptions,
    mut each: impl FnMut(&str, &Tensor, Stored) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let variables = vs.variables();
    let mut remaining: BTreeSet<&str> = variables.keys().map(String::as_str).collect();
    let mut unexpected = vec![];
    let label = files.first().map(|f| f.display().to_string()).unwrap_or_default();
    let _guard = tch::no_grad_guard();
    for file in files {
        let handle = std::fs::File::open(file).map_err(|e| io(file, e))?;
        // SAFETY: the file is mapped read-only and not modified while mapped.
        let map = Arc::new(unsafe { memmap2::Mmap::map(&handle) }.map_err(|e| io(file, e))?);
        let tensors = SafeTensors::deserialize(&map).map_err(|e| ModelError::Format {
            path: file.display().to_string(),
            message: format!("not a safetensors file: {e}"),
        })?;
        for (stored, view) in tensors.tensors() {
            let name = options
                .renamed_prefixes
                .iter()
                .find_map(|(from, to)| stored.strip_prefix(from).map(|rest| format!("{to}{rest}")))
                .unwrap_or(stored);
            let Some(var) = variables.get(&name) else {
                let ignored = options.ignored_suffixes.iter().any(|s| name.ends_with(s))
                    || options.ignored_prefixes.iter().any(|p| name.starts_with(p));
                if !ignored {
                    unexpected.push(name);
                }
                continue;
            };
            remaining.remove(name.as_str());
            let found: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            if found != var.size() {
                return Err(ModelError::Shape {
                    path: file.display().to_string(),
                    name,
                    expected: var.size(),
                    found,
                });
            }
            let kind = kind_of(view.dtype()).ok_or_else(|| ModelError::Format {
                path: file.display().to_string(),
                message: format!("tensor {name} has unsupported dtype {:?}", view.dtype()),
            })?;
            let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
            let range = start..start + view.data().len();
            each(&name, var, Stored { map: map.clone(), range, kind })?;
        }
    }
    if !remaining.is_empty() {
        return Err(ModelError::Missing { path: label, names: list(remaining.iter().copied()) });
    }
    if !unexpected.is_empty() {
        unexpected.sort();
        return Err(ModelError::Unexpected {
            path: label,
            names: list(unexpected.iter().map(String::as_str)),
        });
    }
    Ok(())
}

/// Bytes copied from a mapped file at a time: a larger tensor is copied in slices, each slice's
/// pages handed back before the next is read, so the mapping's resident share stays about this
/// size however large the tensor (SD3.5's position table is 0.4 GiB in bf16).
const SLICE_BYTES: usize = 64 << 20;

/// Fills `var` from `data`, its elements stored as `kind` in `map`, in slices of at most
/// `slice_bytes` of the flat element order (one element when an element is larger).
fn copy_from_map(
    var: &Tensor,
    map: &memmap2::Mmap,
    data: &[u8],
    kind: Kind,
    slice_bytes: usize,
) -> Result<(), ModelError> {
    let size = kind.elt_size_in_bytes();
    let elements = (data.len() / size) as i64;
    let per_slice = (slice_bytes / size).max(1) as i64;
    // A variable is created contiguous, so its flat view writes into it.
    let flat = var.f_view([-1])?;
    let mut start = 0;
    while start < elements {
        let n = per_slice.min(elements - start);
        let bytes = &data[start as usize * size..(start + n) as usize * size];
        let source = mapped(bytes, &[n], kind)?;
        flat.narrow(0, start, n).f_copy_(&source)?;
        drop(source);
        release(map, bytes);
        start += n;
    }
    Ok(())
}

/// `data` as a CPU tensor of `shape` and `kind`: a view of the mapped bytes when they are aligned
/// for `kind` (safetensors files usually are), else a copy.
fn mapped(data: &[u8], shape: &[i64], kind: Kind) -> Result<Tensor, ModelError> {
    if data.is_empty() || !(data.as_ptr() as usize).is_multiple_of(kind.elt_size_in_bytes()) {
        return Ok(Tensor::f_from_data_size(data, shape, kind)?);
    }
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    // SAFETY: the tensor views `data` without owning it; the caller drops it right after copying
    // from it, while the mapping is alive, and nothing writes through it.
    Ok(unsafe { Tensor::f_from_blob(data.as_ptr(), shape, &strides, kind, Device::Cpu) }?)
}

/// Hands the mapped pages of `data` (a slice of `map`) back to the kernel once copied, so that
/// the resident share of the mapping stays about one tensor instead of growing to the file.
fn release(map: &memmap2::Mmap, data: &[u8]) {
    #[cfg(unix)]
    {
        let offset = data.as_ptr() as usize - map.as_ptr() as usize;
        // SAFETY: a read-only file mapping: pages dropped here are read again from the file if
        // touched, and no tensor views them any more. Failure only leaves the pages resident.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, data.len())
        };
    }
}

/// At most eight names, then a count.
fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = names.collect();
    let shown = all.iter().take(8).copied().collect::<Vec<_>>().join(", ");
    if all.len() > 8 {
        format!("{shown} and {} more", all.len() - 8)
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A (7, 3) f32 tensor copied into a bf16 variable five elements at a time, and a scalar,
    /// equal the tensors converted whole.
    #[test]
    fn slices_of_rows_fill_a_variable_as_one_copy() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.safetensors");
        let matrix = Tensor::randn([7, 3], (Kind::Float, Device::Cpu));
        let scalar = Tensor::from(2.5f32);
        Tensor::write_safetensors(&[("m", &matrix), ("s", &scalar)], &file).unwrap();
        let handle = std::fs::File::open(&file).unwrap();
        // SAFETY: a file this test wrote and nothing changes.
        let map = unsafe { memmap2::Mmap::map(&handle) }.unwrap();
        let tensors = SafeTensors::deserialize(&map).unwrap();
        let _guard = tch::no_grad_guard();
        for (name, want) in [("m", &matrix), ("s", &scalar)] {
            let view = tensors.tensor(name).unwrap();
            let var = Tensor::zeros(want.size(), (Kind::BFloat16, Device::Cpu));
            copy_from_map(&var, &map, view.data(), Kind::Float, 5 * 4).unwrap();
            assert!(var.equal(&want.to_kind(Kind::BFloat16)), "{name}");
        }
    }
}
