"""The secrets a settings tree holds: registered for masking, and masked when shown."""

from __future__ import annotations

from typing import Any

from sentinel.config.models import Settings
from sentinel.model import secrets


def register_secrets(settings: Settings) -> None:
    """Register the secret fragments of every URL in ``settings`` for masking
    (``sentinel.model.secrets``)."""
    notify = settings.notify
    urls = [url.get_secret_value() for url in notify.urls]
    urls += [target.url.get_secret_value() for target in notify.targets]
    for url in urls:
        secrets.register(secrets.url_secrets(url))
    if notify.heartbeat_url is not None:
        secrets.register(secrets.heartbeat_secrets(notify.heartbeat_url.get_secret_value()))


def effective_config(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret masked (for ``check-config``).

    URLs keep their readable parts (scheme, host, routing); every other string
    is masked too, in case a registered secret was pasted elsewhere.
    """
    notify = settings.notify
    data = settings.model_dump(mode="json")
    shown = data["notify"]
    shown["urls"] = [secrets.mask_url(url.get_secret_value()) for url in notify.urls]
    for target, target_data in zip(notify.targets, shown["targets"], strict=True):
        target_data["url"] = secrets.mask_url(target.url.get_secret_value())
    if notify.heartbeat_url is not None:
        shown["heartbeat_url"] = secrets.mask_heartbeat_url(notify.heartbeat_url.get_secret_value())
    masked: dict[str, Any] = secrets.mask_data(data)
    return masked
