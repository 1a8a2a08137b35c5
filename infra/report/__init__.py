"""The comparison report (pure, no MLflow): the side-by-side table of two runs (`table`), what
its figures do not say (`notes`), who won in one sentence (`verdict`) and the plots
(`plots`), the same in the terminal, the Prefect artifact and the MLflow run.
"""
