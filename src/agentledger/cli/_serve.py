"""`agentledger serve`: the HTTP API (FastAPI + uvicorn)."""

from __future__ import annotations

import click

from agentledger import _heap as heap
from agentledger._app import load_app
from agentledger._extras import require
from agentledger.cli._common import check_port_free, db_option
from agentledger.errors import UsageError


@click.command("serve")
@click.option(
    "--app", "app_path", envvar="AGENTLEDGER_APP", required=True,
    help="module:attr of the App whose agents the API accepts runs for.",
)  # fmt: skip
@db_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--workers-inline", default=0, show_default=True, type=click.IntRange(0, 64),
    help="Also run this many workers in this process (the embedded SQLite case).",
)  # fmt: skip
@click.option(
    "--idempotency-ttl", default=24 * 3600.0, show_default=True, type=click.FloatRange(1),
    help="Seconds an Idempotency-Key is kept.",
)  # fmt: skip
@click.option(
    "--require-idempotency-key", is_flag=True,
    help="Refuse (428) submits without Idempotency-Key for agents with side-effecting tools.",
)  # fmt: skip
@click.option("--runs-per-minute", type=click.IntRange(1), default=None,
              help="Default per-tenant quota of runs started per minute.")  # fmt: skip
@click.option("--max-in-flight", type=click.IntRange(1), default=None,
              help="Default per-tenant quota of runs in flight.")  # fmt: skip
@click.option(
    "--agent-webhook", "agent_webhooks", multiple=True, metavar="AGENT=URL",
    help="Post the events of AGENT's runs that name no webhook to URL (repeatable).",
)  # fmt: skip
@click.option(
    "--webhook-allow-host", "webhook_allow_hosts", multiple=True, metavar="HOST",
    help="Allow webhooks to this internal host: a name, address or network (repeatable; "
    "also AGENTLEDGER_WEBHOOK_ALLOW_HOSTS). Loopback, link-local and private targets are "
    "refused otherwise.",
)  # fmt: skip
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=None,
    help="Serve Prometheus /metrics without a key on this port (0: any free port); on the "
    "API port it needs a key with the deployment role.",
)  # fmt: skip
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True,
    help="Address the keyless /metrics listens on (0.0.0.0: every interface).",
)  # fmt: skip
@click.option(
    "--header-timeout", default=5.0, show_default=True, type=click.FloatRange(0.1, 3600),
    help="Seconds a client may take to send a request's head (then 408, closed).",
)  # fmt: skip
@click.option(
    "--body-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 3600),
    help="Seconds a client may take to send a request's body after its head (then closed).",
)  # fmt: skip
@click.option(
    "--keep-alive", default=5, show_default=True, type=click.IntRange(1, 3600),
    help="Seconds an idle connection is kept open between requests.",
)  # fmt: skip
@click.option(
    "--max-connections", default=2048, show_default=True, type=click.IntRange(1),
    help="Open connections at most; one more is closed at once.",
)  # fmt: skip
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    help="uvicorn's log level (debug, info, warning).",
)
@click.option(
    "-v", "--verbose", is_flag=True,
    help="Also log every step of the inline workers' runs (default: one line per run state).",
)  # fmt: skip
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="json: one JSON object per line, for log collectors.",
)  # fmt: skip
@click.option(
    "--no-access-log", is_flag=True,
    help="No access lines (by default one per request: method, path, status, milliseconds, "
    "request id, tenant, key id).",
)  # fmt: skip
def serve(
    app_path: str,
    db: str,
    host: str,
    port: int,
    workers_inline: int,
    idempotency_ttl: float,
    require_idempotency_key: bool,
    runs_per_minute: int | None,
    max_in_flight: int | None,
    agent_webhooks: tuple[str, ...],
    webhook_allow_hosts: tuple[str, ...],
    metrics_port: int | None,
    metrics_host: str,
    header_timeout: float,
    body_timeout: float,
    keep_alive: int,
    max_connections: int,
    log_level: str,
    verbose: bool,
    log_format: str,
    no_access_log: bool,
) -> None:
    """Serve the HTTP API: POST /v1/runs, events, approvals, audit (docs at /docs).

    API keys are HMACed under AGENTLEDGER_KEY_PEPPER (the same value as for
    `agentledger keys`). The process is stateless: run several behind a load
    balancer on one PostgreSQL database to scale out.
    """
    require("service", "agentledger serve")
    if metrics_port is not None:
        require("metrics", "agentledger serve --metrics-port")
    # Before the app loads or the database opens: a busy port is one line, not uvicorn's
    # "startup complete" followed by an error.
    check_port_free(host, port)
    if metrics_port is not None:
        if metrics_port == port != 0:
            raise UsageError(
                f"--metrics-port {port} is the API's --port; give the keyless /metrics a "
                "port of its own"
            )
        check_port_free(metrics_host, metrics_port, "--metrics-port", "--metrics-host")

    from agentledger.service import ServiceSettings, create_app
    from agentledger.service._server import uvicorn_config
    from agentledger.service._settings import ClientBounds
    from agentledger.service._startup import (
        ListeningServer,
        quiet_access_log,
        route_uvicorn_logs,
        start_line,
    )  # fmt: skip
    from agentledger.worker._runlog import configure_logging

    # As the worker logs (worker/_runlog.py); uvicorn's own lines too (route_uvicorn_logs).
    configure_logging(verbose=int(verbose), fmt=log_format)
    if no_access_log:
        quiet_access_log()

    settings = ServiceSettings(
        db_url=db,
        pepper=_pepper(),
        idempotency_ttl=idempotency_ttl,
        require_idempotency_for_writes=require_idempotency_key,
        runs_per_minute=runs_per_minute,
        max_in_flight=max_in_flight,
        workers_inline=workers_inline,
        agent_webhooks=_agent_webhooks(agent_webhooks),
        webhook_allow_hosts=webhook_allow_hosts,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        client_bounds=ClientBounds(header_timeout, body_timeout, keep_alive, max_connections),
    )
    agent_app = load_app(app_path)
    api = create_app(settings, agent_app)
    heap.freeze_startup()  # agentledger/_heap.py: full collections skip the start-up heap
    # service/_server.py: uvicorn with bounds on slow and idle clients.
    config = uvicorn_config(api, host, port, settings.client_bounds, log_level)
    route_uvicorn_logs()
    ListeningServer(config, start_line(agent_app, settings)).run()


def _agent_webhooks(given: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in given:
        name, sep, url = item.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"{item!r}: give AGENT=URL (http or https)")
        out[name] = url
    return out


def _pepper() -> bytes:
    # Imported here: the service (FastAPI) loads only for the commands that need it.
    from agentledger.service._settings import pepper_from_env

    return pepper_from_env()
