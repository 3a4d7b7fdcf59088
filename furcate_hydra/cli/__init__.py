"""The ``furcate`` command: a sweep's state and report, read from its store and sweep dir.

    furcate status [SWEEP_DIR] [--json]   what each job is doing or did, and why it failed
    furcate report [SWEEP_DIR]            report/report.html (+ PNGs) in the sweep dir
    furcate ls                            the sweeps a store holds

Imports the store and the shared modules, never Hydra or torch: it starts in the time MLflow
takes to import, and runs where the sweep's code does not.
"""
