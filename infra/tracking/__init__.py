"""MLflow tracking, the adapter: the tracker (`tracker.MLflowTracker`, the only reader and
writer of MLflow), what hetflow's runs hold (`content`) and the runs' addresses in the UI
(`links`). The comparison it logs is drawn and worded in `hetflow.infra.report`.

Nothing here is a Prefect task: the tasks and flows call the tracker.
"""
