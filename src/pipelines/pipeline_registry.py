"""Project pipelines: every method sub-package with a ``pipeline.py``, imported only when asked for."""

from pipelines.core.registry import LazyPipelines


def register_pipelines() -> LazyPipelines:
    """Map pipeline names to pipelines; ``__default__`` is the flagship (TESS), never "all"."""
    return LazyPipelines()
