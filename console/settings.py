"""Settings for the console, read from the environment with defaults that suit a laptop."""

import os
import secrets
from pathlib import Path
from urllib.parse import quote

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name, default=""):
    return os.environ.get(name, default)


def envbool(name, default="False"):
    return env(name, default).lower() in ("1", "true", "yes", "on")


def envint(name, default):
    return int(env(name, str(default)))


def envfloat(name, default):
    return float(env(name, str(default)))


def private_dir(path):
    """`path`, made and kept 0700 when this account owns it: what the console keeps there (the SQLite
    database with sessions, password hashes and tokens; the secret key; the registry's files; logs) is
    for the console alone. Users' jobs run on this very host under the local backend, as accounts
    that must not read any of it (the local clusters live elsewhere: LOCAL_CLUSTERS_DIR)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid == os.getuid():
        os.chmod(path, 0o700)
    return path


VAR_DIR = private_dir(env("CONSOLE_VAR_DIR", str(BASE_DIR / "var")))

# Off unless asked for: DEBUG pages show settings and tracebacks to anyone who triggers an error.
DEBUG = envbool("DEBUG", "False")


def generated_secret_key(path):
    """The key in `path`, made on first use (mode 0600, never logged). Every process of one machine
    reads the same file; several machines must share SECRET_KEY through the environment instead."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, path)  # atomic, and fails if another process made it first
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


SECRET_KEY = env("SECRET_KEY") or generated_secret_key(VAR_DIR / "secret_key")

ALLOWED_HOSTS = [h for h in env("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env("CSRF_TRUSTED_ORIGINS").split(",") if o]
SITE_ROOT = env("SITE_ROOT", "http://localhost:8000")

# Behind HTTPS (HTTPS=true, the production setting, docs/scaling.md): secure cookies, redirects to
# https, HSTS for a year; TLS may end at a proxy that sets X-Forwarded-Proto.
HTTPS = envbool("HTTPS")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = 31_536_000 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if envbool("BEHIND_PROXY") else None
SESSION_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "console",
    "clusters",
    "recipes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "console.middleware.RequestSizeLimit",
    # Static files from the app itself (after collectstatic), so DEBUG can stay off everywhere.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs a login; DRF views opt out and authenticate themselves.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "console.middleware.ConsoleErrorPages",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# SQLite by default; DATABASE_URL=postgres://... for several workers on several machines.
DATABASES = {
    "default": dj_database_url.parse(
        env("DATABASE_URL", f"sqlite:///{VAR_DIR / 'console.sqlite3'}"),
        conn_max_age=envint("DB_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # The web process and Celery workers write the same file: wait for locks instead of failing,
    # and take the write lock at BEGIN so two writers never deadlock on an upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
# Sign-in throttle (console.views.SignInView): failures per username and per address in a window.
LOGIN_THROTTLE_MINUTES = envint("LOGIN_THROTTLE_MINUTES", 15)
LOGIN_FAILURES_PER_USER = envint("LOGIN_FAILURES_PER_USER", 5)
LOGIN_FAILURES_PER_ADDRESS = envint("LOGIN_FAILURES_PER_ADDRESS", 20)
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# Without collectstatic (tests, a checkout), serve from the apps' folders.
WHITENOISE_USE_FINDERS = envbool("WHITENOISE_USE_FINDERS", "True")

# The Redis scripts/bootstrap.sh starts on this machine requires the password it generated into
# REDIS_PASSWORD_FILE (root only); several machines set REDIS_URL (with its password) instead.
REDIS_PASSWORD_FILE = Path(env("REDIS_PASSWORD_FILE", "/var/lib/tcc/redis/password"))


def local_redis_url(db):
    try:
        password = REDIS_PASSWORD_FILE.read_text().strip()
    except OSError:  # none yet (bootstrap makes it), or not this account's to read: Redis will say NOAUTH
        password = ""
    auth = f":{quote(password, safe='')}@" if password else ""
    return f"redis://{auth}127.0.0.1:{envint('REDIS_PORT', 6379)}/{db}"


REDIS_URL = env("REDIS_URL") or local_redis_url(envint("REDIS_DB", 0))

CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True
# A worker that dies mid-task leaves its message unacknowledged, so it is delivered again;
# the operation's compare-and-set claim makes the second delivery harmless.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT", 3600)}
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER")
# Periodic tasks go to their own queue and expire when a newer run is due, so a backlog of them (a
# worker down for an hour) never queues ahead of provisioning; run a worker per queue to keep them
# apart (docs/scaling.md). Operations go to the default queue ("celery").
CELERY_PERIODIC_QUEUE = env("CELERY_PERIODIC_QUEUE", "periodic")
# Slurm sync (clusters/services/sync.py): every SLURM_SYNC_SECONDS one task per live cluster pulls its
# nodes and jobs (and the progress of its runs) into the database; pages and GET endpoints read only
# that. State older than SLURM_STALE_SECONDS is flagged on the pages as stale.
SLURM_SYNC_SECONDS = envfloat("SLURM_SYNC_SECONDS", 10.0)
SLURM_STALE_SECONDS = envfloat("SLURM_STALE_SECONDS", 3 * SLURM_SYNC_SECONDS + 10)
SLURM_SYNC_LEASE_SECONDS = envint("SLURM_SYNC_LEASE_SECONDS", 60)
PERIODIC_TASKS = {
    "sync-clusters": ("clusters.tasks.sync_clusters", SLURM_SYNC_SECONDS),
    "resume-stale-operations": ("clusters.tasks.resume_stale_operations", 60.0),
    "watch-clusters": ("clusters.tasks.watch_clusters", 15.0),
    # Periodic health scans per cluster (their schedules are rows, edited on the cluster page / API).
    "run-due-scans": ("clusters.tasks.run_due_scans", 60.0),
    "prune-history": ("clusters.tasks.prune_history", 3600.0),
    # Controller certificates near their end (clusters/tls.py RENEW_DAYS) are rotated.
    "rotate-certificates": ("clusters.tasks.rotate_certificates", 86400.0),
}
# Inference endpoints (recipes/serving/): one reconcile round for every endpoint (replicas, rolls,
# autoscaling) every ENDPOINT_RECONCILE_SECONDS; the router (recipes/serving/router.py) writes a sample per
# endpoint every ROUTER_SAMPLE_SECONDS and reads its routing table every ROUTER_REFRESH_SECONDS.
ENDPOINT_RECONCILE_SECONDS = envfloat("ENDPOINT_RECONCILE_SECONDS", 5.0)
ENDPOINT_SCALE_WINDOW_SECONDS = envfloat("ENDPOINT_SCALE_WINDOW_SECONDS", 30.0)
ENDPOINT_SCALE_COOLDOWN_SECONDS = envfloat("ENDPOINT_SCALE_COOLDOWN_SECONDS", 60.0)
ENDPOINT_SCALE_DOWN_IDLE_SECONDS = envfloat("ENDPOINT_SCALE_DOWN_IDLE_SECONDS", 300.0)
# A replica not serving this long after it was submitted (queued, or its engine never loads: vLLM
# gives a large model up to 30 min) has failed; during a roll that fails the roll.
ENDPOINT_START_SECONDS = envfloat("ENDPOINT_START_SECONDS", 2400.0)
ROUTER_HOST = env("ROUTER_HOST", "127.0.0.1")
ROUTER_PORT = envint("ROUTER_PORT", 8100)
ROUTER_REFRESH_SECONDS = envfloat("ROUTER_REFRESH_SECONDS", 1.0)
ROUTER_SAMPLE_SECONDS = envfloat("ROUTER_SAMPLE_SECONDS", 5.0)
ROUTER_TOKEN_CACHE_SECONDS = envfloat("ROUTER_TOKEN_CACHE_SECONDS", 10.0)
ROUTER_TOKEN_CACHE_SIZE = envint("ROUTER_TOKEN_CACHE_SIZE", 10000)  # tokens remembered at once (a bounded LRU)
ROUTER_REQUEST_TIMEOUT = envfloat("ROUTER_REQUEST_TIMEOUT", 120.0)
ROUTER_CONNECT_TIMEOUT = envfloat("ROUTER_CONNECT_TIMEOUT", 3.0)  # a replica that takes longer is skipped
# A draining replica gets no new request once every router has re-read its table; it is stopped as soon
# as it has no request in flight, and at the latest after this: a request sent just before the drain
# may run ROUTER_REQUEST_TIMEOUT, so less would cut it (refused below).
ENDPOINT_DRAIN_SECONDS = envfloat(
    "ENDPOINT_DRAIN_SECONDS", ROUTER_REQUEST_TIMEOUT + 2 * ROUTER_REFRESH_SECONDS + ROUTER_CONNECT_TIMEOUT
)
if ENDPOINT_DRAIN_SECONDS < ROUTER_REQUEST_TIMEOUT:
    raise ImproperlyConfigured(
        f"ENDPOINT_DRAIN_SECONDS ({ENDPOINT_DRAIN_SECONDS:g}) must be at least ROUTER_REQUEST_TIMEOUT "
        f"({ROUTER_REQUEST_TIMEOUT:g}): a draining replica would be stopped under requests still allowed to run"
    )
# Connections to replicas the router holds open at once (aiohttp's default, 100, queued the 101st request).
ROUTER_MAX_CONNECTIONS = envint("ROUTER_MAX_CONNECTIONS", 1024)
# Requests a replica is given at once; past that, requests wait in a bounded queue per endpoint
# (ROUTER_QUEUE_PER_REPLICA x its replicas, each for up to ROUTER_QUEUE_SECONDS), and past the queue
# the router answers 429 with Retry-After.
ROUTER_REPLICA_CONCURRENCY = envint("ROUTER_REPLICA_CONCURRENCY", 8)
ROUTER_QUEUE_PER_REPLICA = envint("ROUTER_QUEUE_PER_REPLICA", 32)
ROUTER_QUEUE_SECONDS = envfloat("ROUTER_QUEUE_SECONDS", 30.0)
# Every replica's /health is probed this often; EJECT_AFTER failures in a row take it out of the
# routing until one probe passes again.
ROUTER_HEALTH_SECONDS = envfloat("ROUTER_HEALTH_SECONDS", 2.0)
# The bearer token Prometheus scrapes /metrics with (unset: /metrics answers 404). Read from a file so
# it is never in a process's command line or environment listing.
METRICS_TOKEN_FILE = env("METRICS_TOKEN_FILE", "")
ROUTER_HEALTH_EJECT_AFTER = envint("ROUTER_HEALTH_EJECT_AFTER", 2)
PERIODIC_TASKS["reconcile-endpoints"] = ("recipes.tasks.reconcile_endpoints", ENDPOINT_RECONCILE_SECONDS)
# A round holds its endpoint this long at most (a worker that died mid-round frees it then): more than
# a round takes (a few 2 s probes per replica), so two rounds never drive one endpoint at once.
ENDPOINT_RECONCILE_LEASE_SECONDS = envfloat("ENDPOINT_RECONCILE_LEASE_SECONDS", 120.0)
# Tasks the periodic ones fan out, on the same queue: one round per cluster or endpoint waits at a time
# (console/rounds.py), however late; one waiting this long is taken for lost and another is sent.
PERIODIC_FAN_OUT = ["clusters.tasks.sync_cluster", "recipes.tasks.reconcile_endpoint"]
PERIODIC_ROUND_TIMEOUT = envfloat("PERIODIC_ROUND_TIMEOUT", 300.0)


# A periodic task waits in the queue for up to PERIODIC_LATE_RUNS of its intervals (and never less than one):
# a worker that runs behind still runs it, late, and at most that many pile up. (Expiring at the next run
# dropped every run of it while the worker stayed more than one interval behind.)
PERIODIC_LATE_RUNS = envint("PERIODIC_LATE_RUNS", 10)


def periodic(queue):
    """(beat schedule, task routes) putting every periodic task on `queue`, expiring PERIODIC_LATE_RUNS
    intervals late (at most PERIODIC_ROUND_TIMEOUT, at least one interval)."""
    schedule = {
        name: {"task": task, "schedule": every, "options": {"queue": queue, "expires": late(every)}}
        for name, (task, every) in PERIODIC_TASKS.items()
    }
    tasks = [task for task, _every in PERIODIC_TASKS.values()] + PERIODIC_FAN_OUT
    return schedule, {task: {"queue": queue} for task in tasks}


def late(every):
    return max(every, min(PERIODIC_ROUND_TIMEOUT, PERIODIC_LATE_RUNS * every))


CELERY_BEAT_SCHEDULE, CELERY_TASK_ROUTES = periodic(CELERY_PERIODIC_QUEUE)

# Retention (clusters/retention.py, pruned hourly): days kept.
EVENTS_KEEP_DAYS = envint("EVENTS_KEEP_DAYS", 90)
JOBS_KEEP_DAYS = envint("JOBS_KEEP_DAYS", 90)
OPERATIONS_KEEP_DAYS = envint("OPERATIONS_KEEP_DAYS", 180)
SCAN_FOLDERS_KEEP_DAYS = envint("SCAN_FOLDERS_KEEP_DAYS", 30)

# Request bodies: a cluster spec is a few KB; refuse what no spec needs, with a clear message.
JSON_MAX_BYTES = envint("JSON_MAX_BYTES", 1_000_000)
JSON_MAX_DEPTH = envint("JSON_MAX_DEPTH", 32)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(JSON_MAX_BYTES * 2, 2_621_440)
# Any request body, uploads included (Django streams files to disk without a limit of its own).
REQUEST_MAX_BYTES = envint("REQUEST_MAX_BYTES", DATA_UPLOAD_MAX_MEMORY_SIZE + 1_048_576)

REST_FRAMEWORK = {
    "DEFAULT_PARSER_CLASSES": [
        "console.safejson.SafeJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "EXCEPTION_HANDLER": "console.safejson.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "console.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_THROTTLE_CLASSES": ["console.throttles.Reads", "console.throttles.Writes"],
}
# Requests per minute per user on the REST APIs (console/throttles.py), reads and writes apart.
API_READS_PER_MINUTE = envint("API_READS_PER_MINUTE", 600)
API_WRITES_PER_MINUTE = envint("API_WRITES_PER_MINUTE", 60)
# The cache the throttles count in: this process's memory, or Redis shared by every web server.
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": env("CACHE_URL")}
        if env("CACHE_URL")
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    )
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Training cluster console API",
    "DESCRIPTION": "Create and manage Slurm training clusters from the managed service's cluster JSON.",
    "VERSION": "1",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI's assets are served from this app, not a CDN: consoles often run without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.schema.document_errors",
    ],
    "ENUM_NAME_OVERRIDES": {
        "ClusterStatusEnum": "clusters.choices.ClusterStatus",
        "OperationStatusEnum": "clusters.choices.OperationStatus",
        "NodeStateEnum": "clusters.choices.NodeState",
    },
}

# Cluster backends: the name in a spec's console.backend picks one of these.
# The model registry: an MLflow tracking server (scripts/mlflow.sh starts the embedded one: SQLite and
# an artifact folder under var/, bound to 127.0.0.1; production: PostgreSQL and a GCS bucket, see
# docs/registry.md). The console is its only client; users reach models through the console.
MLFLOW_TRACKING_URI = env("MLFLOW_TRACKING_URI", "http://127.0.0.1:5070")
# Its credentials: the embedded server's (scripts/mlflow.sh generates the password into this file),
# or, for another server, MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (MLflow's own variables)
# with MLFLOW_PASSWORD_FILE set empty.
MLFLOW_USERNAME = env("MLFLOW_USERNAME", "console")
MLFLOW_PASSWORD_FILE = env("MLFLOW_PASSWORD_FILE", str(VAR_DIR / "mlflow" / "password"))
MLFLOW_TIMEOUT = envint("MLFLOW_TIMEOUT", 30)
# Model names in the registry are "<project slug>.<name>"; experiments "<prefix><project slug>".
MLFLOW_EXPERIMENT_PREFIX = env("MLFLOW_EXPERIMENT_PREFIX", "tcc/")
# Runs outlive their cluster: the registry keeps each run's newest checkpoint and TensorBoard files
# (recipes/registry/archive.py), copied through the console; a checkpoint larger than this stays on the
# cluster's storage only (full-size ones are tens to hundreds of GB).
RUN_ARCHIVE_MAX_BYTES = envint("RUN_ARCHIVE_MAX_BYTES", 4 << 30)
# Larger checkpoints go from the cluster straight into the registry's store (MLflow's multipart upload,
# recipes/registry/direct.py) when it takes them (a bucket); up to this size (Llama 3.1 405B in fp32
# with AdamW's two moments: 12 bytes a parameter, about 4.9 TB), in parts of RUN_ARCHIVE_PART_BYTES.
RUN_ARCHIVE_DIRECT_MAX_BYTES = envint("RUN_ARCHIVE_DIRECT_MAX_BYTES", 8 << 40)
RUN_ARCHIVE_PART_BYTES = envint("RUN_ARCHIVE_PART_BYTES", 128 << 20)
# Parts of one file the cluster agent sends at once (one stream to Cloud Storage carries far less than a
# controller's NIC: its docs advise parallel parts for large objects,
# https://cloud.google.com/storage/docs/multipart-uploads).
RUN_ARCHIVE_PARALLEL_PARTS = envint("RUN_ARCHIVE_PARALLEL_PARTS", 4)

CLUSTER_BACKENDS = {
    "local": "clusters.backends.local.LocalBackend",
    "gce": "clusters.backends.gce.GceBackend",
}
DEFAULT_CLUSTER_BACKEND = env("DEFAULT_CLUSTER_BACKEND", "local")

# Local backend: where each cluster's directory (slurm.conf, munge key, state, logs, users' homes) lives.
# Not under var/, which users' jobs must not enter. Keep it short: munge's unix socket lives inside and
# socket paths are limited to 107 bytes.
LOCAL_CLUSTERS_DIR = Path(env("LOCAL_CLUSTERS_DIR", str(BASE_DIR / "local-clusters")))
LOCAL_MAX_NODES = envint("LOCAL_MAX_NODES", 16)
# Users' POSIX accounts and projects' groups on clusters start with this (clusters/accounts.py).
POSIX_ACCOUNT_PREFIX = env("POSIX_ACCOUNT_PREFIX", "tcc-")
LOCAL_PORT_RANGE = (envint("LOCAL_PORT_MIN", 20000), envint("LOCAL_PORT_MAX", 40000))
LOCAL_NODE_IDLE_TIMEOUT = envfloat("LOCAL_NODE_IDLE_TIMEOUT", 60)
# The ports serving replicas listen on (recipes/node/serve.py --ports), on every backend: gce opens exactly
# this range of the compute nodes to the console's router (GCE_CONSOLE_RANGES). Outside LOCAL_PORT_RANGE
# and Slurm's own ports (6817-6821).
SERVING_REPLICA_PORTS = (envint("SERVING_REPLICA_PORT_MIN", 18000), envint("SERVING_REPLICA_PORT_MAX", 18999))
# Seconds to pause before each slurmd start; only tests set it, to stop a worker mid-provisioning.
LOCAL_NODE_START_DELAY = envfloat("LOCAL_NODE_START_DELAY", 0)

# gce backend. GCE_API_ENDPOINT points every Google client at another host (the tests' fake API);
# empty means Google's. Credentials: GCE_CREDENTIALS_DIR/<project slug>.json (a service-account key
# per console project) when it exists, else Application Default Credentials. Keys are never logged.
GCE_API_ENDPOINT = env("GCE_API_ENDPOINT")
GCE_FILESTORE_ENDPOINT = env("GCE_FILESTORE_ENDPOINT")
GCE_LUSTRE_ENDPOINT = env("GCE_LUSTRE_ENDPOINT")
GCE_SERVICE_NETWORKING_ENDPOINT = env("GCE_SERVICE_NETWORKING_ENDPOINT")
GCE_SECRET_MANAGER_ENDPOINT = env("GCE_SECRET_MANAGER_ENDPOINT")
GCE_SERVICE_USAGE_ENDPOINT = env("GCE_SERVICE_USAGE_ENDPOINT")
GCE_RESOURCE_MANAGER_ENDPOINT = env("GCE_RESOURCE_MANAGER_ENDPOINT")
GCE_STORAGE_ENDPOINT = env("GCE_STORAGE_ENDPOINT")
GCE_IAM_ENDPOINT = env("GCE_IAM_ENDPOINT")
# Anonymous credentials, for a fake API only (the tests'); never against Google.
GCE_ANONYMOUS = envbool("GCE_ANONYMOUS")
GCE_CREDENTIALS_DIR = env("GCE_CREDENTIALS_DIR")
GCE_OPERATION_TIMEOUT = envfloat("GCE_OPERATION_TIMEOUT", 1800)
GCE_POLL_INTERVAL = envfloat("GCE_POLL_INTERVAL", 2)
# How long the controller's and login nodes' startup scripts may take (package installs, mounts).
GCE_STARTUP_TIMEOUT = envfloat("GCE_STARTUP_TIMEOUT", 1800)
GCE_IMAGE = env("GCE_IMAGE", "projects/debian-cloud/global/images/family/debian-12")
# GPU compute pools boot this image (NVIDIA driver and DCGM installed; the startup script fails on a
# GPU node without nvidia-smi, and the failing line shows on the cluster's timeline); empty: GCE_IMAGE.
GCE_GPU_IMAGE = env("GCE_GPU_IMAGE")
# Arm GPU pools (A4X: Grace CPUs) boot this Arm64 image (`manage.py gce_image build --gpu --arm64`); an
# x86 image cannot boot them, so a spec with such a pool is refused while it is empty.
GCE_GPU_ARM64_IMAGE = env("GCE_GPU_ARM64_IMAGE")
# VMs run as runtime_spec.service_account when the spec names one, else as this: "cluster", an account
# the console makes for each cluster and grants only what its nodes need (clusters/backends/gce/identity.py);
# an email; or "default", the project's Compute Engine default account (shared by every cluster: one
# cluster's nodes could then read another's keys). The cloud-platform scope either way, IAM deciding.
GCE_SERVICE_ACCOUNT = env("GCE_SERVICE_ACCOUNT", "cluster")
# Project-level roles a cluster's own account gets (these exist only at the project level); empty: none.
GCE_NODE_PROJECT_ROLES = [
    r for r in env("GCE_NODE_PROJECT_ROLES", "roles/logging.logWriter,roles/monitoring.metricWriter").split(",") if r
]
# A new service account may not be seen for a minute or more (IAM is eventually consistent): its first
# uses are retried this long.
GCE_IAM_PROPAGATION_TIMEOUT = envfloat("GCE_IAM_PROPAGATION_TIMEOUT", 180)
# Flex-start VMs get this max run duration (Compute Engine allows up to 7 days for them).
GCE_FLEX_START_MAX_RUN_HOURS = envfloat("GCE_FLEX_START_MAX_RUN_HOURS", 168)
GCE_CONTROLLER_MACHINE_TYPE = env("GCE_CONTROLLER_MACHINE_TYPE", "n2-standard-8")
# Who may reach a login node's SSH port: Identity-Aware Proxy's TCP forwarding range by default
# (https://cloud.google.com/iap/docs/using-tcp-forwarding), not the whole internet.
GCE_SSH_SOURCE_RANGES = [r for r in env("GCE_SSH_SOURCE_RANGES", "35.235.240.0/20").split(",") if r]
# The console reaches a gce controller's slurmrestd and cluster agent on these ports of its internal
# address (from inside the VPC, a peered one, or through IAP TCP forwarding; docs/backends.md).
# Off: a console outside the clusters' VPCs that only provisions (no jobs, scans or recipes; node state
# from Compute Engine alone).
GCE_REACH_CLUSTERS = envbool("GCE_REACH_CLUSTERS", "True")
# Where the console's workers reach the controllers from: a firewall rule on each cluster admits these
# ranges (the workers' subnet; comma-separated) to slurmrestd and the agent, and nothing else does.
# Required while GCE_REACH_CLUSTERS is on. GCE_CONSOLE_NETWORK (projects/P/global/networks/N), when
# set, is peered with each VPC the console creates so the workers have a route to it (docs/gce.md).
GCE_CONSOLE_RANGES = [r for r in env("GCE_CONSOLE_RANGES", "").split(",") if r]
GCE_CONSOLE_NETWORK = env("GCE_CONSOLE_NETWORK")
# How the console reaches a controller: "internal" (its internal address, from the VPC or a peered one:
# the console runs in Google Cloud), or "external" for a console outside Google Cloud: the controller
# gets an external address and the firewall admits GCE_CONSOLE_RANGES (the console's public egress
# addresses) to slurmrestd and the agent only, both on TLS with the cluster's own CA (docs/gce.md).
# External reach serves no endpoints: the router cannot reach the compute nodes' replicas.
GCE_CONTROLLER_ACCESS = env("GCE_CONTROLLER_ACCESS", "internal")
if GCE_CONTROLLER_ACCESS not in ("internal", "external"):
    raise ImproperlyConfigured(f"GCE_CONTROLLER_ACCESS must be internal or external, not {GCE_CONTROLLER_ACCESS!r}")
GCE_SLURMRESTD_PORT = envint("GCE_SLURMRESTD_PORT", 6820)
GCE_AGENT_PORT = envint("GCE_AGENT_PORT", 6821)
# The Python on a gce cluster's nodes that runs health checks (numpy) and recipes (torch, transformers,
# tensorboard): an image's own, e.g. a Deep Learning VM image's /opt/conda/bin/python.
GCE_NODE_PYTHON = env("GCE_NODE_PYTHON", "/usr/bin/python3")
# Slurm's job credential lifetime (AuthInfo=cred_expire; Slurm's default 120 s), which is also how long
# a requeued job waits before it can start again.
GCE_SLURM_CRED_EXPIRE = envint("GCE_SLURM_CRED_EXPIRE", 120)
# Seconds between runs of the nodes' HealthCheckProgram (Azure CycleCloud's health agent runs every 60 s).
GCE_HEALTH_CHECK_INTERVAL = envint("GCE_HEALTH_CHECK_INTERVAL", 60)

# Self-repair: start a repair after a scan finds a failing node, and watch nodes every 15 s.
AUTO_REPAIR = envbool("AUTO_REPAIR", "True")
# A running run that logs no metrics line for this long gets an alert (a launch may set its own).
RUN_STALL_MINUTES = envint("RUN_STALL_MINUTES", 30)
# A new cluster is READY only once its first health scan (every check) passes on every node; backends
# that cannot run Slurm jobs from the console yet (gce) skip it and say so on the timeline.
HEALTH_SCAN_BEFORE_READY = envbool("HEALTH_SCAN_BEFORE_READY", "True")
# Periodic scans: the schedule a new cluster starts with (editable per cluster; 0 = off), and how long
# scan results are kept.
HEALTH_SCAN_EVERY_HOURS = envfloat("HEALTH_SCAN_EVERY_HOURS", 24)
HEALTH_RESULTS_KEEP_DAYS = envint("HEALTH_RESULTS_KEEP_DAYS", 30)

# An operation whose worker has not reported for this long is taken to be orphaned and re-enqueued.
OPERATION_STALE_AFTER = envint("OPERATION_STALE_AFTER", 300)
OPERATION_MAX_RETRIES = envint("OPERATION_MAX_RETRIES", 5)
# A stockout (no capacity in the zone or reservation) is tried again every OPERATION_CAPACITY_RETRY_SECONDS
# for up to OPERATION_CAPACITY_WAIT_HOURS before the operation fails; those tries spend no attempts.
OPERATION_CAPACITY_RETRY_SECONDS = envint("OPERATION_CAPACITY_RETRY_SECONDS", 300)
OPERATION_CAPACITY_WAIT_HOURS = envfloat("OPERATION_CAPACITY_WAIT_HOURS", 6)
# Refuse to start an operation (503 with Retry-After) while the task queue does not answer.
OPERATION_CHECK_BROKER = envbool("OPERATION_CHECK_BROKER", "True")
OPERATION_BROKER_TIMEOUT = envfloat("OPERATION_BROKER_TIMEOUT", 2)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
}
