"""Tools to change the repository itself (not installed): `python -m tools.split_tests`."""
