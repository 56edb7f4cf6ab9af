"""lemon_core: the library behind lemon.

Spec parsing, DAG execution on capacity pools, benchmarks, rewards, counterfactual edits, GRPO,
storage, metrics and the serving app. It knows nothing of Kubeflow or Kubernetes: every pipeline
component is a thin wrapper around a function here, which a user can also run with ``lemon <stage>``.
"""

__version__ = "0.1.0"
