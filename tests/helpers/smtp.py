"""A real SMTP server on 127.0.0.1 for tests (aiosmtpd), and the apprise URL that reaches it.

It requires a login (AUTH over plain SMTP, which apprise's ``mode=insecure``
speaks), records each message as a parsed ``EmailMessage``, and lets a test
wait for them with a deadline.

    with SmtpServer() as smtp:
        send_envelope(smtp.url(), envelope, 5.0)
        (mail,) = smtp.wait_for(1)
        assert mail["Subject"] == "[sentinel] CRITICAL nan_inf job=llama-ft step=1342"
"""

from __future__ import annotations

import email
import email.policy
import socket
import threading
from email.message import EmailMessage
from types import TracebackType
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class SmtpServer:
    """An SMTP server on a free port of 127.0.0.1 that accepts one login and records mail."""

    def __init__(self, *, login: str = "user", password: str = "pass") -> None:
        self.port = free_port()
        self.login = login
        self.password = password
        self.messages: list[EmailMessage] = []
        self.logins: list[tuple[bytes, bytes]] = []
        self._condition = threading.Condition()
        self._controller = Controller(
            self,
            hostname="127.0.0.1",
            port=self.port,
            authenticator=self._authenticate,
            auth_require_tls=False,  # apprise's mode=insecure speaks plain SMTP
        )

    def url(self, *, sender: str = "sentinel@example.com", to: str = "oncall@example.com") -> str:
        """The apprise ``mailto://`` URL that logs in here and sends from ``sender`` to ``to``."""
        return (
            f"mailto://{self.login}:{self.password}@127.0.0.1:{self.port}"
            f"?smtp=127.0.0.1&mode=insecure&from={sender}&to={to}"
        )

    def wait_for(self, count: int, timeout: float = 5.0) -> list[EmailMessage]:
        """Block until ``count`` messages have arrived; fail after ``timeout`` seconds."""
        with self._condition:
            if not self._condition.wait_for(lambda: len(self.messages) >= count, timeout):
                raise AssertionError(
                    f"expected {count} messages within {timeout}s, got {len(self.messages)}"
                )
            return list(self.messages)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        parsed = email.message_from_bytes(content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        with self._condition:
            self.messages.append(parsed)
            self._condition.notify_all()
        return "250 OK"

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        self.logins.append((data.login, data.password))
        return AuthResult(success=data.password == self.password.encode())

    def __enter__(self) -> SmtpServer:
        self._controller.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._controller.stop()
