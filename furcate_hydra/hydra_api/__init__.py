"""Hydra's API as furcate reads it: Hydra's private names (one module), plugin options and
their key/value/fix error, a task config as plain values, the command line's overrides."""
