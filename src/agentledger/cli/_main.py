"""The ``agentledger`` command."""

from __future__ import annotations

import importlib

import click

from agentledger._extras import PACKAGES, ExtraNotInstalled, installed, package_hint
from agentledger.cli._guard import guarded

# The built-in commands, by name: the module (in agentledger.cli) and attribute of each,
# imported when the command is named, so a command loads only what it runs (a worker
# started by a supervisor, a script calling `submit`, start in a fraction of the time it
# takes to import every command), and the first sentence of its help, which
# `agentledger --help` lists without importing any command
# (tests/cli/test_command_loading.py holds each to the command's own help).
BUILTIN: dict[str, tuple[str, str, str]] = {
    "submit": (
        "_runs",
        "submit",
        "Queue a run of agent or workflow NAME and print its id.",
    ),
    "runs": (
        "_runs",
        "runs",
        "List, show, cancel and resume runs.",
    ),
    "worker": (
        "_ops",
        "worker",
        "Claim and execute runs until SIGTERM (then release them and exit 0).",
    ),
    "migrate": (
        "_ops",
        "migrate",
        "Create or upgrade the schema (with --status or --check: only tell).",
    ),
    "approvals": (
        "_ops",
        "approvals",
        "Pending approvals and decisions.",
    ),
    "outbox": (
        "_ops",
        "outbox",
        "Deliver due outbox rows (needs --app), or inspect dead letters.",
    ),
    "memory": (
        "_memory",
        "memory",
        "Per-user facts agents remember (list, forget).",
    ),
    "docs": (
        "_docs",
        "docs",
        "Documents agents search (policies, FAQs): Markdown, text and HTML.",
    ),
    "describe": (
        "_describe",
        "describe",
        "List an app's agents and workflows (versions, input schema) and its tools with their "
        "contracts: what `submit` accepts and what each tool may change.",
    ),
    "stats": (
        "_stats",
        "stats_command",
        "Completion rate, p50/p95 duration, cost per run, the failing steps (with the average cost"
        " and seconds of each failure) and stuck runs.",
    ),
    "serve": (
        "_serve",
        "serve",
        "Serve the HTTP API: POST /v1/runs, events, approvals, audit (docs at /docs).",
    ),
    "keys": (
        "_keys",
        "keys",
        "API keys (`al_<id>_<secret>`, sent as `Authorization: Bearer <key>`).",
    ),
    "audit": (
        "_audit",
        "audit",
        "TARGET is a run id (print its audit records), `verify` (check every tenant's hash chain "
        "and, with AGENTLEDGER_AUDIT_KEY set, its signatures; exit 1 naming the first tampered "
        "record and every run whose records are gone) or `checkpoint` (verify, then print every "
        "tenant's signed head as JSON, to keep outside the database for `verify "
        "--since-checkpoint`), or `sign-unsigned` (sign, under AGENTLEDGER_AUDIT_KEY, the records "
        "sealed before it was set, once their chain is verified: you vouch for them as they are).",
    ),
    "prune": (
        "_prune",
        "prune",
        "Remove finished runs with their journal, events, outbox rows and effects, in small "
        "transactions.",
    ),
    "backup": (
        "_backup",
        "backup",
        "Copy a live SQLite store to FILE while its workers go on (one consistent snapshot).",
    ),
    "restore": (
        "_backup",
        "restore",
        "Bring back a backup, then mark its unfinished runs restored.",
    ),
    "versions": (
        "_versions",
        "versions",
        "Each agent and workflow version: its runs by state and the live workers serving it.",
    ),
    "chaos": (
        "_chaos",
        "chaos",
        "Run your own agent or workflow on worker processes under failure, and check it.",
    ),
    "soak": (
        "_soak",
        "soak",
        "Soak your app: a steady mixed load for hours under kills, sampled over time.",
    ),
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
    module, attribute, _ = BUILTIN[name]
    command = _command(module, attribute)
    assert command.name == name, (name, command.name)
    if isinstance(command, click.Group):
        for module, attribute in ATTACHED.get(name, []):
            command.add_command(_command(module, attribute))
    return command


# The commands of the installables beside the runtime (examples/ and bench/ in the
# repository): loaded from them when they are installed, else a stand-in that says in one
# line what to install. Loaded when named, so other commands never import them. Each with
# what its stand-in says it does and, as in BUILTIN, the first sentence of its own help.
PACKAGED: dict[str, tuple[str, str, str, str]] = {
    "sandbox": (
        "examples",
        "agentledger_examples.cli.sandbox",
        "StayHub's providers over HTTP.",
        "Run StayHub's providers (hotels, bookings, payments, CRM, email) as a local HTTP service,"
        " with injected faults; Ctrl-C stops it.",
    ),
    "example": (
        "examples",
        "agentledger_examples.cli.example",
        "A workflow and an agent run.",
        "Submit a workflow and an agent run, execute them with a worker, print the journals.",
    ),
    "demo": (
        "examples",
        "agentledger_examples.cli.demo",
        "The StayHub demo on worker processes.",
        "Book StayHub stays on worker processes and check the providers' ledger.",
    ),
    "bench": (
        "bench",
        "agentledger_bench.cli",
        "The benchmarks.",
        "Measure per-step overhead against raw INSERT+COMMIT, throughput and bytes stored.",
    ),
}


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
    package, module, summary, _ = PACKAGED[name]
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The listing from the tables: loading every command to read its help would
        # import what all of them run.
        listed = [click.Command(name, help=_summary(name)) for name in self.list_commands(ctx)]
        limit = formatter.width - 6 - max(len(command.name or "") for command in listed)
        with formatter.section("Commands"):
            formatter.write_dl([(c.name or "", c.get_short_help_str(limit)) for c in listed])


def _summary(name: str) -> str:
    if name in BUILTIN:
        return BUILTIN[name][2]
    package, _, summary, listed = PACKAGED[name]
    return listed if installed(PACKAGES[package][0]) else f"(not installed) {summary}"


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
