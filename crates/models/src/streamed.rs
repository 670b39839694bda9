//! A safetensors file written a tensor at a time: the header (every name, dtype, shape and
//! offset) first, then the values in its order, so that a model too large to hold whole (trained
//! sharded blocks, gathered one at a time) is written without ever being whole in memory.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use crate::ModelError;

/// The safetensors name of a dtype.
fn dtype(kind: Kind) -> Result<&'static str, ModelError> {
    Ok(match kind {
        Kind::Float => "F32",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        Kind::Uint8 => "U8",
        Kind::Bool => "BOOL",
        other => return Err(ModelError::Input(format!("no safetensors dtype for {other:?}"))),
    })
}

/// A file being written: the tensors still to come, in order.
pub struct StreamedSafetensors {
    out: BufWriter<std::fs::File>,
    path: PathBuf,
    next: std::iter::Peekable<std::vec::IntoIter<(String, Vec<i64>, Kind)>>,
}

impl StreamedSafetensors {
    /// Creates `path` with the header of `layout` (name, shape, kind), in the order the values
    /// will be written.
    pub fn create(path: &Path, layout: Vec<(String, Vec<i64>, Kind)>) -> Result<Self, ModelError> {
        let io = |e: std::io::Error| ModelError::Format {
            path: path.display().to_string(),
            message: format!("cannot write: {e}"),
        };
        let mut header = serde_json::Map::new();
        let mut offset = 0u64;
        for (name, shape, kind) in &layout {
            let bytes = shape.iter().product::<i64>() as u64 * kind.elt_size_in_bytes() as u64;
            let entry = serde_json::json!({
                "dtype": dtype(*kind)?, "shape": shape, "data_offsets": [offset, offset + bytes]
            });
            header.insert(name.clone(), entry);
            offset += bytes;
        }
        let mut text = serde_json::to_string(&header).expect("JSON");
        text.push_str(&" ".repeat((8 - text.len() % 8) % 8));
        let mut out = BufWriter::new(std::fs::File::create(path).map_err(io)?);
        out.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
        out.write_all(text.as_bytes()).map_err(io)?;
        Ok(Self { out, path: path.to_path_buf(), next: layout.into_iter().peekable() })
    }

    /// Writes the values of `tensor`, which must be the next of the layout.
    pub fn write(&mut self, name: &str, tensor: &Tensor) -> Result<(), ModelError> {
        let t = tensor.detach().to_device(tch::Device::Cpu).contiguous();
        let expected = self.next.next_if_eq(&(name.to_string(), t.size(), t.kind()));
        if expected.is_none() {
            return Err(ModelError::Input(format!(
                "{}: {name} {:?} {:?} written where the layout has {:?}",
                self.path.display(),
                t.size(),
                t.kind(),
                self.next.peek()
            )));
        }
        let bytes = Vec::<u8>::try_from(t.view([-1]).view_dtype(Kind::Uint8))?;
        let io = |e: std::io::Error| ModelError::Format {
            path: self.path.display().to_string(),
            message: format!("cannot write: {e}"),
        };
        self.out.write_all(&bytes).map_err(io)
    }

    /// Flushes the file once every tensor of the layout is written.
    pub fn finish(mut self) -> Result<(), ModelError> {
        let io = |e: std::io::Error| ModelError::Format {
            path: self.path.display().to_string(),
            message: format!("cannot write: {e}"),
        };
        if let Some((name, _, _)) = self.next.next() {
            return Err(ModelError::Input(format!(
                "{}: {name} never written",
                self.path.display()
            )));
        }
        self.out.flush().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tensors written one at a time read back as written (names, dtypes, shapes, values).
    #[test]
    fn a_streamed_file_reads_back_as_written() {
        let dir = flowtune_fixtures::scratch("streamed");
        let path = dir.join("w.safetensors");
        let a = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]);
        let b = Tensor::from_slice(&[1.5f32, -2.0, 3.25]).to_kind(Kind::BFloat16);
        let layout =
            vec![("z.a".into(), vec![2, 3], Kind::Float), ("b".into(), vec![3], Kind::BFloat16)];
        let mut file = StreamedSafetensors::create(&path, layout).unwrap();
        let err = file.write("b", &b).unwrap_err().to_string();
        assert!(err.contains("b [3] BFloat16 written where the layout has"), "{err}");
        file.write("z.a", &a).unwrap();
        file.write("b", &b).unwrap();
        file.finish().unwrap();
        let read: std::collections::BTreeMap<String, Tensor> =
            Tensor::read_safetensors(&path).unwrap().into_iter().collect();
        assert!(read["z.a"].equal(&a) && read["b"].equal(&b) && read["b"].kind() == Kind::BFloat16);
    }
}
