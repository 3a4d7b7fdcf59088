"""Why a member cannot be fused, read from its module: one short reason each, for the sweep's
"not fused: ..." line (what only running a step shows is in ``probe.py``).

These are reasons to run a config alone, not errors: the module keeps state a vmapped step
cannot keep per member (running statistics), draws random numbers inside its steps, or
optimizes by hand.
"""

from __future__ import annotations

from torch import nn

from furcate_hydra.fusion.lineage import derives_from

# torch's layers that draw from the global random stream in training
_RANDOM_LAYERS = (
    nn.Dropout,
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.AlphaDropout,
    nn.FeatureAlphaDropout,
)


def module_refusals(module: nn.Module) -> list[str]:
    """What in ``module`` itself rules fusion out (empty: nothing)."""
    reasons = []
    if getattr(module, "automatic_optimization", True) is False:
        reasons.append("it optimizes by hand (automatic_optimization=False)")
    for _, child in module.named_modules():
        kind = type(child).__name__
        if isinstance(child, nn.modules.batchnorm._BatchNorm) and child.track_running_stats:
            reasons.append(f"{kind} keeps running statistics")
        elif isinstance(child, _RANDOM_LAYERS) and child.p > 0:
            reasons.append(f"{kind} draws random numbers in training")
    return sorted(set(reasons))


def is_stateful_metric(module: nn.Module) -> bool:
    """A torchmetrics ``Metric`` (by its class's lineage: torchmetrics need not be installed)."""
    return derives_from(module, "Metric", ("torchmetrics",))
