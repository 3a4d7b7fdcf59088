"""The record policy over the store: before a run, skip / resume / claim / open its MLflow run;
after it, its outcome, run data and the JobReturn Hydra gets back."""
