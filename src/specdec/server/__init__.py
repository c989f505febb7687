"""OpenAI-compatible HTTP server: thin JSON <-> engine; no decoding logic here."""

from specdec.server.app import create_app
from specdec.server.scheduler import Scheduler

__all__ = ["Scheduler", "create_app"]
