"""Running the sandbox: :func:`serve` (blocking, in-process) and :class:`SandboxServer`
(a subprocess that tests can stop, SIGKILL and restart on the same ledger file and port).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import agentledger
import agentledger_examples as examples
from agentledger_examples.stayhub.sandbox.faults import FaultConfig, config_from_dict, parse_faults

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
DEFAULT_PORT = 8700

FaultsLike = FaultConfig | str | Mapping[str, Any] | None


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    ledger_path: str | None = None,
    faults: FaultConfig | None = None,
    key_ttl: float | None = None,
) -> None:
    """Run the sandbox with uvicorn until interrupted. Loopback hosts only."""
    import uvicorn

    from agentledger_examples.stayhub.sandbox.app import create_app

    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"the sandbox listens on loopback only, not {host!r}; use 127.0.0.1")
    from agentledger_examples.stayhub.sandbox.idempotency import DEFAULT_KEY_TTL

    uvicorn.run(
        create_app(ledger_path, faults, DEFAULT_KEY_TTL if key_ttl is None else key_ttl),
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=1,
    )


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def as_fault_config(faults: FaultsLike) -> FaultConfig:
    """A :class:`FaultConfig` from a config, a spec string, a JSON-shaped dict or ``None``."""
    if faults is None:
        return FaultConfig()
    if isinstance(faults, FaultConfig):
        return faults
    if isinstance(faults, str):
        return parse_faults(faults)
    return config_from_dict(faults)


class SandboxServer:
    """The sandbox in a subprocess on a loopback port
    (``python -m agentledger_examples.stayhub.sandbox``).

    Use as a context manager; ``.url`` is stable across :meth:`restart`, which keeps the
    ledger file and the current fault config (the last one set, unless given).
    ``key_ttl`` (seconds) prunes idempotency keys sooner than the default 24 h.
    """

    def __init__(
        self,
        ledger_path: str | None = None,
        faults: FaultsLike = None,
        port: int = 0,
        startup_timeout: float = 20.0,
        key_ttl: float | None = None,
    ) -> None:
        self.key_ttl = key_ttl
        self._workdir = Path(tempfile.mkdtemp(prefix="stayhub-sandbox-"))
        self.ledger_path = ledger_path or str(self._workdir / "ledger.db")
        self.log_path = self._workdir / "sandbox.log"
        self._faults = as_fault_config(faults)
        self._auto_port = port == 0
        self.port = port or free_port()
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The subprocess id while running."""
        return self._proc.pid if self._proc else None

    @property
    def faults(self) -> FaultConfig:
        """The fault config the sandbox was last given."""
        return self._faults

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "agentledger_examples.stayhub.sandbox", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--ledger", self.ledger_path]
        if self._faults.faults or self._faults.seed:
            cmd += ["--faults", self._faults.to_spec()]
        if self.key_ttl is not None:
            cmd += ["--key-ttl", str(self.key_ttl)]
        return cmd

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        # The same agentledger and examples as this process, wherever they are installed.
        roots = [str(Path(agentledger.__file__).resolve().parents[1])]
        roots.append(str(Path(examples.__file__).resolve().parents[1]))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            return subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self._workdir
            )

    def start(self) -> SandboxServer:
        """Start the subprocess and wait until ``/healthz`` answers."""
        # httpx is imported where a request is made: the sandbox process imports this module
        # with its package and never makes one.
        import httpx

        if self._proc is not None:
            raise RuntimeError("sandbox already running")
        for attempt in range(3):
            self._proc = self._spawn()
            deadline = time.monotonic() + self.startup_timeout
            # One client for the whole wait: a client is costly to make (it builds a TLS
            # context), and a new one per poll takes the CPU the starting sandbox needs.
            with httpx.Client(trust_env=False, timeout=0.5) as client:
                while time.monotonic() < deadline:
                    if self._proc.poll() is not None:
                        break
                    try:
                        if client.get(f"{self.url}/healthz").status_code == 200:
                            return self
                    except httpx.TransportError:
                        pass
                    time.sleep(0.05)
            code = self._proc.poll()
            self._reap()
            if code is None or not self._auto_port or attempt == 2:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"sandbox did not start (exit code {code}); log:\n{tail}")
            self.port = free_port()  # the port was taken in the meantime: try another
        raise AssertionError("unreachable")

    def _reap(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc = None

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the sandbox and wait (SIGKILL after ``timeout`` seconds)."""
        if self._proc is None:
            return
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the sandbox (a crash: nothing is flushed or finished)."""
        self._reap()

    def restart(self, faults: FaultsLike = None, *, hard: bool = False) -> SandboxServer:
        """Stop (or SIGKILL if ``hard``) and start again on the same ledger file and port."""
        if hard:
            self.kill()
        else:
            self.stop()
        if faults is not None:
            self._faults = as_fault_config(faults)
        return self.start()

    def _request(self, method: str, path: str, json: Any = None) -> Any:
        import httpx

        with httpx.Client(base_url=self.url, trust_env=False, timeout=10) as client:
            response = client.request(method, path, json=json)
            response.raise_for_status()
            return response.json()

    def ledger(self) -> list[dict[str, Any]]:
        """Every applied effect (``GET /ledger``)."""
        effects: list[dict[str, Any]] = self._request("GET", "/ledger")["effects"]
        return effects

    def fault_stats(self) -> dict[str, Any]:
        """How often each fault fired and each endpoint dropped an answer (``GET /faults``)."""
        stats: dict[str, Any] = self._request("GET", "/faults")["stats"]
        return stats

    def reset(self) -> None:
        """Clear ledger, idempotency records, bookings and inventory."""
        self._request("POST", "/ledger/reset")

    def set_faults(self, faults: FaultConfig | str | Mapping[str, Any]) -> FaultConfig:
        """Replace the running sandbox's faults (a spec string, a config or a dict)."""
        config = as_fault_config(faults)
        self._request("PUT", "/faults", json=config.to_dict())
        self._faults = config
        return config

    def clear_faults(self) -> None:
        """Remove every fault."""
        self._request("DELETE", "/faults")
        self._faults = FaultConfig()

    def close(self) -> None:
        """Stop the sandbox and delete its working directory (a default ledger goes too)."""
        self.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
