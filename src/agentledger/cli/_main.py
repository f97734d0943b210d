"""The ``agentledger`` command."""

from __future__ import annotations

import importlib

import click

from agentledger._extras import PACKAGES, ExtraNotInstalled, installed, package_hint
from agentledger.cli import (
    _audit as audit,
)
from agentledger.cli import (
    _backup as backup,
)
from agentledger.cli import (
    _chaos as chaos_cli,
)
from agentledger.cli import (
    _describe as describe,
)
from agentledger.cli import (
    _docs as docs,
)
from agentledger.cli import (
    _keys as keys,
)
from agentledger.cli import (
    _memory as memory,
)
from agentledger.cli import (
    _ops as ops,
)
from agentledger.cli import (
    _prune as prune,
)
from agentledger.cli import (
    _resume as resume,
)
from agentledger.cli import (
    _runs as runs,
)
from agentledger.cli import (
    _serve as serve,
)
from agentledger.cli import (
    _soak as soak_cli,
)
from agentledger.cli import _stats as stats_cli
from agentledger.cli import (
    _versions as versions,
)
from agentledger.cli._common import guarded

# The commands of the installables beside the runtime (examples/ and bench/ in the
# repository): loaded from them when they are installed, else a stand-in that says in one
# line what to install. Loaded when named, so other commands never import them.
PACKAGED: dict[str, tuple[str, str, str]] = {
    "sandbox": ("examples", "agentledger_examples.cli.sandbox", "StayHub's providers over HTTP."),
    "example": ("examples", "agentledger_examples.cli.example", "A workflow and an agent run."),
    "demo": ("examples", "agentledger_examples.cli.demo", "The StayHub demo on worker processes."),
    "bench": ("bench", "agentledger_bench.cli", "The benchmarks."),
}  # fmt: skip


def _stand_in(name: str, package: str, summary: str) -> click.Command:
    message = package_hint(package, f"agentledger {name}")

    def refuse() -> None:
        raise ExtraNotInstalled(message)

    return click.Command(
        name,
        callback=refuse,
        help=f"{summary} Not installed: {PACKAGES[package][1]}.",
        short_help=f"(not installed) {summary}",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


def packaged_command(name: str) -> click.Command:
    """The command ``name`` of :data:`PACKAGED`, or its stand-in when not installed."""
    package, module, summary = PACKAGED[name]
    if not installed(PACKAGES[package][0]):
        return _stand_in(name, package, summary)
    command = getattr(importlib.import_module(module), name)
    assert isinstance(command, click.Command)
    return command


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *PACKAGED})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in PACKAGED and cmd_name not in self.commands:
            self.add_command(packaged_command(cmd_name))
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands)
@click.version_option(package_name="agentledger")
def cli() -> None:
    """agentledger: a durable runtime for AI agents that change things in the world.

    Set AGENTLEDGER_DEBUG=1 to see tracebacks.
    """


cli.add_command(runs.submit)
cli.add_command(runs.runs)
cli.add_command(ops.worker)
cli.add_command(ops.migrate)
cli.add_command(ops.approvals)
cli.add_command(ops.outbox)
cli.add_command(memory.memory)
cli.add_command(docs.docs)
cli.add_command(describe.describe)
cli.add_command(stats_cli.stats_command)
runs.runs.add_command(resume.resume)
runs.runs.add_command(resume.settle)
ops.outbox.add_command(resume.outbox_retry)
cli.add_command(serve.serve)
cli.add_command(keys.keys)
cli.add_command(audit.audit)
cli.add_command(prune.prune)
cli.add_command(backup.backup)
cli.add_command(backup.restore)
cli.add_command(versions.versions)
cli.add_command(chaos_cli.chaos)
cli.add_command(soak_cli.soak)


@guarded
def main() -> None:
    cli(standalone_mode=True)


if __name__ == "__main__":
    main()
