"""``hydra.sweeper`` for furcate_optuna, checked once before anything runs."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import MISSING, DictConfig

from furcate_hydra.addresses import HostPort, StoreAddress
from furcate_hydra.errors import FurcateConfigError
from furcate_hydra.hydra_api.options import OptionError, as_option_error, plain
from furcate_hydra.sweepers.grid import SweepSpec
from furcate_hydra.sweeping.exclusion import ExclusionRule
from hydra_plugins.furcate_optuna_sweeper.config import PRUNER_CONFS

if TYPE_CHECKING:
    from furcate_hydra.tuning.proxy import ProxyTls

__all__ = ["DIRECTIONS", "OptunaOptions", "job_storage_url"]

DIRECTIONS = ("minimize", "maximize")
_PRUNERS = tuple(PRUNER_CONFS)  # the config group's names


@dataclass(frozen=True)
class OptunaOptions:
    """What the sweeper was asked for; the sampler comes instantiated by Hydra."""

    sampler: Any  # an optuna sampler, or a partial waiting for its grid (GridSampler)
    params: tuple[tuple[str, str], ...]
    search_space: dict[str, Any]  # the deprecated search_space, as Optuna distributions
    rules: tuple[ExclusionRule, ...]
    directions: tuple[str, ...]
    storage: str | None  # None (storage: null): a new study for this run, in the sweep dir
    storage_proxy: tuple[str, int] | None  # (host, port; 0: any free one), or None: automatic
    storage_proxy_tls: ProxyTls | None  # None: the proxy speaks in clear text
    study_name: str | None
    n_trials: int
    n_jobs: int | None
    max_failure_rate: float
    pruner: dict[str, Any]  # {"name": ..., **constructor arguments}
    monitor: str | None
    metric_names: tuple[str, ...] | None  # as given; see objective_names
    custom_search_space: Callable[[DictConfig, Any], Any] | None
    max_resamples: int
    asynchronous: bool

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> OptunaOptions:
        """``hydra.sweeper`` with every key set (``with_defaults``); an unchosen sampler or
        pruner (MISSING) means Optuna's TPE and no pruning."""
        from hydra_plugins.furcate_optuna_sweeper._legacy_space import (
            distributions_from_search_space,
        )

        spec = SweepSpec.parse(options["params"], options["exclude"])
        pruner = _chosen(options["pruner"]) or {"name": "none"}
        if not isinstance(pruner, dict) or pruner.get("name") not in _PRUNERS:
            raise OptionError(
                "hydra.sweeper.pruner",
                pruner,
                f"is not a pruner furcate_optuna knows ({', '.join(_PRUNERS)})",
                f"pick one with hydra/sweeper/pruner={_PRUNERS[0]} (or {', '.join(_PRUNERS[1:])}) "
                "and set its arguments as hydra.sweeper.pruner.<arg>=...",
            )
        _check_pruner(pruner)
        monitor = options["monitor"]
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise OptionError(
                "hydra.sweeper.monitor",
                monitor,
                "must be the name of a metric the LightningModule logs",
                "set e.g. hydra.sweeper.monitor=val_loss, or null to report nothing",
            )
        directions = _directions(options["direction"])
        return cls(
            sampler=_chosen(options["sampler"]),
            params=spec.params,
            search_space=distributions_from_search_space(options["search_space"], spec.params),
            rules=spec.rules,
            directions=directions,
            storage=_storage(options["storage"]),
            storage_proxy=_storage_proxy(options["storage_proxy"]),
            storage_proxy_tls=_storage_proxy_tls(
                options["storage_proxy_tls_cert"], options["storage_proxy_tls_key"]
            ),
            study_name=_optional_text("hydra.sweeper.study_name", options["study_name"]),
            n_trials=_count("hydra.sweeper.n_trials", options["n_trials"], "20"),
            n_jobs=_n_jobs(options["n_jobs"]),
            max_failure_rate=_rate(options["max_failure_rate"]),
            pruner=pruner,
            monitor=monitor,
            metric_names=_metric_names(options["metric_names"], directions),
            custom_search_space=_callable(options["custom_search_space"]),
            max_resamples=_count("hydra.sweeper.max_resamples", options["max_resamples"], "100"),
            asynchronous=bool(options["asynchronous"]),
        )

    @property
    def objective_names(self) -> tuple[str, ...] | None:
        """What the study calls the values the task returns: ``metric_names``, else, for one
        direction, the ``monitor`` metric (whose final value a task that trains with ``fit``
        returns); None where neither says."""
        if self.metric_names is not None:
            return self.metric_names
        if self.monitor is not None and len(self.directions) == 1:
            return (self.monitor,)
        return None

    def pruner_json(self) -> str:
        return json.dumps(self.pruner, sort_keys=True)

    def pruner_object(self) -> Any:
        """The study's pruner, built as each job builds it."""
        from furcate_hydra.tuning.pruners import pruner_from_spec

        return pruner_from_spec(self.pruner)


def _chosen(value: Any) -> Any:
    """A config-group choice as plain values; None where nothing was chosen (MISSING)."""
    value = plain(value)
    return None if value is None or value == MISSING else value


def job_storage_url(storage: str, cwd: Path) -> str:
    """``storage`` with a relative sqlite file made absolute against ``cwd``: a job may
    change directory."""
    return StoreAddress.parse(storage).absolute(cwd, resolve=True).url


def _directions(value: Any) -> tuple[str, ...]:
    raw = plain(value)
    items = raw if isinstance(raw, list) else [raw]
    names = [getattr(item, "name", item) for item in items]  # Direction enums, as strings
    if not names or not all(isinstance(n, str) and n in DIRECTIONS for n in names):
        raise OptionError(
            "hydra.sweeper.direction",
            raw,
            "must be minimize or maximize, or a list of them (one per value the task returns)",
            "set hydra.sweeper.direction=minimize, or direction: [minimize, maximize]",
        )
    return tuple(str(n) for n in names)


def _metric_names(value: Any, directions: tuple[str, ...]) -> tuple[str, ...] | None:
    raw = plain(value)
    if raw is None:
        return None
    names = raw if isinstance(raw, list) else [raw]
    fix = (
        "give one name per direction, in its order, e.g. hydra.sweeper.metric_names=[val_loss]"
        " or metric_names: [val_loss, latency_ms] for two directions"
    )
    if not names or not all(isinstance(n, str) and n for n in names):
        raise OptionError("hydra.sweeper.metric_names", raw, "must be names (text)", fix)
    if len(names) != len(directions):
        raise OptionError(
            "hydra.sweeper.metric_names",
            raw,
            f"names {len(names)} values, but the study has {len(directions)} direction(s) "
            f"({', '.join(directions)})",
            fix,
        )
    if len(set(names)) != len(names):
        raise OptionError("hydra.sweeper.metric_names", raw, "names a value twice", fix)
    return tuple(names)


def _storage(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or "://" not in value:
        raise OptionError(
            "hydra.sweeper.storage",
            value,
            "must be an Optuna RDB storage URL (the trials' jobs report to it from their own "
            "processes, so an in-memory study cannot work)",
            "set hydra.sweeper.storage=sqlite:///optuna.db (or a postgresql:// or mysql:// URL),"
            " or null for a new study in the sweep dir",
        )
    try:
        StoreAddress.parse(value).checked("hydra.sweeper.storage")
    except FurcateConfigError as exc:
        raise as_option_error(exc) from None
    return value


def _storage_proxy(value: Any) -> tuple[str, int] | None:
    """``HOST:PORT`` or ``HOST`` (port 0: any free one); ``[::1]:PORT`` for IPv6."""
    if value is None:
        return None
    fix = (
        "set e.g. hydra.sweeper.storage_proxy=10.0.0.5:13000 (or 10.0.0.5 for any free port): "
        "an address of this machine that the Ray nodes reach, where the sweeper serves its "
        "sqlite study; or leave it unset for this machine's address toward the Ray head"
    )
    try:
        address = HostPort.parse(value, "hydra.sweeper.storage_proxy", fix, port_optional=True)
    except FurcateConfigError as exc:
        raise as_option_error(exc) from None
    return address.host, address.port


_TLS_CERT = "hydra.sweeper.storage_proxy_tls_cert"
_TLS_KEY = "hydra.sweeper.storage_proxy_tls_key"


class _EncryptedKey(Exception):
    """Raised by the password callback: gRPC takes no encrypted key, so none is asked for."""


def _no_password() -> bytes:
    raise _EncryptedKey


def _storage_proxy_tls(cert: Any, key: Any) -> ProxyTls | None:
    """The proxy's certificate and key, read now (both or neither) and checked as a pair."""
    from furcate_hydra.tuning.proxy import ProxyTls

    if cert is None and key is None:
        return None
    fix = (
        f"set both {_TLS_CERT}=PATH and {_TLS_KEY}=PATH, to a PEM certificate that names the "
        "proxy's address and its unencrypted key, e.g. made with `openssl req -x509 -newkey "
        "rsa:3072 -nodes -days 365 -subj /CN=optuna-proxy -addext subjectAltName=IP:10.0.0.5 "
        "-keyout proxy.key -out proxy.crt`; or neither, for no TLS"
    )
    given = {_TLS_CERT: cert, _TLS_KEY: key}
    for name, value in given.items():
        if value is None:
            other = _TLS_KEY if name == _TLS_CERT else _TLS_CERT
            raise OptionError(name, value, f"is unset while {other} is set: TLS needs both", fix)
        if not isinstance(value, str) or not value:
            raise OptionError(name, value, "must be the path of a PEM file", fix)
    paths = {name: Path(value).expanduser() for name, value in given.items()}
    pems: dict[str, bytes] = {}
    for name, path in paths.items():
        try:
            pems[name] = path.read_bytes()
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror or exc})"
            raise OptionError(name, given[name], problem, fix) from None
    cert_pem, key_pem = pems[_TLS_CERT], pems[_TLS_KEY]
    if b"PRIVATE KEY-----" in cert_pem:
        raise OptionError(
            _TLS_CERT,
            cert,
            "holds a private key, which would be handed to every job with the certificate",
            f"give the certificate alone in {_TLS_CERT} and its key in {_TLS_KEY}",
        )
    try:
        cert_pem.decode("ascii")
        # the same check a TLS server makes when it starts: PEM, and the key is the cert's
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            paths[_TLS_CERT], paths[_TLS_KEY], password=_no_password
        )
    except _EncryptedKey:
        raise OptionError(
            _TLS_KEY,
            key,
            "is encrypted, and gRPC takes only an unencrypted key",
            f"decrypt it (openssl pkey -in {key} -out proxy.key) and set {_TLS_KEY} to that "
            "file, readable by the sweeper's user alone",
        ) from None
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise OptionError(
            _TLS_CERT,
            cert,
            f"and {_TLS_KEY}={key!r} are not a PEM certificate and its key "
            f"({getattr(exc, 'reason', None) or exc})",
            fix,
        ) from None
    return ProxyTls(cert_pem, key_pem)


def _count(key: str, value: Any, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(key, value, "must be a whole number, 1 or more", f"e.g. {example}")
    return value


def _n_jobs(value: Any) -> int | None:
    """Trials in flight at once; None: one per slot of the launcher."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(
            "hydra.sweeper.n_jobs",
            value,
            "must be a whole number of trials in flight at once, 1 or more",
            "remove hydra.sweeper.n_jobs (or set it to null) for one trial per slot of the "
            "launcher, or set e.g. hydra.sweeper.n_jobs=4",
        )
    return value


def _rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise OptionError(
            "hydra.sweeper.max_failure_rate",
            value,
            "must be a fraction of trials between 0.0 and 1.0",
            "set hydra.sweeper.max_failure_rate=0.0 (stop at the first failure) or e.g. 0.25",
        )
    return float(value)


def _optional_text(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise OptionError(key, value, "must be a non-empty name", f"set {key}=my_study")
    return value


def _callable(path: Any) -> Callable[[DictConfig, Any], Any] | None:
    if path is None:
        return None
    from hydra.utils import get_method

    key = "hydra.sweeper.custom_search_space"
    if not isinstance(path, str) or not path:
        raise OptionError(key, path, "must be a dotted path", "e.g. my_module.configure")
    try:
        return get_method(path)
    except Exception as exc:  # ImportError, AttributeError or Hydra's wrapper of them
        raise OptionError(
            key,
            path,
            f"does not name a function that can be imported ({str(exc).splitlines()[0]})",
            "give module.function, where module is importable from the working directory, "
            "and the function takes (cfg, trial)",
        ) from None


def _check_pruner(spec: dict[str, Any]) -> None:
    from furcate_hydra.tuning.pruners import pruner_from_spec

    try:
        pruner_from_spec(spec)
    except FurcateConfigError as exc:
        raise OptionError(
            "hydra.sweeper.pruner",
            spec,
            exc.problem,
            "set only the arguments optuna.pruners takes for this pruner",
        ) from None
