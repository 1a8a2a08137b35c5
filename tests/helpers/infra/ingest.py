"""Helpers both halves of test_ingest.py use: tests/unit/infra/test_ingest.py and
tests/integration/infra/test_ingest.py (and any other test module that imports them)."""

from __future__ import annotations

from hetflow.config import DatasetSpec
from hetflow.infra.data.ingest import ingest_streamed
from hetflow.tasks.data import ingest_params


def _ingest(**kw) -> object:
    spec = DatasetSpec(**kw)
    return ingest_streamed(spec, ingest_params(spec))
