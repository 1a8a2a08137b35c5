"""Recognisable fake AWS credentials, and where they leaked: a run is given these and every
record it made is scanned for them (tests/integration/config/test_secrets.py)."""

from __future__ import annotations

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAHETFLOWLEAKTEST7",
    "AWS_SECRET_ACCESS_KEY": "hetflowLeakTestSecret/0123456789+abcdefXYZ",
    "AWS_SESSION_TOKEN": "hetflowLeakTestSessionToken0987654321",
}


def leaks(text: str) -> list[str]:
    """The names of the secrets whose values appear in `text`."""
    return [name for name, value in SECRETS.items() if value in text]
