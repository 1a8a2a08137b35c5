"""PyTorch: models, the torchrun worker, the heterogeneity scheduler, comm hooks, accounting."""
