//! Decoded sound: what a family with an audio stream (LTX-2) hands to rewards and writes beside
//! its frames, one waveform per sample.

use std::io::Cursor;

use tch::{Device, Kind, Tensor};

use crate::ModelError;

/// One sample's sound: `channels` rows of samples in [-1, 1] at `sample_rate` Hz.
#[derive(Debug, Clone, PartialEq)]
pub struct Waveform {
    pub channels: Vec<Vec<f32>>,
    pub sample_rate: u32,
}

impl Waveform {
    /// The rows of a (B, channels, samples) batch.
    pub fn from_batch(batch: &Tensor, sample_rate: u32) -> Result<Vec<Self>, ModelError> {
        let (b, c, _) = batch.size3()?;
        let host = batch.to_kind(Kind::Float).to_device(Device::Cpu);
        (0..b)
            .map(|i| {
                let channels = (0..c)
                    .map(|k| Vec::<f32>::try_from(host.get(i).get(k)).map_err(ModelError::from))
                    .collect::<Result<_, _>>()?;
                Ok(Self { channels, sample_rate })
            })
            .collect()
    }

    /// Samples per channel.
    pub fn len(&self) -> usize {
        self.channels.first().map_or(0, Vec::len)
    }

    /// Whether it holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its length in seconds.
    pub fn seconds(&self) -> f64 {
        self.len() as f64 / f64::from(self.sample_rate)
    }

    /// Mean square of every sample of every channel, summed in f64 in order.
    pub fn mean_square(&self) -> f64 {
        let n = self.channels.iter().map(Vec::len).sum::<usize>().max(1);
        let sum: f64 = self.channels.iter().flatten().map(|&x| f64::from(x) * f64::from(x)).sum();
        sum / n as f64
    }

    /// A 16-bit PCM WAV file of it (samples clamped to [-1, 1], interleaved channels).
    pub fn wav(&self) -> Result<Vec<u8>, ModelError> {
        let fail = |e: hound::Error| ModelError::Input(format!("writing WAV: {e}"));
        let spec = hound::WavSpec {
            channels: self.channels.len() as u16,
            sample_rate: self.sample_rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut bytes = Cursor::new(vec![]);
        {
            let mut writer = hound::WavWriter::new(&mut bytes, spec).map_err(fail)?;
            for i in 0..self.len() {
                for channel in &self.channels {
                    let level = (channel[i].clamp(-1.0, 1.0) * f32::from(i16::MAX)).round();
                    writer.write_sample(level as i16).map_err(fail)?;
                }
            }
            writer.finalize().map_err(fail)?;
        }
        Ok(bytes.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_becomes_wav_files_that_read_back() {
        let batch =
            Tensor::from_slice(&[0.5f32, -1.0, 0.25, 2.0, 0.0, 0.1, 0.2, 0.3]).view([2, 2, 2]);
        let waves = Waveform::from_batch(&batch, 16000).unwrap();
        assert_eq!(waves[1].channels, vec![vec![0.0, 0.1], vec![0.2, 0.3]]);
        assert_eq!((waves[0].len(), waves[0].seconds()), (2, 2.0 / 16000.0));
        assert!((waves[0].mean_square() - (0.25 + 1.0 + 0.0625 + 4.0) / 4.0).abs() < 1e-12);
        let mut reader = hound::WavReader::new(Cursor::new(waves[0].wav().unwrap())).unwrap();
        assert_eq!((reader.spec().channels, reader.spec().sample_rate), (2, 16000));
        let levels: Vec<i16> = reader.samples::<i16>().map(Result::unwrap).collect();
        // Interleaved (left, right) per instant; 2.0 is clamped to full scale.
        assert_eq!(levels, vec![16384, 8192, -32767, 32767]);
    }
}
