"""A sweep over seeds (`kedro sweep --grid "<m>.seeds=[0],[1]"`) gives each point only a seeds override:
every parameter that depends on the seeds (plot_seed, ...) defaults from them, for every method and env."""

from __future__ import annotations

import pytest

from pipelines.core.registry import discover_methods
from tests.test_docs_commands import _raw


@pytest.mark.parametrize("env", [None, "test", "full"])
@pytest.mark.parametrize("m", discover_methods())
def test_a_seeds_override_alone_validates(m, env):
    from pipelines import cli

    # two seeds at default scale; one at test/full scale, where some data sizes are set per seed count
    for seeds in ([7], [3, 5]) if env is None else ([7],):
        cli.validate_params([m], _raw([m], env, {f"{m}.seeds": seeds}))
