"""The link the launch log gives to an experiment's runs in MLflow's web UI."""

from __future__ import annotations

from furcate_hydra.store.ui_link import experiment_link

RUNS = "/#/experiments/7?workflowType=machine_learning"


def test_a_tracking_server_links_to_its_own_page_of_the_experiments_runs() -> None:
    assert experiment_link("http://127.0.0.1:5000", "7") == f"http://127.0.0.1:5000{RUNS}"
    assert experiment_link("https://ml.example/mlflow/", "7") == f"https://ml.example/mlflow{RUNS}"


def test_credentials_in_the_tracking_uri_stay_out_of_the_log() -> None:
    link = experiment_link("http://me:s3cret@[::1]:8080", "7")
    assert link == f"http://[::1]:8080{RUNS}"


def test_a_database_store_is_served_by_mlflow_ui() -> None:
    link = experiment_link("sqlite:////tmp/x/mlflow.db", "7")
    assert (
        link
        == f"mlflow ui --backend-store-uri sqlite:////tmp/x/mlflow.db, then http://127.0.0.1:5000{RUNS}"
    )


def test_a_database_password_stays_out_of_the_log() -> None:
    link = experiment_link("postgresql://me:s3cret@db/mlflow", "7")
    assert "s3cret" not in link
    assert link.startswith("mlflow ui --backend-store-uri postgresql://me:***@db/mlflow, then ")
