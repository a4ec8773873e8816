"""Tests of what deploy/images/ builds into the images: ComfyUI's readyz custom node and the
Wan2GP launcher, each against a stand-in of the engine, and the images' tags in deploy/."""
