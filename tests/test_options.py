"""Every backend option is type-checked, and its error names it."""
import pytest

from autoprec.planner.options import parse_options
from autoprec.planner.plan import Plan


@pytest.mark.parametrize("options, error, text", [
    ({"budget": "0.01"}, TypeError, "option budget must be a number, got str '0.01'"),
    ({"budget": True}, TypeError, "option budget must be a number, got bool"),
    ({"budget": float("nan")}, ValueError, "option budget must be a finite number >= 0"),
    ({"budget": -1}, ValueError, "option budget must be a finite number >= 0"),
    ({"target_speedup": "2"}, TypeError, "option target_speedup must be a number or None, got str"),
    ({"target_speedup": False}, TypeError, "option target_speedup must be a number or None, got bool"),
    ({"target_speedup": float("inf")}, ValueError, "option target_speedup must be a finite number > 0"),
    ({"plan": 123}, TypeError, "option plan must be an autoprec.Plan or the path of a saved plan, got int"),
    ({"plan": "missing.json"}, ValueError, "option plan: no plan file at 'missing.json'"),
    ({"phase": "rl_trainer", "match": ["x"]}, TypeError, "option match must be an autoprec.Plan"),
    ({"recipe": 4}, TypeError, "option recipe must be a string, got int"),
    ({"recipe": "fp4"}, ValueError, "option recipe='fp4' is not valid; choose from auto"),
    ({"hardware": None}, TypeError, "option hardware must be a string"),
    ({"seed": 1.5}, TypeError, "option seed must be an int, got float"),
    ({"calibrate": True}, TypeError, "option calibrate must be an int, got bool"),
    ({"calibrate": 0}, ValueError, "option calibrate must be >= 1"),
    ({"overrides": [("a", "bf16")]}, TypeError, "option overrides must be a dict, got list"),
    ({"inner": "eager"}, ValueError, "option inner='eager' is not valid; choose from aot_eager, inductor"),
    ({"mx_scale": "ceil"}, ValueError, "option mx_scale='ceil' is not valid"),
    ({"measure": "some"}, ValueError, "option measure='some' is not valid; choose from eligible, all"),
    ({"grad_weights": [0.1]}, TypeError, "option grad_weights must be a dict, got list"),
    ({"grad_weights": {"nois": 0.1}}, ValueError, "option grad_weights: unknown key 'nois'; valid: noise, bias"),
    ({"grad_weights": {"bias": -1}}, ValueError, r"option grad_weights\['bias'\] must be a finite number >= 0"),
    ({"grad_weights": {"noise": "0"}}, ValueError, r"option grad_weights\['noise'\] must be a finite number"),
])
def test_bad_option_names_itself(options, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        parse_options(options)


def test_good_options_pass():
    opts = parse_options({"budget": 1, "target_speedup": 2, "plan": Plan(), "seed": 3})
    assert opts.budget == 1 and opts.target_speedup == 2 and opts.seed == 3
    assert opts.damage_weights() == (0.25, 1.0)
    assert parse_options({"grad_weights": {"noise": 0.05}}).damage_weights() == (0.05, 1.0)
    with pytest.raises(TypeError, match="autoprec options must be a dict, got str"):
        parse_options("auto")
