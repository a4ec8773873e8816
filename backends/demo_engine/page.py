"""The web UI: one HTML page plus the stylesheet and script it loads.

Every URL is relative (`prompt`, `view?...`, `static/app.js`, a websocket URL resolved against
`location`), so the UI keeps working when a proxy serves the engine under a path prefix such as
`/comfy/`. Like ComfyUI's frontend, the page shows a red "Reconnecting" banner (`#reconnecting`)
while its websocket is down, and retries it every second.
"""

from __future__ import annotations

INDEX_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>warmgate demo engine</title>
<link rel="stylesheet" href="static/app.css">
</head>
<body>
<div id="reconnecting" class="banner" role="alert" hidden>Reconnecting&hellip;</div>
<main>
  <h1>warmgate demo engine</h1>
  <form id="form">
    <label>Prompt <textarea id="text" rows="3">a warm gate at dawn, volumetric light</textarea>
    </label>
    <div class="row">
      <label>Seed <input id="seed" type="number" min="0" value="42"></label>
      <label>Width <input id="width" type="number" min="16" max="2048" step="8" value="512">
      </label>
      <label>Height <input id="height" type="number" min="16" max="2048" step="8" value="512">
      </label>
      <label>Steps <input id="steps" type="number" min="1" max="1000" value="10"></label>
      <button id="render" type="submit">Render</button>
    </div>
  </form>
  <progress id="bar" max="1" value="0"></progress>
  <p id="status">connecting&hellip;</p>
  <div class="images">
    <figure><img id="preview" alt=""><figcaption>preview</figcaption></figure>
    <figure><img id="final" alt=""><figcaption id="caption">result</figcaption></figure>
  </div>
</main>
<script src="static/app.js"></script>
</body>
</html>
"""

APP_CSS = """:root { color-scheme: light dark; font-family: system-ui, sans-serif; }
main { max-width: 960px; margin: 2rem auto; padding: 0 1rem; }
textarea { width: 100%; box-sizing: border-box; font: inherit; }
.row { display: flex; gap: 1rem; align-items: end; flex-wrap: wrap; margin: .5rem 0; }
.row input { width: 7rem; }
progress { width: 100%; height: 1rem; }
.images { display: flex; gap: 1rem; flex-wrap: wrap; }
figure { margin: 0; }
#preview { width: 256px; height: 256px; image-rendering: pixelated; background: #8882; }
#final { max-width: 512px; background: #8882; min-width: 256px; min-height: 256px; }
.banner { position: fixed; top: 0; left: 0; right: 0; padding: .5rem 1rem; text-align: center;
          background: #c62828; color: #fff; font-weight: 600; z-index: 10; }
.banner[hidden] { display: none; }
"""

APP_JS = """'use strict';
const $ = (id) => document.getElementById(id);
const clientId = (crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2));
let current = null;
let previewUrl = null;

function wsUrl() {
  const url = new URL('ws', location.href);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.searchParams.set('clientId', clientId);
  return url.href;
}

function graph(text, seed, width, height, steps) {
  return {
    '3': {class_type: 'KSampler', inputs: {seed, steps, cfg: 7, sampler_name: 'euler',
          scheduler: 'normal', denoise: 1, model: ['4', 0], positive: ['6', 0],
          negative: ['7', 0], latent_image: ['5', 0]}},
    '4': {class_type: 'CheckpointLoaderSimple', inputs: {ckpt_name: 'demo.safetensors'}},
    '5': {class_type: 'EmptyLatentImage', inputs: {width, height, batch_size: 1}},
    '6': {class_type: 'CLIPTextEncode', inputs: {text, clip: ['4', 1]}},
    '7': {class_type: 'CLIPTextEncode', inputs: {text: '', clip: ['4', 1]}},
    '8': {class_type: 'VAEDecode', inputs: {samples: ['3', 0], vae: ['4', 2]}},
    '9': {class_type: 'SaveImage', inputs: {filename_prefix: 'warmgate', images: ['8', 0]}},
  };
}

function showImage(image) {
  const q = new URLSearchParams({filename: image.filename, subfolder: image.subfolder || '',
                                 type: image.type || 'output'});
  $('final').src = 'view?' + q.toString();
  $('caption').textContent = image.filename;
}

function finish(text) {
  current = null;
  $('render').disabled = false;
  $('status').textContent = text;
}

function onMessage(event) {
  if (event.data instanceof ArrayBuffer) {
    const view = new DataView(event.data);
    if (view.byteLength > 8 && view.getUint32(0) === 1 && view.getUint32(4) === 2) {
      if (previewUrl) URL.revokeObjectURL(previewUrl);
      previewUrl = URL.createObjectURL(new Blob([event.data.slice(8)], {type: 'image/png'}));
      $('preview').src = previewUrl;
    }
    return;
  }
  const msg = JSON.parse(event.data);
  const d = msg.data || {};
  if (msg.type === 'status') {
    if (!current) $('status').textContent = 'queue: ' + d.status.exec_info.queue_remaining;
    return;
  }
  if (!current || d.prompt_id !== current) return;
  if (msg.type === 'execution_start') $('status').textContent = 'rendering\\u2026';
  if (msg.type === 'progress') {
    $('bar').max = d.max; $('bar').value = d.value;
    $('status').textContent = 'step ' + d.value + ' / ' + d.max;
  }
  if (msg.type === 'executed' && d.output && d.output.images) showImage(d.output.images[0]);
  if (msg.type === 'execution_success') finish('done');
  if (msg.type === 'execution_error') finish('error: ' + d.exception_message);
}

// As ComfyUI's frontend does: a red banner while the websocket is down, retried every second.
function connect() {
  const ws = new WebSocket(wsUrl());
  ws.binaryType = 'arraybuffer';
  ws.onmessage = onMessage;
  ws.onopen = () => {
    $('reconnecting').hidden = true;
    if (!current) $('status').textContent = 'connected';
  };
  ws.onerror = () => { $('reconnecting').hidden = false; };
  ws.onclose = () => {
    $('reconnecting').hidden = false;
    $('status').textContent = 'disconnected, retrying';
    setTimeout(connect, 1000);
  };
}

async function pollHistory(promptId) {
  while (current === promptId) {
    await new Promise((r) => setTimeout(r, 1000));
    const res = await fetch('history/' + encodeURIComponent(promptId));
    const h = (await res.json())[promptId];
    if (h && h.status && h.status.completed && current === promptId) {
      const out = Object.values(h.outputs)[0];
      if (out && out.images) showImage(out.images[0]);
      finish('done');
    }
  }
}

$('form').addEventListener('submit', async (event) => {
  event.preventDefault();
  $('render').disabled = true;
  $('bar').value = 0;
  const body = {client_id: clientId, prompt: graph($('text').value, Number($('seed').value),
    Number($('width').value), Number($('height').value), Number($('steps').value))};
  try {
    const res = await fetch('prompt', {method: 'POST', body: JSON.stringify(body),
                                       headers: {'Content-Type': 'application/json'}});
    const data = await res.json();
    if (!res.ok) { finish('rejected: ' + (data.error ? data.error.message : res.status)); return; }
    current = data.prompt_id;
    $('status').textContent = 'queued as #' + data.number;
    pollHistory(current);
  } catch (err) {
    finish('failed: ' + err);
  }
});

connect();
"""
