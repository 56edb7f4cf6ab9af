"""The lemon inference service: task -> orchestrator-written spec -> executed multi-agent answer.

``create_app(settings)`` builds the FastAPI app; ``lemon serve`` runs it with uvicorn. Modules:
settings (config), auth (bearer tokens), limits (body size, concurrency), orchestrator (task -> spec
through a Backend, with one re-sample), batcher (micro-batching of concurrent requests), app (HTTP).
"""

from lemon_core.serve.app import create_app
from lemon_core.serve.settings import ServeSettings, load_settings

__all__ = ["ServeSettings", "create_app", "load_settings"]
