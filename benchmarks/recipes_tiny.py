"""Tiny-recipe figures on a real local Slurm cluster: tokens/s on 1 and 2 nodes (scaling efficiency),
checkpoint save and load time, and the time from launch to the first training step.

Runs the console's own launch path in-process (no Celery needed: submission is synchronous and the
job runs under Slurm). Usage: .venv/bin/python benchmarks/recipes_tiny.py [steps]
"""

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from _setup import ROOT, WORK, bench_project, scratch_django

scratch_django()


from clusters import services as cluster_services  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.operations import engine  # noqa: E402
from recipes import runs  # noqa: E402
from recipes.models import RunStatus  # noqa: E402


def wait(run, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs.refresh_run(run)
        if run.is_done:
            return run
        time.sleep(0.5)
    raise RuntimeError(f"run {run.uuid} did not finish")


def read(run, name):
    path = Path(run.work_dir) / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(steps):
    user, project = bench_project()
    spec = json.loads((ROOT / "examples" / "cluster-local-cpu.json").read_text())
    operation = cluster_services.create_cluster(project=project, name="bench", spec=spec, user=user)
    engine.run(operation.pk)
    cluster = Cluster.objects.get(pk=operation.cluster_id)
    results = {}
    try:
        for nodes in (1, 2):
            launched = time.time()
            run = runs.launch_run(
                cluster=cluster, data={"recipe": "llama3.1-8b-pretrain", "nodes": nodes, "steps": steps}, user=user
            )
            engine.run(run.launch_id)  # the LAUNCH operation: stage, write, submit
            run.refresh_from_db()
            wait(run)
            assert run.status == RunStatus.COMPLETED, run.error
            metrics = read(run, "metrics.jsonl")
            saves = [e["seconds"] for e in read(run, "events.jsonl") if e["event"] == "checkpoint_saved"]
            results[nodes] = {
                "tokens_per_s": metrics[-1]["tokens_per_s"],
                "first_step_s": metrics[0]["time"] - launched,
                "save_s": statistics.median(saves),
                "run": run,
            }
        # Load time: a second job on the finished run's folder resumes from its last checkpoint.
        run = results[2]["run"]
        config = json.loads((Path(run.work_dir) / "config.json").read_text())
        config["steps"] += 1
        (Path(run.work_dir) / "config.json").write_text(json.dumps(config))
        job = cluster_services.submit_batch(cluster, f"runs/{Path(run.work_dir).name}/job.sbatch")
        deadline = time.monotonic() + 300
        while not any(e["event"] == "resumed" for e in read(run, "events.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.5)
        load = next(e["seconds"] for e in read(run, "events.jsonl") if e["event"] == "resumed")
        while cluster_services.job_status(cluster, job) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        engine.run(cluster_services.delete_cluster(cluster=cluster, user=user).pk)
        shutil.rmtree(WORK, ignore_errors=True)
    one, two = results[1]["tokens_per_s"], results[2]["tokens_per_s"]
    print(f"tiny Llama pretraining, {steps} steps, gloo on CPU, one task per node")
    print(f"tokens/s on 1 node:            {one:10.0f}")
    print(f"tokens/s on 2 nodes:           {two:10.0f}   scaling efficiency {two / (2 * one):.0%}")
    print(f"checkpoint save (median):      {results[2]['save_s'] * 1000:10.1f} ms")
    print(f"checkpoint load (resume):      {load * 1000:10.1f} ms")
    print(f"launch -> first step, 1 node:  {results[1]['first_step_s']:10.2f} s")
    print(f"launch -> first step, 2 nodes: {results[2]['first_step_s']:10.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 60)
