from prefect.utilities.callables import parameter_schema

from hetflow.flows.compare import compare
from hetflow.flows.job_queue import queue
from hetflow.flows.train import train

for f in (train, compare, queue):
    s = parameter_schema(f.fn).model_dump_for_openapi()
    for d in ("TrainConfig", "QueueJob"):
        for k, p in s["definitions"].get(d, {}).get("properties", {}).items():
            print(f.name, d, k, len(p.get("description", "")))
