"""A small Gradio Blocks app shaped like Wan2GP for the engine tests: per-session gr.State, a slow
generator reporting progress, a file output, and a model that loads on first use (or at the
warm-up call). ``python -m tests.gradio_app --port PORT``; ``GRADIO_ROOT_PATH`` as Gradio reads it.

Like Wan2GP, it launches with Gradio's own check of ``HEAD /`` (3 s timeout; it exits 1 when that
fails). Two more of Wan2GP's ways, asked through the environment:
- ``GRADIO_APP_OPEN_STREAMS=1``: the ``events`` job leaves its tab's ``queue/data`` stream open
  with no job behind it (heartbeats only), as Gradio 5.29's page often does with Wan2GP; here by
  keeping one more event id pending for the session, so Gradio never sends ``close_stream``.
- ``GRADIO_APP_PAGE_WEIGHT=N``: a page as heavy to build as Wan2GP's: N hidden values in its
  config, copied by every ``GET /`` (and by ``HEAD /``, the launch check).
- ``GRADIO_APP_START_DELAY=SECONDS``: that long before it listens, as an app that loads its
  weights before ``launch()``: a cold start longer than any client's read timeout.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

EVENTS: list[str] = []
"""What happened, in order: ``load`` (the model became resident), ``generate``, ..."""


def _ensure_model() -> None:
    if "load" not in EVENTS:
        time.sleep(0.3)  # "loading the weights"
        EVENTS.append("load")


def warm_up() -> str:
    EVENTS.append("warmup")
    _ensure_model()
    return "resident"


def generate(
    prompt: str,
    seconds: float,
    count: int,
    progress: Any = gr.Progress(),  # noqa: B008 - how Gradio injects its progress tracker
) -> Iterator[tuple[str, int]]:
    """Reports progress and yields at the start and at the end only: a long job whose event
    stream is silent for ``seconds``."""
    EVENTS.append("generate")
    _ensure_model()
    count += 1
    progress(0.0, desc="rendering")
    yield f"started {prompt}", count
    time.sleep(seconds)
    progress(1.0, desc="rendering")
    yield f"rendered {prompt} (#{count} in this session)", count


def export(prompt: str) -> str:
    path = Path(tempfile.mkdtemp()) / "render.txt"
    path.write_text(f"a render of {prompt}\n")
    return str(path)


def events(request: gr.Request) -> str:
    if os.environ.get("GRADIO_APP_OPEN_STREAMS") == "1":
        # An event id that never completes: Gradio keeps the session's stream open after this
        # job, carrying heartbeats only (warmgate sees no job on it: none names this id).
        pending = DEMO._queue.pending_event_ids_session
        pending.setdefault(str(request.session_hash), set()).add("never-completes")
    return ",".join(EVENTS)


def build() -> gr.Blocks:
    weight = int(os.environ.get("GRADIO_APP_PAGE_WEIGHT", "0"))
    with gr.Blocks(title="wan2gp-like") as demo:
        if weight:
            gr.JSON([{"i": i, "v": [i, str(i)]} for i in range(weight)], visible=False)
        count = gr.State(0)
        prompt = gr.Textbox(label="prompt", elem_id="prompt")
        seconds = gr.Number(label="seconds", value=1.0)
        status = gr.Textbox(label="status", elem_id="status")
        file = gr.File(label="file")
        log = gr.Textbox(label="events", elem_id="events")
        gr.Button("generate", elem_id="generate").click(
            generate, [prompt, seconds, count], [status, count], api_name="generate"
        )
        gr.Button("export").click(export, [prompt], [file], api_name="export")
        gr.Button("events", elem_id="list-events").click(events, [], [log], api_name="events")
        gr.Button("warm up", visible=False).click(warm_up, [], [status], api_name="warm_up")
    return demo


DEMO: Any = None


def main() -> None:
    global DEMO
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    time.sleep(float(os.environ.get("GRADIO_APP_START_DELAY", "0")))
    DEMO = build()
    DEMO.queue(default_concurrency_limit=4).launch(
        server_name="127.0.0.1", server_port=args.port, show_error=True, quiet=True
    )


if __name__ == "__main__":
    main()
