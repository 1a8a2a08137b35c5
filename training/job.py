"""The job file a torchrun worker reads: the config models plus what the flow decided."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from hetflow.config import ClusterSpec, DatasetSpec, TrainConfig


class RunSpec(BaseModel):
    run_name: str
    variant: str
    mode: Literal["train", "profile"] = "train"
    cluster: ClusterSpec
    dataset: DatasetSpec
    train: TrainConfig
    plan: list[int] = Field(default_factory=list, description="Initial local batch per rank.")
    compression: str = Field("none", description="Resolved method; never 'auto'.")
    compression_reason: str = ""
    latency_s: list[float] = Field(default_factory=list, description="Profiled per-step latency per rank.")
    per_sample_s: list[float] = Field(default_factory=list, description="Profiled compute time per sample per rank.")
    stragglers: list[tuple[int, int, float]] = Field(
        default_factory=list,
        description="(rank, step, factor): from `step` on, that rank's slowdown is multiplied by factor.",
    )
    run_dir: str
    checkpoint_url: str | None = Field(None, description="Where checkpoints go; default RUN_DIR/checkpoints.")
    profile_batches: list[int] = Field(default_factory=lambda: [8, 16, 32, 64])

    def write(self, path: Path) -> Path:
        path.write_text(self.model_dump_json(indent=1))
        return path

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        return cls.model_validate_json(Path(path).read_text())
