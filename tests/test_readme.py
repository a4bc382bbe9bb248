"""The README's Python examples run as written, in order, in one namespace
(the later ones use the index the first one builds), in a scratch folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    # (```py blocks need a Spark cluster or files a reader has: the Spark
    # session example runs as a user's script in tests/test_spark_session.py)
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def test_the_readme_python_examples_run(tmp_path, monkeypatch, capsys):
    blocks = python_blocks()
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)                    # idx.save("subs.bexidx") writes here
    namespace: dict = {}
    for n, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {n + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "NULL     brand IN ('a', 'b')        -- brand is absent" in out     # the explain example's tree
    assert "[7]" in out                                                        # EventStream's result
    # the rules-table example: its read-back and both matches
    assert ("device IN ('desktop') AND age >= 25 AND floor_price <= 2.5 AND premium = TRUE AND site NOT IN (7, 9)\n"
            "[101]\n[102]\n") in out
