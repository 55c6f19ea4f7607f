"""gce clusters created before resource names carried a 16-digit digest keep the 4-digit names
their resources have: the prefix goes into backend_state, where the backend reads it first."""

import hashlib

from django.db import migrations


def keep_prefix(apps, schema_editor):
    Cluster = apps.get_model("clusters", "Cluster")
    for cluster in Cluster.objects.filter(backend="gce").exclude(status__in=["DRAFT", "DELETED"]).select_related(
        "project"
    ):
        state = dict(cluster.backend_state or {})
        if "gce_prefix" in state:
            continue
        digest = hashlib.sha256(f"{cluster.project.slug}/{cluster.name}".encode()).hexdigest()[:4]
        state["gce_prefix"] = f"{cluster.name[:28].rstrip('-')}-{digest}"
        Cluster.objects.filter(pk=cluster.pk).update(backend_state=state)


class Migration(migrations.Migration):
    dependencies = [("clusters", "0012_node_inject_faults_permission")]

    operations = [migrations.RunPython(keep_prefix, migrations.RunPython.noop)]
