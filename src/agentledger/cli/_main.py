"""The ``agentledger`` command."""

from __future__ import annotations

import importlib

import click

from agentledger._extras import PACKAGES, ExtraNotInstalled, installed, package_hint
from agentledger.cli._common import guarded

# The built-in commands, by name: the module (in agentledger.cli) and attribute of each,
# imported when the command is named, so a command loads only what it runs (a worker
# started by a supervisor, a script calling `submit`, start in a fraction of the time it
# takes to import every command). `agentledger --help` imports them all.
BUILTIN: dict[str, tuple[str, str]] = {
    "submit": ("_runs", "submit"),
    "runs": ("_runs", "runs"),
    "worker": ("_ops", "worker"),
    "migrate": ("_ops", "migrate"),
    "approvals": ("_ops", "approvals"),
    "outbox": ("_ops", "outbox"),
    "memory": ("_memory", "memory"),
    "docs": ("_docs", "docs"),
    "describe": ("_describe", "describe"),
    "stats": ("_stats", "stats_command"),
    "serve": ("_serve", "serve"),
    "keys": ("_keys", "keys"),
    "audit": ("_audit", "audit"),
    "prune": ("_prune", "prune"),
    "backup": ("_backup", "backup"),
    "restore": ("_backup", "restore"),
    "versions": ("_versions", "versions"),
    "chaos": ("_chaos", "chaos"),
    "soak": ("_soak", "soak"),
}
# Subcommands defined beside another group's module, added to the group when it loads.
ATTACHED: dict[str, list[tuple[str, str]]] = {
    "runs": [("_resume", "resume"), ("_resume", "settle")],
    "outbox": [("_resume", "outbox_retry")],
}


def _command(module: str, attribute: str) -> click.Command:
    command = getattr(importlib.import_module(f"agentledger.cli.{module}"), attribute)
    assert isinstance(command, click.Command)
    return command


def builtin_command(name: str) -> click.Command:
    """The built-in command ``name`` of :data:`BUILTIN`, its attached subcommands added."""
    command = _command(*BUILTIN[name])
    assert command.name == name, (name, command.name)
    if isinstance(command, click.Group):
        for module, attribute in ATTACHED.get(name, []):
            command.add_command(_command(module, attribute))
    return command


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
        return sorted({*super().list_commands(ctx), *BUILTIN, *PACKAGED})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            if cmd_name in BUILTIN:
                self.add_command(builtin_command(cmd_name))
            elif cmd_name in PACKAGED:
                self.add_command(packaged_command(cmd_name))
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands)
@click.version_option(package_name="agentledger")
def cli() -> None:
    """agentledger: a durable runtime for AI agents that change things in the world.

    Set AGENTLEDGER_DEBUG=1 to see tracebacks.
    """


@guarded
def main() -> None:
    cli(standalone_mode=True)


if __name__ == "__main__":
    main()
