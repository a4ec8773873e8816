"""Request traces for ``warmgate simulate`` (loadtests/traces/generate.py)."""
