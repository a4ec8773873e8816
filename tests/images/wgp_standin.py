"""A stand-in for Wan2GP's wgp.py, speaking as it does where the launcher listens.

Like wgp.py it reads ``wgp_config.json`` from its working directory (writing the defaults when
there is none), opens with ``last_model_type`` (else "t2v"), and when ``preload_model_policy``
holds "P" loads that model at module level, printing ``Loading Model '<file>' ...`` first and
raising ``Unable to locate file`` when a file is in none of ``checkpoints_paths``; only then does it
open its web server on ``--server-port`` (``--listen``: all addresses), answering Gradio's
``/config``. SIGINT closes it, as Gradio's launch loop does. With ``STANDIN_DOWNLOAD`` and
``HF_HUB_OFFLINE`` set it fails as Wan2GP's download of a missing file does offline. With
``STANDIN_LAUNCH_CHECK_DIES`` (a file) it dies in Gradio's launch check, after its app answered,
while that file is not there yet (it makes it first; ``always``: every time).

The test holds the load until it creates ``release-load`` in the working directory, and finds
the process id in ``wgp.pid``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL_FILES = {
    "t2v": ["wan2.1_text2video_14B_quanto_mbf16_int8.safetensors"],
    "i2v_2_2": [
        "wan2.2_image2video_14B_high_quanto_mbf16_int8.safetensors",
        "wan2.2_image2video_14B_low_quanto_mbf16_int8.safetensors",
    ],
}

parser = argparse.ArgumentParser()
parser.add_argument("--listen", action="store_true")
parser.add_argument("--server-port", type=str, default=0)
parser.add_argument("--server-name", type=str, default="")
parser.add_argument("--profile", type=str, default=-1)
args, _ = parser.parse_known_args()

Path("wgp.pid").write_text(str(os.getpid()))
config_file = Path("wgp_config.json")
if not config_file.is_file():
    config_file.write_text(json.dumps({"preload_model_policy": [], "checkpoints_paths": ["ckpts"]}))
server_config = json.loads(config_file.read_text())
transformer_type = server_config.get("last_model_type") or "t2v"
print(f"stand-in wgp.py: model {transformer_type}", flush=True)


def locate_file(name: str) -> str:
    tried = []
    for folder in server_config.get("checkpoints_paths", ["ckpts", "."]):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
        tried.append(os.path.abspath(path))
    raise Exception(f"Unable to locate file '{name}', tried {tried}")


def load_models(model_type: str) -> None:
    files = MODEL_FILES[model_type]
    for i, name in enumerate(files):
        print(f"Loading {'Model' if i == 0 else 'Module'} '{name}' ...", flush=True)
    deadline = time.monotonic() + 20
    while not Path("release-load").exists():
        if time.monotonic() > deadline:
            sys.exit("stand-in wgp.py: the test never released the load")
        time.sleep(0.01)
    for name in files:
        locate_file(name)
    print("\r 50%|#####     | 1/2\r100%|##########| 2/2", flush=True)


def download(name: str) -> None:
    """Wan2GP fetches a missing file with hf_hub_download, which offline raises this (and prints
    no name)."""
    print("Traceback (most recent call last):", file=sys.stderr, flush=True)
    print('  File "huggingface_hub/file_download.py", line 1484', file=sys.stderr, flush=True)
    raise SystemExit(
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the "
        "disk cache and outgoing traffic has been disabled. To enable hf.co look-ups and "
        "downloads online, set 'local_files_only' to False."
    )


if os.environ.get("STANDIN_DOWNLOAD") and os.environ.get("HF_HUB_OFFLINE"):
    download(MODEL_FILES[transformer_type][0])
if "P" in server_config.get("preload_model_policy", []):
    load_models(transformer_type)


LAUNCH_CHECK_FAILED = (
    "ValueError: When localhost is not accessible, a shareable link must be created. Please set "
    "share=True or check your proxy settings to allow access to localhost."
)
"""What Gradio's launch() raises when its own ``HEAD /`` check times out."""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/config" else 404
        body = json.dumps({"version": "5.x", "mode": "blocks"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


port = int(args.server_port) or int(os.getenv("SERVER_PORT", "7860"))
host = "0.0.0.0" if args.listen else (args.server_name or "localhost")
httpd = ThreadingHTTPServer((host, port), Handler)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
print(f"* Running on local URL:  http://{host}:{port}", flush=True)
dies = os.environ.get("STANDIN_LAUNCH_CHECK_DIES")
if dies and (dies == "always" or not Path(dies).exists()):
    if dies != "always":
        Path(dies).touch()
    time.sleep(0.5)  # answering /config meanwhile, as Gradio's app does during its check
    print("Traceback (most recent call last):", file=sys.stderr, flush=True)
    print('  File "gradio/blocks.py", line 2570, in launch', file=sys.stderr, flush=True)
    print(LAUNCH_CHECK_FAILED, file=sys.stderr, flush=True)
    sys.exit(1)
try:
    while True:
        time.sleep(0.1)
except KeyboardInterrupt:
    print("Keyboard interruption in main thread... closing server.", flush=True)
    httpd.shutdown()
