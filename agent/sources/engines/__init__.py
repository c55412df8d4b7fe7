"""Engine sources: a fast exposition parser, one declarative adapter per engine, and the shared
scraper (``scraper.py``, the only module here that does I/O)."""

from agent.sources.engines.base import Adapter, Finished, Series
from agent.sources.engines.registry import ADAPTERS, detect_kind

__all__ = ["ADAPTERS", "Adapter", "Finished", "Series", "detect_kind"]
