"""Where to see an experiment's runs in MLflow's web UI, for the launch log.

MLflow 3.x's UI opens every experiment as its GenAI or its Model training view, by a switch
the browser remembers (GenAI in a new browser): a furcate experiment would open on an overview
of traces it has none of. A link that carries ``workflowType=machine_learning`` opens the runs.
"""

from __future__ import annotations

from urllib.parse import urlparse, urlunparse

from furcate_hydra.addresses import shown_url

__all__ = ["MLFLOW_UI_ADDRESS", "experiment_link"]

# Where ``mlflow ui`` serves when given no --host/--port.
MLFLOW_UI_ADDRESS = "http://127.0.0.1:5000"


def experiment_link(tracking_uri: str, experiment_id: str) -> str:
    """How to open the experiment's runs: its page on a tracking server, or, for a database or
    file store, the ``mlflow ui`` command that serves it and the page there."""
    page = f"/#/experiments/{experiment_id}?workflowType=machine_learning"
    parsed = urlparse(tracking_uri)
    if parsed.scheme in ("http", "https"):
        # without user:password@, which a log line should not carry
        host = parsed.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parsed.port is not None:
            netloc += f":{parsed.port}"
        server = urlunparse((parsed.scheme, netloc, parsed.path.rstrip("/"), "", "", ""))
        return server + page
    shown = shown_url(tracking_uri)
    return f"mlflow ui --backend-store-uri {shown}, then {MLFLOW_UI_ADDRESS}{page}"
