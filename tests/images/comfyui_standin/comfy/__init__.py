"""Stand-in for ComfyUI's ``comfy`` package (only the modules the custom node touches)."""
