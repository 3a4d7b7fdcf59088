"""``furcate ls``: the sweeps a store holds, newest first, with their state and job counts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from furcate_hydra.cli._values import format_time, iso_time
from furcate_hydra.store.sweep_list import SweepSummary

__all__ = ["print_sweeps"]


def print_sweeps(
    sweeps: Sequence[SweepSummary], tracking_uri: str, out: TextIO, as_json: bool = False
) -> None:
    if as_json:
        data = [
            {
                "run_id": s.run_id,
                "experiment": s.experiment,
                "sweep_dir": s.sweep_dir,
                "status": s.status,
                "reason": s.reason,
                "start": iso_time(s.start),
                "end": iso_time(s.end),
                "command": s.command,
                "counts": s.counts,
            }
            for s in sweeps
        ]
        json.dump({"tracking_uri": tracking_uri, "sweeps": data}, out, indent=2)
        out.write("\n")
        return
    if not sweeps:
        out.write(f"no sweeps in {tracking_uri}\n")
        return
    out.write(f"sweeps in {tracking_uri}, newest first:\n\n")
    for sweep in sweeps:
        counts = "  ".join(f"{state} {n}" for state, n in sorted(sweep.counts.items()))
        state = sweep.status + (f" ({sweep.reason})" if sweep.reason else "")
        out.write(
            f"{format_time(sweep.start)}  {sweep.experiment}  {state}\n"
            f"    {sweep.sweep_dir}\n"
            f"    jobs: {counts or 'none'}"
            + (f"    command: {sweep.command}" if sweep.command else "")
            + "\n"
        )
