//! TensorBoard event files (`events.out.tfevents.*`): scalar summaries per step, so `tensorboard
//! --logdir OUTPUT_DIR/tensorboard` plots every metric. Records are TFRecord framed (length, masked
//! CRC-32C, payload, masked CRC-32C) around hand-encoded `Event` protos.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::TrainError;

/// An open event file.
pub struct EventWriter {
    file: File,
    path: std::path::PathBuf,
}

fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field.
fn bytes_field(field: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `Event { wall_time = 1 (double), step = 2 (int64), <body> }`.
fn event(step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = vec![0x09];
    e.extend_from_slice(&now().to_le_bytes());
    varint(2 << 3, &mut e);
    varint(step as u64, &mut e);
    body(&mut e);
    e
}

impl EventWriter {
    /// Creates `dir/events.out.tfevents.<time>.flowtune` and writes the file-version event.
    pub fn create(dir: &Path) -> Result<Self, TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let path = dir.join(format!(
            "events.out.tfevents.{}.flowtune.{}",
            now() as u64,
            std::process::id()
        ));
        let file = File::create(&path).map_err(|e| TrainError::io(&path, e))?;
        let mut w = Self { file, path };
        w.record(&event(0, |e| bytes_field(3, b"brain.Event:2", e)))?;
        Ok(w)
    }

    fn record(&mut self, data: &[u8]) -> Result<(), TrainError> {
        let len = (data.len() as u64).to_le_bytes();
        let mut frame = Vec::with_capacity(data.len() + 16);
        frame.extend_from_slice(&len);
        frame.extend_from_slice(&masked_crc(&len).to_le_bytes());
        frame.extend_from_slice(data);
        frame.extend_from_slice(&masked_crc(data).to_le_bytes());
        self.file
            .write_all(&frame)
            .and_then(|_| self.file.flush())
            .map_err(|e| TrainError::io(&self.path, e))
    }

    /// One event holding every finite scalar of `metrics` at `step`.
    pub fn scalars<'a>(
        &mut self,
        step: u64,
        metrics: impl IntoIterator<Item = (&'a String, &'a f64)>,
    ) -> Result<(), TrainError> {
        let mut summary = vec![];
        for (tag, value) in metrics.into_iter().filter(|(_, v)| v.is_finite()) {
            // Summary.Value { tag = 1 (string), simple_value = 2 (float) }
            let mut v = vec![];
            bytes_field(1, tag.as_bytes(), &mut v);
            v.push(0x15);
            v.extend_from_slice(&(*value as f32).to_le_bytes());
            bytes_field(1, &v, &mut summary);
        }
        self.record(&event(step as i64, |e| bytes_field(5, &summary, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_masking_matches_tensorflow() {
        // TensorFlow's masked CRC of an empty payload (the value of crc32c::Mask(crc32c::Value("", 0))).
        assert_eq!(masked_crc(b""), 0xa282_ead8);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn records_frame_the_scalars() {
        let dir = flowtune_fixtures::scratch("tb");
        let mut w = EventWriter::create(&dir).unwrap();
        let m = std::collections::BTreeMap::from([
            ("critic/rewards/mean".to_string(), 0.5f64),
            ("bad".to_string(), f64::NAN),
        ]);
        w.scalars(7, &m).unwrap();
        let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        let bytes = std::fs::read(&file).unwrap();
        let mut records = vec![];
        let mut at = 0;
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            assert_eq!(
                u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()),
                masked_crc(&bytes[at..at + 8])
            );
            let data = &bytes[at + 12..at + 12 + len];
            assert_eq!(
                u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap()),
                masked_crc(data)
            );
            records.push(data.to_vec());
            at += 16 + len;
        }
        assert_eq!(records.len(), 2);
        assert!(records[0].windows(13).any(|w| w == b"brain.Event:2"));
        let scalar = &records[1];
        assert!(scalar.windows(19).any(|w| w == b"critic/rewards/mean"));
        assert!(scalar.windows(4).any(|w| w == 0.5f32.to_le_bytes()));
        assert!(!scalar.windows(3).any(|w| w == b"bad"), "non-finite values are left out");
    }
}
