"""``/docs`` and ``/redoc`` work without internet: every script, style and icon they
load is served by the service itself, from files that ship in the wheel; and in a real
browser with every other host unreachable, the pages render the API."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import _skip_or_fail
from tests.service.conftest import Api, served, settings_for

ROOT = Path(__file__).resolve().parents[2]
_URL = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|\burl\s*:\s*["']([^"']+)["']""")
TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".json": "json"}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_pages_load_only_what_the_service_serves(sqlite_api: Api, page: str) -> None:
    r = await sqlite_api.client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    # No host named anywhere in the page: nothing to fetch from a CDN or a font server.
    assert not re.search(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}", html), html
    urls = [a or b for a, b in _URL.findall(html)]
    assert urls, html
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        asset = await sqlite_api.client.get(url)
        assert asset.status_code == 200, url
        kind = TYPES[Path(url).suffix]
        assert kind in asset.headers["content-type"], (url, asset.headers["content-type"])
        assert len(asset.content) > 0


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        _skip_or_fail("chromium not installed (apt-get install chromium)")
    return str(found)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "rendered"),
    # Swagger UI: an operation block per route; ReDoc: the operations' titles.
    [("/docs", 'class="opblock-summary-path"'), ("/redoc", "Submit Run")],
)
def test_a_browser_renders_the_pages_with_every_other_host_unreachable(
    tmp_path: Path, page: str, rendered: str
) -> None:
    browser = _chromium()
    with served(settings_for(f"sqlite:///{tmp_path / 'docs.db'}")) as s:
        result = subprocess.run(
            [
                browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}",
                # Offline but for the service: any other host does not resolve.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--virtual-time-budget=20000", "--dump-dom", s.base_url + page,
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert rendered in dom, dom[-3000:]
    assert "/v1/runs" in dom


@pytest.mark.slow
@pytest.mark.long  # a wheel built in an isolated environment
def test_the_wheel_ships_the_assets(tmp_path: Path) -> None:
    built = subprocess.run(
        # Built as a user's pip builds it (pyproject's build requirements, isolated).
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("agentledger-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    static = "agentledger/service/static/"
    for name in (
        "swagger-ui/swagger-ui-bundle.js", "swagger-ui/swagger-ui.css",
        "swagger-ui/favicon-32x32.png", "swagger-ui/LICENSE", "swagger-ui/NOTICE",
        "redoc/redoc.standalone.js", "redoc/LICENSE",
    ):  # fmt: skip
        assert static + name in names, sorted(n for n in names if "static" in n)
    # The console's templates and assets (service/_console/).
    console = "agentledger/service/_console/"
    for name in ("templates/base.html", "templates/_story.html", "static/console.css",
                 "static/console.js"):  # fmt: skip
        assert console + name in names, sorted(n for n in names if "_console" in n)
