"""``bench/compare.py``: what it installs and how it reads two sets of reports.

No benchmark runs here (timings are never test assertions); the tool's own
arithmetic and choices are checked on made-up reports.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compare() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(concurrent: float, read_ratio: float, raw: float, **extra: Any) -> dict[str, Any]:
    return {
        "concurrent_steps_per_s": concurrent,
        "read_step_ratio": read_ratio,
        "raw_commit_us": raw,
        **extra,
    }


def test_table_gives_medians_ratios_and_which_way() -> None:
    compare = _compare()
    ref = [_report(1000.0, 1.0, 300.0), _report(900.0, 1.2, 310.0), _report(5.0, 9.0, 900.0)]
    head = [_report(500.0, 0.8, 600.0), _report(450.0, 0.7, 650.0), _report(480.0, 0.9, 700.0)]
    out = compare.table({"sqlite": {"ref": ref, "head": head}}, "old")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines()}
    # medians, not means: the outlier round of REF does not move its figure
    assert rows["(d) 200 runs x 10 steps, steps/s"].endswith("| 900 | 480 | 0.53 | worse |")
    assert rows["(b) read step / raw commit"].endswith("| 1.200 | 0.800 | 0.67 | better |")
    # the raw commit is the machine's: a ratio but no verdict
    assert rows["(a) raw INSERT+COMMIT, µs (the disk, not the code)"].endswith(
        "| 310 | 650 | 2.10 |  |"
    )
    # figures neither side reported are left out
    assert not any("stored bytes" in line for line in out.splitlines())


def test_a_figure_only_one_side_has_prints_a_dash() -> None:
    compare = _compare()
    ref = [_report(1000.0, 1.0, 300.0)]
    head = [_report(1000.0, 1.02, 300.0, stored_bytes_over_payload=1.5)]
    out = compare.table({"postgresql": {"ref": ref, "head": head}}, "old")
    assert "| (e) stored bytes / payload | - | 1.500 | - |  |" in out
    # within 5 %: no verdict either way
    assert "| (b) read step / raw commit | 1.000 | 1.020 | 1.02 |  |" in out


def test_installs_the_runtime_and_its_bench_packages_not_the_anchors(tmp_path: Path) -> None:
    compare = _compare()
    for name in ("anchors", "suite"):
        (tmp_path / "bench" / name).mkdir(parents=True)
        (tmp_path / "bench" / name / "pyproject.toml").write_text("[project]\n")
    assert compare.install_targets(tmp_path) == [
        f"{tmp_path}[postgres]",
        str(tmp_path / "bench" / "suite"),
    ]


def test_a_bench_project_at_the_root_of_bench_and_the_binary_driver(tmp_path: Path) -> None:
    compare = _compare()
    (tmp_path / "pyproject.toml").write_text(
        '[project.optional-dependencies]\npostgres = []\n"postgres-binary" = []\n'
    )
    (tmp_path / "bench" / "anchors").mkdir(parents=True)
    (tmp_path / "bench" / "anchors" / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "bench" / "pyproject.toml").write_text(
        "[project.optional-dependencies]\npostgres = []\n"
    )
    assert compare.install_targets(tmp_path) == [
        f"{tmp_path}[postgres-binary]",
        f"{tmp_path / 'bench'}[postgres]",
    ]


def test_children_do_not_inherit_a_pythonpath(monkeypatch: Any) -> None:
    compare = _compare()
    monkeypatch.setenv("PYTHONPATH", "/somewhere/src")
    env = compare.clean_env(Path("/tmp/venv"))
    assert "PYTHONPATH" not in env
    assert env["PATH"].startswith("/tmp/venv/bin")


def test_zero_rounds_is_refused_in_one_line_before_anything_is_built(
    capsys: pytest.CaptureFixture[str],
) -> None:
    compare = _compare()
    with pytest.raises(SystemExit) as stopped:
        compare.main(["HEAD", "--rounds", "0"])
    assert stopped.value.code == 2
    assert "--rounds must be at least 1 (got 0)" in capsys.readouterr().err
