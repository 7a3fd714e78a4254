"""The driver loop the two offloading runners share.

:class:`pipelines.core.pool.PoolRunner` sends train nodes to local worker processes and
:class:`pipelines.core.runner.GPUNodeRunner` sends gpu nodes to Ray; every other node runs in the driver,
in the order ``SequentialRunner`` would run it. The driver loads an offloaded node's inputs and saves its
outputs through the catalog and the hooks, so versioned datasets, hooks and MLflow logging behave as in a
sequential run. A subclass says how a node travels:

- ``_offload(node, catalog, hook_manager, run_id)`` ships one node: ``(handle, inputs)``, or ``None`` when
  it ran the node here instead (it cannot be shipped);
- ``_wait(inflight)`` returns the handles that finished (possibly none: it is called again);
- ``_outputs(handle, node, inputs, catalog, hook_manager, run_id)`` a finished node's outputs (raising
  the node's error, after the ``on_node_error`` hook);
- ``_cancel(handles)`` stops what is in flight when the run fails or is interrupted;
- ``_capacity()`` how many nodes may be in flight at once; ``_completed(node, seconds)`` logs one.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from itertools import chain
from typing import TYPE_CHECKING, Any

from kedro.runner.runner import AbstractRunner
from kedro.runner.task import Task

if TYPE_CHECKING:
    from collections.abc import Collection

    from kedro.pipeline import Pipeline
    from kedro.pipeline.node import Node


def load_inputs(node: Node, catalog, hook_manager, run_id) -> dict[str, Any]:
    """A node's inputs, loaded in the driver with the dataset hooks (as ``Task`` loads them)."""
    inputs = {}
    for name in node.inputs:
        hook_manager.hook.before_dataset_loaded(dataset_name=name, node=node)
        inputs[name] = catalog.load(name)
        hook_manager.hook.after_dataset_loaded(dataset_name=name, data=inputs[name], node=node)
    inputs.update(Task._collect_inputs_from_hook(node, catalog, inputs, False, hook_manager, run_id=run_id))
    return inputs


def save_outputs(node: Node, outputs: dict[str, Any], catalog, hook_manager) -> None:
    """A node's outputs, saved in the driver with the dataset hooks."""
    for name, data in outputs.items():
        hook_manager.hook.before_dataset_saved(dataset_name=name, data=data, node=node)
        catalog.save(name, data)
        hook_manager.hook.after_dataset_saved(dataset_name=name, data=data, node=node)
    for name in node.confirms:
        catalog.confirm(name)


class OffloadingRunner(AbstractRunner):
    """A runner that sends some nodes elsewhere and runs the rest itself (see the module docstring)."""

    def _capacity(self) -> int:
        return sys.maxsize

    def _offload(self, node: Node, catalog, hook_manager, run_id) -> tuple[Any, dict[str, Any]] | None:
        raise NotImplementedError

    def _wait(self, inflight: dict[Any, tuple[Node, dict[str, Any], float]]) -> list:
        raise NotImplementedError

    def _outputs(self, handle, node: Node, inputs: dict[str, Any], catalog, hook_manager, run_id) -> dict[str, Any]:
        raise NotImplementedError

    def _cancel(self, handles: list) -> None:
        raise NotImplementedError

    def _completed(self, node: Node, seconds: float) -> None:
        self._logger.info("Completed node: %s (%.2fs)", node.name, seconds)

    def _run_here(self, node: Node, catalog, hook_manager, run_id) -> None:
        Task(node=node, catalog=catalog, hook_manager=hook_manager, is_async=self._is_async, run_id=run_id).execute()

    def _drive(self, pipeline: Pipeline, catalog, hook_manager, run_id, offloaded: Collection[Node]) -> None:
        nodes = pipeline.nodes  # topological order: driver nodes run in SequentialRunner's order
        order = {nd: i for i, nd in enumerate(nodes)}
        deps = pipeline.node_dependencies
        load_counts = Counter(chain.from_iterable(nd.inputs for nd in nodes))
        todo, done = set(nodes), set()
        inflight: dict[Any, tuple[Node, dict[str, Any], float]] = {}

        def finish(node: Node) -> None:
            done.add(node)
            self._logger.debug("Completed %d out of %d tasks", len(done), len(nodes))
            self._release_datasets(node, catalog, load_counts, pipeline)

        try:
            while todo or inflight:
                ready = sorted((nd for nd in todo if deps[nd] <= done), key=order.__getitem__)
                # inputs are loaded only when a node can be shipped, so the driver holds no more than the
                # in-flight nodes' inputs at once
                for node in [nd for nd in ready if nd in offloaded][: max(0, self._capacity() - len(inflight))]:
                    todo.discard(node)
                    shipped = self._offload(node, catalog, hook_manager, run_id)
                    if shipped is None:  # it ran here: look again
                        finish(node)
                        break
                    inflight[shipped[0]] = (node, shipped[1], time.perf_counter())
                else:
                    local = [nd for nd in ready if nd not in offloaded]
                    if local:  # one driver node, then look again: it may unlock more offloaded nodes
                        todo.discard(local[0])
                        self._run_here(local[0], catalog, hook_manager, run_id)
                        finish(local[0])
                        continue
                    if not inflight:
                        if todo:
                            raise RuntimeError(
                                f"{type(self).__name__}: cannot schedule {sorted(nd.name for nd in todo)}"
                            )
                        break
                    for handle in self._wait(inflight):
                        node, inputs, t0 = inflight.pop(handle)
                        outputs = self._outputs(handle, node, inputs, catalog, hook_manager, run_id)
                        save_outputs(node, outputs, catalog, hook_manager)
                        self._completed(node, time.perf_counter() - t0)
                        finish(node)
        except BaseException:
            self._cancel(list(inflight))
            self._suggest_resume_scenario(pipeline, done, catalog)
            raise
