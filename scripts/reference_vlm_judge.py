"""In-process vision-language judge fixtures (`crates/models/tests/vlm_judge.rs`, the native `vlm_judge` reward).

    $FLOWTUNE_VENV/bin/python scripts/reference_vlm_judge.py        # PYTHONPATH=$FLOWTUNE_CACHE/anchors

Needs torch, transformers (5.x), Pillow and safetensors; no GPU, no network. Deterministic (fixed seeds). Without
torchvision, transformers' Qwen2-VL image processor is its PIL version (8-bit bicubic resize). Writes into `fixtures/`:

- `vlm_qwen25_tiny/`: a tiny random `Qwen2_5_VLForConditionalGeneration` (untied LM head), the tiny Qwen2 tokenizer
  of `qwen_text_tiny_tokenizer/` (472 tokens: `<|image_pad|>` 462, `<|im_end|>` 452 ends answers, `<|endoftext|>`
  450 pads), a Qwen2-VL image processor config with small pixel bounds, and Qwen2.5-VL's chat template
  (`chat_template.json`: the default system prompt when the first message is not a system one).
- `vlm_qwen3_tiny/`: the same for `Qwen3VLForConditionalGeneration` with a tied head (no `lm_head.weight` saved),
  patch 16, deepstack after both vision blocks, Qwen3-VL's processor settings and its Instruct chat template (no
  default system prompt).
- `vlm_judge_io.safetensors`: `picture<i>` (H, W, 3) u8, four sizes; per model `m` (`qwen25`, `qwen3`): the
  processor's left-padded batch of the four conversations (`m.input_ids`, `m.attention_mask`, `m.pixel_values`,
  `m.image_grid_thw`), `m.logits` = `model(...).logits` (B, L, V), `m.score_probs` (B, 5) = softmax over the
  vocabulary of the last position at the tokens "1"…"5", `m.generated` (B, N) = the new tokens of
  `generate(do_sample=False, max_new_tokens=40)` (finished rows padded with 450): Qwen2.5-VL's rows answer 40, 27,
  25 and 40 tokens, Qwen3-VL's 40 each.
- `vlm_judge.json` (real sizes include Qwen2-VL-7B-Instruct, HPSv3's backbone): per model its folder, its
  parameter count (tied tensors once), each row's `system` (null: none given) and `user` text, the rendered
  `texts`, the decoded `answers`, the `score_token_ids`; `real_sizes`: parameter counts of Qwen2.5-VL-7B-Instruct,
  Qwen3-VL-8B-Instruct and Qwen3-VL-4B-Instruct (built on the meta device) with their configs, which also go to
  `examples/models/judges/<name>/config.json` (config-only, for `flowtune plan`).

The processor step is written out (template rendered with `apply_chat_template` of the tokenizer, each
`<|image_pad|>` repeated once per merged image token, tokenized, left-padded; `mm_token_type_ids` marking the image
tokens), as transformers' `Qwen2_5_VLProcessor` / `Qwen3VLProcessor` do for pictures; Qwen3-VL's processor needs a
video processor that the PIL-only environment lacks. `serve_vlm_judge.py` answers through the same steps.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                          Qwen2VLForConditionalGeneration, Qwen3VLConfig, Qwen3VLForConditionalGeneration)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "fixtures"

IDS = dict(image_token_id=462, video_token_id=463, vision_start_token_id=459, vision_end_token_id=460)
EOS, PAD = 452, 450

QWEN25_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == "
    "'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)

QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

SIZES = [(40, 60), (64, 64), (90, 50), (120, 100)]
PROMPTS = ["a red kite", "the word OPEN", "two cats on a mat", "a blue door at night"]
SYSTEM = "You judge pictures."
USER = "Rate the picture from 1 to 5 for: {}"

MODELS = {
    "qwen25": dict(
        folder="vlm_qwen25_tiny", seed=31, template=QWEN25_TEMPLATE, systems=[None, SYSTEM, SYSTEM, SYSTEM],
        processor=dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, patch_size=14, merge_size=2,
                       temporal_patch_size=2),
    ),
    "qwen3": dict(
        folder="vlm_qwen3_tiny", seed=32, template=QWEN3_TEMPLATE, systems=[SYSTEM] * 4,
        processor=dict(min_pixels=32 * 32 * 4, max_pixels=32 * 32 * 16, patch_size=16, merge_size=2,
                       temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
    ),
}


def build(m: str):
    spec = MODELS[m]
    torch.manual_seed(spec["seed"])
    if m == "qwen25":
        text = dict(vocab_size=472, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=EOS,
                    rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 1, 1]))
        vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=14, in_channels=3,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1],
                      out_hidden_size=32)
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **IDS)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    else:
        text = dict(vocab_size=472, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=EOS,
                    rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[2, 1, 1],
                                         mrope_interleaved=True))
        vision = dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=16, in_channels=3,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[0, 1], out_hidden_size=32)
        cfg = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **IDS)
        model = Qwen3VLForConditionalGeneration(cfg)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))
        if m == "qwen25":
            # The end-of-answer token's logit a little smaller: two answers run to the limit, two stop.
            model.lm_head.weight[EOS] *= 0.93
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    model.generation_config.do_sample = False
    out = FIX / spec["folder"]
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    for name in ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"]:
        shutil.copy(FIX / "qwen_text_tiny_tokenizer" / name, out / name)
    (out / "chat_template.json").write_text(json.dumps({"chat_template": spec["template"]}, indent=2) + "\n")
    processor = Qwen2VLImageProcessorPil(**spec["processor"])
    config = {k: v for k, v in sorted(processor.to_dict().items()) if not k.startswith("_")}
    config["min_pixels"], config["max_pixels"] = spec["processor"]["min_pixels"], spec["processor"]["max_pixels"]
    config["image_processor_type"] = "Qwen2VLImageProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n")
    loaded = type(model).from_pretrained(out).eval()
    return loaded, out


def load(folder: Path):
    """A judge folder as the scripts run it: model, tokenizer, image processor, chat template."""
    config = json.loads((folder / "config.json").read_text())
    cls = Qwen3VLForConditionalGeneration if config["model_type"] == "qwen3_vl" else Qwen2_5_VLForConditionalGeneration
    model = cls.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
    return model, tokenizer, processor


def messages(system, user):
    out = [] if system is None else [{"role": "system", "content": system}]
    return out + [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user}]}]


def batch(model, tokenizer, processor, conversations, pictures, answer_prefix=""):
    """The processor's batch of (conversation, picture) pairs, left-padded, with `mm_token_type_ids`."""
    texts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) + answer_prefix
             for c in conversations]
    images = processor(images=pictures, return_tensors="pt")
    merge = processor.merge_size ** 2
    expanded = []
    for text, grid in zip(texts, images["image_grid_thw"]):
        assert text.count("<|image_pad|>") == 1, text
        expanded.append(text.replace("<|image_pad|>", "<|image_pad|>" * int(grid.prod() // merge)))
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in expanded]
    longest = max(len(r) for r in ids)
    input_ids = torch.tensor([[PAD] * (longest - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in ids])
    types = (input_ids == model.config.image_token_id).int()
    inputs = dict(input_ids=input_ids, attention_mask=mask, pixel_values=images["pixel_values"],
                  image_grid_thw=images["image_grid_thw"], mm_token_type_ids=types)
    return texts, inputs


def pictures():
    rng = np.random.default_rng(5)
    out = []
    for h, w in SIZES:
        y, x = np.mgrid[0:h, 0:w] / max(h, w)
        phase = rng.uniform(0, 6, size=3)
        rgb = np.stack([np.sin(6 * x + 3 * y + phase[c]) for c in range(3)], -1)
        noise = rng.normal(0, 0.1, size=(h, w, 3))
        out.append(((rgb + noise) * 0.5 + 0.5).clip(0, 1).__mul__(255).round().astype(np.uint8))
    return out


REAL_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                vision_end_token_id=151653)


def qwen3_vl(hidden, intermediate, tied, depth, width, inner, deepstack):
    """A Qwen3-VL Instruct config: the language model's and vision tower's sizes that differ by model."""
    return (Qwen3VLConfig, Qwen3VLForConditionalGeneration, dict(
        tie_word_embeddings=tied, **REAL_IDS,
        text_config=dict(vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=36,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                         max_position_embeddings=262144,
                         rope_parameters=dict(rope_type="default", rope_theta=5e6, mrope_section=[24, 20, 20],
                                              mrope_interleaved=True)),
        vision_config=dict(depth=depth, hidden_size=width, intermediate_size=inner, num_heads=16, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                           deepstack_visual_indexes=deepstack, out_hidden_size=hidden)))


def real_sizes():
    out = {}
    cases = {
        "Qwen2.5-VL-7B-Instruct": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, dict(
            vocab_size=152064, tie_word_embeddings=False, **REAL_IDS,
            text_config=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                             num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6,
                             max_position_embeddings=128000,
                             rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[16, 24, 24])),
            vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                               fullatt_block_indexes=[7, 15, 23, 31], out_hidden_size=3584))),
        "Qwen2-VL-7B-Instruct": (Qwen2VLConfig, Qwen2VLForConditionalGeneration, dict(
            vocab_size=152064, tie_word_embeddings=False, **REAL_IDS,
            text_config=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                             num_attention_heads=28, num_key_value_heads=4, rms_norm_eps=1e-6,
                             max_position_embeddings=32768,
                             rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[16, 24, 24])),
            vision_config=dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16, mlp_ratio=4, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2))),
        "Qwen3-VL-8B-Instruct": qwen3_vl(4096, 12288, False, 27, 1152, 4304, [8, 16, 24]),
        "Qwen3-VL-4B-Instruct": qwen3_vl(2560, 9728, True, 24, 1024, 4096, [5, 11, 17]),
    }
    for name, (config_cls, model_cls, fields) in cases.items():
        cfg = config_cls(**fields)
        with torch.device("meta"):
            model = model_cls(cfg)
        unique = {id(p): p for p in model.parameters()}
        visual = sum(p.numel() for p in model.model.visual.parameters())
        language = sum(p.numel() for p in model.model.language_model.parameters())
        tied = model.lm_head.weight is model.model.language_model.embed_tokens.weight
        config = cfg.to_dict()
        config["architectures"] = [model_cls.__name__]
        config["dtype"] = "bfloat16"  # as the released checkpoints are stored
        out[name] = dict(total=sum(p.numel() for p in unique.values()), visual=visual, language_model=language,
                         lm_head=0 if tied else model.lm_head.weight.numel(), config=json.loads(json.dumps(config, default=str)))
    return out


def main():
    tensors, spec = {}, {}
    pics = pictures()
    for i, p in enumerate(pics):
        tensors[f"picture{i}"] = torch.from_numpy(p).contiguous()
    for m, s in MODELS.items():
        model, folder = build(m)
        model, tokenizer, processor = load(folder)
        users = [USER.format(p) for p in PROMPTS]
        conversations = [messages(sys_, u) for sys_, u in zip(s["systems"], users)]
        texts, inputs = batch(model, tokenizer, processor, conversations, [Image.fromarray(p) for p in pics])
        with torch.no_grad():
            logits = model(**inputs).logits.float()
            generated = model.generate(**inputs, do_sample=False, max_new_tokens=40)
        new = generated[:, inputs["input_ids"].shape[1]:]
        score_ids = []
        for digit in "12345":
            ids = tokenizer(digit, add_special_tokens=False)["input_ids"]
            assert len(ids) == 1, (digit, ids)
            score_ids.append(ids[0])
        probs = logits[:, -1].softmax(-1)[:, score_ids]
        lengths = [next((k for k, t in enumerate(row) if t == EOS), len(row)) for row in new.tolist()]
        print(m, "tokens before eos per row:", lengths, "distinct tokens:", len(set(new.flatten().tolist())))
        assert sum(n >= 32 for n in lengths) >= 2, lengths
        for k, v in inputs.items():
            if k != "mm_token_type_ids":
                tensors[f"{m}.{k}"] = v.contiguous()
        tensors[f"{m}.logits"] = logits.contiguous()
        tensors[f"{m}.score_probs"] = probs.contiguous()
        tensors[f"{m}.generated"] = new.contiguous()
        params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        spec[m] = dict(model=s["folder"], params=params, system=s["systems"], user=users, texts=texts,
                       answers=tokenizer.batch_decode(new, skip_special_tokens=True), score_token_ids=score_ids)
    spec["real_sizes"] = real_sizes()
    for name, sizes in spec["real_sizes"].items():
        # Config-only copies for `flowtune plan` (the recipes' judges; scripts/size_recipes.py).
        folder = ROOT / "examples/models/judges" / name.lower()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(sizes["config"], indent=2) + "\n")
    save_file(tensors, FIX / "vlm_judge_io.safetensors")
    (FIX / "vlm_judge.json").write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
    for name, sizes in spec["real_sizes"].items():
        print(name, {k: v for k, v in sizes.items() if k != "config"})


if __name__ == "__main__":
    main()
