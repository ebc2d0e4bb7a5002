"""Whose failure is it (issue 49): a config that fails from the wheel against the same config run
without the wheel. The pure parts here; the reference itself runs for real in test_pipeline_units (a
site config with DeepSpeed's own LBFGS failure)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from test_recipe import GOOD

from builder import configs, smoke
from builder.configs import Blame, Outcome, as_check
from builder.contracts import BuildManifest
from builder.errors import RecipeError
from builder.node import ManifestError, config_category
from builder.recipe import parse_recipe
from builder.reference import judge

VERSIONS = "DeepSpeed 0.19.8 from its sdist with no op prebuilt and torch 2.13.0+cpu"
LBFGS = (
    "TypeError: LBFGS.step() missing 1 required positional argument: 'closure'\nTraceback (most recent call last):\n"
    '  File "/work/a/venv/lib/python3.11/site-packages/deepspeed/runtime/engine.py", line 3516'
)


def test_the_failures_signature_ignores_folders_and_addresses() -> None:
    a = "KeyError: 'sum' at /tmp/smoke-1/venv/lib/python3.11/site-packages/torch/optim/adagrad.py object 0x7f00aa"
    b = "KeyError: 'sum' at /var/cache/reference/3f2a/lib/python3.11/site-packages/torch/optim/adagrad.py object 0x1"
    assert configs.signature(a) == configs.signature(b) == "KeyError: 'sum' at adagrad.py object 0x?"
    assert configs.signature("") == ""
    assert configs.signature("RuntimeError: x\nmore") == "RuntimeError: x"


def test_the_same_failure_without_the_wheel_is_deepspeeds_own_anything_else_is_not() -> None:
    failed = Outcome("lbfgs.json", "failed", LBFGS)
    there = Outcome("lbfgs.json", "failed", LBFGS.replace("/work/a/venv", "/cache/reference/k"), jit=("shm",))
    own = judge(failed, there, VERSIONS)
    assert own.whose == "deepspeed"
    assert own.why == f"DeepSpeed's own failure, not the wheel's: the same error with {VERSIONS}; it compiled shm at " \
        "first use"  # fmt: skip
    # It passes without the wheel: the wheel's failure alone.
    assert judge(failed, Outcome("lbfgs.json", "passed", "3 steps"), VERSIONS).whose == "wheel"
    # Another error there, another status, no report, an empty error: not shown to be DeepSpeed's.
    other = judge(failed, Outcome("lbfgs.json", "failed", "RuntimeError: something else"), VERSIONS)
    assert other.whose == "unknown" and "RuntimeError: something else" in other.why
    assert judge(failed, Outcome("lbfgs.json", "needs-compiler", "no c++"), VERSIONS).whose == "unknown"
    assert judge(failed, None, VERSIONS).whose == "unknown"
    assert judge(Outcome("x", "failed", ""), Outcome("x", "failed", ""), VERSIONS).whose == "unknown"


def test_deepspeeds_own_failure_does_not_block_a_matrix_row_nor_a_listed_site_config() -> None:
    failed = Outcome("Adagrad/zero0/none/fp16", "failed", "KeyError: 'sum'\nTraceback ...")
    own = Blame("deepspeed", f"DeepSpeed's own failure, not the wheel's: the same error with {VERSIONS}")
    row = as_check(failed, "cuda", site=False, blame=own)
    assert row.status == "upstream"
    assert row.detail.splitlines()[0] == f"{own.why}: KeyError: 'sum'"  # the manifest keeps the first line
    assert config_category(row.status, row.detail) == "fails in DeepSpeed itself"
    # A site's config: it blocks unless the recipe lists it, with the way to list it.
    site = as_check(failed, "cuda", site=True, blame=own)
    assert site.status == "failed"
    assert "list it under [known_failures] with a reason" in site.detail.splitlines()[0]
    listed = as_check(failed, "cuda", site=True, blame=own, known="torch 2.11 Adagrad (https://x.org/1)")
    assert listed.status == "upstream"
    assert listed.detail.splitlines()[0].endswith("listed by the recipe as a known failure: torch 2.11 Adagrad "
                                                  "(https://x.org/1)")  # fmt: skip
    # Only with the wheel, or not shown: a failure, matrix or site, listed or not.
    for whose in ("wheel", "unknown"):
        for site_ in (False, True):
            check = as_check(failed, "cuda", site=site_, blame=Blame(whose, "it passes without the wheel"), known="x")
            assert check.status == "failed" and "(it passes without the wheel)" in check.detail.splitlines()[0]
    # Without a reference (none ran) a failure stays one.
    assert as_check(failed, "cuda", site=False).status == "failed"


def test_a_recipes_known_failures_name_its_configs_with_a_reason_and_a_link() -> None:
    data: dict[str, Any] = {**copy.deepcopy(GOOD), "configs": ["configs/lbfgs.json"]}
    good = {**data, "known_failures": {"configs/lbfgs.json": {"reason": "DeepSpeed steps LBFGS   without a closure",
                                                               "link": "https://github.com/x/y/issues/1"}}}  # fmt: skip
    recipe = parse_recipe(good)
    assert recipe.known_failures == (("configs/lbfgs.json", "DeepSpeed steps LBFGS without a closure",
                                      "https://github.com/x/y/issues/1"),)  # fmt: skip
    assert recipe.known_table == {"configs/lbfgs.json": {"reason": "DeepSpeed steps LBFGS without a closure",
                                                         "link": "https://github.com/x/y/issues/1"}}  # fmt: skip
    bad = [
        ({"configs/lbfgs.jsn": {"reason": "r"}}, "is not one of the recipe's configs (did you mean"),
        ({"configs/lbfgs.json": "just text"}, "must be a table of reason and link"),
        ({"configs/lbfgs.json": {"reason": "r", "url": "https://x"}}, "must be a table of reason and link"),
        ({"configs/lbfgs.json": {"link": "https://x"}}, "reason must say why it fails"),
        ({"configs/lbfgs.json": {"reason": "  "}}, "reason must say why it fails"),
        ({"configs/lbfgs.json": {"reason": "r" * 501}}, "reason must say why it fails"),
        ({"configs/lbfgs.json": {"reason": "r", "link": "javascript:alert(1)"}}, "link is not an http(s) URL"),
        ({"configs/lbfgs.json": {"reason": "r", "link": 'https://x/"><script>'}}, "link is not an http(s) URL"),
    ]
    for table, expected in bad:
        with pytest.raises(RecipeError) as err:
            parse_recipe({**data, "known_failures": table})
        assert expected in err.value.message and err.value.exit_code == 2, (table, err.value.message)
    with pytest.raises(RecipeError) as err:  # a config the recipe does not name at all
        parse_recipe({**copy.deepcopy(GOOD), "known_failures": {"configs/lbfgs.json": {"reason": "r"}}})
    assert "is not one of the recipe's configs" in err.value.message


def _manifest(**extra: Any) -> dict[str, Any]:
    return {"schema": 1, "version": "0.19.8+cpu.torch2.13", "recipe": {"name": "site", "torch": "2.13.0"},
            "accelerator": "cpu", "python_tag": "cp311", "torch": {"version": "2.13.0+cpu"}, "archs": [],
            "cpu_target": "x86-64-v3", "ops": ["cpu_adam"], "source": {"sha256": "a" * 64},
            "configs": {"configs/lbfgs.json": {}}, **extra}  # fmt: skip


def test_the_wheels_manifest_carries_known_failures_each_checked() -> None:
    from builder.contracts import BUILD_SCHEMA

    good = _manifest(schema=BUILD_SCHEMA, known_failures={"configs/lbfgs.json": {"reason": "r", "link": "https://x/1"}})
    manifest = BuildManifest.from_dict(good, "ds_builder.json")
    assert manifest.known_failures == {"configs/lbfgs.json": {"reason": "r", "link": "https://x/1"}}
    assert smoke.known_reason(manifest.known_failures, "configs/lbfgs.json") == "r (https://x/1)"
    assert smoke.known_reason(manifest.known_failures, "configs/other.json") == ""
    for table, expected in (
        ({"configs/other.json": {"reason": "r"}}, "which is not one of its configs"),
        ({"configs/lbfgs.json": {"reason": "r\x1b[2J"}}, "field 'reason' is not valid"),
        ({"configs/lbfgs.json": {"reason": "r", "link": "file:///etc/passwd"}}, "field 'link' is not valid"),
        ({"configs/lbfgs.json": "r"}, "is not"),
    ):
        with pytest.raises(ManifestError) as err:
            BuildManifest.from_dict(_manifest(schema=BUILD_SCHEMA, known_failures=table), "ds_builder.json")
        assert expected in err.value.message, (table, err.value.message)
    assert json.loads(manifest.to_json())["known_failures"]["configs/lbfgs.json"]["reason"] == "r"


def test_the_reference_venv_is_made_with_deepspeeds_requirements_and_never_a_second_torch() -> None:
    """Issue 56: on an air-gapped node the reference venv reaches the node's own packages through a .pth
    file, which `uv pip install <sdist>` does not count ("einops was not found in the provided package
    locations"); DeepSpeed's requirements now go in with torch's requirement first, the sdist alone after."""
    from builder.recipe import TorchSpec
    from builder.reference import requirements

    got = requirements(TorchSpec("2.11.0"), ["einops", "hjson", "torch>=2.0", "Torch", "numpy", "einops"])
    assert got == ["torch==2.11.0", "setuptools", "wheel", "ninja", "einops", "hjson", "numpy"]
