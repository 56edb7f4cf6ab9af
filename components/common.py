"""Shared kfp bits: how every lemon component is declared."""

from collections.abc import Callable
from typing import Any

from kfp import dsl


def lightweight(func: Callable[..., Any], image: str) -> Any:
    """A lightweight Python component that installs nothing at runtime: the image (or, locally, the
    current venv) already has lemon and kfp. kfp copies ``func``'s source into the pod, so component
    functions import everything they use inside their body."""
    return dsl.component(func, base_image=image, packages_to_install=[], install_kfp_package=False)
