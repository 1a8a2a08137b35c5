"""Screenshots of the Prefect and MLflow UIs of a running `hetflow stack`, in headless Chromium,
for docs/measurements/ui.md:

    hetflow stack up && . ~/.hetflow/stack/env.sh && prefect deploy --all
    python -m benchmarks.ui_shots [--out docs/measurements/img] [--steps 30] [--no-run]
                                  [--run-id FLOW_RUN_ID]

- `ui-deployments.png`: the Deployments page, once every deployment reports Ready;
- `ui-form-train.png`, `ui-form-compare.png`, `ui-form-queue.png`: each deployment's
  "Run > Custom run" form, whole; `ui-block-cluster.png`: a new ClusterSpec block's form and
  `ui-block-cluster-saved.png`: the saved `demo-1-1-2-4`'s;
  the height each takes (its scroll height in a 1400x1000 window) is printed;
- unless `--no-run`: a `compare` run submitted from its form (the cluster block
  `demo-1-1-2-4`, the dataset block `digits`, `--steps` steps), waited for until it ends,
  then `ui-compare-run.png` (its flow run page), `ui-compare-artifact.png` (its table
  artifact) and `ui-compare-artifact-links.png` (the end of it: the links), and MLflow:
  `ui-mlflow-experiments.png` (the stack's MLflow address as printed) and
  `ui-mlflow-run.png` (the table's first run link); `--run-id` shoots a compare run
  submitted before instead.

The last line printed is a JSON object: each picture's path and, for the forms, the height.
The UIs are JavaScript applications: each shot waits for the network to go idle and for a
piece of text the page shows once drawn. Driven by Playwright (`pip install playwright`)
with the system's Chromium (`--chromium`, default /usr/bin/chromium; Debian's `chromium`
package), so no browser download is needed. PNGs are reduced to a 256-colour palette to stay
small.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

WIDTH, HEIGHT = 1400, 1000  # the window every shot is taken in
FORMS = ("train", "compare", "queue")
SCROLLER = ".app-router-view"  # Prefect's UI scrolls this element, not the document
CLUSTER_BLOCK, DATASET_BLOCK = "demo-1-1-2-4", "digits"


def api(base: str, path: str, body: dict | None = None):
    """GET (or POST `body` to) Prefect's REST API at `base` (ending in /api); the JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"{base}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def small_png(path: Path) -> None:
    """Rewrite `path` with a 256-colour palette (a UI's flat colours survive it)."""
    from PIL import Image

    with Image.open(path) as im:
        im.convert("RGB").quantize(256).save(path, optimize=True)


def settle(page, text: str, timeout_s: float = 60) -> None:
    """Wait until the network is idle (at most 15 s: MLflow's UI polls, never idle) and
    `text` is on the page, then for the fonts."""
    from playwright.sync_api import TimeoutError as Late

    try:
        page.wait_for_load_state("networkidle", timeout=15_000)
    except Late:
        pass
    page.get_by_text(text).first.wait_for(timeout=timeout_s * 1000)
    page.wait_for_timeout(1000)


def scroll_height(page) -> int:
    """The height of the page's content: Prefect's scrolling view, else the document."""
    return page.evaluate(
        f"""() => {{
            const v = document.querySelector('{SCROLLER}');
            const inner = [...document.querySelectorAll('{SCROLLER} *')].map(e => e.scrollHeight);
            return Math.max(v ? v.scrollHeight : 0, document.scrollingElement.scrollHeight,
                            ...inner);
        }}"""
    )


def shoot(page, out: Path, name: str, whole: bool = False) -> dict:
    """A shot of the window, or with `whole` of the whole content (the window made as tall as
    it, then put back); its path, and with `whole` the content's height."""
    path = out / f"{name}.png"
    got: dict = {"path": str(path)}
    if whole:
        got["scroll_height_px"] = tall = scroll_height(page)
        got["screens"] = round(tall / HEIGHT, 2)
        page.set_viewport_size({"width": WIDTH, "height": max(tall, HEIGHT)})
        page.wait_for_timeout(500)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": WIDTH, "height": HEIGHT})
    small_png(path)
    got["kb"] = round(path.stat().st_size / 1024)
    return got


def deployments_ready(page, ui: str, base: str, out: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        deps = api(base, "/deployments/filter", {})
        if deps and all(d.get("status") == "READY" for d in deps):
            break
        if time.monotonic() > deadline:
            states = {d["name"]: d.get("status") for d in deps}
            raise SystemExit(f"ui_shots: deployments not all Ready: {states}")
        time.sleep(2)
    page.goto(f"{ui}/deployments")
    settle(page, "Ready")
    badges = page.get_by_text("Ready", exact=True)
    while badges.count() < len(deps):  # the table draws its rows one request at a time
        if time.monotonic() > deadline:
            raise SystemExit(f"ui_shots: {badges.count()} Ready badges of {len(deps)}")
        page.wait_for_timeout(500)
    return {**shoot(page, out, "ui-deployments"), "ready": sorted(d["name"] for d in deps)}


def deployment_ids(base: str) -> dict[str, str]:
    return {d["name"]: d["id"] for d in api(base, "/deployments/filter", {})}


def forms(page, ui: str, base: str, out: Path) -> dict:
    """Each run form, whole; the saved cluster block's edit form, whole."""
    ids, shots = deployment_ids(base), {}
    for name in FORMS:
        page.goto(f"{ui}/deployments/deployment/{ids[name]}/run")
        settle(page, "Parameters")
        shots[f"form_{name}"] = shoot(page, out, f"ui-form-{name}", whole=True)
    page.goto(f"{ui}/blocks/catalog/cluster-spec/create")
    settle(page, "Workers")
    shots["block_cluster"] = shoot(page, out, "ui-block-cluster", whole=True)
    blocks = api(base, "/block_documents/filter", {})
    block = next(b for b in blocks if b["name"] == CLUSTER_BLOCK)
    page.goto(f"{ui}/blocks/block/{block['id']}/edit")
    settle(page, "Workers")
    shots["block_cluster_saved"] = shoot(page, out, "ui-block-cluster-saved", whole=True)
    return shots


def field(page, label: str):
    """The form property whose label starts with `label`."""
    return page.locator(
        ".schema-form-property",
        has=page.locator(".schema-form-property__label", has_text=re.compile(f"^{label}")),
    ).last


def pick_block(page, label: str, name: str) -> None:
    """Choose the block `name` in the list of the field `label` (the list opens on a key)."""
    prop = field(page, label)
    prop.locator("button.p-select-button__control").first.focus()
    page.keyboard.press("ArrowDown")
    page.locator(".p-select-option", has_text=name).first.click()
    prop.locator(".p-select-button__value", has_text=name).wait_for()


def submit_compare(page, ui: str, base: str, out: Path, steps: int) -> str:
    """Fill the compare form (both blocks, the steps) and submit it; the flow run's id. Where
    no run appears, the page as it was goes to `ui-compare-submit-failed.png`."""
    page.goto(f"{ui}/deployments/deployment/{deployment_ids(base)['compare']}/run")
    settle(page, "Parameters")
    pick_block(page, "Cluster", CLUSTER_BLOCK)
    pick_block(page, "Dataset", DATASET_BLOCK)
    field(page, "Optimizer steps").locator("input").first.fill(str(steps))
    name = page.locator(".flow-run-name-input input").first.input_value()
    page.get_by_role("button", name="Submit").click()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = api(base, "/flow_runs/filter", {"flow_runs": {"name": {"any_": [name]}}})
        if runs:
            return runs[0]["id"]
        page.wait_for_timeout(1000)
    shoot(page, out, "ui-compare-submit-failed", whole=True)
    raise SystemExit(f"ui_shots: no flow run {name!r} after submitting; see {out}")


def wait_done(base: str, run_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = api(base, f"/flow_runs/{run_id}")["state"]
        if state and state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return state["type"]
        time.sleep(5)
    raise SystemExit(f"ui_shots: flow run {run_id} not done within {timeout_s:.0f}s")


def compare_run(
    page, ui: str, base: str, out: Path, steps: int, timeout_s: float, run_id: str | None
) -> dict:
    """A compare run from its form (or the run `run_id`, submitted before), to its end; its
    page, its table artifact, MLflow's."""
    run_id = run_id or submit_compare(page, ui, base, out, steps)
    state = wait_done(base, run_id, timeout_s)
    shots = {"run_id": run_id, "state": state}
    page.goto(f"{ui}/runs/flow-run/{run_id}")
    settle(page, "Completed" if state == "COMPLETED" else state.title())
    shots["compare_run"] = shoot(page, out, "ui-compare-run")
    tables = api(base, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})
    table = next((a for a in tables if a["type"] == "markdown"), None)
    if table is None:
        return shots
    page.goto(f"{ui}/artifacts/artifact/{table['id']}")
    settle(page, "MLflow runs")
    shots["compare_artifact"] = shoot(page, out, "ui-compare-artifact", whole=True)
    page.get_by_text("MLflow runs").first.scroll_into_view_if_needed()  # its links, at the end
    shots["compare_artifact_links"] = shoot(page, out, "ui-compare-artifact-links")
    links = re.findall(r"\((https?://[^)]+/runs/[^)]+)\)", table["data"])
    shots["mlflow_run_link"] = links[0] if links else None
    return shots


def mlflow(page, tracking: str, run_link: str | None, out: Path) -> dict:
    """The stack's MLflow address as `stack up` prints it, and one run link of the table."""
    from hetflow.infra.tracking.links import home_url

    shots = {}
    page.goto(home_url(tracking))
    settle(page, "hetflow")
    shots["mlflow_experiments"] = shoot(page, out, "ui-mlflow-experiments")
    if run_link:
        page.goto(run_link)
        settle(page, "Overview")
        shots["mlflow_run"] = shoot(page, out, "ui-mlflow-run")
    return shots


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ui_shots", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("docs/measurements/img"))
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--steps", type=int, default=30, help="the compare run's steps")
    p.add_argument("--no-run", action="store_true", help="the pages and forms only")
    p.add_argument("--run-timeout-s", type=float, default=1800)
    p.add_argument("--run-id", help="shoot this compare flow run instead of submitting one")
    args = p.parse_args(argv)
    args.api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    args.tracking = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not args.api.endswith("/api") or not args.tracking.startswith("http"):
        p.error("PREFECT_API_URL and MLFLOW_TRACKING_URI: export the stack's (its env.sh)")
    return args


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    args = parse(argv)
    ui = args.api.removesuffix("/api")
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.set_default_timeout(60_000)
        got = {"deployments": deployments_ready(page, ui, args.api, args.out, 120)}
        got.update(forms(page, ui, args.api, args.out))
        for name in (*FORMS, "cluster"):
            shot = got.get(f"form_{name}") or got["block_cluster"]
            print(f"{name}: {shot['scroll_height_px']} px ({shot['screens']} screens)")
        if not args.no_run:
            run = (args.steps, args.run_timeout_s, args.run_id)
            got.update(compare_run(page, ui, args.api, args.out, *run))
            got.update(mlflow(page, args.tracking, got.get("mlflow_run_link"), args.out))
        browser.close()
    print(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main())
