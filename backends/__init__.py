"""Backends (how a target runs and scales) and engines (which protocol it speaks)."""
