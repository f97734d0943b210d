# The one place the project's commands live.
.PHONY: install demo test lint typecheck bench screenshots core-install env-table bench-compare bench-anchors

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

# The console's screenshots in docs/screenshots/, refreshed by its browser tests (the
# whole module: the earlier tests leave the runs the pages show; a plain
# test run writes them to its temporary directory instead).
screenshots:
	AGENTLEDGER_SCREENSHOTS=docs/screenshots pytest -q -n 0 tests/service/test_console_browser.py

# `pip install agentledger` alone, in a fresh venv: what it pulls and that the core works.
core-install:
	python tests/install/check_core_install.py

# The README's table of AGENTLEDGER_* variables, rendered from agentledger/_envsettings.py.
env-table:
	python -c 'import pathlib, agentledger._envsettings as e; p = pathlib.Path("README.md"); p.write_text(e.with_table(p.read_text()))'

# Side by side with another commit:
#   make bench-compare REF=main [N=3] [DB=postgresql://...] [KILLS=0]
bench-compare:
	@test -n "$(REF)" || { echo "usage: make bench-compare REF=<git ref> [N=3] [DB=postgresql://...] [KILLS=0]"; exit 2; }
	python3 bench/compare.py $(REF) --rounds $(or $(N),3) $(if $(DB),--db $(DB)) $(if $(KILLS),--kills $(KILLS))

# agentledger, DBOS Transact and LangGraph in one run (their own venv, not the runtime's deps)
ANCHORS_VENV ?= /tmp/anchors-venv
bench-anchors:
	test -x $(ANCHORS_VENV)/bin/python || python3 -m venv $(ANCHORS_VENV)
	$(ANCHORS_VENV)/bin/pip install -q -e '.[postgres-binary]' -e './bench[postgres]' -e bench/anchors
	$(ANCHORS_VENV)/bin/python -m agentledger_anchors $(if $(DB),--db $(DB))
