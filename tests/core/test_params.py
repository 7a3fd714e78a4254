"""Parameter validation: bad type, missing key, out of range, unknown key → one line naming the key."""

import pytest
from pydantic import Field

from pipelines.core.params import MethodParams, ParameterError, Strict, validate


class Inner(Strict):
    lr: float = Field(gt=0)
    layers: int = Field(ge=1)


class Schema(MethodParams):
    model: Inner


GOOD = {"seeds": [0, 1], "model": {"lr": 0.1, "layers": 2}}


def test_valid_params_parse():
    p = validate(Schema, GOOD, "m")
    assert p.model.layers == 2 and p.threads == "auto" and p.claims == []


@pytest.mark.parametrize(
    "raw,key,why",
    [
        ({**GOOD, "model": {"lr": "fast", "layers": 2}}, "m.model.lr", "valid number"),
        ({**GOOD, "model": {"lr": 0.1}}, "m.model.layers", "missing key"),
        ({**GOOD, "model": {"lr": -1.0, "layers": 2}}, "m.model.lr", "greater than 0"),
        ({**GOOD, "model": {"lr": 0.1, "layers": 2, "layres": 3}}, "m.model.layres", "unknown key"),
        ({"model": {"lr": 0.1, "layers": 2}}, "m.seeds", "missing key"),
        (
            {**GOOD, "claims": [{"id": "x", "text": "t", "metric": "a", "op": "==", "threshold": 1}]},
            "m.claims.0.op",
            "",
        ),
        # types are strict, and a union's error (threads: auto | int) names the key, not pydantic's tags
        ({**GOOD, "model": {"lr": 0.1, "layers": True}}, "m.model.layers", "valid integer"),  # true is not 1
        ({**GOOD, "model": {"lr": 0.1, "layers": "2"}}, "m.model.layers", "valid integer"),  # nor is "2"
        ({**GOOD, "threads": True}, "m.threads", "'auto'"),
        ({**GOOD, "threads": 0}, "m.threads", "greater than or equal to 1"),
        ({**GOOD, "threads": "many"}, "m.threads", "'auto'"),
    ],
)
def test_errors_name_the_key(raw, key, why):
    with pytest.raises(ParameterError) as exc:
        validate(Schema, raw, "m")
    msg = str(exc.value)
    assert msg.startswith(f"parameter {key}:") and why in msg and "\n" not in msg


def test_non_mapping_rejected():
    with pytest.raises(ParameterError, match="expected a mapping"):
        validate(Schema, [1, 2], "m")


def test_int_is_a_valid_float_and_threads_take_an_integer():
    p = validate(Schema, {**GOOD, "threads": 3, "model": {"lr": 1, "layers": 2}}, "m")
    assert p.threads == 3 and p.model.lr == 1.0 and isinstance(p.model.lr, float)


def test_method_params_refuses_a_claim_on_an_unplanned_variant():
    from pipelines.core.params import MethodParams, ParameterError, validate

    class P(MethodParams):
        variants: list[str]

    claim = {"id": "c", "text": "t", "metric": "variants.b.acc", "op": ">=", "threshold": 0.5}
    ok = validate(P, {"seeds": [0], "variants": ["a", "b"], "claims": [claim]}, "m")
    assert ok.planned_variants() == ["a", "b"]
    with pytest.raises(ParameterError, match=r"parameter m: .*claim 'c'.*names variant 'b'"):
        validate(P, {"seeds": [0], "variants": ["a"], "claims": [claim]}, "m")
    derived = {**claim, "metric": "gain.b_vs_a"}  # derived metrics are the method's to check
    validate(P, {"seeds": [0], "variants": ["a"], "claims": [derived]}, "m")

    class NoList(MethodParams):  # no variants list: nothing to check
        pass

    assert validate(NoList, {"seeds": [0], "claims": [claim]}, "m").planned_variants() is None


def test_variant_names_become_node_names_so_they_are_checked_once_in_core():
    from pipelines.core.params import MethodParams, ParameterError, Strict, VariantName, validate

    class Spec(Strict):
        lr: float

    class P(MethodParams):
        variants: dict[VariantName, Spec]

    assert list(validate(P, {"seeds": [0], "variants": {"adam_2": {"lr": 1.0}}}, "m").variants) == ["adam_2"]
    with pytest.raises(ParameterError, match=r"parameter m\.variants: .*'Adam-2'.*train\.<variant>"):
        validate(P, {"seeds": [0], "variants": {"Adam-2": {"lr": 1.0}}}, "m")


def test_variant_seeds_is_opt_in_takes_a_prefix_of_seeds_and_names_a_bad_key():
    from pipelines.core.params import VariantSeeds

    class P(MethodParams, VariantSeeds):
        variants: list[str]

    raw = {"seeds": [5, 3, 9], "variants": ["a", "b"], "variant_seeds": {"b": 2}}
    p = validate(P, raw, "m")
    assert p.seeds_for("a") == [5, 3, 9] and p.seeds_for("b") == [5, 3]  # a prefix, in the given order
    assert validate(P, {**raw, "variant_seeds": {"b": 7}}, "m").seeds_for("b") == [5, 3, 9]
    with pytest.raises(ParameterError, match=r"^parameter m.variant_seeds.b: .*greater than or equal to 1"):
        validate(P, {**raw, "variant_seeds": {"b": 0}}, "m")
    with pytest.raises(ParameterError, match=r"variant_seeds: unknown variant\(s\) \['c'\]"):
        validate(P, {**raw, "variant_seeds": {"c": 1}}, "m")

    class Known(P):  # a method that knows more variants than this run plans
        def known_variants(self):
            return ["a", "b", "c"]

    assert validate(Known, {**raw, "variant_seeds": {"c": 1}}, "m").seeds_for("c") == [5]
    # a method without the block rejects the key instead of silently running every seed
    with pytest.raises(ParameterError, match=r"^parameter m.variant_seeds: unknown key"):
        validate(Schema, {**GOOD, "variant_seeds": {"a": 1}}, "m")


def test_extra_claims_append_to_claims_and_errors_name_their_key():
    """An env adds claims with ``extra_claims`` (lists replace under the deep merge, so ``claims`` in an env would
    have to repeat all of base's)."""

    def claim(i, **kw):
        return {"id": i, "text": "t", "metric": "a", "op": ">=", "threshold": 1, **kw}

    p = validate(Schema, {**GOOD, "claims": [claim("x")], "extra_claims": [claim("y")]}, "m")
    assert [c.id for c in p.claims] == ["x", "y"] and "extra_claims" not in p.model_dump()
    assert [c.id for c in validate(Schema, {**GOOD, "extra_claims": [claim("y")]}, "m").claims] == ["y"]
    with pytest.raises(ParameterError, match=r"extra_claims.1.op: Input should be"):
        validate(Schema, {**GOOD, "extra_claims": [claim("y"), claim("z", op="==")]}, "m")
    with pytest.raises(ParameterError, match=r"claims: id\(s\) \['x'\] declared twice"):
        validate(Schema, {**GOOD, "claims": [claim("x")], "extra_claims": [claim("x")]}, "m")
    with pytest.raises(ParameterError, match="extra_claims: expected a list"):
        validate(Schema, {**GOOD, "extra_claims": {"x": 1}}, "m")


def test_constrained_numbers_and_names_of_behave_like_the_fields_they_replace():
    """``PositiveInt`` ≡ ``Field(ge=1)`` on ints, ``Fraction`` ≡ ``Field(gt=0, lt=1)``, ``Probability`` ≡
    ``Field(ge=0, le=1)``; ``names_of(KNOWN)`` is a non-empty list of known names, none twice. Checked
    against the spelled-out fields on the boundary values, and on the messages (they name the key)."""
    from pydantic import NonNegativeInt, PositiveFloat, PositiveInt

    from pipelines.core.params import Fraction, Probability, names_of

    class Typed(MethodParams):
        n: PositiveInt = 1
        k: NonNegativeInt = 0
        lr: PositiveFloat = 0.1
        f: Fraction = 0.5
        p: Probability = 0.5
        variants: names_of(("a", "b", "c")) = ["a"]
        extra: names_of(("x", "y"), "scorer", min_length=0) = []

    class Spelled(MethodParams):
        n: int = Field(default=1, ge=1)
        k: int = Field(default=0, ge=0)
        lr: float = Field(default=0.1, gt=0)
        f: float = Field(default=0.5, gt=0, lt=1)
        p: float = Field(default=0.5, ge=0, le=1)

    for key, values in {
        "n": [0, 1, 5, True],
        "k": [-1, 0, 3],
        "lr": [0, 1e-9, 2],
        "f": [0, 0.3, 1],
        "p": [-0.1, 0, 1, 1.1],
    }.items():
        for v in values:
            raw = {"seeds": [0], key: v}
            outcome = []
            for schema in (Typed, Spelled):
                try:
                    outcome.append(getattr(validate(schema, raw, "m"), key))
                except ParameterError as exc:
                    assert str(exc).startswith(f"parameter m.{key}:")
                    outcome.append("error")
            assert outcome[0] == outcome[1], (key, v, outcome)
    assert validate(Typed, {"seeds": [0], "variants": ["c", "a"]}, "m").variants == ["c", "a"]
    for bad, why in ((["a", "z"], "unknown variant(s) ['z']"), (["a", "a"], "listed twice"), ([], "at least 1")):
        with pytest.raises(ParameterError, match=r"^parameter m\.variants:") as exc:
            validate(Typed, {"seeds": [0], "variants": bad}, "m")
        assert why in str(exc.value)
    with pytest.raises(ParameterError, match=r"parameter m\.extra: .*unknown scorer\(s\) \['q'\]"):
        validate(Typed, {"seeds": [0], "extra": ["q"]}, "m")
