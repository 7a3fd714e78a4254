"""Variant nodes keep the wrapped function's type hints (Kedro validates params through them), bind the
variant, ship through cloudpickle (Ray), and are named train.<variant>."""

import inspect
from typing import get_type_hints

import cloudpickle
import pytest
from kedro.pipeline import pipeline
from kedro.validation.type_extractor import TypeExtractor

from pipelines.core.params import MethodParams
from pipelines.core.variants import bind_variant, variant_node


class P(MethodParams):
    pass


def train(data: int, p: P, variant: str) -> str:
    return f"{data}-{variant}-{p.threads}"


def test_variant_node_binds_and_keeps_hints():
    n = variant_node(train, "ridge", ["d", "params:m"], "predictions_ridge")
    assert n.name == "train.ridge" and {"train", "gpu"} <= n.tags
    assert list(inspect.signature(n.func).parameters) == ["data", "p"]
    assert get_type_hints(n.func)["p"] is P
    reqs = TypeExtractor({"m": pipeline([n], namespace="m", parameters={"params:m": "params:m"})})
    assert reqs.extract_types_from_pipelines() == {"m": P}
    assert cloudpickle.loads(cloudpickle.dumps(n.func))(1, P(seeds=[0])) == "1-ridge-auto"
    assert pipeline([n], namespace="m", parameters={"params:m": "params:m"}).nodes[0].name == "m.train.ridge"


def test_bind_needs_a_variant_argument():
    with pytest.raises(TypeError, match="no 'variant'"):
        bind_variant(lambda x: x, "a")
