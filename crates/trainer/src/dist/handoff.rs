//! The exchange between the two kinds of ranks of a split job (`trainer.rollout_ranks: K`): the
//! first K ranks sample, the others train. Rollout rank r hands its samples to the training ranks
//! over a group of r and the training ranks (r first); the first training rank hands messages and
//! the weights to the rollout ranks over a group of it and the rollout ranks (it first). Every
//! transfer is a broadcast from the group's first rank, on the rank's device: NCCL between GPUs,
//! Gloo on the CPU. A packet is a message (any serde value) and named tensors, sent as the encoded
//! header (message, names, shapes, dtypes) and then each tensor.

use std::collections::BTreeMap;
use std::sync::Arc;

use flowtune_dist::ProcessGroup;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::TrainError;

/// This rank's side of the exchange.
pub struct Handoff {
    /// A rollout rank's samples group; a training rank's, one per rollout rank in rank order.
    samples: Vec<ProcessGroup>,
    /// The weights group: the first training rank (first) and the rollout ranks; none for the
    /// other training ranks.
    weights: Option<ProcessGroup>,
    rollout: bool,
    device: Device,
}

/// The dtypes a packet carries, by their names.
const KINDS: [Kind; 10] = [
    Kind::Uint8,
    Kind::Int8,
    Kind::Int16,
    Kind::Int,
    Kind::Int64,
    Kind::Half,
    Kind::Float,
    Kind::Double,
    Kind::Bool,
    Kind::BFloat16,
];

/// A message and its named tensors.
pub type Packet<T> = (T, BTreeMap<String, Tensor>);

#[derive(Serialize, Deserialize)]
struct Header {
    message: Vec<u8>,
    tensors: Vec<(String, Vec<i64>, String)>,
}

impl Handoff {
    /// Joins the groups of a job of `world`'s ranks whose first `k` sample (every rank calls it,
    /// after its side's group exists).
    pub fn join(world: &Arc<ProcessGroup>, k: usize, device: Device) -> Result<Self, TrainError> {
        let (rank, size) = (world.rank(), world.size());
        let training: Vec<usize> = (k..size).collect();
        let rollout = rank < k;
        let mut samples = vec![];
        for r in 0..k {
            if rollout && r != rank {
                continue;
            }
            let members: Vec<usize> = std::iter::once(r).chain(training.iter().copied()).collect();
            samples.push(world.sub_group("samples", &members)?);
        }
        let weights = match rollout || rank == k {
            true => Some(
                world.sub_group("weights", &[&[k][..], &(0..k).collect::<Vec<_>>()].concat())?,
            ),
            false => None,
        };
        Ok(Self { samples, weights, rollout, device })
    }

    /// Whether this rank samples (else it trains).
    pub fn is_rollout(&self) -> bool {
        self.rollout
    }

    /// A rollout rank hands `message` and `tensors` to the training ranks.
    pub fn send_samples(
        &self,
        message: &impl Serialize,
        tensors: &BTreeMap<String, Tensor>,
    ) -> Result<(), TrainError> {
        send(&self.samples[0], self.device, message, tensors)
    }

    /// A training rank takes every rollout rank's samples, in rank order.
    pub fn receive_samples<T: DeserializeOwned>(&self) -> Result<Vec<Packet<T>>, TrainError> {
        self.samples.iter().map(|group| receive(group, self.device)).collect()
    }

    /// The first training rank tells the rollout ranks `message` with `tensors` (the others do
    /// nothing).
    pub fn send_weights(
        &self,
        message: &impl Serialize,
        tensors: &BTreeMap<String, Tensor>,
    ) -> Result<(), TrainError> {
        match &self.weights {
            Some(group) if !self.rollout => send(group, self.device, message, tensors),
            _ => Ok(()),
        }
    }

    /// A rollout rank takes the first training rank's message; its tensors, if any, go into
    /// `into` (the sampling weights, by name), which must hold exactly the names sent.
    pub fn receive_weights<T: DeserializeOwned>(
        &self,
        into: &BTreeMap<String, Tensor>,
    ) -> Result<T, TrainError> {
        let group = self.weights.as_ref().expect("a rollout rank is in the weights group");
        let header: Header = receive_header(group, self.device)?;
        let names: Vec<&String> = header.tensors.iter().map(|(n, _, _)| n).collect();
        // A message alone carries no weights.
        if !names.is_empty() && !names.iter().copied().eq(into.keys()) {
            return Err(TrainError::Distributed(format!(
                "the training ranks send {} weights, this rollout rank samples with {}: the ranks built different models",
                names.len(),
                into.len()
            )));
        }
        let _guard = tch::no_grad_guard();
        for (name, shape, _) in &header.tensors {
            let live = &into[name];
            if live.size() != *shape {
                return Err(TrainError::Distributed(format!(
                    "weight {name} is {shape:?} on the training ranks but {:?} here",
                    live.size()
                )));
            }
            let mut buffer = Tensor::empty(shape.as_slice(), (live.kind(), self.device));
            group.broadcast_(&mut buffer, 0)?;
            live.shallow_clone().copy_(&buffer);
        }
        decode(&header.message)
    }
}

/// Broadcasts the header of `message` and `tensors`, then each tensor, from this rank (the
/// group's first).
fn send(
    group: &ProcessGroup,
    device: Device,
    message: &impl Serialize,
    tensors: &BTreeMap<String, Tensor>,
) -> Result<(), TrainError> {
    let header = Header {
        message: encode(message)?,
        tensors: tensors
            .iter()
            .map(|(name, t)| (name.clone(), t.size(), format!("{:?}", t.kind())))
            .collect(),
    };
    let bytes = encode(&header)?;
    let mut len = Tensor::from_slice(&[bytes.len() as i64]).to_device(device);
    group.broadcast_(&mut len, 0)?;
    let mut raw = Tensor::from_slice(&bytes).to_device(device);
    group.broadcast_(&mut raw, 0)?;
    for t in tensors.values().filter(|t| t.numel() > 0) {
        // Booleans travel as bytes.
        let t = if t.kind() == Kind::Bool { t.to_kind(Kind::Uint8) } else { t.detach() };
        let mut t = t.to_device(device).contiguous();
        group.broadcast_(&mut t, 0)?;
    }
    Ok(())
}

/// The header the group's first rank broadcasts.
fn receive_header(group: &ProcessGroup, device: Device) -> Result<Header, TrainError> {
    let mut len = Tensor::zeros([1], (Kind::Int64, device));
    group.broadcast_(&mut len, 0)?;
    let mut raw = Tensor::zeros([len.int64_value(&[0])], (Kind::Uint8, device));
    group.broadcast_(&mut raw, 0)?;
    decode(&Vec::<u8>::try_from(&raw.to_device(Device::Cpu))?)
}

/// A packet the group's first rank broadcasts.
fn receive<T: DeserializeOwned>(
    group: &ProcessGroup,
    device: Device,
) -> Result<Packet<T>, TrainError> {
    let header = receive_header(group, device)?;
    let mut tensors = BTreeMap::new();
    for (name, shape, kind) in header.tensors {
        let kind = KINDS.into_iter().find(|k| format!("{k:?}") == kind).ok_or_else(|| {
            TrainError::Distributed(format!(
                "tensor {name} comes as {kind}, which no packet carries"
            ))
        })?;
        let wire = if kind == Kind::Bool { Kind::Uint8 } else { kind };
        let mut t = Tensor::empty(shape.as_slice(), (wire, device));
        if t.numel() > 0 {
            group.broadcast_(&mut t, 0)?;
        }
        tensors.insert(name, t.to_kind(kind));
    }
    Ok((decode(&header.message)?, tensors))
}

fn encode(value: &impl Serialize) -> Result<Vec<u8>, TrainError> {
    postcard::to_stdvec(value)
        .map_err(|e| TrainError::Distributed(format!("encoding a handed-over value: {e}")))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TrainError> {
    postcard::from_bytes(bytes)
        .map_err(|e| TrainError::Distributed(format!("decoding a handed-over value: {e}")))
}
