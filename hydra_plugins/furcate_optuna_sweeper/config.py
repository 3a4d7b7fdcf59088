"""``hydra/sweeper=furcate_optuna``: hydra-optuna-sweeper's options, plus pruning and exclusions.

A hydra-optuna-sweeper config works as it is once ``override hydra/sweeper: optuna`` reads
``furcate_optuna``: the same keys, and the same sampler group (``hydra/sweeper/sampler``).
Pruners are a group of their own (``hydra/sweeper/pruner``).
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module outside
# sys.modules, where dataclasses cannot resolve string annotations, and OmegaConf reads the
# typing forms (Optional, List) to validate what users type.
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

PROVIDER = "furcate_optuna_sweeper"


@dataclass
class SamplerConf:
    _target_: str = MISSING


@dataclass
class TPESamplerConf(SamplerConf):
    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    multivariate: bool = False
    # trials still running count as pending (worst value), so that trials asked while
    # others run spread out instead of piling onto one spot; Optuna advises it in parallel
    constant_liar: bool = True


@dataclass
class RandomSamplerConf(SamplerConf):
    _target_: str = "optuna.samplers.RandomSampler"
    seed: Optional[int] = None


@dataclass
class GridSamplerConf(SamplerConf):
    # the sweeper passes the grid (every value of params), so only the seed is set here
    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True
    seed: Optional[int] = None


@dataclass
class CmaEsSamplerConf(SamplerConf):
    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: Optional[int] = None
    x0: Optional[Dict[str, Any]] = None
    sigma0: Optional[float] = None
    n_startup_trials: int = 1
    warn_independent_sampling: bool = True
    consider_pruned_trials: bool = False
    restart_strategy: Optional[str] = None
    inc_popsize: int = 2
    use_separable_cma: bool = False


@dataclass
class NSGAIISamplerConf(SamplerConf):
    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: Optional[int] = None
    population_size: int = 50
    mutation_prob: Optional[float] = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5


@dataclass
class QMCSamplerConf(SamplerConf):
    _target_: str = "optuna.samplers.QMCSampler"
    seed: Optional[int] = None
    qmc_type: str = "sobol"
    scramble: bool = False
    warn_asynchronous_seeding: bool = True
    warn_independent_sampling: bool = True


# Pruners are rebuilt inside every job from these values (the study's storage does not keep
# its pruner), so they are plain values named by `name`, not `_target_`s Hydra instantiates.
@dataclass
class MedianPrunerConf:
    name: str = "median"
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class PercentilePrunerConf(MedianPrunerConf):
    # the median pruner at another percentile (Optuna's MedianPruner is its 50.0): 25.0 stops
    # a trial worse than the best quarter of the completed ones at the same step
    name: str = "percentile"
    percentile: float = 25.0


@dataclass
class SuccessiveHalvingPrunerConf:
    name: str = "successive_halving"
    min_resource: Any = "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0


@dataclass
class HyperbandPrunerConf:
    name: str = "hyperband"
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3
    bootstrap_count: int = 0


@dataclass
class NoPrunerConf:
    # epochs are still reported (intermediate values), no trial is stopped
    name: str = "none"


@dataclass
class FurcateOptunaSweeperConf:
    _target_: str = (
        "hydra_plugins.furcate_optuna_sweeper.furcate_optuna_sweeper.FurcateOptunaSweeper"
    )
    defaults: List[Any] = field(default_factory=lambda: [{"sampler": "tpe"}, {"pruner": "median"}])
    sampler: SamplerConf = MISSING
    pruner: Any = MISSING
    # minimize or maximize, or a list of them: one per value the task returns
    direction: Any = "minimize"
    # an Optuna RDB URL that every run continues (a relative sqlite path is from the working
    # directory); null: a new study for each run (a sqlite file in the sweep dir, so that the
    # trials' jobs can report to it), as hydra-optuna-sweeper's in-memory one
    storage: Optional[Any] = "sqlite:///optuna.db"
    # with hydra.launcher.backend=ray on a cluster (ray.address set) and a sqlite storage: the
    # address (HOST:PORT, or HOST for any free port) where the sweeper serves the study to the
    # nodes through Optuna's gRPC proxy, which admits only calls carrying a token the sweeper
    # makes for each sweep and gives its jobs. Unset: this machine's address toward the head
    storage_proxy: Optional[str] = None
    # a PEM certificate file (it must name the storage_proxy address, e.g. subjectAltName
    # IP:10.0.0.5) for the proxy to speak TLS; jobs get its text and trust it alone. Set with
    # storage_proxy_tls_key, or neither: without TLS the token and the study travel in clear
    # text, fine on a private network only: set both on any other
    storage_proxy_tls_cert: Optional[str] = None
    # the unencrypted PEM key of storage_proxy_tls_cert (read by the sweeper only, at start)
    storage_proxy_tls_key: Optional[str] = None
    # unset: the task's name (hydra.job.name)
    study_name: Optional[str] = None
    # trials the study should have in all: a rerun runs only the ones missing
    n_trials: int = 20
    # trials in flight at once (unset: one per slot of the launcher); fewer leave slots idle,
    # said once; more run one per slot (with asynchronous=false: a batch of n_jobs is queued)
    n_jobs: Optional[int] = None
    # the sweep fails once more than this fraction of its trials failed
    max_failure_rate: float = 0.0
    # the search space, as hydra-optuna-sweeper reads it: interval, int(interval), tag(log, ..),
    # range, choice, or a fixed value
    params: Optional[Dict[str, Any]] = field(default_factory=dict)
    # deprecated (hydra-optuna-sweeper reads it with a warning): {name: {type, low, high, step,
    # log, choices}}, the search space before params; beside params, ignored with a warning
    search_space: Optional[Dict[str, Any]] = None
    # dotted path of fn(cfg, trial) that suggests more params (define-by-run)
    custom_search_space: Optional[str] = None
    # the metric each epoch reports to the trial (a key the LightningModule logs, e.g.
    # val_loss); it must go the study's direction. Unset: nothing reported, no pruning
    monitor: Optional[str] = None
    # names of the values the task returns, one per direction (optuna-dashboard shows them
    # instead of "Objective 0"). Unset: the monitor metric, for a study of one direction
    metric_names: Optional[Any] = None
    # furcate's exclude_configs: a sampled config matching every pair of one mapping never runs
    exclude: List[Any] = field(default_factory=list)
    # excluded samples in a row before the sweep gives up (the space is all excluded)
    max_resamples: int = 100
    # True: a slot gets a new trial the moment its trial ends. False: hydra-optuna-sweeper's
    # batches of n_jobs, each asked after the last one ended (reproducible order)
    asynchronous: bool = True


_STORE = ConfigStore.instance()
_STORE.store(
    group="hydra/sweeper", name="furcate_optuna", node=FurcateOptunaSweeperConf, provider=PROVIDER
)
for _name, _node in (
    ("tpe", TPESamplerConf),
    ("random", RandomSamplerConf),
    ("grid", GridSamplerConf),
    ("cmaes", CmaEsSamplerConf),
    ("nsgaii", NSGAIISamplerConf),
    ("qmc", QMCSamplerConf),
):
    _STORE.store(group="hydra/sweeper/sampler", name=_name, node=_node, provider=PROVIDER)
# hydra/sweeper/pruner=<name>; the sweeper's options check names these (median first: the
# default, the others as alternatives)
PRUNER_CONFS: Dict[str, Any] = {
    "median": MedianPrunerConf,
    "percentile": PercentilePrunerConf,
    "successive_halving": SuccessiveHalvingPrunerConf,
    "hyperband": HyperbandPrunerConf,
    "none": NoPrunerConf,
}
for _name, _pruner in PRUNER_CONFS.items():
    _STORE.store(group="hydra/sweeper/pruner", name=_name, node=_pruner, provider=PROVIDER)
