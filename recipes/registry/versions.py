"""The model registry: MLflow's tracking server and model registry, behind the console.

MLflow holds the truth: each project's runs in an experiment "<MLFLOW_EXPERIMENT_PREFIX><project>"
(params when the run is first seen, metrics as the Slurm sync stores them), registered models named
"<project slug>.<name>", their versions (artifact: the run's exported Hugging Face format folder,
copied into MLflow's artifact store, so it outlives its cluster), aliases and tags. A ModelVersion row
is the console's index of a version: the project that may see it and its lineage as names.

MLflow binds to 127.0.0.1 and has no users of its own: the console is its only client and enforces the
project prefix on every name. A silent server is `RegistryUnavailable` (503; tasks retry it), a
refusal a ConsoleError with MLflow's reason.

    track(run)                          params once, then the metric lines not logged yet
    register_run(run, name, user)       the run's model as the next version of name
    resolve(project, "name:v3" | "name@production")  -> ModelVersion (404-style FieldErrors otherwise)
    stage(version, cluster)             the version's folder on the cluster (copied once), for init_from
    set_alias / remove_alias / aliases / delete_version / metric_history
"""

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

from django.conf import settings
from django.http import Http404

from clusters import services as clusters
from clusters.choices import ClusterStatus, EventLevel
from clusters.events import record_event
from clusters.spec.validator import ID_RULE, RESOURCE_ID
from clusters.work import heartbeat
from console.errors import Conflict, ConsoleError, FieldErrors, Unavailable

from ..catalog import get_recipe
from ..models import Endpoint, EndpointStatus, ModelVersion, ReplicaState, Run, RunStatus
from ..queue import later

# mlflow is imported inside the functions that call it (start-up cost: about 1.3 s, paid only by the
# processes that talk to the registry).

ALIAS = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
ALIAS_RULE = "an alias is lowercase letters, digits, '-' and '_', starting with a letter ('latest' is MLflow's own)"
REF = re.compile(r"^(?P<name>[a-z][a-z0-9-]*)(?::v(?P<version>\d+)|@(?P<alias>[a-z][a-z0-9_-]*))$")
PARAMS = ("recipe", "family", "kind", "profile", "steps", "seq_len", "micro_batch", "lr", "precision", "seed")
METRICS_PER_CALL = 900  # MLflow's log_batch takes at most 1,000 metrics


class RegistryUnavailable(Unavailable):
    """The registry (MLflow) is not answering; a retry may help."""


def client():
    from mlflow import MlflowClient

    # One try per call, bounded: a silent server is reported, not waited on for minutes.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(settings.MLFLOW_TIMEOUT))
    sign_in()
    return MlflowClient(tracking_uri=settings.MLFLOW_TRACKING_URI, registry_uri=settings.MLFLOW_TRACKING_URI)


def artifacts(mlflow, run_id):
    """(artifact URI, MLflow artifact repository) of the run, for this console's tracking server (not
    MLflow's global one). Callers wrap it in answering()."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    uri = mlflow.get_run(run_id).info.artifact_uri
    return uri, get_artifact_repository(uri, tracking_uri=settings.MLFLOW_TRACKING_URI)


def sign_in():
    """The console's registry credentials where MLflow's client reads them (its environment variables):
    the embedded server's password file (scripts/mlflow.sh writes it), read on every call, since a
    restarted registry may have a new one; without the file, whatever the environment already holds."""
    path = settings.MLFLOW_PASSWORD_FILE
    if not path:
        return
    try:
        password = Path(path).read_text().strip()
    except OSError:  # not made yet: the server is not up either, and the call will say so
        return
    os.environ["MLFLOW_TRACKING_USERNAME"] = settings.MLFLOW_USERNAME
    os.environ["MLFLOW_TRACKING_PASSWORD"] = password


@contextlib.contextmanager
def answering(what):
    """MLflow's failures as the console's: unreachable -> RegistryUnavailable, a refusal -> ConsoleError."""
    from mlflow.exceptions import MlflowException, RestException

    try:
        yield
    except RestException as exc:
        if exc.get_http_status_code() >= 500:
            raise RegistryUnavailable(f"the model registry failed to {what}: {exc.message}") from None
        raise ConsoleError(f"the model registry refused to {what}: {exc.message}") from None
    except MlflowException as exc:
        # The client's own errors: connection refused, retries exhausted, a timeout.
        raise RegistryUnavailable(f"the model registry is not answering ({what}): {exc.message[:200]}") from None
    except OSError as exc:
        raise RegistryUnavailable(f"the model registry is not answering ({what}): {exc}") from None


def mlflow_name(project, name):
    return f"{project.slug}.{name}"


def experiment_id(mlflow, project):
    name = f"{settings.MLFLOW_EXPERIMENT_PREFIX}{project.slug}"
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.create_experiment(name, tags={"tcc.project": project.slug})
    except MlflowException:  # made at the same moment by another worker
        return mlflow.get_experiment_by_name(name).experiment_id


def mlflow_run(mlflow, run):
    """The run's MLflow run id, made (with the run's params) the first time; compare-and-set, so two
    workers tracking the same run at once end with one (the loser's is deleted)."""
    if run.mlflow_run_id:
        return run.mlflow_run_id
    config = run.config or {}
    created = mlflow.create_run(
        experiment_id(mlflow, run.cluster.project),
        run_name=f"{run.recipe_id}-{str(run.uuid)[:8]}",
        tags={"tcc.run": str(run.uuid), "tcc.cluster": run.cluster.name, "tcc.recipe": run.recipe_id},
    )
    run_id = created.info.run_id
    from mlflow.entities import Param

    params = [Param(key, str(config[key])) for key in PARAMS if key in config]
    parallel = config.get("parallel") or {}
    params += [Param(f"parallel.{k}", str(v)) for k, v in parallel.items()]
    params += [Param("nodes", str(run.nodes)), Param("partition", run.partition), Param("cluster", run.cluster.name)]
    if config.get("init_from") or config.get("init_from_hf"):
        params.append(Param("init_from", str(config.get("init_from_ref") or "checkpoint")))
    mlflow.log_batch(run_id, params=params)
    if Run.objects.filter(pk=run.pk, mlflow_run_id="").update(mlflow_run_id=run_id):
        run.mlflow_run_id = run_id
        return run_id
    mlflow.delete_run(run_id)
    run.refresh_from_db(fields=["mlflow_run_id"])
    return run.mlflow_run_id


def track(run):
    """Log to MLflow what the sync stored since the last call: the run's metric lines (each numeric
    value a metric at its step) and, once the run has ended, its end. Returns the lines logged."""
    from mlflow.entities import Metric

    with answering("record the run"):
        mlflow = client()
        run_id = mlflow_run(mlflow, run)
        logged = run.mlflow_logged
        rows = list(run.metric_rows.filter(line__gte=logged).order_by("line").values_list("line", "step", "values"))
        metrics = []
        for _, step, values in rows:
            stamp = int(float(values.get("time", 0)) * 1000)
            metrics += [
                Metric(key, float(value), stamp, step)
                for key, value in values.items()
                if key not in ("step", "time") and isinstance(value, int | float) and not isinstance(value, bool)
            ]
        for start in range(0, len(metrics), METRICS_PER_CALL):
            mlflow.log_batch(run_id, metrics=metrics[start : start + METRICS_PER_CALL])
        if rows:
            Run.objects.filter(pk=run.pk, mlflow_logged=logged).update(mlflow_logged=rows[-1][0] + 1)
        if run.is_done:
            status = {RunStatus.COMPLETED: "FINISHED", RunStatus.FAILED: "FAILED"}.get(run.status, "KILLED")
            mlflow.set_terminated(run_id, status=status)
    return len(rows)


def check_name(name):
    if not isinstance(name, str) or not RESOURCE_ID.match(name):
        raise FieldErrors({"name": [ID_RULE]})


def register_run(run, name, *, user=None, automatic=False):
    """The run's exported model (the `model/` folder every completed run writes) copied from the
    cluster into the registry as the next version of `name` in the run's project."""
    check_name(name)
    if run.status != RunStatus.COMPLETED:
        raise Conflict("Only a completed run can be registered")
    if run.cluster.status == ClusterStatus.DELETED:
        raise Conflict(
            "The run's cluster was deleted and its exported model with it; start a run from its kept checkpoint "
            f"(init_from {run.uuid}) on another cluster, and register that one"
        )
    folder = run.in_home("model")
    try:
        exported = clusters.file_exists(run.cluster, f"{folder}/config.json")
    except ConsoleError as exc:
        raise Conflict(f"The run's model cannot be read: {exc.message}") from None
    if not exported:
        raise ConsoleError("The run left no exported model (a run writes model/ when it completes)")
    project = run.cluster.project
    with tempfile.TemporaryDirectory(prefix="tcc-register-") as temporary:
        local = Path(temporary) / "model"
        size = clusters.download_folder(run.cluster, folder, local)
        about = json.loads((local / "tcc.json").read_text()) if (local / "tcc.json").exists() else {}
        with answering("store the model"):
            mlflow = client()
            run_id = mlflow_run(mlflow, run)
            mlflow.log_artifacts(run_id, str(local), "model")
            source = f"{mlflow.get_run(run_id).info.artifact_uri}/model"
        version = publish(
            project,
            name,
            source,
            run_id=run_id,
            family=get_recipe(run.recipe_id)["family"],
            step=int(about.get("step") or run.steps),
            final_loss=about.get("final_loss"),
            size=size,
            lineage={"run": run, "parent": run.init_version},
            user=user,
            automatic=automatic,
        )
    record_event(
        run.cluster,
        f"Registered {name} v{version.version} from run {run.recipe_id} (step {version.step})"
        + (" by itself on completion" if automatic else ""),
    )
    return version


def publish(project, name, source, *, run_id, family, step, final_loss=None, size=0, lineage=None, user=None,
            automatic=False):  # fmt: skip
    """A new version of `name` in MLflow (the model made on first use) from artifacts at `source`, and
    its ModelVersion row; MLflow numbers versions, so two at once get two numbers."""
    from mlflow.exceptions import MlflowException

    check_name(name)
    lineage = lineage or {}
    run, parent = lineage.get("run"), lineage.get("parent")
    tags = {"tcc.project": project.slug, "tcc.family": family, "tcc.step": str(step)}
    if run is not None:
        tags.update({"tcc.run": str(run.uuid), "tcc.cluster": run.cluster.name, "tcc.recipe": run.recipe_id})
    if parent is not None:
        tags["tcc.parent"] = parent.ref
    full = mlflow_name(project, name)
    with answering("register the version"):
        mlflow = client()
        try:
            mlflow.create_registered_model(full, tags={"tcc.project": project.slug, "tcc.family": family})
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        existing = ModelVersion.objects.filter(project=project, name=name).exclude(family=family).first()
        if existing is not None:
            raise Conflict(f"{name} holds {existing.family} models; this one is {family}")
        made = mlflow.create_model_version(full, source, run_id=run_id or None, tags=tags)
    return ModelVersion.objects.create(
        project=project,
        name=name,
        version=int(made.version),
        run=run,
        run_uuid=run.uuid if run else None,
        cluster_name=run.cluster.name if run else "",
        recipe_id=run.recipe_id if run else "",
        parent=parent,
        family=family,
        checkpoint=source,
        step=step,
        final_loss=final_loss,
        mlflow_run_id=run_id or "",
        size=size,
        automatic=automatic,
        created_by=user,
    )


def model_versions(project, name):
    """The project's versions of its model `name`, newest first (with their run, cluster and parent);
    Http404 when it has none, as clusters.access answers for anything a user may not see."""
    versions = ModelVersion.objects.filter(project=project, name=name).select_related("run__cluster", "parent")
    if not versions.exists():
        raise Http404("No such model")
    return versions


def resolve(project, ref):
    """The project's ModelVersion that "name:vN" or "name@alias" names, else FieldErrors on init_from."""
    match = REF.match(ref or "")
    if match is None:
        raise FieldErrors({"init_from": ["a registered model is name:vN or name@alias"]})
    name = match["name"]
    number = int(match["version"]) if match["version"] else None
    if match["alias"]:
        from mlflow.exceptions import MlflowException

        with answering("read the alias"):
            try:
                number = int(client().get_model_version_by_alias(mlflow_name(project, name), match["alias"]).version)
            except MlflowException as exc:
                if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
                    raise
    version = ModelVersion.objects.filter(project=project, name=name, version=number).first() if number else None
    if version is None:
        raise FieldErrors({"init_from": [f"this project has no registered model version {ref}"]})
    return version


def staged_path(version):
    """Where stage() puts the version in a cluster's shared home."""
    return f"models/{mlflow_name(version.project, version.name)}/v{version.version}"


def version_config(version):
    """The version's config.json from the registry's artifact store (read, never written anywhere but a
    temporary folder of this process)."""
    check_files(version)
    with tempfile.TemporaryDirectory(prefix="tcc-config-") as temporary:
        with answering("read the model's config"):
            if version.mlflow_run_id:
                local = Path(client().download_artifacts(version.mlflow_run_id, "model/config.json", temporary))
            else:
                local = Path(download_source(f"{version.checkpoint.rstrip('/')}/config.json", temporary))
        try:
            return json.loads(local.read_text())
        except (OSError, ValueError):
            raise ConsoleError(f"{version.ref}'s artifact in the registry has no readable config.json") from None


def check_files(version):
    """ConsoleError when a version the registry logged has lost its files (config.json) from the artifact
    store: a missing file is the request's problem, not the registry's silence."""
    if not version.mlflow_run_id:
        return
    with answering("list the model's files"):
        files = client().list_artifacts(version.mlflow_run_id, "model")
    if not any(f.path.endswith("/config.json") for f in files):
        raise ConsoleError(f"{version.ref}'s files are missing from the registry's artifact store")


def stage(version, cluster):
    """The version's Hugging Face format folder in the cluster's shared home ("models/<name>/v<N>"),
    copied there from the registry the first time (a folder half copied is never seen)."""
    check_files(version)
    if version.mlflow_run_id:
        fetch = lambda target: client().download_artifacts(version.mlflow_run_id, "model", target)  # noqa: E731
    else:
        fetch = lambda target: download_source(version.checkpoint, target)  # noqa: E731
    return stage_folder(
        cluster, staged_path(version), "config.json", fetch, doing="hand out the model's files",
        detail=f"downloading {version.ref} from the registry", what=f"{version.ref}'s artifact in the registry",
    )  # fmt: skip


def stage_folder(cluster, path, marker, fetch, *, doing, detail, what):
    """`path` in the cluster's shared home, copied there from the registry the first time: fetch(target)
    downloads into a local temporary folder (heartbeating: a download of many GB is work in progress)
    and returns the folder, which must hold `marker`; the cluster agent writes it so that it appears
    whole or not at all. A folder there with its marker is taken as staged."""
    if clusters.file_exists(cluster, f"{path}/{marker}"):
        return path
    with tempfile.TemporaryDirectory(prefix="tcc-stage-") as temporary:
        with answering(doing):
            local = Path(beating(lambda: fetch(temporary), detail))
        if not (local / marker).exists():
            raise Conflict(f"{what} has no {marker}")
        clusters.upload_folder(cluster, local, path)
    return path


def beating(call, detail):
    """call() in a thread while this one heartbeats (clusters.work.heartbeat: inside an operation's step,
    the engine then knows its worker is alive however long a download of many GB takes)."""
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as Waiting

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tcc-stage") as pool:
        future = pool.submit(call)
        while True:
            heartbeat(detail)
            try:
                return future.result(timeout=2)
            except Waiting:
                continue


def download_source(source, target):
    import mlflow.artifacts

    sign_in()
    return mlflow.artifacts.download_artifacts(
        artifact_uri=source, dst_path=target, tracking_uri=settings.MLFLOW_TRACKING_URI
    )


def aliases(project, name):
    """{alias: version number} of the project's model `name` ({} when MLflow has no such model)."""
    from mlflow.exceptions import MlflowException

    with answering("read the aliases"):
        try:
            found = client().get_registered_model(mlflow_name(project, name))
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return {}
            raise
    return {alias: int(number) for alias, number in found.aliases.items()}


def check_alias(alias):
    if not isinstance(alias, str) or not ALIAS.match(alias) or alias.lower() == "latest":
        raise FieldErrors({"alias": [ALIAS_RULE]})


def set_alias(project, name, alias, number, *, user=None):
    """Point `alias` of the model at its version `number` (moved in one MLflow call: never two versions)."""
    check_alias(alias)
    try:
        number = int(number)
    except (TypeError, ValueError):
        raise FieldErrors({"version": ["must be a version number of this model"]}) from None
    version = ModelVersion.objects.filter(project=project, name=name, version=number).first()
    if version is None:
        raise FieldErrors({"version": [f"{name} has no version {number}"]})
    with answering("set the alias"):
        client().set_registered_model_alias(mlflow_name(project, name), alias, str(number))
    return version


def remove_alias(project, name, alias):
    check_alias(alias)
    if alias not in aliases(project, name):
        raise FieldErrors({"alias": [f"{name} has no alias {alias}"]})
    with answering("remove the alias"):
        client().delete_registered_model_alias(mlflow_name(project, name), alias)


def serving(version):
    """The live endpoints that serve `version`: pinned to it, or with a replica of it still running."""
    live = Endpoint.objects.filter(status__in=EndpointStatus.live(), project=version.project)
    pinned = live.filter(model_name=version.name, version=version.version)
    replicas = live.filter(replicas__version=version, replicas__state__in=ReplicaState.running())
    return sorted({endpoint.name for endpoint in [*pinned, *replicas]})


def delete_version(version):
    """Delete the version from the registry and the console (its artifacts go with it in MLflow);
    refused while an endpoint serves it."""
    from mlflow.exceptions import MlflowException

    endpoints = serving(version)
    if endpoints:
        raise Conflict(
            f"{version.ref} is served by endpoint {', '.join(endpoints)}: deploy another version there "
            "(or move its alias) or delete the endpoint first"
        )
    holding = [a for a, n in aliases(version.project, version.name).items() if n == version.version]
    with answering("delete the version"):
        try:
            client().delete_model_version(mlflow_name(version.project, version.name), str(version.version))
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
    version.delete()
    return holding


def metric_history(version, keys=("loss",)):
    """{key: [(step, value)...]} of the version's training run, from MLflow (the run may be gone)."""
    if not version.mlflow_run_id:
        return {}
    mlflow = client()
    found = {}
    with answering("read the metrics"):
        for key in keys:
            found[key] = [(m.step, m.value) for m in mlflow.get_metric_history(version.mlflow_run_id, key)]
    return found


def run_params(version):
    if not version.mlflow_run_id:
        return {}
    with answering("read the run"):
        return dict(sorted(client().get_run(version.mlflow_run_id).data.params.items()))


def after_sync(run, stored, ended):
    """The runs sync hook's call: track the run in MLflow (and register it when it completed), in a
    task once the sync's transaction commits, so that a slow or silent registry never holds the sync."""
    if stored or ended:
        later("track_run", run.pk)


def track_and_register(run_id):
    """Log a run's new metrics to MLflow; a completed run whose recipe registers by itself becomes the
    next version of its model (once: compare-and-set on auto_registered). RegistryUnavailable is for
    the task to retry."""
    run = Run.objects.filter(pk=run_id).select_related("cluster__project").first()
    if run is None:
        return
    track(run)
    name = (run.config or {}).get("register_as")
    if run.status != RunStatus.COMPLETED or not name:
        return
    if not Run.objects.filter(pk=run.pk, auto_registered=False).update(auto_registered=True):
        return  # registered already (or being registered by another worker)
    try:
        version = register_run(run, name, user=run.created_by, automatic=True)
        alias = (run.config or {}).get("alias")
        if alias:
            set_alias(run.cluster.project, name, alias, version.version, user=run.created_by)
            record_event(
                run.cluster, f"Run {run.recipe_id} registered as {version.ref}; {name}@{alias} now points at it"
            )
    except RegistryUnavailable:
        Run.objects.filter(pk=run.pk).update(auto_registered=False)  # the retry registers it
        raise
    except ConsoleError as exc:
        record_event(run.cluster, f"Run {run.recipe_id} was not registered: {exc.message}", level=EventLevel.WARNING)
