"""Reference runs of diffusers' own `LTX2Pipeline.__call__` on a tiny pipeline written by `flowtune make-tiny ltx2`.

Usage (the project's reference venv):
    flowtune make-tiny ltx2 fixtures/ltx2_pipeline
    python scripts/reference_ltx2_pipeline.py fixtures/ltx2_pipeline fixtures
    flowtune make-tiny ltx2 --ltx23 fixtures/ltx2_pipeline_v23
    python scripts/reference_ltx2_pipeline.py fixtures/ltx2_pipeline_v23 fixtures 1
    python scripts/reference_ltx2_pipeline.py --i2v fixtures/ltx2_pipeline fixtures
    python scripts/reference_ltx2_pipeline.py --i2v fixtures/ltx2_pipeline_v23 fixtures 1
    python scripts/reference_ltx2_pipeline.py --check-pipeline DIR

For each case of CASES (pixel frames, height, width, frame rate, CFG scale, audio CFG scale, guidance rescale) it
draws the initial noise here, video (B, S_v, C) and audio (B, L, C_a * M) as the denoiser sees them (packed and
normalised), hands them to `__call__` as the 5-D / 4-D latents it takes (denormalised, so that its own
normalisation gives the noise back), and runs the ODE twice: `output_type="latent"` for the final latents
(`output.video_latents` (B, C, F, H, W) and `output.audio_latents` (B, C_a, L, M), both denormalised as the pipeline
returns them) and `output_type="np"` for the frames (`output.frames` (B, T, H, W, 3) in [0, 1]) and the vocoder's
waveform (`output.audio` (B, channels, samples)). Spatio-temporal and modality guidance are off (stg_scale 0,
modality_scale 1): flowtune does not run them. Writes `<pipeline folder name>_f{frames}_io.safetensors` (the first
CASES only when a count follows the output folder) with `input.*`
(`video_noise`, `audio_noise`) and the prompt embeds of `encode_prompt` + connectors (`output.video_embeds`,
`output.audio_embeds`, `output.mask`, negative first as the pipeline concatenates them).

With `--i2v` it runs `LTX2ImageToVideoPipeline.__call__` on the same folder for each of I2V_CASES: the picture of
`reference_wan_rollout.test_picture` (40 x 24) as `image`, `image_crf=0` (no H.264 re-compression: flowtune does not re-encode pictures),
the initial latents drawn by the pipeline's own `prepare_latents` / `prepare_audio_latents` from a seeded generator
and recorded as they return them (`input.video_latents`, packed and normalised with the picture's latent in the first
frame's tokens; `input.mask`, 1 on those tokens; `input.audio_noise`). Writes `<folder>_i2v_f{frames}_io.safetensors`
with `input.picture` (u8 H x W x 3) and the outputs above.
"""
import os
import sys

import numpy as np
import torch
from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline
from reference_wan_rollout import test_picture  # the 40 x 24 picture Wan's image-to-video fixtures use
from safetensors.torch import save_file

PROMPTS = ["a red fox barks at the falling snow", "waves crash on rocks while gulls cry overhead at dusk"]
MAX_SEQUENCE_LENGTH = 16
STEPS = 4
# (pixel frames, height, width, frame rate, guidance, audio guidance, guidance rescale)
CASES = [(9, 64, 96, 24.0, 3.0, 3.0, 0.0), (17, 64, 64, 12.5, 4.0, 4.0, 0.0), (1, 64, 64, 24.0, 1.0, 1.0, 0.0)]
# Image-to-video (pixel frames, height, width, frame rate, guidance).
I2V_CASES = [(9, 64, 96, 24.0, 3.0), (17, 64, 64, 12.5, 1.0)]


def run(pipe, frames, height, width, fps, scale, audio_scale, rescale, video, audio, output_type):
    return pipe(
        prompt=PROMPTS, negative_prompt=["", ""], height=height, width=width, num_frames=frames, frame_rate=fps,
        num_inference_steps=STEPS, guidance_scale=scale, audio_guidance_scale=audio_scale, stg_scale=0.0,
        audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=rescale,
        audio_guidance_rescale=rescale, latents=video, audio_latents=audio, output_type=output_type,
        max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False,
    )


def case(pipe, name, frames, height, width, fps, scale, audio_scale, rescale, out_dir):
    g = torch.Generator().manual_seed(frames)
    vae, audio_vae, tr = pipe.vae, pipe.audio_vae, pipe.transformer
    f = (frames - 1) // pipe.vae_temporal_compression_ratio + 1
    h, w = height // pipe.vae_spatial_compression_ratio, width // pipe.vae_spatial_compression_ratio
    c = tr.config.in_channels
    video_noise = torch.randn(2, c, f, h, w, generator=g)
    mel = audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
    per_second = pipe.audio_sampling_rate / pipe.audio_hop_length / float(pipe.audio_vae_temporal_compression_ratio)
    length = round(frames / fps * per_second)
    audio_noise = torch.randn(2, length, audio_vae.config.latent_channels * mel, generator=g)
    video_in = pipe._denormalize_latents(video_noise, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    audio_in = pipe._unpack_audio_latents(
        pipe._denormalize_audio_latents(audio_noise, audio_vae.latents_mean, audio_vae.latents_std), length, mel)
    io = {
        "input.video_noise": pipe._pack_latents(video_noise, tr.config.patch_size, tr.config.patch_size_t),
        "input.audio_noise": audio_noise,
    }
    with torch.no_grad():
        embeds, mask, neg, neg_mask = pipe.encode_prompt(
            PROMPTS, [""] * 2, do_classifier_free_guidance=True, max_sequence_length=MAX_SEQUENCE_LENGTH)
        v, a, m = pipe.connectors(torch.cat([neg, embeds]), torch.cat([neg_mask, mask]), padding_side="left")
        io.update({"output.video_embeds": v, "output.audio_embeds": a, "output.mask": m.to(torch.float32)})
        latents, audio_latents = run(pipe, frames, height, width, fps, scale, audio_scale, rescale, video_in,
                                     audio_in, "latent")
        frames_np, waveform = run(pipe, frames, height, width, fps, scale, audio_scale, rescale, video_in, audio_in,
                                  "np")
    io.update({
        "output.video_latents": latents, "output.audio_latents": audio_latents,
        "output.frames": torch.from_numpy(np.asarray(frames_np)).float(), "output.audio": waveform.float(),
    })
    name = f"{name}_f{frames}_io.safetensors"
    save_file({k: t.contiguous() for k, t in io.items()}, os.path.join(out_dir, name))
    print(f"{name}: video latents {tuple(latents.shape)}, audio latents {tuple(audio_latents.shape)}, "
          f"frames {tuple(np.asarray(frames_np).shape)}, audio {tuple(waveform.shape)}")


def i2v_case(pipe, name, frames, height, width, fps, scale, out_dir):
    picture = test_picture()
    recorded = {}

    def recording(method, keys):
        def call(*args, **kwargs):
            out = method(*args, **kwargs)
            values = out if isinstance(out, tuple) else (out,)
            for key, value in zip(keys, values):
                recorded[key] = value.clone()
            return out
        return call

    pipe.prepare_latents = recording(LTX2ImageToVideoPipeline.prepare_latents.__get__(pipe), ["video", "mask"])
    pipe.prepare_audio_latents = recording(LTX2ImageToVideoPipeline.prepare_audio_latents.__get__(pipe), ["audio"])

    def run_i2v(output_type):
        return pipe(
            image=picture, prompt=PROMPTS, negative_prompt=["", ""], height=height, width=width, num_frames=frames,
            frame_rate=fps, num_inference_steps=STEPS, guidance_scale=scale, audio_guidance_scale=scale,
            stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0,
            audio_guidance_rescale=0.0, image_crf=0,
            generator=torch.Generator().manual_seed(100 + frames), output_type=output_type,
            max_sequence_length=MAX_SEQUENCE_LENGTH, return_dict=False,
        )

    with torch.no_grad():
        latents, audio_latents = run_i2v("latent")
        first = {k: recorded[k] for k in ("video", "mask", "audio")}
        frames_np, waveform = run_i2v("np")
    for k, v in first.items():
        assert torch.equal(v, recorded[k]), f"the two runs drew different initial {k}"
    io = {
        "input.picture": torch.from_numpy(np.array(picture)),
        "input.video_latents": first["video"], "input.mask": first["mask"], "input.audio_noise": first["audio"],
        "output.video_latents": latents, "output.audio_latents": audio_latents,
        "output.frames": torch.from_numpy(np.asarray(frames_np)).float(), "output.audio": waveform.float(),
    }
    name = f"{name}_i2v_f{frames}_io.safetensors"
    save_file({k: t.contiguous() for k, t in io.items()}, os.path.join(out_dir, name))
    print(f"{name}: video latents {tuple(latents.shape)}, held tokens {int(first['mask'][0].sum())}, "
          f"audio {tuple(waveform.shape)}")


def main():
    if sys.argv[1] == "--i2v":
        pipe = LTX2ImageToVideoPipeline.from_pretrained(sys.argv[2])
        name = os.path.basename(os.path.normpath(sys.argv[2]))
        count = int(sys.argv[4]) if len(sys.argv) > 4 else len(I2V_CASES)
        for c in I2V_CASES[:count]:
            i2v_case(pipe, name, *c, sys.argv[3])
        return
    if sys.argv[1] == "--check-pipeline":
        pipe = LTX2Pipeline.from_pretrained(sys.argv[2])
        video, audio = pipe(prompt="a bell rings", height=64, width=64, num_frames=9, num_inference_steps=2,
                            max_sequence_length=MAX_SEQUENCE_LENGTH, output_type="np", return_dict=False)
        print(f"diffusers ran the pipeline: frames {np.asarray(video).shape}, audio {tuple(audio.shape)}")
        return
    pipe = LTX2Pipeline.from_pretrained(sys.argv[1])
    name = os.path.basename(os.path.normpath(sys.argv[1]))
    count = int(sys.argv[3]) if len(sys.argv) > 3 else len(CASES)
    for c in CASES[:count]:
        case(pipe, name, *c, sys.argv[2])


if __name__ == "__main__":
    main()
