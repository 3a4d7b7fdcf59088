"""What a job must not print: lines every job of a sweep used to print alike."""

from __future__ import annotations

# Each a piece of one such line, none of which a user can act on.
NOISE = (
    "`weights_only` was not set",  # our own save_checkpoint, once per epoch
    "LeafSpec",  # torch's deprecation, raised by Lightning's pytree code
    "GPU available:",  # Lightning's start-up banners
    "TPU available:",
    "💡 Tip",
)


def noise_lines(text: str) -> list[str]:
    """The lines of ``text`` that hold a piece of ``NOISE``."""
    return [line for line in text.splitlines() if any(piece in line for piece in NOISE)]
