"""``docs search`` as an operator reads it: related chunks only, each title once, "1
chunk", and a tenant named (or the only one with documents), never tenants mixed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentledger.cli._main import cli
from agentledger_examples.stayhub.knowledge import POLICY_PATH
from tests.cli.helpers import cli_here


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(params=["embeddings", "full_text"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "full_text":
        monkeypatch.setenv("AGENTLEDGER_EMBEDDINGS", "0")
    else:
        pytest.importorskip("wordllama")
        monkeypatch.delenv("AGENTLEDGER_EMBEDDINGS", raising=False)
    return str(request.param)


def _add(store_url: str, tmp_path: Path, tenant: str = "acme") -> str:
    pets = tmp_path / "pets.md"
    pets.write_text("# Pets\n\nDogs are welcome in every room.\n")
    added = invoke("docs", "add", str(POLICY_PATH), str(pets), "--tenant", tenant,
                   "--db", store_url)  # fmt: skip
    assert added.exit_code == 0, added.output
    return added.output


def test_search_shows_related_chunks_each_title_once(
    store_url: str, tmp_path: Path, mode: str
) -> None:
    out = _add(store_url, tmp_path)
    assert "'Pets': 1 chunk" in out and "1 chunks" not in out, out
    found = invoke("docs", "search", "can I bring my dog", "--tenant", "acme", "--db", store_url)
    assert found.exit_code == 0, found.output
    heads = [line for line in found.output.splitlines() if line.startswith("[")]
    # Only the chunk about dogs: the cancellation chunks share no word and no meaning.
    assert len(heads) == 1 and "] Pets  (score " in heads[0], found.output
    policy = invoke("docs", "search", "free cancellation", "--tenant", "acme", "--db", store_url)
    lines = [line for line in policy.output.splitlines() if line.startswith("[")]
    assert lines, policy.output
    assert all(line.count("StayHub cancellation policy and FAQ") == 1 for line in lines), lines
    assert "StayHub cancellation policy and FAQ > Cancellation policy > Free cancellation" in (
        policy.output
    )
    for line in lines:  # a score says something: never 0.000
        score = re.search(r"\(score ([^)]+)\)", line)
        assert score is not None and float(score.group(1)) > 0, line


def test_search_without_tenant_names_the_tenants_and_never_mixes_them(
    store_url: str, tmp_path: Path
) -> None:
    assert invoke("migrate", "--db", store_url).exit_code == 0
    nothing = cli_here("docs", "search", "dog", "--db", store_url)
    assert nothing.returncode == 2, nothing.stderr
    assert nothing.stderr.strip() == (
        "error: no documents; add some with `agentledger docs add PATH`"
    )
    _add(store_url, tmp_path, "acme")
    only = invoke("docs", "search", "dog", "--db", store_url)
    assert only.exit_code == 0 and "] Pets  (score " in only.output, only.output
    assert "tenant acme" in only.output  # says which tenant it searched
    _add(store_url, tmp_path, "globex")
    both = cli_here("docs", "search", "dog", "--db", store_url)
    assert both.returncode == 2 and both.stdout == "", both
    assert both.stderr.strip() == (
        "error: documents are in tenants acme, globex; pass --tenant (a search covers one tenant)"
    )
    none_here = invoke("docs", "search", "dog", "--tenant", "initech", "--db", store_url)
    assert none_here.exit_code == 0, none_here.output
    assert "tenant initech has no documents (tenants with documents: acme, globex)" in (
        none_here.output
    )
