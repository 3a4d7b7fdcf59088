"""Hydra launcher plugin ``hydra/launcher=furcate``."""
