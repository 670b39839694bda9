//! Seeds of the trainer's random streams, apart from the rollout's `row_seed(seed, step, row)`:
//! each stream XORs the run's seed with its own salt, so no two streams share numbers.

/// Validation rollouts: prompt i's noise is `row_seed(VALIDATION, 0, i)`, the same every run.
pub(crate) const VALIDATION: u64 = 42;
/// DiffusionNFT's re-noising and timestep draws.
pub(crate) const NFT_SALT: u64 = 0x004E_4654;
/// Diffusion-DPO's pair noise and noise levels.
pub(crate) const DPO_SALT: u64 = 0xD90;
/// DGPO's shared timesteps and group noise.
pub(crate) const DGPO_SALT: u64 = 0xD690;
/// DMD2's initial noise and exit steps of the student's samples.
pub(crate) const DMD2_SAMPLE_SALT: u64 = 0xD3D2_0001;
/// DMD2's scored noise levels and noise.
pub(crate) const DMD2_SCORE_SALT: u64 = 0xD3D2_0002;

/// The mini-batch shuffle of epoch `epoch` at training step `k`.
pub(crate) fn shuffle(seed: u64, k: u64, epoch: usize) -> u64 {
    seed ^ (k << 16) ^ epoch as u64
}
