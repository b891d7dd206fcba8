"""The schema of the settings tree: one model a table, ``Settings`` at the top.

Each option is declared once, here. The CLI flags of the common case map onto
fields through ``CLI_FIELDS``; the environment uses the field path joined by
``__`` (``SENTINEL_RULES__STALL__SOFT_TIMEOUT_S``).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import create_model as _create_model
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from sentinel.config import resume
from sentinel.config.addresses import parse_http_address
from sentinel.config.reference import load_reference
from sentinel.follow.gathering import LOOK_S
from sentinel.gpu.settings import GpuConfig
from sentinel.model import bounds
from sentinel.model.bounds import MAX_NAME_CHARS, SettingsTable
from sentinel.model.facts import RunFacts
from sentinel.notify.settings import NotifyConfig
from sentinel.parsing.lines import BATCH_S, MAX_BATCH_S
from sentinel.process.settings import ProcessConfig
from sentinel.rules import DETECTORS, RuleConfig

ENV_PREFIX = "SENTINEL_"
#: Variables sentinel sets for the job it restarts; never config.
RESTART_ENV = resume.RESTART_ENV


def _split_words(value: object) -> object:
    """Let a plain string stand for a list: ``"a.log b.log"`` or ``"a.log,b.log"``."""
    if isinstance(value, str):
        return [part for part in re.split(r"[\s,]+", value) if part]
    return value


class JobConfig(SettingsTable):
    """``[job]``: how the job is run and restarted."""

    #: The job's name in messages; unset: its script's (``run``) or its target (``watch``).
    name: str = Field(default="", max_length=MAX_NAME_CHARS)
    #: Run instead of the original command after a rollback; ``{checkpoint}``
    #: and ``{step}`` are filled in, each inside its own argument (sentinel.config.resume).
    resume_command: str | None = None
    max_restarts: int = Field(default=3, ge=0, le=1000)
    #: When no clean checkpoint is left to resume from: "give_up" (exit 90, say why) or
    #: "scratch" (run the original command again, from step 0).
    restart_without_checkpoint: Literal["give_up", "scratch"] = "give_up"
    #: Between the stop signal and SIGKILL: long enough for the job to save and exit.
    grace_period_s: float = Field(default=30.0, ge=0, le=86400)
    #: The first signal sent to the job's tree (SIGKILL for frameworks that would save a
    #: poisoned checkpoint on SIGTERM, such as Megatron's exit-signal handler).
    stop_signal: str = "SIGTERM"
    #: First wait before a restart; doubles with each restart up to the max.
    restart_backoff_s: float = Field(default=5.0, ge=0)
    restart_backoff_max_s: float = Field(default=300.0, ge=0)
    #: A job that lives this long counts as started (Supervisor's ``startsecs``).
    min_uptime_s: float = Field(default=10.0, ge=0)
    #: Give the job one pseudo-terminal for its stdout and stderr (``run``), so progress
    #: bars (tqdm, rich) draw live, Python buffers by line and both streams arrive in the
    #: order written, as at a terminal; off (``--no-pty``): two pipes.
    pty: bool = True
    #: Without a terminal (``pty = false``), set PYTHONUNBUFFERED=1 for the job, so its
    #: printed metrics arrive as written.
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

    @field_validator("stop_signal")
    @classmethod
    def _a_signal(cls, name: str) -> str:
        upper = name.upper()
        upper = upper if upper.startswith("SIG") else "SIG" + upper
        if upper not in signal.Signals.__members__:
            raise ValueError(f"{name!r} is not a signal name such as SIGTERM, SIGINT or SIGKILL")
        return upper


class WatchConfig(SettingsTable):
    """``[watch]``: the job ``sentinel watch`` attaches to (one of pid, pidfile, match, unit)."""

    pid: int | None = Field(default=None, ge=1)
    #: A file holding the job's pid, re-read whenever the target is gone.
    pidfile: Path | None = None
    #: A regular expression over the job's command line; its root process is the job.
    match: str | None = None
    #: With ``match``: only processes of this user.
    user: str | None = None
    #: A systemd unit whose MainPID is the job.
    systemd_unit: str | None = None
    #: With ``systemd_unit``: a unit of the user's own service manager (``systemctl --user``).
    systemd_user: bool = False
    #: How long to wait for the target to appear; unset: forever.
    wait_s: float | None = Field(default=None, ge=0)

    @field_validator("match")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"{pattern!r} is not a valid regular expression: {error}") from (
                    None
                )
        return pattern


class TrainingConfig(SettingsTable):
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


class CostConfig(SettingsTable):
    """``[cost]``: what the job's GPUs cost, for ``cost_overrun``, ``gpu_idle`` and reports."""

    #: Price of one GPU for one hour, in your currency. Unset: no money is counted.
    price_per_gpu_hour: float | None = Field(default=None, ge=0)
    #: GPUs the job holds (billed). Unset: ``[training] world_size`` when that is given
    #: (one GPU a data-parallel rank), else those the GPU source attributes to the job.
    #: Set it where a rank holds several GPUs (tensor or pipeline parallelism).
    gpus: int | None = Field(default=None, ge=1)


class TailConfig(SettingsTable):
    """``[tail]``: how lines are read, from log files and from the job's own output."""

    #: Poll instead of using inotify (network filesystems); automatic when inotify fails.
    poll: bool = False
    poll_interval_s: float = Field(default=1.0, gt=0)
    max_line_bytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    #: How long busy output (a log's, or the job's) gathers before the rules get it: a
    #: chatty job then costs the rules a turn a window, not a turn a read. The first line
    #: after a quiet spell goes at once, and so does a NaN, an error or a traceback (at the
    #: look that finds it: ``look_s``); other lines of a busy stream reach the rules up to
    #: this late, each still placed by when it was written (to a quarter second). ``run``
    #: shows the job's output every quarter second at most, whatever this is. 0: every read.
    batch_s: float = Field(default=BATCH_S, ge=0, le=MAX_BATCH_S)
    #: While output flows, how often the new bytes are looked at for a NaN or an error,
    #: which is handed on at once, not at the window's end: the latency of a NaN inside a
    #: busy stream, for a wake-up each look (longer: less CPU, a later stop).
    look_s: float = Field(default=LOOK_S, gt=0, le=1.0)
    #: Find and follow the metric files a framework writes (Lightning's ``metrics.csv``,
    #: TensorBoard event files, MLflow's ``mlruns``, JSON-lines metrics) as they appear
    #: under ``discover_dir``, without a ``--log`` for them.
    discover: bool = True
    #: Where to look; unset: the job's working directory for ``run``, nowhere for
    #: ``watch`` (its job may run elsewhere).
    discover_dir: Path | None = None


class KeepConfig(SettingsTable):
    """``[keep]``: clean copies of the checkpoints the job overwrites or deletes, and the disk
    they take.

    A file with no step in its name (``ckpt.pt``, ``last.pt``) is rewritten at every save; a
    checkpoint named by its step (``model_step40.pt``, ``checkpoint-400/``) is deleted by a
    job that keeps only its newest few. sentinel keeps their last clean versions under
    ``<checkpoints>/.sentinel-kept/``.
    """

    #: Keep checkpoints up to this size (4 GiB; a folder: its files together); 0: keep none.
    max_bytes: int = Field(default=4 * 1024**3, ge=0)
    #: Versions kept per overwritten file, and checkpoints kept of those named by their step:
    #: the newest may be poisoned, so at least two.
    versions: int = Field(default=2, ge=2, le=100)
    #: A version is kept once its size and modification time held this long (two looks
    #: apart): a save still being written is not a version. Longer for a filesystem that
    #: writes in long pauses (a network mount), shorter for a job that rewrites one file
    #: more often than that.
    settle_s: float = Field(default=2.0, gt=0, le=3600)
    #: ``sentinel status`` warns when the quarantine and the kept copies take more; unset: never.
    warn_disk_bytes: int | None = Field(default=None, ge=1)


class EvidenceConfig(SettingsTable):
    """``[evidence]``: what sentinel takes from a live job before it stops it for a stall, a
    hang, a rank's crash or a GPU fault (stacks, threads, nvidia-smi, XID lines, output)."""

    #: Take it; off: the stop goes at once, with no evidence.
    enabled: bool = True
    #: At most this long before the first signal; what is not taken by then is said so.
    budget_s: float = Field(default=3.0, ge=0, le=60)
    #: Draw each incident's chart (PNG and SVG, in a child process; needs matplotlib, the
    #: ``evidence`` extra); off: the report keeps its text sparklines and no child is started.
    chart: bool = True


class ParserConfig(SettingsTable):
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


class ReferenceSettings(SettingsTable):
    """``[reference]``: a finished run of the same recipe whose curve a run should follow."""

    #: Its ``trainer_state.json``, metrics file, log or run folder (``--reference``).
    path: Path | None = None
    #: Whether leaving its band stops the job on its own (else it warns, and acts when
    #: another rule agrees: people re-run a recipe on purpose with changes).
    act: bool = False

    @field_validator("path")
    @classmethod
    def _readable(cls, path: Path | None) -> Path | None:
        if path is not None:
            load_reference(path)  # ReferenceError (a ValueError) says why it cannot be read
        return path


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
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", allow_inf_nan=False
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The values given, only: ``load_settings`` reads the environment, the secrets
        dir and the file as layers of its own (renamed keys moved, each error naming its
        source). Read here as well, a renamed key's variable came back under its old
        name beside the new one, and sentinel refused to start: "persist_steps is the old
        name of sustain: give only sustain"."""
        return (init_settings,)

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
    tick_interval_s: float = Field(default=1.0, gt=0, le=3600)
    #: Serve /metrics, /livez, /healthz and /readyz at ADDR:PORT (loopback unless an address
    #: is given, ":9464" included); unset: no HTTP.
    http: str | None = None
    #: Write the metrics for node_exporter's textfile collector here each tick (``*.prom``).
    metrics_textfile: Path | None = None
    #: Also write the final verdict's bare code here, on one line.
    verdict_file: Path | None = None
    #: On SIGTERM, how long to go on delivering pending notices before exiting.
    drain_timeout_s: float = Field(default=10.0, ge=0)
    #: The run's id, the same on every node (``--run-id``); unset: the job's own id from the
    #: environment (SLURM_JOB_ID, TORCHELASTIC_RUN_ID), else none. With it, the first node
    #: to decide writes the run's verdict under the checkpoint dir and the others adopt it.
    run_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    job: JobConfig = Field(default_factory=JobConfig)
    watch: WatchConfig = Field(default_factory=WatchConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    process: ProcessConfig = Field(default_factory=ProcessConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    tail: TailConfig = Field(default_factory=TailConfig)
    keep: KeepConfig = Field(default_factory=KeepConfig)
    parsers: ParserConfig = Field(default_factory=ParserConfig)
    reference: ReferenceSettings = Field(default_factory=ReferenceSettings)
    evidence: EvidenceConfig = Field(default_factory=EvidenceConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)  # type: ignore[valid-type]

    _split_logs = field_validator("logs", mode="before")(_split_words)
    # The bounds every table keeps (SettingsTable's), for the top-level settings too.
    _plain_input = field_validator("*", mode="before")(classmethod(bounds.plain_input))
    _within_bounds = field_validator("*", mode="after")(classmethod(bounds.within_bounds))

    @field_validator("http")
    @classmethod
    def _an_address(cls, address: str | None) -> str | None:
        if address is not None:
            parse_http_address(address)  # ValueError: says what is wrong with it
        return address

    @field_validator("notify")
    @classmethod
    def _known_rules(cls, notify: NotifyConfig) -> NotifyConfig:
        """Each target routes rules that exist."""
        for index, target in enumerate(notify.targets):
            unknown = sorted(set(target.rules) - set(DETECTORS))
            if unknown:
                raise ValueError(
                    f"targets[{index}].rules: unknown rule(s) {', '.join(unknown)};"
                    f" known: {', '.join(DETECTORS)}"
                )
        return notify

    @model_validator(mode="after")
    def _gpus_from_world_size(self) -> Settings:
        """The GPUs billed default to the data-parallel ranks, when those were given."""
        if self.cost.gpus is None and "world_size" in self.training.model_fields_set:
            self.cost.gpus = self.training.world_size
        return self

    def run_facts(self) -> RunFacts:
        """What ``[training]`` and ``[cost]`` tell of the run; the log may say better."""
        path = self.reference.path
        return RunFacts(
            samples_per_step=self.training.samples_per_step,
            max_steps=self.training.max_steps,
            gpus=self.cost.gpus,
            price_per_gpu_hour=self.cost.price_per_gpu_hour,
            reference=None if path is None else load_reference(path),
            reference_acts=self.reference.act,
        )

    def rule(self, rule: str) -> RuleConfig:
        """The config of one rule by its id."""
        config = getattr(self.rules, rule)
        assert isinstance(config, RuleConfig)
        return config


#: CLI option dest -> the field it sets. The CLI declares no option of its own.
CLI_FIELDS: dict[str, tuple[str, ...]] = {
    "log": ("logs",),
    "discover": ("tail", "discover_dir"),
    "checkpoints": ("checkpoints",),
    "notify": ("notify", "urls"),
    "state_dir": ("state_dir",),
    "max_restarts": ("job", "max_restarts"),
    "resume_command": ("job", "resume_command"),
    "dry_run": ("dry_run",),
    "http": ("http",),
    "metrics_textfile": ("metrics_textfile",),
    "verdict_file": ("verdict_file",),
    "stop_signal": ("job", "stop_signal"),
    "no_pty": ("job", "pty"),
    "drain_timeout": ("drain_timeout_s",),
    "run_id": ("run_id",),
    "pid": ("watch", "pid"),
    "pidfile": ("watch", "pidfile"),
    "match": ("watch", "match"),
    "user": ("watch", "user"),
    "systemd_unit": ("watch", "systemd_unit"),
    "systemd_user": ("watch", "systemd_user"),
    "wait": ("watch", "wait_s"),
    "reference": ("reference", "path"),
}


def setting_default(path: tuple[str, ...]) -> Any:
    """The default of the setting at ``path`` (``("job", "max_restarts")``), as the model has it."""
    model: Any = Settings
    for name in path[:-1]:
        model = model.model_fields[name].annotation
    return model.model_fields[path[-1]].get_default(call_default_factory=True)
