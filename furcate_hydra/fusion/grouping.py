"""Which members train together: equal signatures, at most ``fuse_max`` to a group, groups
as even as can be; every member left alone gets its one reason (the sweep shows it as "not
fused: its batch size differs")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from furcate_hydra.fusion.signature import FusionSignature


@dataclass(frozen=True)
class Candidate:
    """A member as it arrives at its ``fit``: its signature, or the reasons it has none."""

    key: str
    signature: FusionSignature | None
    reasons: tuple[str, ...] = ()


@dataclass
class Grouping:
    """Groups of two or more keys (in arrival order), and why each other key runs alone."""

    groups: list[list[str]]
    alone: dict[str, str]


def form_groups(candidates: Sequence[Candidate], fuse_max: int) -> Grouping:
    """Members with equal signatures, in arrival order, cut into groups of at most
    ``fuse_max``; a member whose signature no other shares runs alone."""
    if fuse_max < 2:
        raise ValueError(f"fuse_max={fuse_max}: a group needs room for two members")
    alone: dict[str, str] = {}
    by_signature: dict[FusionSignature, list[str]] = {}
    for candidate in candidates:
        if candidate.signature is None or candidate.reasons:
            alone[candidate.key] = (
                candidate.reasons[0] if candidate.reasons else "it has no signature"
            )
            continue
        by_signature.setdefault(candidate.signature, []).append(candidate.key)
    groups: list[list[str]] = []
    for keys in by_signature.values():
        groups.extend(even_cut(keys, fuse_max))
    lone = {group[0] for group in groups if len(group) == 1}
    groups = [group for group in groups if len(group) > 1]
    reference = _largest(by_signature)
    for candidate in candidates:
        if candidate.key in lone and candidate.signature is not None:
            alone[candidate.key] = _why_alone(candidate.signature, reference, by_signature)
    return Grouping(groups=groups, alone=alone)


def even_cut(keys: list[str], fuse_max: int) -> list[list[str]]:
    """``keys`` in as few groups of at most ``fuse_max`` as can be, their sizes as even as
    can be: 5 at ``fuse_max=4`` train as 3 and 2, not 4 and one left alone."""
    count = -(-len(keys) // fuse_max)
    base, extra = divmod(len(keys), count)
    groups, start = [], 0
    for index in range(count):
        size = base + (1 if index < extra else 0)
        groups.append(keys[start : start + size])
        start += size
    return groups


def _largest(by_signature: dict[FusionSignature, list[str]]) -> FusionSignature | None:
    if not by_signature:
        return None
    return max(by_signature, key=lambda signature: len(by_signature[signature]))


def _why_alone(
    signature: FusionSignature,
    reference: FusionSignature | None,
    by_signature: dict[FusionSignature, list[str]],
) -> str:
    if reference is None or reference == signature:
        return "no other config trains like it here"
    differences = signature.differences(reference)
    return differences[0] if differences else "no other config trains like it here"
