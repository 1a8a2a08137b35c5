"""hetflow: data-parallel PyTorch training on heterogeneous instances, orchestrated by Prefect."""

__version__ = "0.1.0"
