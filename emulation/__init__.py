"""Emulating a heterogeneous cluster on one CPU host: a worker's compute by time dilation
(`emulator`), its network link by delay per collective (`link`), a slow object store by
latency and shared bandwidth (`store`). Off in the cloud, where the same code measures real
instances.

Installed as `hetflow.emulation`; it imports nothing of hetflow's, so every layer may use it.
"""

if __name__ != "hetflow.emulation":  # e.g. `import emulation` from the repository root
    raise ImportError(
        f"import hetflow.emulation, not {__name__}: only the hetflow namespace is installed"
    )
