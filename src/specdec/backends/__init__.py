"""Model runtimes behind one small protocol (see ``base.Backend``)."""

from specdec.backends.base import Backend, common_prefix_length, sync_cache

__all__ = ["Backend", "common_prefix_length", "sync_cache"]
