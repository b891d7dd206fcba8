"""The one settings tree: file (TOML or YAML), then ``SENTINEL_*`` environment, then CLI flags.

Each option is declared once, here. The CLI flags of the common case map onto
fields through ``CLI_FIELDS``; the environment uses the field path joined by
``__`` (``SENTINEL_RULES__STALL__SOFT_TIMEOUT_S``). Validation happens before
anything starts, and every error names the key and where its value came from.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic import create_model as _create_model
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    SettingsConfigDict,
    SettingsError,
)

from sentinel import resume, secrets
from sentinel.config_renames import REMOVED_IN, Rename, move_old_keys
from sentinel.detectors import DETECTORS, RuleConfig
from sentinel.records import Severity
from sentinel.sources.lines import BATCH_S, MAX_BATCH_S

log = logging.getLogger(__name__)

ENV_PREFIX = "SENTINEL_"
#: Variables sentinel sets for the job it restarts; never config.
RESTART_ENV = resume.RESTART_ENV


class ConfigError(Exception):
    """An invalid setting: names the key and the source of its value."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def _split_words(value: object) -> object:
    """Let a plain string stand for a list: ``"a.log b.log"`` or ``"a.log,b.log"``."""
    if isinstance(value, str):
        return [part for part in re.split(r"[\s,]+", value) if part]
    return value


def _split_urls(value: object) -> object:
    """Apprise URLs from one string are separated by whitespace (a URL may hold commas)."""
    if isinstance(value, str):
        return value.split()
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobConfig(_Model):
    """``[job]``: how the job is run and restarted."""

    name: str = ""
    #: Run instead of the original command after a rollback; ``{checkpoint}``
    #: and ``{step}`` are filled in, each inside its own argument (sentinel.resume).
    resume_command: str | None = None
    max_restarts: int = Field(default=3, ge=0)
    #: When no clean checkpoint is left to resume from: "give_up" (exit 90, say why) or
    #: "scratch" (run the original command again, from step 0).
    restart_without_checkpoint: Literal["give_up", "scratch"] = "give_up"
    #: Between SIGTERM and SIGKILL: long enough for the job to save and exit.
    grace_period_s: float = Field(default=30.0, ge=0)
    #: First wait before a restart; doubles with each restart up to the max.
    restart_backoff_s: float = Field(default=5.0, ge=0)
    restart_backoff_max_s: float = Field(default=300.0, ge=0)
    #: A job that lives this long counts as started (Supervisor's ``startsecs``).
    min_uptime_s: float = Field(default=10.0, ge=0)
    #: Set PYTHONUNBUFFERED=1 for the job, so its printed metrics arrive as written.
    unbuffered: bool = True
    #: A link to the run's dashboard put in every message, e.g.
    #: ``https://wandb.ai/acme/llm/runs/{env[WANDB_RUN_ID]}``; ``{job}``, ``{host}``,
    #: ``{run_id}`` (sentinel's) and ``{env[NAME]}`` are substituted.
    dashboard_url: str = ""

    @field_validator("resume_command")
    @classmethod
    def _splits(cls, template: str | None) -> str | None:
        if template is not None:
            resume.parse_template(template)
        return template

    @property
    def resume_argv(self) -> list[str] | None:
        """The resume command's arguments, placeholders unfilled; None without one."""
        if self.resume_command is None:
            return None
        return resume.parse_template(self.resume_command)


class TrainingConfig(_Model):
    """``[training]``: facts about the training run that its log may not say.

    Used to explain incidents (the sample range of the step to inspect) and, for
    facts the log does state (HF's "Total train batch size"), a fallback.
    """

    #: Samples per device per forward pass (HF ``per_device_train_batch_size``).
    batch_size: int | None = Field(default=None, ge=1)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    #: Data-parallel processes (ranks) sharing each optimizer step. When given, it is also
    #: the GPUs the job holds (one a rank) unless ``[cost] gpus`` says otherwise.
    world_size: int = Field(default=1, ge=1)
    #: Optimizer steps the run will take (HF ``max_steps``).
    max_steps: int | None = Field(default=None, ge=1)

    @property
    def samples_per_step(self) -> int | None:
        """Samples consumed by one optimizer step, when the batch size is known."""
        if self.batch_size is None:
            return None
        return self.batch_size * self.gradient_accumulation_steps * self.world_size


class GpuConfig(_Model):
    """``[gpu]``: the NVML source. Without NVML (no driver, no GPU) the GPU rules are off."""

    enabled: bool = True
    #: Seconds between readings of every GPU. One reading costs a few NVML calls a GPU.
    interval_s: float = Field(default=5.0, gt=0)
    #: Which GPUs are the job's: "auto" takes those running one of the job's processes, or
    #: every visible GPU when NVML shows none of them (a container's own PID namespace
    #: hides them); "job" only the former; "all" every visible GPU.
    attribution: Literal["auto", "job", "all"] = "auto"
    #: Wait for XID critical errors on a thread of their own (NVML event set).
    xid_events: bool = True


class ProcessConfig(_Model):
    """``[process]``: the job's process tree (psutil)."""

    enabled: bool = True
    #: Seconds between readings of the tree: CPU, RSS, states, I/O.
    interval_s: float = Field(default=5.0, gt=0)


class CostConfig(_Model):
    """``[cost]``: what the job's GPUs cost, for ``cost_overrun``, ``gpu_idle`` and reports."""

    #: Price of one GPU for one hour, in your currency. Unset: no money is counted.
    price_per_gpu_hour: float | None = Field(default=None, ge=0)
    #: GPUs the job holds (billed). Unset: ``[training] world_size`` when that is given
    #: (one GPU a data-parallel rank), else those the GPU source attributes to the job.
    #: Set it where a rank holds several GPUs (tensor or pipeline parallelism).
    gpus: int | None = Field(default=None, ge=1)


class TailConfig(_Model):
    """``[tail]``: how lines are read, from log files and from the job's own output."""

    #: Poll instead of using inotify (network filesystems); automatic when inotify fails.
    poll: bool = False
    poll_interval_s: float = Field(default=1.0, gt=0)
    max_line_bytes: int = Field(default=1 << 20, ge=1024)
    #: After reading lines (of a log, or of the job's output), let more gather this long
    #: before reading again: a chatty job then costs a wake-up per window, not per line.
    #: The first line after a quiet spell (no output for this long) is read at once; a
    #: line inside a busy stream (a NaN among a hundred lines a second) waits up to this
    #: long. 0: read at every write.
    batch_s: float = Field(default=BATCH_S, ge=0, le=MAX_BATCH_S)


class KeepConfig(_Model):
    """``[keep]``: clean copies of checkpoint files the job overwrites, and the disk they take.

    A file with no step in its name (``ckpt.pt``, ``last.pt``) is rewritten at every save;
    sentinel keeps its last clean versions under ``<checkpoints>/.sentinel-kept/``.
    """

    #: Keep versions of files up to this size (4 GiB); 0: keep none.
    max_bytes: int = Field(default=4 * 1024**3, ge=0)
    #: Versions kept per file: the newest may be poisoned, so at least two.
    versions: int = Field(default=2, ge=2)
    #: ``sentinel status`` warns when the quarantine and the kept copies take more; unset: never.
    warn_disk_bytes: int | None = Field(default=None, ge=1)


class ParserConfig(_Model):
    """``[parsers]``: extra line formats."""

    #: Regular expressions with named groups; each group but ``step`` and ``time`` is a metric.
    regexes: list[str] = Field(default_factory=list)
    #: The HF Trainer's ``logging_steps``. When set, the step of each printed metric dict
    #: is counted (exact even when the job's stdout was buffered); unset, it is taken from
    #: the last progress bar seen, which can lag by a step when tqdm skipped a redraw.
    logging_steps: int | None = Field(default=None, ge=1)

    @field_validator("regexes")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                compiled = re.compile(pattern)
            except re.error as error:
                raise ValueError(
                    f"{pattern!r} is not a valid regular expression: {error}"
                ) from None
            if not compiled.groupindex:
                raise ValueError(f"{pattern!r} has no named group such as (?P<loss>...)")
        return patterns


def _accepted_url(url: SecretStr) -> SecretStr:
    """An apprise URL apprise accepts; the error shows it masked."""
    from sentinel.actions.notify import mask_url, validate_url

    problem = validate_url(url.get_secret_value())
    if problem:
        raise ValueError(f"{mask_url(url.get_secret_value())}: {problem}")
    return url


class NotifyTarget(_Model):
    """``[[notify.targets]]``: one apprise URL with its own route."""

    url: SecretStr
    #: Shown instead of the masked URL in ``sentinel status`` and the logs.
    name: str = ""
    #: The least severe alert this target gets; unset: ``[notify] min_severity``.
    min_severity: Severity | None = None
    #: Only incidents of these rules reach this target; empty: every rule.
    rules: list[str] = Field(default_factory=list)

    _accepted = field_validator("url")(_accepted_url)

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, rules: list[str]) -> list[str]:
        unknown = sorted(set(rules) - set(DETECTORS))
        if unknown:
            raise ValueError(f"unknown rule(s) {', '.join(unknown)}; known: {', '.join(DETECTORS)}")
        return rules


class NotifyConfig(_Model):
    """``[notify]``: where alerts go, and how often people hear of them."""

    #: Apprise URLs (https://github.com/caronc/apprise/wiki); they hold tokens and are never logged.
    #: Each gets every incident at ``min_severity`` or worse.
    urls: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    #: Targets with routes of their own (severity, rules), beside ``urls``.
    targets: list[NotifyTarget] = Field(default_factory=list)
    min_severity: Severity = Severity.WARNING
    timeout_s: float = Field(default=10.0, gt=0)
    retry_max_s: float = Field(default=300.0, gt=0)
    #: Notices raised within this many seconds of the first go out as one message
    #: (a NaN, the grad-norm run before it and the rollback that followed).
    group_wait_s: float = Field(default=30.0, ge=0)
    #: An incident still open and critical is announced again this often (Alertmanager: 4 h).
    repeat_interval_s: float = Field(default=4 * 3600.0, gt=0)
    #: Send a message when an announced incident resolves.
    send_resolved: bool = True
    #: At most this many messages per target per ``rate_window_s``; the rest are folded
    #: into one digest (every alert stays in the journal).
    rate_limit: int = Field(default=20, ge=1)
    rate_window_s: float = Field(default=3600.0, gt=0)
    #: A rule whose incidents open this many times within ``flap_window_s`` is flapping:
    #: one message says so, and its opens and resolves are held until it settles.
    flap_threshold: int = Field(default=3, ge=2)
    flap_window_s: float = Field(default=3600.0, gt=0)
    #: A URL pinged every ``heartbeat_interval_s`` while sentinel is healthy (a dead-man
    #: switch such as healthchecks.io), so silence from sentinel itself is noticed.
    heartbeat_url: SecretStr | None = None
    heartbeat_interval_s: float = Field(default=300.0, gt=0)

    _split = field_validator("urls", mode="before")(_split_urls)

    @field_validator("urls")
    @classmethod
    def _apprise_accepts(cls, urls: list[SecretStr]) -> list[SecretStr]:
        return [_accepted_url(url) for url in urls]


_RULE_FIELDS: dict[str, Any] = {
    rule: (detector.config_model, Field(default_factory=detector.config_model))
    for rule, detector in DETECTORS.items()
}
#: ``[rules]``: one table per registered detector, so a new rule needs no edit here.
RulesConfig: type[BaseModel] = _create_model(
    "RulesConfig", __config__=ConfigDict(extra="forbid"), **_RULE_FIELDS
)


class Settings(BaseSettings):
    """Everything sentinel can be told."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid"
    )

    #: A directory of secret files (a Kubernetes or Docker secret mount): a file named
    #: like a setting's environment variable (``SENTINEL_NOTIFY__URLS``) holds its value.
    secrets_dir: Path | None = None
    #: Files to follow, by path or glob; they need not exist yet.
    logs: Annotated[list[str], NoDecode] = Field(default_factory=list)
    #: The job's checkpoint directory (rollback quarantines in here).
    checkpoints: Path | None = None
    state_dir: Path = Path(".sentinel")
    #: Detect and notify, but never signal, move or restart.
    dry_run: bool = False
    #: Granularity of the time-based rules (stall).
    tick_interval_s: float = Field(default=1.0, gt=0)
    job: JobConfig = Field(default_factory=JobConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    process: ProcessConfig = Field(default_factory=ProcessConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    tail: TailConfig = Field(default_factory=TailConfig)
    keep: KeepConfig = Field(default_factory=KeepConfig)
    parsers: ParserConfig = Field(default_factory=ParserConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)  # type: ignore[valid-type]

    _split_logs = field_validator("logs", mode="before")(_split_words)

    @model_validator(mode="after")
    def _gpus_from_world_size(self) -> Settings:
        """The GPUs billed default to the data-parallel ranks, when those were given."""
        if self.cost.gpus is None and "world_size" in self.training.model_fields_set:
            self.cost.gpus = self.training.world_size
        return self

    def rule(self, rule: str) -> RuleConfig:
        """The config of one rule by its id."""
        config = getattr(self.rules, rule)
        assert isinstance(config, RuleConfig)
        return config


#: CLI option dest -> the field it sets. The CLI declares no option of its own.
CLI_FIELDS: dict[str, tuple[str, ...]] = {
    "log": ("logs",),
    "checkpoints": ("checkpoints",),
    "notify": ("notify", "urls"),
    "state_dir": ("state_dir",),
    "max_restarts": ("job", "max_restarts"),
    "resume_command": ("job", "resume_command"),
    "dry_run": ("dry_run",),
}


@dataclass(frozen=True)
class _Layer:
    """One source of values and how to name it in an error."""

    values: dict[str, Any]
    describe: Callable[[tuple[str | int, ...]], str]
    #: Whether the layer names a value by its variable (environment, secret files).
    by_variable: bool = False


def _named_by(names: Mapping[tuple[str, ...], str], fallback: str) -> Any:
    """Describe a key by the variable or file that set it: the longest prefix of its path."""

    def describe(loc: tuple[str | int, ...]) -> str:
        parts = tuple(str(part).lower() for part in loc)
        for end in range(len(parts), 0, -1):
            if parts[:end] in names:
                return names[parts[:end]]
        return fallback

    return describe


def _take_old_names(layers: list[_Layer]) -> list[_Layer]:
    """Move each renamed key to its new name, warning once for each, naming its source.

    An old key and its new one both given (in one source or two) is an error naming
    both. Errors in a moved value name the old key as the user wrote it.
    """
    found = [move_old_keys(layer.values) for layer in layers]
    problems = []
    for layer, (moved, clashes) in zip(layers, found, strict=True):
        problems += [_clash(rename, layer, layer) for rename in clashes]
        for rename in moved:
            for other, (other_moved, _) in zip(layers, found, strict=True):
                given_new = other is not layer and rename not in other_moved
                if given_new and _has_path(other.values, rename.new):
                    problems.append(_clash(rename, layer, other))
    if problems:
        raise ConfigError(problems)
    out = []
    for layer, (moved, _) in zip(layers, found, strict=True):
        for rename in moved:
            new = _dotted(rename.new)
            if layer.by_variable:
                new += f" ({ENV_PREFIX}{'__'.join(rename.new).upper()})"
            log.warning(
                "%s (from %s) is deprecated: use %s; the old name goes in %s",
                _dotted(rename.old),
                layer.describe(rename.old),
                new,
                REMOVED_IN,
            )
        out.append(_Layer(layer.values, _as_written(layer, moved), layer.by_variable))
    return out


def _clash(rename: Rename, old_layer: _Layer, new_layer: _Layer) -> str:
    old, new = _dotted(rename.old), _dotted(rename.new)
    return (
        f"{old} (from {old_layer.describe(rename.old)}) and {new} (from"
        f" {new_layer.describe(rename.new)}) are one setting: give only {new}"
        f" ({rename.old[-1]} is its old name)"
    )


def _as_written(layer: _Layer, moved: list[Rename]) -> Callable[[tuple[str | int, ...]], str]:
    """``layer.describe``, naming a moved value by its old key where the user wrote it."""
    if not moved:
        return layer.describe

    def describe(loc: tuple[str | int, ...]) -> str:
        for rename in moved:
            if loc[: len(rename.new)] == rename.new:
                where = layer.describe(rename.old)
                return where if layer.by_variable else f"{_dotted(rename.old)} in {where}"
        return layer.describe(loc)

    return describe


def load_settings(
    config_file: Path | None = None,
    *,
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Validate file, secrets dir, environment and CLI values into one ``Settings``.

    Raises ``ConfigError``. Every URL the settings hold is registered with
    ``sentinel.secrets``, so its tokens are masked wherever sentinel writes.
    """
    environ = os.environ if environ is None else environ
    if config_file is None and environ.get("SENTINEL_CONFIG"):
        config_file = Path(environ["SENTINEL_CONFIG"])
    file_values = _read_file(config_file) if config_file is not None else {}
    settings_env = {key: value for key, value in environ.items() if _is_setting(key)}
    env_values, env_names = _read_env_like(settings_env, {key: key for key in settings_env})
    secrets_dir = _secrets_dir(env_values, env_names, file_values, config_file)
    secret_values, secret_names = _read_secrets_dir(secrets_dir) if secrets_dir else ({}, {})
    cli_values: dict[str, Any] = {}
    for dest, value in (cli or {}).items():
        if value is None or value == [] or value is False:
            continue
        _set_path(cli_values, CLI_FIELDS[dest], value)

    layers = [
        _Layer(cli_values, lambda loc: f"--{str(_flag_for(loc)).replace('_', '-')}"),
        _Layer(env_values, _named_by(env_names, "the environment"), by_variable=True),
        _Layer(secret_values, _named_by(secret_names, str(secrets_dir)), by_variable=True),
        _Layer(file_values, lambda loc: str(config_file)),
    ]
    layers = _take_old_names(layers)
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        _deep_merge(merged, layer.values)
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as error:
        raise ConfigError([_describe(problem, layers) for problem in error.errors()]) from None
    heartbeat = settings.notify.heartbeat_url
    if heartbeat is not None and urlsplit(heartbeat.get_secret_value()).scheme not in _HTTP:
        loc = ("notify", "heartbeat_url")
        raise ConfigError([_where(loc, layers) + ": must be an http:// or https:// URL"])
    resume_argv = settings.job.resume_argv
    if resume_argv and settings.checkpoints is None:
        for placeholder in resume.PLACEHOLDERS:
            if resume.names(resume_argv, placeholder):
                raise ConfigError(
                    [
                        _where(("job", "resume_command"), layers)
                        + f": names {{{placeholder}}} but no checkpoint dir is set"
                        " (--checkpoints or `checkpoints` in the config)"
                    ]
                )
    register_secrets(settings)
    return settings


_HTTP = ("http", "https")


def register_secrets(settings: Settings) -> None:
    """Register the secret fragments of every URL in ``settings`` with ``sentinel.secrets``."""
    notify = settings.notify
    urls = [url.get_secret_value() for url in notify.urls]
    urls += [target.url.get_secret_value() for target in notify.targets]
    if urls:
        from sentinel.actions.notify import _secrets

        for url in urls:
            secrets.register(_secrets(url))
    if notify.heartbeat_url is not None:
        from sentinel.actions.heartbeat import heartbeat_secrets

        secrets.register(heartbeat_secrets(notify.heartbeat_url.get_secret_value()))


def _is_setting(name: str) -> bool:
    """Whether an environment variable or secret file name is meant as a setting."""
    upper = name.upper()
    return upper.startswith(ENV_PREFIX) and upper not in RESTART_ENV


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError([f"--config: cannot read {path}: {error.strerror}"]) from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            data = _load_yaml(path, text)
        else:
            data = tomllib.loads(text)
    except ValueError as error:
        raise ConfigError([f"{path}: not valid {_kind(path)}: {error}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a table of settings"])
    return data


def _kind(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "TOML"


def _load_yaml(path: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            [f"{path}: YAML config needs PyYAML: pip install 'sentinel-watchdog[yaml]'"]
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(str(error)) from None


def _read_env_like(
    values: Mapping[str, str], where: Mapping[str, str]
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Settings from ``SENTINEL_*`` names (variables or secret files) and the path each sets.

    ``values`` holds only names meant as settings; ``where`` names, for an error,
    where each came from (the variable itself, or its secret file).
    """
    names = {_path_of(name): where[name] for name in values}
    try:
        parsed = _parse_env(values)
    except SettingsError:
        # One name's value is not valid JSON (a list or table): find which, without its value.
        problems = []
        for name, value in values.items():
            try:
                _parse_env({name: value})
            except SettingsError as error:
                cause = error.__cause__
                reason = cause.msg if isinstance(cause, json.JSONDecodeError) else "unparsable"
                key = _dotted(_path_of(name))
                problems.append(f"{key} (from {where[name]}): not valid JSON: {reason}")
        raise ConfigError(problems or ["a setting's value is not valid JSON"]) from None
    known = {name.lower() for name in Settings.model_fields} | {"config"}
    for name, value in values.items():
        top = _path_of(name)[0]
        if top not in known:
            parsed.setdefault(top, value)  # rejected by extra="forbid", named by _describe
    return parsed, names


def _path_of(name: str) -> tuple[str, ...]:
    """``SENTINEL_NOTIFY__URLS`` -> ``("notify", "urls")``."""
    return tuple(name[len(ENV_PREFIX) :].lower().split("__"))


def _parse_env(values: Mapping[str, str]) -> dict[str, Any]:
    source = EnvSettingsSource(
        Settings, env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False
    )
    source.env_vars = {key.lower(): value for key, value in values.items()}
    parsed: dict[str, Any] = source()
    return parsed


def _secrets_dir(
    env_values: Mapping[str, Any],
    env_names: Mapping[tuple[str, ...], str],
    file_values: Mapping[str, Any],
    config_file: Path | None,
) -> Path | None:
    """The secrets directory named by the environment, else the config file; it must exist."""
    if "secrets_dir" in env_values:
        value, source = env_values["secrets_dir"], env_names[("secrets_dir",)]
    elif "secrets_dir" in file_values:
        value, source = file_values["secrets_dir"], str(config_file)
    else:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError([f"secrets_dir (from {source}): must be the path of a directory"])
    path = Path(value).expanduser()
    if not path.is_dir():
        why = "is not a directory" if path.exists() else "does not exist"
        raise ConfigError([f"secrets_dir (from {source}): {path} {why}"])
    return path


def _read_secrets_dir(
    directory: Path,
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Settings from a secret mount: each ``SENTINEL_*`` file holds one setting's value.

    Names match case-insensitively, as environment variables would be written;
    other files (another program's secrets) and hidden entries (Kubernetes'
    ``..data``) are ignored. A file's content is never shown, only its path.
    """
    values: dict[str, str] = {}
    where: dict[str, str] = {}
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith(".") or not _is_setting(entry.name) or not entry.is_file():
            continue
        if entry.name.upper() in ("SENTINEL_SECRETS_DIR", "SENTINEL_CONFIG"):
            raise ConfigError(
                [f"{entry}: {entry.name} cannot come from the secrets directory it names"]
            )
        try:
            values[entry.name] = entry.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise ConfigError([f"{entry}: the secret file is not UTF-8 text"]) from None
        except OSError as error:
            raise ConfigError([f"{entry}: cannot read the secret file: {error.strerror}"]) from None
        where[entry.name] = str(entry)
    return _read_env_like(values, where)


def _flag_for(loc: tuple[str | int, ...]) -> str:
    for dest, path in CLI_FIELDS.items():
        if tuple(loc[: len(path)]) == path:
            return dest
    return ".".join(str(part) for part in loc)


def _describe(problem: Any, layers: list[_Layer]) -> str:
    loc: tuple[str | int, ...] = tuple(problem["loc"])
    message = str(problem["msg"]).removeprefix("Value error, ")
    if problem["type"] == "extra_forbidden":
        message = "unknown setting" + _suggestion(loc)
    return f"{_where(loc, layers)}: {message}"


def _where(loc: tuple[str | int, ...], layers: list[_Layer]) -> str:
    """The dotted key and the source of its value: ``job.max_restarts (from c.toml)``."""
    key = _dotted(loc)
    for layer in layers:
        if _has_path(layer.values, loc):
            # A table-level error (e.g. hard <= soft) names the keys this layer set inside it.
            sources = sorted({layer.describe(leaf) for leaf in _leaves(layer.values, loc)})
            return f"{key} (from {', '.join(sources)})"
    return key


def _leaves(values: Any, loc: tuple[str | int, ...]) -> list[tuple[str | int, ...]]:
    """The full paths of the values set at or below ``loc``."""
    for part in loc:
        values = values[part]
    if isinstance(values, dict) and values:
        return [loc + rest for rest in _sub_leaves(values)]
    return [loc]


def _sub_leaves(values: dict[str, Any]) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = []
    for sub_key, sub_value in values.items():
        if isinstance(sub_value, dict) and sub_value:
            out += [(sub_key, *rest) for rest in _sub_leaves(sub_value)]
        else:
            out.append((sub_key,))
    return out


def _suggestion(loc: tuple[str | int, ...]) -> str:
    import difflib

    model: Any = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not isinstance(field.annotation, type):
            return ""
        model = field.annotation
    if not hasattr(model, "model_fields"):
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _has_path(values: Any, loc: tuple[str | int, ...]) -> bool:
    for part in loc:
        in_dict = isinstance(values, dict) and part in values
        in_list = isinstance(values, list) and isinstance(part, int) and part < len(values)
        if in_dict or in_list:
            values = values[part]
        else:
            return False
    return True


def _set_path(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        values = values.setdefault(part, {})
    values[path[-1]] = value


def _deep_merge(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def effective_config(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret masked (for ``check-config``).

    URLs keep their readable parts (scheme, host, routing); every other string
    is masked too, in case a registered secret was pasted elsewhere.
    """
    from sentinel.actions.heartbeat import mask_heartbeat_url
    from sentinel.actions.notify import mask_url

    notify = settings.notify
    data = settings.model_dump(mode="json")
    shown = data["notify"]
    shown["urls"] = [mask_url(url.get_secret_value()) for url in notify.urls]
    for target, target_data in zip(notify.targets, shown["targets"], strict=True):
        target_data["url"] = mask_url(target.url.get_secret_value())
    if notify.heartbeat_url is not None:
        shown["heartbeat_url"] = mask_heartbeat_url(notify.heartbeat_url.get_secret_value())
    masked: dict[str, Any] = secrets.mask_data(data)
    return masked
