"""Helpers both halves of test_recommend_flow.py use: tests/unit/flows/test_recommend_flow.py and
tests/integration/flows/test_recommend_flow.py (and any other test module that imports them)."""

from __future__ import annotations

import json


def cli(flags: list[str], tmp_path, capsys) -> tuple[int, dict, str, str]:
    """`hetflow recommend FLAGS`: (exit status, its --json figures, its cluster file, stderr)."""
    from hetflow.cli import main

    out, figures = tmp_path / "cli.yaml", tmp_path / "cli.json"
    code = main(["recommend", *flags, "-o", str(out), "--json", str(figures)])
    err = capsys.readouterr().err
    if code:
        return code, {}, "", err
    return code, json.loads(figures.read_text()), out.read_text(), err
