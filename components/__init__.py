"""Kubeflow components: one module per stage, each a thin kfp wrapper around ``lemon_core.stages``.

Components are built by factories (``make(images)``) rather than decorated at import time, so the
container image is chosen when a pipeline is compiled (``configs/*.yaml: kubernetes.image``) and the
same function runs under ``kfp.local.SubprocessRunner`` (which needs lightweight Python components:
no runtime ``pip install``, ``install_kfp_package=False``) and in a cluster pod whose image already
has lemon installed.
"""
