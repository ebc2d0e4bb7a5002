from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from builder.errors import RecipeError
from builder.recipe import load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
GOOD: dict[str, Any] = {
    "name": "cpu",
    "accelerator": "cpu",
    "ops": ["cpu_adam", "cpu_lion"],
    "deepspeed": {"version": "0.19.8", "sha256": "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"},
    "torch": {"version": "2.13.0"},
}
CUDA = {**GOOD, "accelerator": "cuda", "arch": ["sm_90", "8.0"]}


def with_change(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(GOOD)
    table = data
    for key in path[:-1]:
        table = table[key]
    if value is None:
        del table[path[-1]]
    else:
        table[path[-1]] = value
    return data


def test_default_recipe_is_the_issue_recipe() -> None:
    recipe = load_recipe(ROOT / "recipes" / "cpu.toml")
    assert recipe.name == "cpu"
    assert recipe.accelerator == "cpu"
    assert recipe.ops == ("cpu_adam", "cpu_adagrad", "cpu_lion", "deepspeed_shm_comm", "fused_adam")
    assert recipe.deepspeed.version == "0.19.8"
    assert recipe.deepspeed.sha256 == "9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"
    assert recipe.torch.requirement == "torch==2.13.0+cpu" and recipe.torch.variant == "cpu"
    assert recipe.torch.index_url == "https://download.pytorch.org/whl/cpu" and recipe.torch.index is None


def test_torch_build_is_named_by_variant_or_index() -> None:
    """Issue 31 item 6: a variant pins the build (an index's default build cannot stand in) and maps
    to PyTorch's index for it; a site's index is kept as written; neither pins nothing extra."""
    plain = parse_recipe(GOOD).torch
    assert (plain.requirement, plain.index_url, plain.describe()) == ("torch==2.13.0", None, "2.13.0")
    cu = parse_recipe({**CUDA, "torch": {"version": "2.14.1", "variant": "cu126"}}).torch
    assert cu.requirement == "torch==2.14.1+cu126" and cu.index_url == "https://download.pytorch.org/whl/cu126"
    mirror = parse_recipe({**GOOD, "torch": {"version": "2.13.0", "variant": "cpu",
                                             "index": "file:///srv/pytorch/whl/cpu/"}}).torch  # fmt: skip
    assert mirror.index_url == "file:///srv/pytorch/whl/cpu" and mirror.describe().endswith(
        "from file:///srv/pytorch/whl/cpu"
    )
    only_index = parse_recipe({**GOOD, "torch": {"version": "2.13.0", "index": "https://mirror.site/whl/cpu"}}).torch
    assert only_index.requirement == "torch==2.13.0" and only_index.index_url == "https://mirror.site/whl/cpu"


@pytest.mark.parametrize(
    ("data", "expected", "fix"),
    [
        (
            {**GOOD, "torch": {"version": "2.13.0", "variant": "cuda12"}},
            'torch.variant "cuda12" is not a build',
            '"cu126", "cu130"',
        ),
        (
            {**GOOD, "torch": {"version": "2.13.0", "variant": "cu130"}},
            'torch.variant "cu130" does not fit accelerator "cpu"',
            "variant = cpu",
        ),
        (
            {**CUDA, "torch": {"version": "2.14.1", "variant": "cpu"}},
            'torch.variant "cpu" does not fit accelerator "cuda"',
            "variant = cu126, cu128, cu130",
        ),
        (
            {**GOOD, "torch": {"version": "2.13.0+cpu"}},
            'torch.version "2.13.0+cpu" has a build label',
            'version = "2.13.0", variant = "cpu"',
        ),
        (
            {**GOOD, "torch": {"version": "system", "variant": "cpu"}},
            'torch.version = "system" takes no variant',
            "remove torch.variant",
        ),
        (
            {**GOOD, "torch": {"version": "2.13.0", "index": "download.pytorch.org/whl/cpu"}},
            "is not an index URL",
            "https://download.pytorch.org/whl/cu130",
        ),
        (
            {**GOOD, "torch": {"version": "2.13.0", "index": "https://x/ --trusted-host y"}},
            "is not an index URL",
            "mirror",
        ),
        ({**GOOD, "torch": {"version": "2.13.0", "variant": 3}}, "torch.variant must be a string", ""),
        (
            {**GOOD, "torch": {"version": "2.13.0", "index": "http://user:TOKEN@mirror.example/simple"}},
            "torch.index holds a user name or password (user:TOKEN@host)",
            "~/.netrc",
        ),
        (
            {**GOOD, "torch": {"version": "2.13.0", "index": "https://mirror.example/\x1b[2Jsimple"}},
            "holds a control character",
            "plain text",
        ),
        (
            {**GOOD, "description": "a\x1b]0;owned\x07 recipe"},
            "description = 'a\\x1b]0;owned\\x07 recipe' holds a control character",
            "",
        ),
    ],
)
def test_bad_torch_builds_are_refused(data: dict[str, Any], expected: str, fix: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(data, Path("r.toml"))
    assert expected in err.value.message and fix in err.value.fix


def test_recipe_is_frozen() -> None:
    recipe = parse_recipe(GOOD)
    with pytest.raises(AttributeError):
        recipe.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("opss",), ["cpu_adam"], 'unknown key "opss" (did you mean "ops"?)'),
        (("torch", "verison"), "2.13.0", 'unknown key "torch.verison" (did you mean "version"?)'),
        (("deepspeed", "sha265"), "ab", 'unknown key "deepspeed.sha265" (did you mean "sha256"?)'),
        (("accelerator",), "cdua", 'unknown accelerator "cdua" (did you mean "cuda"?)'),
        (("ops",), "cpu_adam", 'ops = "cpu_adam" is not a list of ops or "all"'),
        (("ops",), [], "ops must be a non-empty list"),
        (("ops",), ["cpu_adam", "cpu_adam"], "ops lists cpu_adam more than once"),
        (("name",), "CPU recipe", 'name "CPU recipe" is not usable'),
        (("deepspeed", "sha256"), "abc", "deepspeed.sha256 is not a sha256 hex digest"),
        (("deepspeed", "version"), "zero.nineteen", 'deepspeed.version "zero.nineteen" is not a valid version'),
        (("torch",), None, "missing torch"),
        (("torch", "version"), None, "missing torch.version"),
        (("torch",), "2.13.0", "torch must be a table"),
    ],
)
def test_bad_recipes_are_rejected_with_the_reason(path: tuple[str, ...], value: Any, expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(with_change(path, value), Path("r.toml"))
    assert expected in err.value.message
    assert err.value.message.startswith("r.toml: ")
    assert err.value.fix


def test_unknown_key_lists_allowed_keys() -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(with_change(("colour",), "blue"))
    assert (
        "allowed keys: name, description, accelerator, ops, ops_except, on_op_failure, arch, cpu_target, strip, "
        "narrow_ops, compress_device_code, cuda_toolkit, python, deepspeed, torch" in err.value.fix
    )


def test_cuda_recipe_archs_are_normalised() -> None:
    recipe = parse_recipe(CUDA)
    assert recipe.archs == ("8.0", "9.0") and not recipe.auto_arch
    assert parse_recipe({**CUDA, "arch": "Hopper"}).archs == ("9.0+PTX",)
    auto = parse_recipe({**CUDA, "arch": "auto"})
    assert auto.auto_arch and auto.archs == ()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({**CUDA, "arch": ["9.0", "sm_99x"]}, 'r.toml: arch "sm_99x" is not a CUDA architecture'),
        ({**CUDA, "arch": []}, 'arch must be "auto" or a non-empty list'),
        ({k: v for k, v in CUDA.items() if k != "arch"}, "a cuda recipe needs arch"),
        ({**GOOD, "arch": ["9.0"]}, "arch is only for cuda recipes"),
        ({**GOOD, "cpu_target": "x86-64-v5"}, 'unknown cpu_target "x86-64-v5" (did you mean "x86-64-v4"?)'),
        ({**GOOD, "strip": "yes"}, "strip must be true or false"),
        ({**CUDA, "narrow_ops": ["fp_quantizer"]}, "narrow_ops names fp_quantizer, which ops does not list"),
        ({**GOOD, "narrow_ops": ["cpu_adam"]}, "narrow_ops is only for cuda recipes"),
        ({**CUDA, "narrow_ops": [3]}, "narrow_ops must be a list of op names"),
        ({**CUDA, "cuda_toolkit": "pipx"}, 'unknown cuda_toolkit "pipx" (did you mean "pip"?)'),
        ({**CUDA, "compress_device_code": "no"}, "compress_device_code must be true or false"),
    ],
)
def test_bad_arch_and_targets(data: dict[str, Any], expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        parse_recipe(data, Path("r.toml"))
    assert expected in err.value.message


def test_defaults_are_portable_and_stripped() -> None:
    recipe = parse_recipe(GOOD)
    assert recipe.cpu_target == "x86-64-v3" and recipe.strip is True
    cuda = parse_recipe(CUDA)
    assert cuda.compress_device_code and cuda.cuda_toolkit == "auto" and cuda.narrow_ops == ()
    narrow = parse_recipe({**CUDA, "ops": ["fused_adam", "fp_quantizer"], "narrow_ops": ["fp_quantizer"]})
    assert narrow.narrow_ops == ("fp_quantizer",)


def test_shipped_recipes_load() -> None:
    for path in sorted((ROOT / "recipes").glob("*.toml")):
        recipe = load_recipe(path)
        assert recipe.name == path.stem
        if recipe.accelerator == "cuda":
            assert recipe.archs or recipe.auto_arch


def test_sha256_is_normalised_to_lowercase() -> None:
    recipe = parse_recipe(with_change(("deepspeed", "sha256"), GOOD["deepspeed"]["sha256"].upper()))
    assert recipe.deepspeed.sha256 == GOOD["deepspeed"]["sha256"]


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nops = [\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(bad)
    assert "is not valid TOML" in err.value.message and "bad.toml" in err.value.message


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as err:
        load_recipe(tmp_path / "nope.toml")
    assert "cannot read recipe" in err.value.message
