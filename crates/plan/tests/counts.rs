//! Exact parameter counts of the shipped real configs (`examples/models/`) against
//! large-models.md §1 (diffusers 0.42.1 / transformers 5.24 classes built on the meta device).

use std::path::PathBuf;

use flowtune_plan::Pipeline;

fn read(name: &str) -> Pipeline {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/models").join(name);
    Pipeline::read(&dir).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// (folder, params) of every component, denoisers with their buffers.
fn counts(p: &Pipeline) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = p
        .denoisers
        .iter()
        .map(|(n, d)| (n.clone(), d.inventory.params(), d.inventory.buffers))
        .collect();
    out.extend(p.text_encoders.iter().map(|t| (t.name.clone(), t.params, 0)));
    out.extend(p.vae.iter().map(|(v, _)| (v.name.clone(), v.params, 0)));
    out.extend(p.decoders.iter().map(|a| (a.name.clone(), a.params, 0)));
    out
}

fn check(name: &str, expected: &[(&str, u64, u64)]) {
    let got = counts(&read(name));
    let expected: Vec<(String, u64, u64)> =
        expected.iter().map(|&(n, p, b)| (n.to_string(), p, b)).collect();
    assert_eq!(got, expected, "{name}");
}

const T5_XXL: u64 = 4_762_310_656;
const UMT5_XXL: u64 = 5_680_910_336;
const SD3_VAE: u64 = 83_819_683;
const WAN21_VAE: u64 = 126_892_531;

#[test]
fn sd35_medium_and_large() {
    let encoders = [("text_encoder", 123_650_304, 0), ("text_encoder_2", 694_659_840, 0)];
    let mut m = vec![("transformer", 2_243_171_520, 226_492_416)];
    m.extend(encoders);
    m.extend([("text_encoder_3", T5_XXL, 0), ("vae", SD3_VAE, 0)]);
    check("sd3.5-medium", &m);
    m[0] = ("transformer", 8_056_627_520, 89_653_248);
    check("sd3.5-large", &m);
}

#[test]
fn flux_dev() {
    check(
        "flux.1-dev",
        &[
            ("transformer", 11_901_408_320, 0),
            ("text_encoder", 123_060_480, 0),
            ("text_encoder_2", T5_XXL, 0),
            ("vae", SD3_VAE, 0),
        ],
    );
}

#[test]
fn flux2_klein_base_4b() {
    check(
        "flux.2-klein-base-4b",
        &[
            ("transformer", 3_875_544_576, 0),
            ("text_encoder", 4_022_468_096, 0),
            ("vae", 84_046_115, 0),
        ],
    );
}

/// FLUX.2 [dev]: diffusers' default transformer; the text encoder counts Mistral Small 3's
/// language model only (flowtune runs neither the Pixtral tower nor the LM head).
#[test]
fn flux2_dev() {
    check(
        "flux.2-dev",
        &[
            ("transformer", 32_223_281_152, 0),
            ("text_encoder", 22_901_314_560, 0),
            ("vae", 84_046_115, 0),
        ],
    );
}

/// diffusers' default Qwen-Image 2.1 configs; the text encoder counts Qwen3-VL's language model
/// (7,568,405,504) and vision tower (576,388,336), not the LM head.
#[test]
fn qwen_image21() {
    check(
        "qwen-image-2.1",
        &[
            ("transformer", 7_115_124_736, 0),
            ("text_encoder", 7_568_405_504 + 576_388_336, 0),
            ("vae", 337_740_404, 0),
        ],
    );
}

#[test]
fn qwen_image() {
    check(
        "qwen-image",
        &[
            ("transformer", 20_430_401_088, 0),
            ("text_encoder", 8_292_166_656, 0),
            ("vae", WAN21_VAE, 0),
        ],
    );
}

#[test]
fn z_image() {
    check(
        "z-image-turbo",
        &[
            ("transformer", 6_154_908_736, 0),
            ("text_encoder", 4_022_468_096, 0),
            ("vae", SD3_VAE, 0),
        ],
    );
}

#[test]
fn wan_5b_and_a14b() {
    check(
        "wan2.2-ti2v-5b",
        &[
            ("transformer", 4_999_787_712, 0),
            ("text_encoder", UMT5_XXL, 0),
            ("vae", 704_688_668, 0),
        ],
    );
    check(
        "wan2.2-t2v-a14b",
        &[
            ("transformer", 14_288_491_584, 0),
            ("transformer_2", 14_288_491_584, 0),
            ("text_encoder", UMT5_XXL, 0),
            ("vae", WAN21_VAE, 0),
        ],
    );
}

/// Gemma-3-12B's language model, what LTX-2 loads (`scripts/reference_ltx2_counts.py`). The
/// checkpoint also holds the SigLIP tower (416,866,032) and its projector (4,424,832):
/// 12,187,325,040 with the LM head tied.
const GEMMA3_12B_LM: u64 = 11_766_034_176;
const LTX2_AUDIO_VAE: u64 = 53_248_146;

/// LTX-2.0 (19B) and LTX-2.3 (22B) against diffusers 0.42.1 / transformers 5.17 on the meta
/// device (`scripts/reference_ltx2_counts.py`); the connectors count their input projection
/// (188,160 stacked Gemma features).
#[test]
fn ltx2_and_ltx23() {
    check(
        "ltx-2",
        &[
            ("transformer", 18_876_174_592, 0),
            ("text_encoder", GEMMA3_12B_LM, 0),
            ("connectors", 1_431_475_200, 0),
            ("vae", 1_222_479_601, 0),
            ("audio_vae", LTX2_AUDIO_VAE, 0),
            ("vocoder", 55_592_802, 0),
        ],
    );
    check(
        "ltx-2.3",
        &[
            ("transformer", 18_988_838_144, 0),
            ("text_encoder", GEMMA3_12B_LM, 0),
            ("connectors", 3_172_227_584, 0),
            ("vae", 726_105_969, 0),
            ("audio_vae", LTX2_AUDIO_VAE, 0),
            ("vocoder", 128_537_448, 0),
        ],
    );
    let total = |name: &str| {
        let c = counts(&read(name));
        c.iter().map(|e| e.1).sum::<u64>()
    };
    assert_eq!(total("ltx-2"), 33_405_004_517);
    assert_eq!(total("ltx-2.3"), 34_834_991_467);
}

/// LoRA sizes of large-models.md §1.1 (r = 64 on the recipes' attention and feed-forward layers).
#[test]
fn lora_counts() {
    let lora = |name: &str, targets: &[&str]| {
        let t: Vec<String> = targets.iter().map(|s| s.to_string()).collect();
        let p = read(name);
        p.denoiser().inventory.lora_params(|m| flowtune_lora_match::targets(&t, m).then_some(64))
    };
    let qwen = [
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
        "img_mlp.net.0.proj",
        "img_mlp.net.2",
        "txt_mlp.net.0.proj",
        "txt_mlp.net.2",
    ];
    assert_eq!(lora("qwen-image", &qwen), 424_673_280);
    let attn = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0"];
    let joint = ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"];
    let mut flux: Vec<&str> = attn.iter().chain(&joint).copied().collect();
    flux.extend([
        "proj_mlp",
        "proj_out",
        "ff.net.0.proj",
        "ff.net.2",
        "ff_context.net.0.proj",
        "ff_context.net.2",
    ]);
    // The note counts the single blocks' `proj_out` only; the suffix match (flowtune's and
    // PEFT's) also adapts the top-level `proj_out` (3072 → 64): 64 · (3072 + 64) more.
    assert_eq!(lora("flux.1-dev", &flux), 261_488_640 + 64 * (3072 + 64));
    // FLUX.2's recipe targets, counted on the diffusers model's linears.
    let mut flux2: Vec<&str> = attn.iter().chain(&joint).copied().collect();
    flux2.extend([
        "attn.to_qkv_mlp_proj",
        "ff.linear_in",
        "ff.linear_out",
        "ff_context.linear_in",
        "ff_context.linear_out",
    ]);
    assert_eq!(lora("flux.2-klein-base-4b", &flux2), 76_677_120);
    assert_eq!(lora("flux.2-dev", &flux2), 308_281_344);
    // Qwen-Image 2.1's recipe targets: 32 blocks × 64 · (4 · 8192 + 3 · 16384).
    let qwen21 = [
        "attn.to_q",
        "attn.to_k",
        "attn.to_v",
        "attn.to_out.0",
        "img_mlp.proj",
        "img_mlp.gate_layer",
        "img_mlp.out",
    ];
    assert_eq!(lora("qwen-image-2.1", &qwen21), 167_772_160);
    let wan = [
        "attn1.to_q",
        "attn1.to_k",
        "attn1.to_v",
        "attn1.to_out.0",
        "attn2.to_q",
        "attn2.to_k",
        "attn2.to_v",
        "attn2.to_out.0",
        "ffn.net.0.proj",
        "ffn.net.2",
    ];
    assert_eq!(lora("wan2.2-ti2v-5b", &wan), 161_218_560);
    assert_eq!(lora("wan2.2-t2v-a14b", &wan), 306_708_480);
    let mut sd3: Vec<&str> = vec!["to_q", "to_k", "to_v", "to_out.0"];
    sd3.extend(["add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]);
    sd3.extend(["ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"]);
    assert_eq!(lora("sd3.5-medium", &sd3), 93_978_624);
    assert_eq!(lora("sd3.5-large", &sd3), 211_058_688);
    let z = ["to_q", "to_k", "to_v", "to_out.0", "w1", "w2", "w3"];
    assert_eq!(lora("z-image-turbo", &z), 158_760_960);
    // LTX-2's recipe targets (examples/flow_grpo_ltx2_tiny.yaml): per block 64 · Σ(in + out)
    // over both streams' self- and text attentions, the a2v / v2a attentions (2048-wide inner)
    // and both feed-forwards; the gates are not adapted, so LTX-2.0 and 2.3 agree.
    let mut ltx2 = vec![];
    for a in ["attn1", "attn2", "audio_attn1", "audio_attn2"] {
        ltx2.extend(["to_q", "to_k", "to_v", "to_out.0"].map(|p| format!("{a}.{p}")));
    }
    for a in ["audio_to_video_attn", "video_to_audio_attn"] {
        ltx2.extend(["to_q", "to_k", "to_v", "to_out.0"].map(|p| format!("{a}.{p}")));
    }
    for f in ["ff", "audio_ff"] {
        ltx2.extend(["net.0.proj", "net.2"].map(|p| format!("{f}.{p}")));
    }
    let ltx2: Vec<&str> = ltx2.iter().map(String::as_str).collect();
    let per_block = 64 * (4 * 8192 * 2 + 4 * 4096 * 2 + 2 * 20480 + 2 * 20480 + 2 * 10240);
    assert_eq!(per_block, 12_845_056);
    assert_eq!(lora("ltx-2", &ltx2), 48 * per_block);
    assert_eq!(lora("ltx-2.3", &ltx2), 48 * per_block);
}

/// In-process judges (and HPSv3's Qwen2-VL backbone): both towers and the LM head (none when
/// tied), against transformers 5.17's
/// classes built on the meta device (`fixtures/vlm_judge.json`, `scripts/reference_vlm_judge.py`);
/// the key-value cache per token is keys and values of every layer.
#[test]
fn judges() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("fixtures/vlm_judge.json")).unwrap();
    let sizes: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = [
        ("Qwen2.5-VL-7B-Instruct", 8_292_166_656, 2 * 28 * 4 * 128),
        ("Qwen2-VL-7B-Instruct", 8_291_375_616, 2 * 28 * 4 * 128),
        ("Qwen3-VL-8B-Instruct", 8_767_123_696, 2 * 36 * 8 * 128),
        ("Qwen3-VL-4B-Instruct", 4_437_815_808, 2 * 36 * 8 * 128),
    ];
    for (name, params, per_token) in cases {
        assert_eq!(sizes["real_sizes"][name]["total"], params, "{name}: transformers' count");
        let dir = root.join("examples/models/judges").join(name.to_lowercase());
        let judge =
            flowtune_plan::judges::Judge::read(&dir, false, None, false, 8, 512, 64).unwrap();
        assert_eq!(judge.params, params, "{name}");
        assert_eq!(judge.cache_per_token, per_token, "{name}");
        assert_eq!(judge.dtype, flowtune_plan::Dtype::Bf16, "{name}: the checkpoint's dtype");
    }
    // A Qwen2-VL preference model with its head (scripts/reference_preference_model.py).
    let text = std::fs::read_to_string(root.join("fixtures/preference.json")).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
    let dir = root.join("fixtures").join(spec["model"].as_str().unwrap());
    let judge = flowtune_plan::judges::Judge::read(&dir, true, None, false, 8, 512, 0).unwrap();
    assert_eq!(judge.params, spec["params"].as_u64().unwrap(), "the tiny preference model");
}
