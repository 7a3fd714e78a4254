"""The MLflow UI, checked as a user would: `mlflow server` on 127.0.0.1 over the store of a TESS
``--env=test`` run, headless Chromium (the distribution's, driven by playwright; no browser download):
the experiment opens on its runs (not on GenAI traces) with the parent run named ``<pipeline> · <env> ·
<save version>``, the headline metric shows as a column, the parent run and one child run per variant
are listed, and Compare shows the variants' metrics. Screenshots go to test-artifacts/."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_notebook import PIPELINE, tess_store

pytestmark = [pytest.mark.browser, pytest.mark.e2e]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def chromium_path() -> str | None:
    candidates = [
        os.environ.get("CHROMIUM_PATH"),
        "/usr/bin/chromium",
        *(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")),
    ]
    return next((c for c in candidates if c and Path(c).is_file() and os.access(c, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"mlflow server not healthy after {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def browser_path() -> str:
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (dev extra)")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium found (run .ci/install_browser.sh as root, or set CHROMIUM_PATH)")
    return path


@pytest.fixture(scope="module")
def mlflow_server(e2e_project, browser_path):
    """(base URL, tracking URI) of an `mlflow server` over the TESS test store, stopped afterwards."""
    uri = tess_store(e2e_project)
    port = free_port()
    log = (e2e_project / f"mlflow_server_{port}.log").open("w")
    # one worker: uvicorn's multi-worker supervisor kills slow-starting workers on a busy machine
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            uri,
            "--default-artifact-root",
            (e2e_project / "mlartifacts").as_uri(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=e2e_project,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, timeout_s=180)
        yield base, uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_runs_listed_and_compare_shows_variant_metrics(mlflow_server, browser_path):
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import sync_playwright

    from pipelines.core.mlflow_logging import CLASSIC_ML_KIND, EXPERIMENT_KIND_TAG
    from pipelines.core.scoreboard import headline_of, parent_runs, report_of_run

    base, uri = mlflow_server
    client = MlflowClient(uri)
    parent = parent_runs(uri, "tags.env = 'test'", [PIPELINE])[0]
    exp_id, pid = parent.info.experiment_id, parent.info.run_id
    assert client.get_experiment(exp_id).tags.get(EXPERIMENT_KIND_TAG) == CLASSIC_ML_KIND
    assert parent.info.run_name == f"{PIPELINE} · test · {parent.data.tags['save_version']}"
    children = client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{pid}' and tags.role = 'variant'")
    variants = {r.info.run_id: r.data.tags["variant"] for r in children}
    assert len(variants) >= 2 and PIPELINE in variants.values()
    head, _ = headline_of(report_of_run(uri, parent))
    head_metric = f"headline.{head['metric']}"
    head_value = parent.data.metrics[head_metric]
    by_name = {name: rid for rid, name in variants.items()}
    picked = [PIPELINE, *[b for b in (head or {}).get("baselines", sorted(by_name)) if b in by_name and b != PIPELINE]]
    compared = {by_name[n]: n for n in picked[:5]}
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1800, "height": 1100})
            page.set_default_timeout(60_000)
            # the experiment as the docs open it: the runs table, not the GenAI overview / traces
            # (MLflow 3.17's UI follows its "GenAI | Model training" switch, workflowType, over the tag)
            page.goto(f"{base}/#/experiments/{exp_id}?workflowType=machine_learning", wait_until="load")
            parent_link = page.locator(f'a[href$="/runs/{pid}"]')
            parent_link.wait_for()
            assert "/traces" not in page.url and "/overview" not in page.url, page.url
            assert not page.get_by_text("No data available for the selected time range").count()
            close_assistant = page.locator('button[data-component-id="mlflow.assistant.chat_panel.close"]')
            if close_assistant.count():  # the side panel of newer UIs hides half the table in screenshots
                close_assistant.first.click()
            assert parent_link.inner_text().strip() == parent.info.run_name
            # the headline metric as a column (Columns → its name), with the parent run's value
            page.get_by_role("button", name=re.compile(r"^Columns")).first.click()
            page.keyboard.type(head_metric)
            page.get_by_text(head_metric, exact=True).first.click()
            page.keyboard.press("Escape")
            page.locator(f'[role=columnheader]:has-text("{head_metric}")').first.wait_for()
            # the grid draws a row's pinned and scrolled cells in separate [role=row]s of one row-index
            index = page.locator(f'[role=row]:has(a[href$="/runs/{pid}"])').first.get_attribute("row-index")
            row_text = " ".join(page.locator(f'[role=row][row-index="{index}"]').all_inner_texts())
            shown = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", row_text)]
            assert any(abs(x - head_value) <= 5.1e-3 * abs(head_value) + 1e-12 for x in shown), (head_value, row_text)
            page.screenshot(path=str(ARTIFACTS / "mlflow_experiment.png"))
            # the experiment's runs, as a user opens them from the experiment list
            page.goto(f"{base}/#/experiments/{exp_id}/runs", wait_until="load")
            parent_link.wait_for()
            # expand the parent: one child run per variant, named after the variant
            page.locator(
                f'[role=row]:has(a[href$="/runs/{pid}"]) button[data-component-id*="runnamecellrenderer"]'
            ).click()
            for rid, name in variants.items():
                link = page.locator(f'a[href$="/runs/{rid}"]')
                link.wait_for()
                assert link.inner_text().strip() == name
            page.screenshot(path=str(ARTIFACTS / "mlflow_runs.png"))

            # select the method and a few of its baselines (what fits the compare table) and press Compare
            for rid in compared:
                page.locator(f'[role=row]:has(a[href$="/runs/{rid}"]) input.ag-checkbox-input').check()
            page.get_by_role("button", name=re.compile(r"^Compare")).first.click()
            page.wait_for_url(re.compile(r"compare-runs"))
            page.get_by_text(f"Comparing {len(compared)} Runs").wait_for()
            page.get_by_text("test_mse_std", exact=True).first.wait_for()
            # scroll the page to the section header (scrolling to a metric name would scroll the
            # table's name column alone and misalign it with the values in the screenshot)
            page.get_by_text("Metrics", exact=True).first.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "mlflow_compare.png"))
            text = page.inner_text("body")
        finally:
            browser.close()

    for name in compared.values():
        assert re.search(rf"^\s*{re.escape(name)}\s*$", text, flags=re.M), f"variant {name} not in Compare"
    metrics_part = text.rsplit("\nMetrics\n", 1)[-1].split("\nArtifacts\n", 1)[0]
    assert "test_mse" in metrics_part and "test_mae" in metrics_part
    # the values themselves: each variant's test_mse, as the UI rounds it (3 significant digits), is shown
    shown = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", metrics_part)]
    for r in children:
        if r.info.run_id not in compared:
            continue
        v = r.data.metrics["test_mse"]
        assert any(abs(s - v) <= 5.1e-3 * abs(v) + 1e-12 for s in shown), f"{r.data.tags['variant']} test_mse {v}"
