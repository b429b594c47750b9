"""The base config a ``stitchrec tune`` study was created with, recorded in its journal: a
study continued with another base config (its file or ``--set`` values) is refused, as one
continued with another search space is (``pipelines.tune_space.check_study_space``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pipelines.config import PipelineConfig
from pipelines.tune_space import Param, check_record

#: the study's user attribute recording its base config (``base_record``)
BASE_ATTR = "base_config"


def base_record(base: PipelineConfig, space: list[Param]) -> dict[str, Any]:
    """The base config as the study journal records it: ``{dotted key: value}`` of the config
    the trials start from (``[tune]`` stripped, ``--set`` applied, defaults filled in, paths
    absolute), without ``output_dir`` (the trials write into the tune folder) and the keys the
    space sets (each trial sets its own)."""
    doc = tomllib.loads(base.to_toml())
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    spaced = [p.key for p in space]
    return json.loads(
        json.dumps(
            {
                k: v
                for k, v in flat.items()
                if k != "output_dir" and not any(k == s or k.startswith(s + ".") for s in spaced)
            },
            default=str,
        )
    )


def check_study_base(study: Any, base: PipelineConfig, space: list[Param], journal: Path) -> None:
    """Records the base config (``base_record``) in the study (user attribute ``BASE_ATTR``)
    when it holds none (a new study, or one from a journal written without it: continued as it
    is), else raises ConfigError naming the study's ``journal`` and the keys that differ."""
    spaced = [p.key for p in space]
    check_record(
        study,
        BASE_ATTR,
        base_record(base, space),
        journal,
        "base config",
        "the config file and --set values it was created with",
        json.dumps,
        keep=lambda k: not any(k == s or k.startswith(s + ".") for s in spaced),
    )
