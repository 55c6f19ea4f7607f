"""A checkpoint file into the registry's bucket, both ways the console keeps one (recipes/registry):
through the console (the agent's 4 MiB reads into a local file, then MLflow's upload through its
artifact proxy: what runs for checkpoints up to RUN_ARCHIVE_MAX_BYTES) and straight from the cluster
(MLflow's multipart upload, each part PUT by the agent: direct.py, above it). A real MLflow server on a
fake Cloud Storage bucket (tests/fake_gcs.py, in this process) and a real agent on a scratch home, all
on this machine: the figures compare the two paths' overheads here, not a VM's bandwidth to GCS.
Prints MB/s for each and the bytes that passed through the console process.

Usage: .venv/bin/python benchmarks/checkpoint_copy.py [MiB, default 256] [part MiB, default 64]
"""

import os
import sys
import tempfile
import time
from pathlib import Path

from _setup import WORK, scratch_django

scratch_django()

from recipes.registry.direct import spans  # noqa: E402
from tests.conftest import agent_process, mlflow_process  # noqa: E402
from tests.factories import free_port  # noqa: E402
from tests.fake_gcs import FakeGCS  # noqa: E402

MIB = 1 << 20


def main():
    size = int(sys.argv[1]) * MIB if len(sys.argv) > 1 else 256 * MIB
    part = int(sys.argv[2]) * MIB if len(sys.argv) > 2 else 64 * MIB
    gcs = FakeGCS().start()
    key = gcs.key_file(WORK / "sa.json")
    environment = {"MLFLOW_ARTIFACTS_DESTINATION": "gs://bench/mlflow", "API_ENDPOINT_OVERRIDE": gcs.url,
                   "GOOGLE_APPLICATION_CREDENTIALS": str(key), "GOOGLE_CLOUD_PROJECT": "bench"}  # fmt: skip
    with mlflow_process(WORK / "mlflow", free_port(), **environment) as url, agent_process(WORK) as started:
        agent, home, _root = started
        os.environ["MLFLOW_TRACKING_USERNAME"] = "console"
        os.environ["MLFLOW_TRACKING_PASSWORD"] = (WORK / "mlflow" / "password").read_text().strip()
        from mlflow import MlflowClient
        from mlflow.entities.multipart_upload import MultipartUploadPart
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        mlflow = MlflowClient(url)
        run = mlflow.create_run(mlflow.create_experiment("bench")).info
        repo = get_artifact_repository(run.artifact_uri, tracking_uri=url)
        (home / "runs/1/checkpoints/step-1").mkdir(parents=True)
        path = "runs/1/checkpoints/step-1/weights"
        with (home / path).open("wb") as handle:
            for _ in range(size // MIB):
                handle.write(os.urandom(MIB))

        started_at = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=WORK) as local:
            target = Path(local) / "weights"
            with target.open("wb") as handle:
                offset = 0
                while chunk := agent.read(path, offset=offset, limit=4 * MIB):
                    handle.write(chunk)
                    offset += len(chunk)
            mlflow.log_artifact(run.run_id, str(target), "through-console")
        through = time.perf_counter() - started_at

        count = -(-size // part)
        direct = {}
        for at_once in (1, 4):  # recipes/registry/direct.py's calls, RUN_ARCHIVE_PARALLEL_PARTS at once
            started_at = time.perf_counter()
            created = repo.create_multipart_upload("weights", count, f"direct-{at_once}")
            parts = sorted((MultipartUploadPart(part_number=number, etag=answer["etag"])
                            for number, answer in agent.uploads(path, spans(created.credentials, part, size), at_once)),
                           key=lambda p: p.part_number)  # fmt: skip
            repo.complete_multipart_upload("weights", created.upload_id, parts, f"direct-{at_once}")
            direct[at_once] = time.perf_counter() - started_at

        stored = {name: len(data) for (_bucket, name), data in gcs.objects.items()}
        assert sorted(stored.values()) == [size, size, size], stored
    gcs.stop()
    print(f"{size // MIB} MiB checkpoint file into the bucket, on this machine ({os.cpu_count()} CPUs):")
    print(f"  through the console: {through:6.1f} s  {size / through / 1e6:7.1f} MB/s  "
          f"(console process handled {2 * size // MIB} MiB: read from the agent, sent to MLflow)")  # fmt: skip
    for at_once, seconds in direct.items():
        print(f"  straight from agent: {seconds:6.1f} s  {size / seconds / 1e6:7.1f} MB/s  ({count} parts of "
              f"{part // MIB} MiB, {at_once} at once; console process handled 0 bytes)")  # fmt: skip


if __name__ == "__main__":
    main()
