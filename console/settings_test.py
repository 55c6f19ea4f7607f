"""Settings for the test suite: the real settings with a test Redis database and short paths.

Celery workers started by the tests use these settings too, with CONSOLE_WORKER_USES_TEST_DB=1 so
they open the test database file that pytest-django created.
"""

import hashlib
import os
import sys

from .settings import *  # noqa: F403
from .settings import ALLOWED_HOSTS, BASE_DIR, DATABASES, env, local_redis_url, private_dir

# Two checkouts testing at once (a developer's and a CI clone) must not share a database file,
# cluster folders or a task queue.
CHECKOUT = hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:8]
REDIS_URL = env("TEST_REDIS_URL") or local_redis_url(15)
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = f"console-tests-{CHECKOUT}"
CELERY_TASK_ALWAYS_EAGER = False
TEST_ROOT = env("TEST_ROOT", f"/tmp/tcc-tests-{CHECKOUT}")
LOCAL_CLUSTERS_DIR = env("LOCAL_CLUSTERS_DIR", f"{TEST_ROOT}/clusters")
# The console's own files (database, registry) in a private folder, as var/ is: the tests' local
# clusters run users' jobs on this host beside them.
TEST_VAR = f"{TEST_ROOT}/var"
DATABASES["default"]["TEST"] = {"NAME": f"{TEST_VAR}/test.sqlite3"}
if DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {"NAME": "test_console"}
if os.environ.get("CONSOLE_WORKER_USES_TEST_DB"):
    DATABASES["default"]["NAME"] = DATABASES["default"]["TEST"]["NAME"]
os.makedirs(TEST_ROOT, exist_ok=True)
private_dir(TEST_VAR)
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ALLOWED_HOSTS = [*ALLOWED_HOSTS, "testserver"]  # Django's test client; never in the real settings
LOGGING = {"version": 1, "disable_existing_loggers": False}
# Unit tests run without a broker; the fault tests (tests/test_faults.py) turn the check on.
OPERATION_CHECK_BROKER = False
# Workers started by the fault tests run the tests' scripted backend (tests/backends.py).
if os.environ.get("CONSOLE_SCRIPTED_BACKEND"):
    CLUSTER_BACKENDS = {**CLUSTER_BACKENDS, "scripted": "tests.backends.ScriptedBackend"}  # noqa: F405
CELERY_PERIODIC_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-periodic"
CELERY_BEAT_SCHEDULE, CELERY_TASK_ROUTES = periodic(CELERY_PERIODIC_QUEUE)  # noqa: F405
POSIX_ACCOUNT_PREFIX = "tcct-"  # accounts the tests make; tests/conftest.py removes them
# The nodes of a gce cluster booted by the tests' fake (tests/fake_vms.py) run this checkout's Python.
GCE_NODE_PYTHON = env("GCE_NODE_PYTHON", sys.executable)
# Faster than production, as the local clusters' (10 s): the tests wait for a drain.
GCE_HEALTH_CHECK_INTERVAL = envint("GCE_HEALTH_CHECK_INTERVAL", 10)  # noqa: F405
# As the local clusters' (10 s): a requeued job may start again after ~11 s instead of ~121 s.
GCE_SLURM_CRED_EXPIRE = envint("GCE_SLURM_CRED_EXPIRE", 10)  # noqa: F405
# The tests' MLflow server (tests/conftest.py starts it once per session), on a port of this checkout's.
MLFLOW_TRACKING_URI = env("TEST_MLFLOW_TRACKING_URI", f"http://127.0.0.1:{5100 + int(CHECKOUT, 16) % 800}")
MLFLOW_DIR = f"{TEST_VAR}/mlflow"
MLFLOW_PASSWORD_FILE = f"{MLFLOW_DIR}/password"
# The tests' inference router (tests/test_endpoints.py starts it), on a port of this checkout's.
ROUTER_PORT = envint("TEST_ROUTER_PORT", 6100 + int(CHECKOUT, 16) % 800)  # noqa: F405
# The suite's clients (the schema fuzzers above all) send far more than a person would; the throttle
# tests set their own limits.
API_READS_PER_MINUTE = API_WRITES_PER_MINUTE = 100_000
