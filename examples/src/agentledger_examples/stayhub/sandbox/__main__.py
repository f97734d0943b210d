"""Run the sandbox::

python -m agentledger_examples.stayhub.sandbox --port P [--ledger FILE] [--faults SPEC]
    [--key-ttl S]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from agentledger_examples.stayhub.sandbox.faults import EXAMPLE_SPEC, parse_faults
from agentledger_examples.stayhub.sandbox.server import DEFAULT_PORT, serve


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the sandbox until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m agentledger_examples.stayhub.sandbox",
        description="StayHub sandbox: hotel, booking, payment, CRM and email providers.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port")
    parser.add_argument("--ledger", default=None, help="SQLite file (default: a temp file)")
    parser.add_argument("--faults", default=None, help=f"fault spec, e.g. {EXAMPLE_SPEC!r}")
    parser.add_argument(
        "--key-ttl",
        type=float,
        default=None,
        help="seconds after first use when an idempotency key is pruned (default 86400)",
    )
    args = parser.parse_args(argv)
    try:
        faults = parse_faults(args.faults) if args.faults else None
    except ValueError as exc:
        parser.error(str(exc))
    serve(args.host, args.port, args.ledger, faults, args.key_ttl)


if __name__ == "__main__":
    main()
