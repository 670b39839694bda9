"""A test-only OpenAI-compatible chat-completions server on 127.0.0.1 that answers from a judge folder through
transformers (`crates/rewards/tests/vlm_native.rs` checks that the native `vlm_judge` scores as the served one).

    $FLOWTUNE_VENV/bin/python scripts/serve_vlm_judge.py fixtures/vlm_qwen25_tiny [--port 0]

Needs torch, transformers (5.x) and Pillow (PYTHONPATH=$FLOWTUNE_CACHE/anchors). POST /v1/chat/completions with a
system message (a string) and a user message of an `image_url` (a PNG data URI) and a text; the answer is greedy
(`generate(do_sample=False, max_new_tokens=max_tokens)`; temperature and top_p are not read), one request at a time,
laid out as `reference_vlm_judge.py` lays out a batch. Prints `listening on http://127.0.0.1:PORT/v1/chat/completions`
once ready; exits when its standard input closes.
"""

import argparse
import base64
import io
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_vlm_judge import batch, load  # noqa: E402


def conversation(messages):
    """The processor's messages and the picture of an OpenAI request."""
    out, picture = [], None
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
            continue
        items = []
        for item in content:
            if item["type"] == "image_url":
                data = item["image_url"]["url"].split(",", 1)[1]
                picture = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
                items.append({"type": "image"})
            else:
                items.append({"type": "text", "text": item["text"]})
        out.append({"role": message["role"], "content": items})
    return out, picture


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    model, tokenizer, processor = load(Path(a.model))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            messages, picture = conversation(request["messages"])
            with lock, torch.no_grad():
                _, inputs = batch(model, tokenizer, processor, [messages], [picture])
                out = model.generate(**inputs, do_sample=False, max_new_tokens=request["max_tokens"])
            new = out[:, inputs["input_ids"].shape[1]:]
            text = tokenizer.batch_decode(new, skip_special_tokens=True)[0]
            body = json.dumps({"object": "chat.completion", "model": request.get("model", ""), "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", a.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"listening on http://127.0.0.1:{server.server_port}/v1/chat/completions", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
