"""Engines: what warmgate knows of each protocol a target speaks."""
