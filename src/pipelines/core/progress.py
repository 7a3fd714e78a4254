"""Progress of a run, as a researcher reads it: one line per step as it starts and ends, a heartbeat
every ``HEARTBEAT_S`` seconds while a step runs (with what it is doing, when the step says so), and at
the end the report's path and its gates and claims counts.

A long loop says where it is with :func:`note` (``core.training.fit`` does, per step); the heartbeat
prints the latest note, so a step that runs for minutes (a big ``train.epochs``, text embedding) shows
it is alive within seconds of starting and how far it got.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kedro.framework.hooks import hook_impl

log = logging.getLogger("pipelines.progress")

HEARTBEAT_S = 10.0  # first heartbeat after this long, then every this long
_state: dict[str, Any] = {"note": None}


def note(text: Any) -> None:
    """Say what the running step is doing now (cheap: stores the object; formatted only when shown).
    ``text`` may be a string or a tuple ``(what, done, total)``."""
    _state["note"] = text


def _fmt_note(n: Any) -> str:
    if n is None:
        return ""
    if isinstance(n, tuple) and len(n) == 3:
        what, done, total = n
        pct = f" ({100 * done / total:.0f}%)" if total else ""
        return f" - {what} {done}/{total}{pct}"
    return f" - {n}"


def fmt_seconds(s: float) -> str:
    s = float(s)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m{sec:02d}s"


class _Heartbeat:
    def __init__(self, name: str, interval: float) -> None:
        self.name, self.interval, self.t0 = name, interval, time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            log.info(
                "  %s running for %s%s",
                self.name,
                fmt_seconds(time.perf_counter() - self.t0),
                _fmt_note(_state["note"]),
            )

    def stop(self) -> float:
        self._stop.set()
        return time.perf_counter() - self.t0


def summary_line(report: dict[str, Any]) -> str:
    """``gates 3/3 passed; claims 6 held, 0 failed, 2 inconclusive, 0 untested (of 8)``."""
    gates = report.get("gates") or []
    v = report.get("verdicts") or {}
    passed = sum(1 for g in gates if g.get("passed"))
    parts = [f"gates {passed}/{len(gates)} passed"] if gates else []
    n = sum(v.values()) if v else len(report.get("claims") or [])
    parts.append(
        f"claims {v.get('holds', 0)} held, {v.get('fails', 0)} failed, "
        f"{v.get('inconclusive', 0)} inconclusive, {v.get('untested', 0)} untested (of {n})"
    )
    return "; ".join(parts)


class ProgressHooks:
    """Registered in ``settings.HOOKS``. Steps are counted over the pipeline being run (a ``--nodes``
    run counts only its nodes)."""

    def __init__(self) -> None:
        self._n, self._started, self._done, self._t0 = 0, 0, 0, 0.0
        self._beats: dict[str, _Heartbeat] = {}
        self._reports: list[tuple[str, dict[str, Any]]] = []
        self._catalog = None
        self._lock = threading.Lock()

    @hook_impl
    def before_pipeline_run(self, run_params: dict[str, Any], pipeline, catalog) -> None:
        self._n, self._started, self._done, self._t0 = len(pipeline.nodes), 0, 0, time.perf_counter()
        self._reports, self._catalog = [], catalog
        names = ", ".join(run_params.get("pipeline_names") or []) or "__default__"
        log.info(
            "%s: %d steps (env %s, save version %s)",
            names,
            self._n,
            run_params.get("env") or "base",
            run_params.get("run_id"),
        )

    @hook_impl
    def before_node_run(self, node) -> None:
        note(None)
        with self._lock:
            self._started += 1
            k = self._started
        log.info("[%d/%d] %s ...", k, self._n, node.name)
        self._beats[node.name] = _Heartbeat(node.name, HEARTBEAT_S)

    def _end(self, node, status: str) -> None:
        beat = self._beats.pop(node.name, None)
        took = beat.stop() if beat else 0.0
        with self._lock:
            self._done += 1
            k = self._done
        log.info("%s %s in %s (%d/%d done)", node.name, status, fmt_seconds(took), k, self._n)

    @hook_impl
    def after_node_run(self, node, outputs: dict[str, Any]) -> None:
        self._end(node, "done")
        for name, data in (outputs or {}).items():
            if name.endswith(".report") and isinstance(data, dict):
                self._reports.append((name, data))

    @hook_impl
    def on_node_error(self, node) -> None:
        self._end(node, "failed")

    @hook_impl
    def after_pipeline_run(self, run_params: dict[str, Any]) -> None:
        took = fmt_seconds(time.perf_counter() - self._t0)
        if not self._reports:
            log.info(
                "finished %d steps in %s; no report was written by this run (it ran part of the "
                "pipeline: the report is written by <method>.evaluate.report)",
                self._n,
                took,
            )
        for name, report in self._reports:
            log.info("%s: %s", name.rsplit(".", 1)[0], summary_line(report))
            path = self._path(name)
            log.info("report: %s (finished in %s)", path or name, took)
        self._reports, self._catalog = [], None

    def _path(self, name: str) -> str | None:
        try:
            ds = self._catalog.get(name) if self._catalog is not None else None
            return str(ds._get_load_path()) if ds is not None else None
        except Exception:  # noqa: BLE001 - the summary never fails a finished run
            return None
