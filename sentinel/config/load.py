"""Loading the layers: file (TOML or YAML), secrets dir, ``SENTINEL_*`` environment, CLI.

Validation happens before anything starts, and every error names the key and
where its value came from (``sentinel.config.errors``).
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError

from sentinel import install_hint
from sentinel.config import resume
from sentinel.config.errors import (
    ConfigError,
    Layer,
    as_written,
    clash,
    describe_problem,
    dotted,
    flag_for,
    has_path,
    key_and_source,
    named_by,
)
from sentinel.config.masked import register_secrets
from sentinel.config.models import CLI_FIELDS, ENV_PREFIX, RESTART_ENV, Settings
from sentinel.config.renames import REMOVED_IN, move_old_keys

log = logging.getLogger(__name__)


def _take_old_names(layers: list[Layer]) -> list[Layer]:
    """Move each renamed key to its new name, warning once for each, naming its source.

    An old key and its new one both given (in one source or two) is an error naming
    both. Errors in a moved value name the old key as the user wrote it.
    """
    found = [move_old_keys(layer.values) for layer in layers]
    problems = []
    for layer, (moved, clashes) in zip(layers, found, strict=True):
        problems += [clash(rename, layer, layer) for rename in clashes]
        for rename in moved:
            for other, (other_moved, _) in zip(layers, found, strict=True):
                given_new = other is not layer and rename not in other_moved
                if given_new and has_path(other.values, rename.new):
                    problems.append(clash(rename, layer, other))
    if problems:
        raise ConfigError(problems)
    out = []
    for layer, (moved, _) in zip(layers, found, strict=True):
        for rename in moved:
            new = dotted(rename.new)
            if layer.by_variable:
                new += f" ({ENV_PREFIX}{'__'.join(rename.new).upper()})"
            log.warning(
                "%s (from %s) is deprecated: use %s; the old name goes in %s",
                dotted(rename.old),
                layer.describe(rename.old),
                new,
                REMOVED_IN,
            )
        out.append(Layer(layer.values, as_written(layer, moved), layer.by_variable))
    return out


def load_settings(
    config_file: Path | None = None,
    *,
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Validate file, secrets dir, environment and CLI values into one ``Settings``.

    Raises ``ConfigError``. Every URL the settings hold is registered with
    ``sentinel.model.secrets``, so its tokens are masked wherever sentinel writes.
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
        Layer(cli_values, lambda loc: f"--{str(flag_for(loc)).replace('_', '-')}"),
        Layer(env_values, named_by(env_names, "the environment"), by_variable=True),
        Layer(secret_values, named_by(secret_names, str(secrets_dir)), by_variable=True),
        Layer(file_values, lambda loc: str(config_file)),
    ]
    layers = _take_old_names(layers)
    merged: dict[str, Any] = {}
    for layer in reversed(layers):
        _deep_merge(merged, layer.values)
    nul = [key_and_source(loc, layers) + ": holds a NUL character" for loc in _nul_values(merged)]
    if nul:
        # No path or name holds one: the first open() of it raised, past the start.
        raise ConfigError(nul)
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as error:
        problems = [describe_problem(problem, layers) for problem in error.errors()]
        raise ConfigError(problems) from None
    heartbeat = settings.notify.heartbeat_url
    if heartbeat is not None and urlsplit(heartbeat.get_secret_value()).scheme not in _HTTP:
        loc = ("notify", "heartbeat_url")
        raise ConfigError([key_and_source(loc, layers) + ": must be an http:// or https:// URL"])
    resume_argv = settings.job.resume_argv
    if resume_argv and settings.checkpoints is None:
        for placeholder in resume.PLACEHOLDERS:
            if resume.names(resume_argv, placeholder):
                raise ConfigError(
                    [
                        key_and_source(("job", "resume_command"), layers)
                        + f": names {{{placeholder}}} but no checkpoint dir is set"
                        " (--checkpoints or `checkpoints` in the config)"
                    ]
                )
    register_secrets(settings)
    return settings


_HTTP = ("http", "https")


def _is_setting(name: str) -> bool:
    """Whether an environment variable or secret file name is meant as a setting."""
    upper = name.upper()
    return upper.startswith(ENV_PREFIX) and upper not in RESTART_ENV


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError([f"--config: cannot read {path}: {error.strerror}"]) from None
    except UnicodeDecodeError as error:
        line = error.object[: error.start].count(b"\n") + 1
        raise ConfigError(
            [f"{path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} on line {line})"]
        ) from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            data = _load_yaml(path, text)
        else:
            data = tomllib.loads(text)
    except ValueError as error:
        raise ConfigError([f"{path}: not valid {_kind(path)}: {error}"]) from None
    except RecursionError:
        raise ConfigError([f"{path}: not valid {_kind(path)}: nested too deep"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a table of settings"])
    key = _not_a_name(data)
    if key is not None:
        raise ConfigError(
            [
                f"{path}: the key {key!r} is not a name (YAML reads on, off, yes, no and"
                " numbers as values: quote the key)"
            ]
        )
    return data


def _nul_values(value: Any, loc: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Where ``value`` (the merged settings) holds a string with a NUL character."""
    if isinstance(value, str):
        return [loc] if "\x00" in value else []
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _nul_values(item, (*loc, key))]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _nul_values(item, (*loc, i))]
    return []


def _not_a_name(table: dict[Any, Any]) -> Any:
    """The first key of ``table`` or a table in it that is no string, else None."""
    tables = [table]
    while tables:
        for key, value in tables.pop().items():
            if not isinstance(key, str):
                return key
            if isinstance(value, dict):
                tables.append(value)
    return None


def _kind(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "TOML"


def _load_yaml(path: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise ConfigError([f"{path}: YAML config needs PyYAML: {install_hint('yaml')}"]) from None

    class UniqueKeys(yaml.SafeLoader):
        """A key given twice in one table is an error (TOML's rule), not the last one's."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, str) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice", key_node.start_mark
                    )
                if isinstance(key, str):
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=UniqueKeys)  # a SafeLoader: no object built
    except yaml.YAMLError as error:
        raise ValueError(_one_line(error)) from None


def _one_line(error: Any) -> str:
    """A PyYAML error in one line: what is wrong, and where (its own is 8 lines)."""
    problem = getattr(error, "problem", None)
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if not problem:
        return " ".join(str(error).split())
    where = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
    context = getattr(error, "context", None)
    return f"{context + ': ' if context else ''}{problem}{where}"


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
                key = dotted(_path_of(name))
                problems.append(f"{key} (from {where[name]}): not valid JSON: {reason}")
        raise ConfigError(problems or ["a setting's value is not valid JSON"]) from None
    known = {name.lower() for name in Settings.model_fields} | {"config"}
    for name, value in values.items():
        top = _path_of(name)[0]
        if top not in known:
            parsed.setdefault(top, value)  # rejected by extra="forbid", named by describe_problem
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
