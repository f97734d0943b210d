"""The ``agentledger`` command."""

from __future__ import annotations

import click

from agentledger.cli import (
    audit,
    backup,
    describe,
    docs,
    keys,
    memory,
    ops,
    prune,
    resume,
    runs,
    serve,
    versions,
)
from agentledger.cli import stats as stats_cli
from agentledger.cli.common import guarded
from agentledger_bench import cli as bench
from agentledger_examples.cli import demo, example, sandbox


@click.group()
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

# The example and its tools: part of the package, never optional.
cli.add_command(sandbox.sandbox)
cli.add_command(example.example)
cli.add_command(demo.demo)
cli.add_command(bench.bench)


@guarded
def main() -> None:
    cli(standalone_mode=True)


if __name__ == "__main__":
    main()
