# The one place the project's commands live.
.PHONY: install demo test lint typecheck bench env-table

install:
	pip install -e '.[dev]'

demo:
	agentledger demo

test:
	pytest

lint:
	ruff check src tests
	ruff format --check src tests

typecheck:
	mypy src/agentledger

bench:
	agentledger bench

# The README's table of AGENTLEDGER_* variables, rendered from agentledger/envsettings.py.
env-table:
	python -c 'import pathlib, agentledger.envsettings as e; p = pathlib.Path("README.md"); p.write_text(e.with_table(p.read_text()))'
