//! Rows of a rollout batch, known on the host and on the device: selecting them reads nothing
//! back from the device (a GPU keeps running), and what depends on a row's host facts (its text's
//! token count) can be read where the rows are chosen.

use flowtune_sampling::upload;
use tch::{Device, Tensor};

/// Row indices into a rollout batch: `host`, and the same as an int64 tensor on the device.
#[derive(Debug)]
pub struct Rows {
    pub host: Vec<i64>,
    pub device: Tensor,
}

impl Rows {
    /// `host` copied to `device` without waiting for it (pinned memory on a GPU).
    pub fn new(host: Vec<i64>, device: Device) -> Self {
        let tensor = upload(Tensor::from_slice(&host), device);
        Self { host, device: tensor }
    }

    /// These rows at positions `at` (of this list).
    pub fn select(&self, at: &[i64]) -> Self {
        let host = at.iter().map(|&i| self.host[i as usize]).collect();
        Self::new(host, self.device.device())
    }

    /// Positions `start .. start + len` of this list.
    pub fn narrow(&self, start: usize, len: usize) -> Self {
        Self {
            host: self.host[start..start + len].to_vec(),
            device: self.device.narrow(0, start as i64, len as i64),
        }
    }

    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }
}
