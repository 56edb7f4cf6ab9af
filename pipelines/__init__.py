"""Kubeflow pipelines: ``lemon-train`` (training.py) and ``lemon-eval`` (evaluation.py); run.py
compiles them to IR YAML, runs them with kfp.local, and submits them to a cluster."""
