"""Faults: failure records a rank leaves (`records`), the finite-gradient guard, and the
watch that ends a job whose rank failed or stalled (`watch`)."""
