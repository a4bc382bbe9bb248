"""pyproject.toml (pip) and environment.yml (conda) must name the same packages.

Every requirement of pyproject.toml -- core dependencies and every extra --
must appear in environment.yml, as a conda dependency under the conda name
given by PYPI_TO_CONDA below (the PyPI name itself when not listed), or as a
pip dependency under its PyPI name; and every package of environment.yml must
come from pyproject.toml, apart from CONDA_ONLY. Where both files constrain a
version, the constraints must be the same.

So adding a dependency to one file only fails here: a new pyproject
requirement is missing from environment.yml (test_every_pyproject_requirement_
is_in_environment_yml), and a new environment.yml package is unknown to
pyproject (test_environment_yml_has_nothing_pyproject_lacks).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "bexmatch"

# PyPI distribution name -> conda package name, where they differ. The CUDA
# wheels on PyPI carry the CUDA major version in their names; on conda the
# `cuda-version` package selects it instead. DuckDB's Python package is
# published on conda-forge as `python-duckdb`.
PYPI_TO_CONDA = {
    "cupy-cuda12x": "cupy",
    "cudf-cu12": "cudf",
    "duckdb": "python-duckdb",
    "nvidia-cuda-nvcc-cu12": "cuda-nvcc",
    "nvidia-cuda-nvrtc-cu12": "cuda-nvrtc",
}

# Conda packages with no PyPI counterpart in pyproject.toml: the interpreter,
# pip itself, the CUDA major version pin, and the Java runtime Spark needs.
CONDA_ONLY = {"python", "pip", "cuda-version", "openjdk"}

_CONDA_SPEC = re.compile(r"^(?:[\w.-]+::)?(?P<name>[A-Za-z0-9_.-]+)\s*(?P<spec>.*)$")


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _environment() -> dict:
    with open(ROOT / "environment.yml", encoding="utf-8") as f:
        return yaml.safe_load(f)


def pyproject_requirements() -> dict[str, list[tuple[str, SpecifierSet]]]:
    """conda-facing name -> [(where in pyproject, specifier)] for every requirement."""
    project = _pyproject()["project"]
    groups = {"dependencies": project.get("dependencies", [])}
    for extra, reqs in project.get("optional-dependencies", {}).items():
        groups[f"optional-dependencies.{extra}"] = reqs
    found: dict[str, list[tuple[str, SpecifierSet]]] = {}
    for where, reqs in groups.items():
        for text in reqs:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name == PROJECT:  # an extra that pulls in another extra
                continue
            found.setdefault(name, []).append((where, req.specifier))
    return found


def environment_packages() -> dict[str, tuple[str, SpecifierSet | None]]:
    """PyPI name -> (conda or pip, specifier) for every package of environment.yml.

    Conda names are mapped back to PyPI names through PYPI_TO_CONDA; CONDA_ONLY
    packages are returned under their own names with specifier None.
    """
    conda_to_pypi = {conda: pypi for pypi, conda in PYPI_TO_CONDA.items()}
    found: dict[str, tuple[str, SpecifierSet | None]] = {}

    def put(name: str, source: str, spec: SpecifierSet | None) -> None:
        assert name not in found, f"environment.yml names {name!r} twice"
        found[name] = (source, spec)

    for dep in _environment()["dependencies"]:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"unexpected mapping in environment.yml dependencies: {dep}"
            for line in dep["pip"]:
                if line.lstrip().startswith("-"):  # pip options, `-e .` (the project itself)
                    continue
                req = Requirement(line)
                put(canonicalize_name(req.name), "pip", req.specifier)
            continue
        m = _CONDA_SPEC.match(str(dep).strip())
        assert m, f"cannot read conda dependency {dep!r}"
        name = canonicalize_name(m["name"])
        if name in CONDA_ONLY:
            put(name, "conda", None)
            continue
        assert name not in PYPI_TO_CONDA, (
            f"environment.yml: {name!r} is a PyPI name; conda calls it {PYPI_TO_CONDA[name]!r}")
        spec = m["spec"].replace(" ", "")
        # Only the PEP 440 subset of conda's version syntax is comparable with
        # pyproject.toml; conda's fuzzy `=1.2` means `1.2.*` and is refused.
        assert not re.match(r"^=[^=]", spec), (
            f"environment.yml: write {dep!r} with a PEP 440 operator (==, >=, <, ...) "
            "so that it can be compared with pyproject.toml")
        put(conda_to_pypi.get(name, name), "conda", SpecifierSet(spec))
    return found


def test_environment_yml_shape():
    env = _environment()
    assert env["name"] == PROJECT
    assert env["channels"] == ["rapidsai", "conda-forge", "nvidia"]
    deps = env["dependencies"]
    pip_sections = [d for d in deps if isinstance(d, dict)]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    assert any(re.fullmatch(r"-e\s+\.(\[[\w,-]+\])?", line.strip()) for line in pip_sections[0]["pip"]), \
        "the pip: section must install the project itself (-e .)"


def test_environment_python_satisfies_requires_python():
    requires = SpecifierSet(_pyproject()["project"]["requires-python"])
    pythons = [str(d) for d in _environment()["dependencies"]
               if isinstance(d, str) and re.match(r"^python\s*[=<>!~]", d)]
    assert len(pythons) == 1, "environment.yml must pin one python version"
    version = re.sub(r"^python\s*=+\s*", "", pythons[0])
    assert requires.contains(version), f"python={version} does not satisfy requires-python {requires}"


def test_pyproject_repeats_agree():
    """A package named in several groups of pyproject.toml is constrained alike
    wherever it carries a constraint (else there is no one value to compare)."""
    for name, uses in pyproject_requirements().items():
        specs = {str(spec): where for where, spec in uses if str(spec)}
        assert len(specs) <= 1, f"{name} has different version constraints in pyproject.toml: {specs}"


def test_every_pyproject_requirement_is_in_environment_yml():
    env = environment_packages()
    missing = [f"{name} (from {uses[0][0]}; conda name {PYPI_TO_CONDA.get(name, name)!r})"
               for name, uses in sorted(pyproject_requirements().items()) if name not in env]
    assert not missing, "in pyproject.toml but not in environment.yml: " + ", ".join(missing)


def test_environment_yml_has_nothing_pyproject_lacks():
    wanted = pyproject_requirements()
    extra = [f"{name} ({source})" for name, (source, _) in sorted(environment_packages().items())
             if name not in wanted and name not in CONDA_ONLY]
    assert not extra, ("in environment.yml but not in pyproject.toml (add it there, or to "
                       "CONDA_ONLY/PYPI_TO_CONDA in this test with a reason): " + ", ".join(extra))


@pytest.mark.parametrize("name", sorted(pyproject_requirements()))
def test_version_constraints_agree(name):
    env = environment_packages()
    if name not in env:
        pytest.fail(f"{name} is missing from environment.yml")
    env_spec = env[name][1]
    for where, spec in pyproject_requirements()[name]:
        if str(spec) and str(env_spec):
            assert spec == env_spec, (
                f"{name}: pyproject.toml [{where}] says {spec!s}, environment.yml says {env_spec!s}")


# ------------------------------------------------------------------ NumPy floor
# The NumPy floor of pyproject.toml (and so of environment.yml) is the oldest
# NumPy the project runs on.  Two facts bound it from below: NumPy publishes
# no wheels for a Python older than its release, and the project's modules
# must use no NumPy API newer than the floor.  NumPy 2's StringDType, which
# bexmatch once used, is such an API -- and was broken for strings of 16 bytes
# or more (numpy issue 31533).

#: the first NumPy release with wheels for each Python (requires-python's minimum)
NUMPY_FOR_PYTHON = {"3.11": "1.23.2", "3.12": "1.26.0", "3.13": "2.1.0"}

#: NumPy names newer than NumPy 1.23 (dotted below the numpy namespace),
#: with the release that added them
NUMPY_ADDED = {
    "dtypes": "1.25", "exceptions": "1.25", "dtypes.StringDType": "2.0", "strings": "2.0",
    "unique_values": "2.0", "unique_counts": "2.0", "unique_inverse": "2.0", "unique_all": "2.0",
    "bitwise_count": "2.0", "vecdot": "2.0", "isdtype": "2.0", "astype": "2.0", "concat": "2.0",
    "permute_dims": "2.0", "matrix_transpose": "2.0", "pow": "2.0", "bool": "2.0", "long": "2.0", "ulong": "2.0",
    "trapezoid": "2.0", "acos": "2.0", "acosh": "2.0", "asin": "2.0", "asinh": "2.0", "atan": "2.0",
    "atanh": "2.0", "atan2": "2.0", "bitwise_invert": "2.0", "bitwise_left_shift": "2.0",
    "bitwise_right_shift": "2.0", "cumulative_sum": "2.1", "cumulative_prod": "2.1", "unstack": "2.1",
    "matvec": "2.2", "vecmat": "2.2",
}

#: keywords newer than their NumPy function: (function, keyword) -> release
NUMPY_KEYWORD_ADDED = {
    ("unique", "equal_nan"): "1.24", ("isin", "kind"): "1.24", ("asarray", "copy"): "2.0",
    ("sort", "stable"): "2.0", ("argsort", "stable"): "2.0", ("reshape", "shape"): "2.1",
    ("reshape", "copy"): "2.1", ("unique", "sorted"): "2.3",
}

SOURCE_PACKAGES = ("engine", "gpu_kernels", "spark_integration")


def numpy_floor() -> Version:
    (spec,) = [req.specifier for req in map(Requirement, _pyproject()["project"]["dependencies"])
               if canonicalize_name(req.name) == "numpy"]
    (floor,) = [s.version for s in spec if s.operator == ">="]
    return Version(floor)


def _below_numpy(node: ast.AST) -> str | None:
    """``dtypes.StringDType`` for the expression ``np.dtypes.StringDType``
    (or ``numpy.``...), None for anything not rooted at the numpy module."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join(reversed(parts)) if parts and isinstance(node, ast.Name) and node.id in ("np", "numpy") \
        else None


def numpy_apis(tree: ast.AST) -> list[tuple[int, str, Version]]:
    """(line, what, release that added it) of every NumPy API of
    NUMPY_ADDED / NUMPY_KEYWORD_ADDED that a module's syntax tree uses."""
    found = []
    for node in ast.walk(tree):
        name = _below_numpy(node)
        if name in NUMPY_ADDED:
            found.append((node.lineno, f"np.{name}", Version(NUMPY_ADDED[name])))
        if isinstance(node, ast.Call) and _below_numpy(node.func):
            for keyword in node.keywords:
                added = NUMPY_KEYWORD_ADDED.get((_below_numpy(node.func), keyword.arg))
                if added:
                    found.append((node.lineno, f"np.{_below_numpy(node.func)}({keyword.arg}=)", Version(added)))
    return sorted(found)


def test_numpy_floor_has_wheels_for_the_oldest_python():
    python = re.fullmatch(r">=\s*(\d+\.\d+)", _pyproject()["project"]["requires-python"].strip())
    assert python, "requires-python must be a plain >= X.Y"
    needed = Version(NUMPY_FOR_PYTHON[python.group(1)])
    assert numpy_floor() >= needed, f"NumPy {numpy_floor()} has no wheels for Python {python.group(1)}"


def test_numpy_floor_covers_every_numpy_api_the_modules_use():
    """No module of the project uses a NumPy API newer than the floor of
    pyproject.toml (raise the floor, or do without the API)."""
    floor = numpy_floor()
    newer = [f"{path.relative_to(ROOT)}:{line}: {what} (NumPy {added})"
             for package in SOURCE_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for line, what, added in numpy_apis(ast.parse(path.read_text(encoding="utf-8"), str(path)))
             if added > floor]
    assert not newer, f"NumPy APIs newer than the floor numpy>={floor}: " + "; ".join(newer)


def test_the_numpy_api_scan_finds_names_chains_and_keywords():
    tree = ast.parse("import numpy as np\nnp.unique_values(a)\nx = np.dtypes.StringDType()\n"
                     "np.sort(a, stable=True)\nnp.unique(a, return_inverse=True)\na.astype(int, copy=False)\n")
    assert [(line, what) for line, what, _ in numpy_apis(tree)] == [
        (2, "np.unique_values"), (3, "np.dtypes"), (3, "np.dtypes.StringDType"), (4, "np.sort(stable=)")]


def test_the_public_api_is_typed():
    # every public function and public method of the two packages' exports
    # has a hint on each parameter and on its return, and the hints resolve
    import inspect
    import os
    import typing

    import pandas
    import pyspark.sql
    import pyspark.sql.streaming
    import pyspark.sql.types

    import engine
    import spark_integration
    from engine.algorithms.base import Matcher
    from engine.explain import Explanation
    from engine.expr import Node
    from engine.schema import SchemaView

    names = {"pandas": pandas, "os": os, "DataFrame": pyspark.sql.DataFrame, "SparkSession": pyspark.sql.SparkSession,
             "StreamingQuery": pyspark.sql.streaming.StreamingQuery, "StructType": pyspark.sql.types.StructType,
             "Index": engine.Index, "MatchStats": spark_integration.MatchStats, "Matcher": Matcher,
             "Explanation": Explanation, "Node": Node, "SchemaView": SchemaView, "Iterable": typing.Iterable}
    checked = []
    for package in (engine, spark_integration):
        for name in package.__all__:
            obj = getattr(package, name)
            if inspect.isfunction(obj):
                functions = [(name, obj)]
            elif inspect.isclass(obj) and obj.__module__.startswith(("engine", "spark_integration")):
                functions = [(f"{name}.{member}", f) for member, f in vars(obj).items()
                             if inspect.isfunction(f) and (not member.startswith("_") or member == "__init__")]
            else:
                continue
            for label, function in functions:
                hints = typing.get_type_hints(function, localns=names)
                parameters = [p for p in inspect.signature(function).parameters.values() if p.name not in ("self", "cls")]
                assert all(p.name in hints for p in parameters), (label, [p.name for p in parameters if p.name not in hints])
                assert "return" in hints or function.__name__ == "__init__", label
                checked.append(label)
    assert {"Index.match_batch", "Index.add_many", "match_events", "session", "validate", "EventStream.submit"} <= set(checked)
