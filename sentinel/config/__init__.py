"""The one settings tree: file (TOML or YAML), then ``SENTINEL_*`` environment, then CLI flags.

``models`` is the schema (each option declared once), ``load`` reads and merges
the layers, ``errors`` words a bad value with the key and the source it came
from, ``masked`` registers and masks the secrets the settings hold,
``renames`` moves old key names to their new ones, and ``addresses`` reads ``--http``'s
``ADDR:PORT``. The bounds every number and text keeps are ``sentinel.model.bounds``'.
"""

from __future__ import annotations

from sentinel.config.errors import ConfigError
from sentinel.config.load import load_settings
from sentinel.config.masked import effective_config, register_secrets
from sentinel.config.models import (
    CLI_FIELDS,
    ENV_PREFIX,
    RESTART_ENV,
    CostConfig,
    JobConfig,
    KeepConfig,
    ParserConfig,
    RulesConfig,
    Settings,
    TailConfig,
    TrainingConfig,
    WatchConfig,
    setting_default,
)
from sentinel.gpu.settings import GpuConfig
from sentinel.notify.settings import NotifyConfig, NotifyTarget
from sentinel.process.settings import ProcessConfig

__all__ = [
    "CLI_FIELDS",
    "ENV_PREFIX",
    "RESTART_ENV",
    "ConfigError",
    "CostConfig",
    "GpuConfig",
    "JobConfig",
    "KeepConfig",
    "NotifyConfig",
    "NotifyTarget",
    "ParserConfig",
    "ProcessConfig",
    "RulesConfig",
    "Settings",
    "TailConfig",
    "TrainingConfig",
    "WatchConfig",
    "effective_config",
    "load_settings",
    "register_secrets",
    "setting_default",
]
