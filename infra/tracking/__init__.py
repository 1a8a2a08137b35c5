"""MLflow tracking: the tracker (`tracker.MLflowTracker`), its plots and the comparison table.

Nothing here is a Prefect task: the tasks and flows call the tracker. The submodules are
imported by name (`hetflow.infra.tracking.report` is pure and does not load MLflow).
"""
