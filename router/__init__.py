"""warmgate: request router and scale-from-zero proxy for GPU render engines."""

__version__ = "0.1.0"
