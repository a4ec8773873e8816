"""warmgate's launcher for Wan2GP: runs wgp.py with its preload policy set from the environment
and serves ``/readyz``, 200 only once the preload finished. See README.md beside this package."""
