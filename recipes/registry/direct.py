"""Checkpoints too big to pass through the console (over settings.RUN_ARCHIVE_MAX_BYTES) go from the
cluster straight into the registry's artifact store, by MLflow's own multipart upload: the MLflow server
opens the upload in its store (a GCS bucket, S3 or Azure behind --artifacts-destination) and signs one
URL per part, the cluster agent PUTs the parts from the shared home, several at once (clusters.upload_parts),
and MLflow completes the upload. The bytes never pass through the console, and the console holds no bucket
credentials. A store that takes no multipart uploads (MLflow's local folder: the embedded registry)
raises NotDirect, and the checkpoint stays on the cluster's storage, as before.

Parts: every part but the last at least 5 MiB and at most 5 GiB, at most 10,000 parts per object (GCS's
XML API multipart uploads, https://cloud.google.com/storage/docs/multipart-uploads and
https://cloud.google.com/storage/quotas; S3's are the same: https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html),
so a part is settings.RUN_ARCHIVE_PART_BYTES or the size that keeps a file under 10,000 parts. MLflow
signs part URLs for 60 minutes (its GCS and S3 repositories), so one file's parts must be sent within
that hour; a copy interrupted between files goes on with the next file (runs/... archive["copying"]).

    repository(mlflow, run_id)                         the run's artifact repository, or NotDirect
    spans(credentials, part, size)                     what each signed part URL takes of the file
    send_file(cluster, repo, path, name, size, artifact_path, sent)   one file of the cluster's home, whole
"""

import logging

from django.conf import settings

from clusters import services as clusters
from console.errors import ConsoleError

from .versions import answering, artifacts

log = logging.getLogger(__name__)
MIN_PART = 5 << 20
MAX_PART = 5 << 30
MAX_PARTS = 10_000


class NotDirect(ConsoleError):
    """The registry's artifact store cannot take the checkpoint from the cluster (the reason)."""


def repository(mlflow, run_id):
    """The MLflow artifact repository of the run, when it takes multipart uploads; NotDirect otherwise."""
    from mlflow.store.artifact.artifact_repo import MultipartUploadMixin

    with answering("find the run's artifact store"):
        uri, repo = artifacts(mlflow, run_id)
    if not isinstance(repo, MultipartUploadMixin):
        raise NotDirect(f"the registry's artifact store ({uri.split(':', 1)[0]}) takes no multipart uploads")
    return repo


def part_size(size):
    """The part size for a file of `size` bytes (NotDirect for a file over 10,000 parts of 5 GiB)."""
    part = max(settings.RUN_ARCHIVE_PART_BYTES, MIN_PART, -(-size // MAX_PARTS))
    if part > MAX_PART:
        raise NotDirect(f"a file of {size} bytes is over the {MAX_PARTS} parts of 5 GiB a multipart upload may have")
    return part


def spans(credentials, part, size):
    """(part number, URL, offset, length, headers) of each part MLflow signed, in order: the bytes of a file
    of `size` each part URL takes, in parts of `part` bytes (what clusters.upload_parts sends)."""
    out = []
    for credential in sorted(credentials, key=lambda c: c.part_number):
        offset = (credential.part_number - 1) * part
        out.append((credential.part_number, credential.url, offset, min(part, size - offset), credential.headers or {}))
    return out


def send_file(cluster, repo, path, name, size, artifact_path, sent):
    """Put the cluster's file `path` (`size` bytes) into the run's artifacts as `artifact_path`/`name`,
    part by part through the cluster agent, RUN_ARCHIVE_PARALLEL_PARTS at a time; sent(bytes) after each
    part. NotDirect when the store takes no multipart uploads; Conflict when the file went or the store
    refused a part (the upload is then aborted, nothing is left half-made)."""
    from mlflow.entities.multipart_upload import MultipartUploadPart
    from mlflow.exceptions import _UnsupportedMultipartUploadException

    part = part_size(size)
    count = max(1, -(-size // part))
    try:
        with answering(f"open an upload of {name}"):
            created = repo.create_multipart_upload(name, count, artifact_path)
    except ConsoleError as exc:  # answering's: MLflow's "unsupported" (its own or its server's) among them
        if _UnsupportedMultipartUploadException.MESSAGE in exc.message:
            raise NotDirect("the registry's artifact store takes no multipart uploads") from None
        raise
    except Exception as exc:  # requests' HTTPError from the proxy: its text says why, never the URLs
        if _UnsupportedMultipartUploadException.MESSAGE in str(exc):
            raise NotDirect("the registry's artifact store takes no multipart uploads") from None
        raise ConsoleError(f"the model registry refused to open an upload of {name}") from None
    try:
        parts = []
        todo = spans(created.credentials, part, size)
        for number, answer in clusters.upload_parts(cluster, path, todo, settings.RUN_ARCHIVE_PARALLEL_PARTS):
            parts.append(MultipartUploadPart(part_number=number, etag=answer["etag"]))
            sent(answer["bytes"])
        parts.sort(key=lambda p: p.part_number)
        with answering(f"complete the upload of {name}"):
            repo.complete_multipart_upload(name, created.upload_id, parts, artifact_path)
    except BaseException:
        try:
            with answering(f"abort the upload of {name}"):
                repo.abort_multipart_upload(name, created.upload_id, artifact_path)
        except Exception as exc:  # a leftover upload costs storage only (a bucket lifecycle rule ends it)
            log.warning("the upload of %s was not aborted: %s", name, exc)
        raise
