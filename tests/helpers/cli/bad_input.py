"""Helpers both halves of test_bad_input.py use: tests/unit/cli/test_bad_input.py and
tests/integration/cli/test_bad_input.py (and any other test module that imports them)."""

from __future__ import annotations

import os

from tests.procs import run_cli

# -- the real command, as a user runs it: one line, no traceback, before any flow starts -------


def _hetflow(tmp_path, *args: str, s3: str | None = None) -> str:
    """`hetflow ARGS` in a subprocess, nothing configured but the S3 endpoint `s3` (the moto
    server's, with its fake credentials, where given); asserts it was refused in one line
    with exit status 2, no traceback and no flow started; that line."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API", "RAY_"))
    }
    env.update(
        HETFLOW_HOME=str(tmp_path / "home"),
        PREFECT_HOME=str(tmp_path / "home" / "prefect"),
        AWS_EC2_METADATA_DISABLED="true",  # no instance-role lookup on a machine that is none
    )
    if s3:
        env.update({k: os.environ[k] for k in os.environ if k.startswith("AWS_")})
    proc = run_cli(list(args), env, timeout=120)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if "hetflow: error:" in line]
    assert proc.returncode == 2, out
    assert len(errors) == 1 and proc.stderr.strip() == errors[0], out
    assert "Traceback" not in out and "temporary server" not in out, out  # no flow started
    return errors[0]
