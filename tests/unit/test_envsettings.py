"""One settings model for every ``AGENTLEDGER_*`` variable, and the README's table of them."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from agentledger import _envsettings as envsettings
from agentledger._envsettings import EnvSettings, current, env_name
from agentledger.cli._main import cli
from agentledger.errors import UsageError
from agentledger.store import DEFAULT_URL

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = re.compile(r"\bAGENTLEDGER_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def test_the_readme_table_is_the_one_the_model_renders() -> None:
    readme = (ROOT / "README.md").read_text()
    assert envsettings.with_table(readme) == readme, (
        "README.md's table of environment variables differs from agentledger/_envsettings.py: "
        "run `make env-table`"
    )


def test_every_variable_the_code_names_is_in_the_model() -> None:
    fields = {env_name(name) for name in EnvSettings.model_fields}
    named: dict[str, str] = {}
    for path in sorted((ROOT / "src" / "agentledger").rglob("*.py")):
        for found in VARIABLE.findall(path.read_text()):
            named.setdefault(found, str(path.relative_to(ROOT)))
    missing = {name: where for name, where in named.items() if name not in fields}
    assert not missing, f"variables read outside the settings model: {missing}"


def test_the_commands_environment_options_are_in_the_model() -> None:
    fields = {env_name(name) for name in EnvSettings.model_fields}

    def walk(command: click.Command) -> set[str]:
        names = {p.envvar for p in command.params if isinstance(p.envvar, str)}
        for sub in getattr(command, "commands", {}).values():
            names |= walk(sub)
        return names

    assert walk(cli) - fields == set()
    assert envsettings.default("db") == DEFAULT_URL


def test_every_variable_has_a_description_and_a_table_type() -> None:
    table = envsettings.render_table()
    for name, field in EnvSettings.model_fields.items():
        assert field.description and "\n" not in field.description, name
        assert f"| `{env_name(name)}` |" in table


def test_reading_sees_the_environment_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTLEDGER_STUCK_AFTER", raising=False)
    assert current().stuck_after == 900.0
    monkeypatch.setenv("AGENTLEDGER_STUCK_AFTER", "1.5")
    assert current().stuck_after == 1.5
    monkeypatch.setenv("AGENTLEDGER_STUCK_AFTER", "  ")
    assert current().stuck_after == 900.0  # blank is unset
    monkeypatch.delenv("AGENTLEDGER_STUCK_AFTER")
    assert current().stuck_after == 900.0


def test_a_given_environment_reads_like_the_process_one(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {
        "AGENTLEDGER_MODEL": " openai:gpt-4.1-mini ",
        "AGENTLEDGER_MODEL_TIMEOUT": "3",
        "AGENTLEDGER_MODEL_STREAM": "yes",
        "AGENTLEDGER_WEBHOOK_ALLOW_HOSTS": "a.internal, 10.0.0.0/8",
        "AGENTLEDGER_KEY_PEPPER": " pepper with spaces ",
        "AGENTLEDGER_EMBEDDINGS": "off",
    }
    for name in list(EnvSettings.model_fields):
        monkeypatch.delenv(env_name(name), raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    here = current()
    assert EnvSettings.from_environ(given) == here
    assert here.model == "openai:gpt-4.1-mini" and here.model_timeout == 3.0
    assert here.model_stream is True and here.embeddings is False
    assert here.webhook_allow_hosts == ("a.internal", "10.0.0.0/8")
    assert here.key_pepper.get_secret_value() == " pepper with spaces "  # secrets as given
    assert "with spaces" not in repr(here)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("AGENTLEDGER_OUTBOX_BASE_DELAY", "soon", "a number of seconds more than 0"),
        ("AGENTLEDGER_AUDIT_SEAL_EVERY", "nan", "from 0.01 to 3600"),
        ("AGENTLEDGER_METRICS_REFRESH", "-1", "0 or more"),
        ("AGENTLEDGER_STUCK_TAKEOVERS", "2.5", "a whole number, 1 or more"),
        ("AGENTLEDGER_MODEL_MAX_TOKENS", "lots", "a whole number, 1 or more"),
        ("AGENTLEDGER_MODEL_STREAM", "maybe", "1, true, yes or on"),
    ],
)
def test_an_unusable_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError) as caught:
        current()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(name) and says in message and "unset it for the default" in message
    with pytest.raises(UsageError, match=name):
        EnvSettings.from_environ({name: value})
