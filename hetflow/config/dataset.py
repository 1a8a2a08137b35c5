"""What a user writes about a dataset: where it lives and how the workers read it
(`DatasetSpec`), and where runs are recorded (`TrackingConfig`); both re-exported by
`hetflow.config`."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from hetflow.config.base import ConfigModel

_URL = re.compile(r"^(s3|memory)://[^/].*$|^file://.+$")


class DatasetSpec(ConfigModel):
    """Where a dataset lives (shards + manifest) and how workers read it."""

    source: Literal["digits", "synthetic", "stdlib", "text", "parquet", "images", "existing"] = (
        Field(
            "digits",
            title="Source",
            description="'digits': scikit-learn's handwritten digits; 'synthetic': random digits-"
            "shaped samples of any size; 'stdlib': the Python standard library's source as bytes "
            "(for 'gpt'); 'text' (files matching the glob), 'parquet' (the columns named) or "
            "'images' (one subfolder per class) under Source path; 'existing': the dataset "
            "already at the URL ('hetflow data ingest' wrote it).",
        )
    )
    source_url: str | None = Field(
        None, title="Source path", description="A local folder, file:// or s3:// prefix."
    )
    glob: str = Field("**/*", title="Files to read (text, parquet)")
    columns: list[str] = Field(default_factory=list, title="Parquet feature columns")
    label_column: str | None = Field(None, title="Parquet label column")
    image_size: int = Field(32, ge=4, le=1024, title="Image side (pixels)")
    max_mb: float | None = Field(
        None, gt=0, title="Text cap (MB)", description="Read at most this much text; None: all."
    )
    url: str = Field(
        "s3://hetflow-data/digits",
        title="Dataset URL",
        description="Prefix holding manifest.json and the shards (s3://, file:// or memory://).",
    )
    shard_samples: int = Field(256, ge=1, title="Samples per shard")
    test_fraction: float = Field(0.2, gt=0, lt=1, title="Test fraction")
    synthetic_samples: int = Field(10_000, ge=1, title="Synthetic samples")
    seed: int = Field(0, title="Split seed")
    cache_dir: SkipJsonSchema[str | None] = Field(
        None, title="Cache directory", description="Local shard cache; default under HETFLOW_HOME."
    )
    cache_mb: SkipJsonSchema[float] = Field(256.0, gt=0, title="Cache budget (MB)")
    prefetch: SkipJsonSchema[int] = Field(
        2,
        ge=0,
        title="Prefetch depth (shards)",
        description="Shards each rank reads and decodes ahead of the step that needs them.",
    )
    s3_latency_ms: SkipJsonSchema[float] = Field(
        0.0,
        ge=0,
        title="Emulated S3 latency (ms)",
        description="Added to every shard fetched from the source (0: none; for measurements).",
    )
    s3_mbps: SkipJsonSchema[float | None] = Field(
        None, gt=0, title="Emulated S3 bandwidth (Mbit/s)", description="None: unlimited."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not _URL.match(v):
            raise ValueError("must start with s3://, file:// or memory:// and name a bucket/path")
        return v.rstrip("/")


class TrackingConfig(ConfigModel):
    """Where runs are recorded. Empty fields defer to MLFLOW_* variables, then local defaults."""

    tracking_uri: str | None = Field(
        None,
        title="MLflow tracking URI",
        description="Empty: $MLFLOW_TRACKING_URI, else a SQLite file under HETFLOW_HOME.",
    )
    experiment: str = Field("hetflow", min_length=1, title="MLflow experiment")
