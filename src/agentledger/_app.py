"""The App: the registry of tools, agents and workflows a worker loads.

    app = App()

    @app.tool(effect="write", idempotency="provider", status_check=booking_status)
    async def create_booking(ctx: ToolContext, hotel_id: str) -> dict: ...

    app.add_agent(Agent(name="concierge", model=..., instructions=..., tools=[create_booking]))

Workers load an App by import path (``agentledger worker --app mypkg.agents:app``).
"""

from __future__ import annotations

import importlib
import sys
import sysconfig
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentledger._agent import Agent
from agentledger._workflow import Workflow, WorkflowFn
from agentledger.errors import UnknownTargetError, UsageError
from agentledger.records import target_of
from agentledger.store._base import NewRun
from agentledger.store._sqlstore import Store
from agentledger.tools._contract import Tool, tool

Definition = Agent | Workflow
Hook = Callable[["App"], Awaitable[None]]


class App:
    """Tools, agents and workflows, plus per-process resources (HTTP clients, URLs)."""

    def __init__(self, name: str = "app") -> None:
        self.name = name
        self.tools: dict[str, Tool] = {}
        self.definitions: dict[str, Definition] = {}
        self.resources: dict[str, Any] = {}
        self._startup: list[Hook] = []
        self._shutdown: list[Hook] = []

    # registration -------------------------------------------------------

    def tool(self, fn: Any = None, **contract: Any) -> Any:
        """Declare and register a tool (same arguments as :func:`agentledger.tool`)."""

        def wrap(f: Any) -> Tool:
            t: Tool = tool(f, **contract)
            self.add_tool(t)
            return t

        return wrap(fn) if fn is not None else wrap

    def add_tool(self, t: Tool) -> Tool:
        existing = self.tools.get(t.name)
        if existing is not None and existing is not t:
            raise UsageError(f"two tools named {t.name!r}; give one another name")
        self.tools[t.name] = t
        return t

    def add_agent(self, agent: Agent) -> Agent:
        """Register an agent (and its tools)."""
        for t in agent.tools:
            self.add_tool(t)
        self._add(agent)
        return agent

    def workflow(
        self,
        fn: WorkflowFn | None = None,
        *,
        name: str | None = None,
        version: str = "1",
        **options: Any,
    ) -> Any:
        """Register an async function as a workflow.

        ``input_model`` (a pydantic model class or a JSON schema dict) declares its
        input, checked at submit.
        """

        def wrap(f: WorkflowFn) -> Workflow:
            wf = Workflow(name=name or f.__name__, fn=f, version=version, **options)
            self._add(wf)
            return wf

        return wrap(fn) if fn is not None else wrap

    def _add(self, definition: Definition) -> None:
        target = target_of(definition.name, definition.version)
        if target in self.definitions:
            raise UsageError(f"{target} is registered twice; bump the version of one")
        self.definitions[target] = definition

    def on_startup(self, hook: Hook) -> Hook:
        """Run ``hook(app)`` when a worker process starts (open clients here)."""
        self._startup.append(hook)
        return hook

    def on_shutdown(self, hook: Hook) -> Hook:
        self._shutdown.append(hook)
        return hook

    async def startup(self) -> None:
        for hook in self._startup:
            await hook(self)

    async def shutdown(self) -> None:
        for hook in reversed(self._shutdown):
            await hook(self)

    # lookup ---------------------------------------------------------------

    def targets(self) -> dict[str, str]:
        """``name@version`` -> kind, for every definition this app can run."""
        return {t: d.kind for t, d in self.definitions.items()}

    def get(self, name: str, version: str) -> Definition | None:
        return self.definitions.get(target_of(name, version))

    def resolve(self, name: str, version: str | None = None) -> Definition:
        """The definition for ``name`` at ``version`` (default: the highest registered)."""
        candidates = [d for d in self.definitions.values() if d.name == name]
        if version is not None:
            candidates = [d for d in candidates if d.version == version]
        if not candidates:
            known = ", ".join(sorted(self.definitions)) or "none"
            wanted = name if version is None else target_of(name, version)
            raise UnknownTargetError(f"unknown agent or workflow {wanted!r}; known: {known}")
        return max(candidates, key=lambda d: _version_key(d.version))

    async def submit(
        self,
        store: Store,
        name: str,
        input: Any = None,
        *,
        version: str | None = None,
        tenant_id: str = "default",
        user_id: str | None = None,
    ) -> str:
        """Queue a run and return its id at once; nothing executes in the caller.

        Raises :class:`~agentledger._inputs.InvalidInput` (one line naming the field)
        when ``input`` does not fit what the agent or workflow declares.
        """
        definition = self.resolve(name, version)
        definition.validate_input(input)
        run = await store.create_run(
            NewRun(
                kind=definition.kind,
                name=definition.name,
                version=definition.version,
                input=input,
                tenant_id=tenant_id,
                user_id=user_id,
            )
        )
        return run.id


def _version_key(version: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.split("."))


def load_app(path: str) -> App:
    """Import ``module:attribute`` (like uvicorn) and return the App it names.

    Every way this fails is one :class:`UsageError` line saying which: the module is not
    on the path, the app's own import failed (and on what), a syntax or other error in
    the app's code (file and line), or the attribute is missing or not an App (and which
    App objects the module does have).
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--app must look like package.module:app, got {path!r}")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise UsageError(
                f"cannot import {module_name!r} ({exc}); check --app and PYTHONPATH"
            ) from exc
        raise UsageError(
            f"importing {module_name} failed{_where(exc)}: it imports {missing!r}, which is "
            "not installed (install it, or fix that import)"
        ) from exc
    except SyntaxError as exc:
        raise UsageError(
            f"{module_name} has a syntax error at {exc.filename}, line {exc.lineno}: {exc.msg}"
        ) from exc
    except Exception as exc:  # the app's own code raised while being imported
        first = str(exc).splitlines()[0] if str(exc) else ""
        reason = first if isinstance(exc, UsageError) else f"{type(exc).__name__}: {first}"
        raise UsageError(f"importing {module_name} failed{_where(exc)}: {reason}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        apps = ", ".join(sorted(k for k, v in vars(module).items() if isinstance(v, App)))
        listing = f"its App objects: {apps}" if apps else "it defines no App"
        if not hasattr(module, attr):
            raise UsageError(f"module {module_name} has no attribute {attr!r}; {listing}")
        raise UsageError(f"{path} is a {type(app).__name__}, not an agentledger App; {listing}")
    return app


def _where(exc: BaseException) -> str:
    """`` at FILE, line N``: the innermost frame of a failed import that is the app's
    own code (not agentledger's library, the standard library, installed packages or
    the import machinery), or nothing."""
    library = [str(Path(__file__).resolve().parent)]
    library += [sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        name = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else ""
        if not name or any(name.startswith(root) for root in library if root):
            continue
        found = f" at {frame.filename}, line {frame.lineno}"
    return found
