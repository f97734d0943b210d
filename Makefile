# The one place the project's commands live.
.PHONY: install demo test lint typecheck bench core-install env-table

# The README's test command installs the same: the runtime with every extra, the
# examples (StayHub, the sandbox, the demo) and the benchmarks.
install:
	pip install -e '.[dev]' -e ./examples -e ./bench

demo:
	agentledger demo

test:
	pytest

lint:
	ruff check src tests examples bench
	ruff format --check src tests examples bench

typecheck:
	mypy src/agentledger examples/src/agentledger_examples bench/src/agentledger_bench

bench:
	agentledger bench

# `pip install agentledger` alone, in a fresh venv: what it pulls and that the core works.
core-install:
	python tests/install/check_core_install.py

# The README's table of AGENTLEDGER_* variables, rendered from agentledger/envsettings.py.
env-table:
	python -c 'import pathlib, agentledger.envsettings as e; p = pathlib.Path("README.md"); p.write_text(e.with_table(p.read_text()))'
