# The one place the project's commands live.
.PHONY: install demo test lint typecheck bench

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
