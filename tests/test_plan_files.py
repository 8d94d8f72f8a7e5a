"""Plan files: every malformed field is named with the file, the decision and the valid values; a plan
of another model (other weight shapes) is refused."""
import json

import pytest
import torch

import autoprec
from autoprec.planner.plan import Plan

from gpt_model import TinyGPT, tokens

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def saved_plan(tmp_path, d: int = 64) -> tuple[dict, object]:
    torch.manual_seed(0)
    c = torch.compile(TinyGPT(vocab=64, d=d, layers=1, heads=2, ctx=16), backend="autoprec",
                      options={"recipe": "nvfp4"})
    idx, tgt = tokens(batch=2, ctx=16, vocab=64)
    c(idx, tgt).backward()
    path = tmp_path / "plan.json"
    autoprec.plan(c).save(path)
    return json.loads(path.read_text()), path


def load_edited(path, data) -> Plan:
    path.write_text(json.dumps(data))
    return Plan.load(path)


def test_malformed_files_name_file_decision_and_field(tmp_path):
    data, path = saved_plan(tmp_path)
    assert data["schema_version"] == 4 and all("weight_shape" in d and "groups" in d and "input_amax" in d
                                               for d in data["decisions"])
    with pytest.raises(ValueError, match="plan.json: the top level must be a JSON object .* got a list"):
        load_edited(path, data["decisions"])
    with pytest.raises(ValueError, match="plan.json: field 'decisions' must be a list of decisions, got NoneType"):
        load_edited(path, {"schema_version": 3})
    with pytest.raises(ValueError, match="field 'hardware' = 'a100' is not valid; valid: gb300"):
        load_edited(path, {**data, "hardware": "a100"})
    bad_fields = [("rounding", "stochastic", "expected one of rne, sr"),
                  ("rht", "no", "expected true or false"),
                  ("tile2d", 1, "expected true or false"),
                  ("fmt", "fp4", "expected one of nvfp4, mxfp8"),
                  ("role", "forward", "expected one of fprop, dgrad, wgrad"),
                  ("index", "0", "expected an int"),
                  ("weight_shape", [64, "x"], "expected a list of ints or null"),
                  ("groups", 0, "expected a positive int or null"),
                  ("group_tokens", ["many"], "expected a list of numbers or null")]
    for field, value, valid in bad_fields:
        edited = json.loads(json.dumps(data))
        edited["decisions"][3][field] = value
        module = data["decisions"][3]["module"]
        with pytest.raises(ValueError, match=rf"plan.json, decision 3 \({module} .*\): field '{field}' .* {valid}"):
            load_edited(path, edited)
    edited = json.loads(json.dumps(data))
    del edited["decisions"][1]["fmt"]
    with pytest.raises(ValueError, match=r"decision 1 \(.*\): missing field\(s\) \['fmt'\]"):
        load_edited(path, edited)


def test_plan_of_another_model_is_refused(tmp_path):
    _, path = saved_plan(tmp_path, d=128)
    torch._dynamo.reset()
    torch.manual_seed(0)
    c = torch.compile(TinyGPT(vocab=64, d=64, layers=1, heads=2, ctx=16), backend="autoprec",
                      options={"plan": str(path)})
    idx, tgt = tokens(batch=2, ctx=16, vocab=64)
    with pytest.raises(Exception, match=r"option plan: the decision for blocks.0.attn.qkv fprop was made for a weight "
                                        r"of shape \(384, 128\), this model's is \(192, 64\)"):
        c(idx, tgt)


def test_version_1_files_still_load(tmp_path):
    data, path = saved_plan(tmp_path)
    for d in data["decisions"]:
        del d["weight_shape"]
    plan = load_edited(path, {**data, "schema_version": 1})
    assert all(d.weight_shape is None for d in plan.decisions)
