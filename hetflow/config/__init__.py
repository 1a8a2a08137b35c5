"""The configuration models, defined once and passed down to every layer: one section a module.

Flow parameters are these models, so the Prefect UI renders them as forms; the CLI builds them
from flags and files; the torchrun workers receive them as one JSON job file. Cross-field rules
that JSON Schema cannot express (a global batch smaller than the cluster) live in
`rules.check_job`, called before anything is launched.

Sections: `base` (the models' base, the one-line error, the form schema, reading a file),
`cluster` (workers and their devices), `dataset` (where the data lives, MLflow), `train` (the
job: `TrainConfig`), `diloco` (rounds), `faults` (the failure policy), `recommend` (what
recommend is asked), `queue` (what a user queues), `rules` (the rules across sections). This
package re-exports the names callers use, so `from hetflow.config import TrainConfig` holds.
"""

from hetflow.config.base import (
    BUILTIN_RECIPES,
    MODEL_ALIASES,
    RECIPE_ALIASES,
    RECIPE_DESCRIPTION,
    RECIPE_NOTES,
    RECIPE_PATTERN,
    ConfigError,
    ConfigModel,
    FormChoices,
    FormFields,
    alias_note,
    describe_validation_error,
    finite_positive,
    form_schema,
    load_mapping,
    offer_choices,
    parse_speeds,
    suggestion,
    validated,
)
from hetflow.config.cluster import ClusterSpec, WorkerSpec
from hetflow.config.dataset import DatasetSpec, TrackingConfig
from hetflow.config.diloco import DiLoCoConfig
from hetflow.config.faults import FaultPolicy
from hetflow.config.recommend import (
    DEADLINE_MARGIN,
    DEFAULT_RENTABLE,
    PROFILE_MAX_AGE_H,
    ProfileHistory,
    RecommendJob,
    RecommendMarket,
    RecommendObjective,
    RecommendRequest,
    RentableType,
    SpotOverride,
    default_rentable,
)
from hetflow.config.rules import check_fsdp, check_job, fp16_fields
from hetflow.config.train import (
    AUTO_CANDIDATES,
    DEFAULT_SPEEDS,
    LR_RULES,
    TrainConfig,
    default_cluster,
    link_cluster,
    lr_factor,
)

__all__ = [
    "AUTO_CANDIDATES",
    "BUILTIN_RECIPES",
    "DEADLINE_MARGIN",
    "DEFAULT_RENTABLE",
    "DEFAULT_SPEEDS",
    "LR_RULES",
    "MODEL_ALIASES",
    "PROFILE_MAX_AGE_H",
    "RECIPE_ALIASES",
    "RECIPE_DESCRIPTION",
    "RECIPE_NOTES",
    "RECIPE_PATTERN",
    "ClusterSpec",
    "ConfigError",
    "ConfigModel",
    "DatasetSpec",
    "DiLoCoConfig",
    "FaultPolicy",
    "FormChoices",
    "FormFields",
    "ProfileHistory",
    "RecommendJob",
    "RecommendMarket",
    "RecommendObjective",
    "RecommendRequest",
    "RentableType",
    "SpotOverride",
    "TrackingConfig",
    "TrainConfig",
    "WorkerSpec",
    "alias_note",
    "check_fsdp",
    "check_job",
    "default_cluster",
    "default_rentable",
    "describe_validation_error",
    "finite_positive",
    "form_schema",
    "fp16_fields",
    "link_cluster",
    "load_mapping",
    "lr_factor",
    "offer_choices",
    "parse_speeds",
    "suggestion",
    "validated",
]
