"""The Hydra layer: the only code besides ``hydra_plugins/`` that imports Hydra.

The plugins stay thin (their config dataclass and a small plugin class); what they share lives
here: the streaming-launcher protocol, option parsing and its error, job composition, the launch
session over an executor, the run ledger, the grid and its exclusion filter, the sweeper
base class. Hydra's plugin scan, at every app start, imports only ``sweeper_base`` from here
(the sweeper plugins subclass it), which loads nothing heavy; the rest is imported when a sweep
starts.
"""
