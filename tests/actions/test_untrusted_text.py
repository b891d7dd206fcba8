"""The job's words and file names, neutralised where they are rendered (issue 32.5).

A crash line holding mentions, a Markdown link and a token, printed by a real job under a
real ``sentinel run``, reaches real receivers (Mattermost and a JSON webhook on 127.0.0.1,
an SMTP server), the report on disk and the alert journal; Slack's payload is apprise's
real request, rerouted to a local server. Chat and Markdown show the text without pinging
or linking; the journal and the JSON webhook keep it as it was, but for the token; no
target gets the token. Folder names and paths with escapes reach terminals and log lines
escaped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from sentinel.follow.terminal_text import strip_escapes
from sentinel.model.incidents import IncidentTracker
from sentinel.model.secrets import mask_tokens
from sentinel.model.untrusted import defang_urls, markdown_literal, no_mentions, printable
from sentinel.notify.notices import Envelope, NoticeKind, incident_notice
from sentinel.notify.notifier import send_envelope
from sentinel.rules import STORIES
from sentinel.rules.job_crash import JobCrashConfig, JobCrashDetector
from tests.helpers.env import clean_env
from tests.helpers.notices import JOB
from tests.helpers.slack import SlackReceiver, slack_routed_to
from tests.helpers.smtp import SmtpServer
from tests.helpers.webhook import WebhookReceiver

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
LINK = "[Click to re-auth](http://evil.example/phish)"
CRASH_LINE = (
    f"RuntimeError: login failed with {TOKEN} @channel @all @here <!channel> {LINK}"
    " \x1b[2J\x1b[31mred\x1b[0m\x08\x08\x07\r"
)
#: The line as sentinel reads it from the job's output: escape sequences are taken out
#: for the parsers (``sentinel.follow.terminal_text``), ``\r`` ends the line; the other
#: controls (backspaces that would hide text on a terminal, a bell) are still there.
READ = strip_escapes(CRASH_LINE).strip()

#: A mention that would notify: ``@channel``, ``@all``, ``@here`` with nothing between.
PING = re.compile(r"(?<![\w@])@(?:channel|all|here)\b|<!(?:channel|here|everyone)")
#: A link a renderer would make live: a Markdown link, or a URL it autolinks.
LIVE_LINK = re.compile(r"\]\(\s*<?https?://|https?://evil|<https?://evil|evil\.example")


# -- the pieces ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("step_5\x1b[2J", "step_5\\x1b[2J"),
        ("a\nFAKE LINE", "a\\nFAKE LINE"),
        ("bar\rover", "bar\\rover"),
        ("tab\there", "tab\\there"),
        ("c1\x9b31m del\x7f", "c1\\x9b31m del\\x7f"),
        ("bidi\u202egnp.exe", "bidi\\u202egnp.exe"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("plain é 中 ▁▂▃", "plain é 中 ▁▂▃"),
    ],
    ids=["ansi", "newline", "carriage-return", "tab", "c1-and-del", "bidi", "zero-width", "plain"],
)
def test_printable_escapes_controls_visibly(text: str, shown: str) -> None:
    assert printable(text) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("see http://evil.example/phish now", "see hxxp://evil[.]example/phish now"),
        ("HTTPS://a.b:8080/x?y=1", "HxxPS://a[.]b:8080/x?y=1"),
        ("ftp://files.example/x", "fxp://files[.]example/x"),
        ("visit www.evil.example/a", "visit www[.]evil[.]example/a"),
        ("model.safetensors at torch.cuda", "model.safetensors at torch.cuda"),
        ("s3://bucket/key", "s3://bucket/key"),
    ],
    ids=["http", "https-port", "ftp", "www", "dotted-words-stay", "s3-not-linkable"],
)
def test_defang_urls(text: str, shown: str) -> None:
    assert defang_urls(text) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (LINK, "\\[Click to re-auth\\](http://evil.example/phish)"),
        ("![pixel](http://t.example/p.png)", "!\\[pixel\\](http://t.example/p.png)"),
        ("<http://evil.example>", "\\<http://evil.example\\>"),
        ("<img src=x onerror=alert(1)>", "\\<img src=x onerror=alert(1)\\>"),
        ("\\[x\\](y)", "\\\\\\[x\\\\\\](y)"),
        ("# heading", "\\# heading"),
        ("esc \\x1b kept", "esc \\x1b kept"),
    ],
    ids=["link", "image", "autolink", "html", "escaped-escape", "heading", "plain-backslash"],
)
def test_markdown_literal(text: str, shown: str) -> None:
    assert markdown_literal(text) == shown


def test_no_mentions_breaks_each_mention_and_keeps_email_addresses() -> None:
    text = no_mentions("@channel @all @here @alice.b <!channel> <@U123> ops@example.com")
    assert not PING.search(text)
    assert "@\u200balice.b" in text
    assert "<\u200b!channel>" in text and "<@\u200bU123>" in text
    assert "ops@example.com" in text
    assert text.replace("\u200b", "") == "@channel @all @here @alice.b <!channel> <@U123> " + (
        "ops@example.com"
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"token {TOKEN}.", "token hf_****."),
        ("xoxb-1234567890-0987654321-AbCdEfGhIj", "xoxb-****"),
        ("ghp_" + "a1" * 18, "ghp_****"),
        ("github_pat_11ABCDEFG0_" + "x" * 40, "github_pat_****"),
        ("sk-proj-" + "Ab1_" * 10, "sk-****"),
        ("sk-ant-api03-" + "Zz9-" * 10, "sk-****"),
        ("key AKIAIOSFODNN7EXAMPLE used", "key AKIA**** used"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
         "aws_secret_access_key = ****"),
        ("WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567", "WANDB_API_KEY=****"),
        ("HF_TOKEN='hf_zzzz'", "HF_TOKEN='****'"),
        ("Authorization: Bearer eyJhbGciOi.abc.def-ghijk", "Authorization: Bearer ****"),
        ("https://bob:hunter22@git.example/r.git", "https://bob:****@git.example/r.git"),
        ("AIzaSyA-1234567890abcdefghijklmnopqrstu", "AIza****"),
        ("tokens_per_sec=5120.5 max_token_len=512 num_tokens: 100000",
         "tokens_per_sec=5120.5 max_token_len=512 num_tokens: 100000"),
        ("task-12345678901234567890 sk-learn", "task-12345678901234567890 sk-learn"),
    ],
    ids=["huggingface", "slack", "github", "github-fine-grained", "openai", "anthropic",
         "aws-key-id", "aws-secret", "wandb-env", "quoted-env", "bearer", "url-password",
         "google", "metric-names-stay", "lookalikes-stay"],
)  # fmt: skip
def test_mask_tokens(text: str, shown: str) -> None:
    assert mask_tokens(text) == shown


# -- a real crash, every target -------------------------------------------------------------

JOB_SCRIPT = textwrap.dedent(
    f"""
    import sys, time
    print('{{"step": 1, "loss": 2.0}}', flush=True)
    time.sleep(0.3)  # the crash line is the last the job writes, in any interleaving
    sys.stderr.write({CRASH_LINE!r} + "\\n")
    sys.exit(1)
    """
)


def _email_texts(mail: EmailMessage) -> list[str]:
    parts = [part for part in mail.walk() if part.get_content_maintype() == "text"]
    return [str(part.get_content()).replace("\r\n", "\n") for part in parts]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real ``sentinel run`` whose job prints the crash line and exits 1, notifying a
    Mattermost hook, a JSON webhook and an SMTP server, all on 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("crash")
    job, state = tmp / "job.py", tmp / "state"
    job.write_text(JOB_SCRIPT)
    with WebhookReceiver() as chat, WebhookReceiver() as hook, SmtpServer() as smtp:
        run = subprocess.run(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
             "--notify", f"mmost://127.0.0.1:{chat.port}/tok3n", "--notify", hook.url,
             "--notify", smtp.url(), "--", sys.executable, str(job)],
            env=clean_env(SENTINEL_NOTIFY__GROUP_WAIT_S="0"),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        chat_posts = [r.json for r in chat.wait_for(1)]
        hook_posts = [r.json for r in hook.wait_for(1)]
        mails = smtp.wait_for(1)
    return {
        "run": run,
        "state": state,
        "mattermost": [post["text"] for post in chat_posts],
        "json": hook_posts,
        "email": [text for mail in mails for text in _email_texts(mail)]
        + [str(mail["Subject"]) for mail in mails],
    }


@pytest.mark.slow
def test_the_run_gives_up_on_the_crash(crashed: dict[str, Any]) -> None:
    run = crashed["run"]
    assert run.returncode == 90, run.stderr
    # (text=True reads the "\r" that ends the line as a newline)
    # (the job's terminal is one for both streams: its stderr passes to sentinel's stdout)
    assert CRASH_LINE[:-1] in run.stdout, "the job's own passthrough keeps its text as it was"


@pytest.mark.slow
def test_mattermost_is_not_pinged_and_shows_no_live_link(crashed: dict[str, Any]) -> None:
    [text] = [t for t in crashed["mattermost"] if "RuntimeError" in t][:1]
    assert not PING.search(text), text
    assert not LIVE_LINK.search(text), text
    assert "\\[Click to re-auth\\](hxxp://evil\\[.\\]example/phish)" in text
    assert "@\u200bchannel" in text
    assert not re.search("[\x00-\x09\x0b-\x1f]", text)
    assert "red\\x08\\x08\\x07" in text  # shown, escaped
    assert TOKEN not in text and "hf_****" in text


@pytest.mark.slow
def test_email_shows_no_live_link_and_no_token(crashed: dict[str, Any]) -> None:
    texts = crashed["email"]
    body = "\n".join(texts)
    assert "RuntimeError" in body
    assert "http://evil" not in body and "evil.example" not in body
    assert "hxxp://evil[.]example/phish" in body
    assert TOKEN not in body and "hf_****" in body
    assert not re.search("[\x00-\x09\x0b-\x1f]", body)
    assert "red\\x08\\x08\\x07" in body


@pytest.mark.slow
def test_json_webhook_keeps_the_text_but_not_the_token(crashed: dict[str, Any]) -> None:
    [body] = [b for b in crashed["json"] if "RuntimeError" in b["message"]][:1]
    # apprise's json:// envelope carries sentinel's body as a JSON string.
    alert = json.loads(body["message"])
    kept = READ.replace(TOKEN, "hf_****")
    assert kept in alert["message"]
    assert TOKEN not in json.dumps(body)


@pytest.mark.slow
def test_alert_journal_keeps_the_text_as_it_was(crashed: dict[str, Any]) -> None:
    lines = (crashed["state"] / "alerts.jsonl").read_text().splitlines()
    crash = next(json.loads(line) for line in lines if "RuntimeError" in line)
    assert READ in crash["message"]


@pytest.mark.slow
def test_report_renders_no_link_and_no_raw_controls(crashed: dict[str, Any]) -> None:
    [report] = (crashed["state"] / "reports").glob("*.md")
    text = report.read_text()
    assert "RuntimeError" in text
    assert not LIVE_LINK.search(text), text
    assert "\\[Click to re-auth\\](hxxp://evil\\[.\\]example/phish)" in text
    assert not re.search("[\x00-\x09\x0b-\x1f]", text)
    assert "red\\x08\\x08\\x07" in text
    assert TOKEN not in text and "hf_****" in text


@pytest.mark.slow
def test_slack_is_not_pinged_and_shows_no_live_link() -> None:
    """apprise's real Slack request for a real job_crash alert, rerouted to 127.0.0.1."""
    detector = JobCrashDetector(JobCrashConfig())
    detector.output_text(CRASH_LINE, "job", 1_700_000_000.0)
    [alert] = detector.job_exited(1, 1_700_000_001.0, expected=False)
    change = IncidentTracker("r", STORIES).observe(alert)
    assert change is not None
    notice = incident_notice(NoticeKind.OPENED, change[1], alert, recent={})
    with SlackReceiver() as slack, slack_routed_to(slack):
        send_envelope("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7",
                      Envelope("k", JOB, (notice,)), 5.0)  # fmt: skip
        (post,) = slack.wait_for(1)
    payload = json.dumps(post.payload, ensure_ascii=False)
    (attachment,) = post.payload["attachments"]
    section = next(b for b in attachment["blocks"] if b["type"] == "section")["text"]["text"]
    assert "RuntimeError" in section
    assert not PING.search(section), section
    assert "<http" not in section.replace("<https://wandb.ai", ""), section  # Slack's own links
    assert "http://evil" not in section and "evil.example" not in section
    assert "&lt;\u200b!channel&gt;" in section
    assert TOKEN not in payload and "\x1b" not in payload


# -- terminals and log lines ------------------------------------------------------------------


@pytest.mark.slow
def test_checkpoints_listing_escapes_folder_names(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    names = ["checkpoint-5", "checkpoint-6\x1b[2J", "step_7\nFAKE 99 clean"]
    for name in names:
        (ckpt / name).mkdir()
        (ckpt / name / "model.pt").write_bytes(b"")
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "checkpoints", "--state-dir", str(tmp_path / "st"),
         str(ckpt)],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert "checkpoint-6\\x1b[2J" in result.stdout
    assert "step_7\\nFAKE 99 clean" in result.stdout
    assert not any(line.startswith("FAKE") for line in result.stdout.splitlines())
    listing = subprocess.run(
        [sys.executable, "-m", "sentinel", "checkpoints", "--json", "--state-dir",
         str(tmp_path / "st"), str(ckpt)],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    found = {Path(c["path"]).name for c in json.loads(listing.stdout)["checkpoints"]}
    assert set(names) <= found, "--json gives the names as they are"


@pytest.mark.slow
def test_log_lines_and_the_summary_escape_a_path(tmp_path: Path) -> None:
    """sentinel's log lines name the state dir; a name with an escape and a newline in it
    stays on its line, escaped."""
    state = tmp_path / "st\x1b]0;pwned\x07\nFAKE LINE"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--",
         sys.executable, "-c", "print('{\"step\": 1, \"loss\": 1.0}')"],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    assert not any(line.startswith("FAKE LINE") for line in result.stderr.splitlines())
    assert "st\\x1b]0;pwned\\x07\\nFAKE LINE" in result.stderr


def test_a_long_run_of_name_characters_is_masked_in_one_pass_not_one_per_start() -> None:
    """Two credential shapes repeated without bound: a job's line of 12,000 ``a1-`` took 1.4 s
    to mask, 200,000 took minutes (each start tried to the run's end). A hang, not a speed:
    the child gets 60 s for what now takes a fraction of one."""
    code = (
        "from sentinel.model.secrets import mask_tokens\n"
        "for text in ('a1-' * 70000, 'y' * 200000, 'tokentoken_' * 20000):\n"
        "    assert mask_tokens(text) == text\n"
        "print(mask_tokens('MY_COMPANY_PROD_US_EAST_HF_TOKEN=abcd1234 --hf-token=abcdef"
        " json://u:pw@host/x'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == (
        "MY_COMPANY_PROD_US_EAST_HF_TOKEN=**** --hf-token=**** json://u:****@host/x"
    )
