"""An example reward server for flowtune's `http` reward, in plain Python (standard library only).

    python3 examples/reward_server.py --port 8000

flowtune POSTs JSON {"images": [base64 PNG, ...], "prompts": [...], "metadata": [...]} (a video's
frames side by side in its image), with "audio": [base64 WAV, ...] (16-bit PCM) for a model with
sound (LTX-2), and expects {"scores": [number, ...]} (one per image) and optionally
{"extras": {"name": [number, ...]}}. This scorer rewards small PNG files (a compressibility score:
-kB/10) and reports each sound's RMS level and length; replace `score()` with your model. The testing flags make it misbehave on purpose: --delay S answers late, --garbage
answers with non-JSON, --fail-first N answers HTTP 500 to the first N requests.
"""
import argparse
import base64
import io
import json
import math
import struct
import sys
import time
import wave
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def score(png_bytes, prompt, metadata):
    return -len(png_bytes) / 10000.0


def sound(wav_bytes):
    """RMS level (full scale 1) over every channel, and seconds, of a 16-bit PCM WAV file."""
    with wave.open(io.BytesIO(wav_bytes)) as w:
        frames, channels, rate = w.getnframes(), w.getnchannels(), w.getframerate()
        levels = struct.unpack(f"<{frames * channels}h", w.readframes(frames))
    rms = math.sqrt(sum(x * x for x in levels) / max(len(levels), 1)) / 32767.0
    return rms, frames / rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--garbage", action="store_true")
    ap.add_argument("--fail-first", type=int, default=0)
    args = ap.parse_args()
    state = {"requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"] += 1
            time.sleep(args.delay)
            if state["requests"] <= args.fail_first:
                return self.reply(500, b"temporarily unavailable")
            if args.garbage:
                return self.reply(200, b"<html>not a score</html>")
            pngs = [base64.b64decode(s) for s in body["images"]]
            scores = [score(p, t, m) for p, t, m in zip(pngs, body["prompts"], body["metadata"])]
            extras = {"png_kb": [len(p) / 1000.0 for p in pngs]}
            if "audio" in body:
                sounds = [sound(base64.b64decode(a)) for a in body["audio"]]
                extras["audio_rms"] = [rms for rms, _ in sounds]
                extras["audio_seconds"] = [seconds for _, seconds in sounds]
            self.reply(200, json.dumps({"scores": scores, "extras": extras}).encode())

        def reply(self, code, payload):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
