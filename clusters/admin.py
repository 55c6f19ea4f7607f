"""Admin for every cluster model; specs are validated by the same validator as the API."""

import json

from django import forms
from django.contrib import admin, messages

from .backends import all_backends
from .health import faults
from .models import Cluster, ClusterEvent, Membership, Node, NodePool, Operation, Partition, Project, SlurmJob
from .spec import SpecError, validate_spec


class ClusterAdminForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["project", "name", "location", "backend", "spec", "status", "status_message", "created_by"]

    def clean_spec(self):
        spec = self.cleaned_data["spec"]
        try:
            return validate_spec(spec, backends=all_backends())
        except SpecError as exc:
            raise forms.ValidationError([f"{path}: {', '.join(msgs)}" for path, msgs in exc.errors.items()]) from None


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created"]
    inlines = [MembershipInline]
    prepopulated_fields = {"slug": ["name"]}


class NodePoolInline(admin.TabularInline):
    model = NodePool
    extra = 0


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterAdminForm
    list_display = ["name", "project", "backend", "status", "location", "created"]
    list_filter = ["status", "backend", "project"]
    search_fields = ["name", "project__slug"]
    readonly_fields = ["backend_state_summary"]
    exclude = ["backend_state"]
    inlines = [NodePoolInline]

    @admin.display(description="Backend state")
    def backend_state_summary(self, obj):
        return json.dumps(obj.backend_state, indent=1, sort_keys=True)


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ["pool_id", "cluster", "role", "machine_type", "accelerator_type", "node_count"]


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "is_default"]


def fault_action(kind):
    """An admin action injecting `kind` into the selected nodes (local backend only; others get an error)."""

    def action(model_admin, request, queryset):
        for node in queryset.select_related("cluster"):
            try:
                model_admin.message_user(request, f"{node.cluster}: {faults.inject(node.cluster, node.name, kind)}")
            except faults.FaultError as exc:
                model_admin.message_user(request, f"{node.cluster} {node.name}: {exc}", level=messages.ERROR)

    action.__name__ = f"inject_{kind}"
    action.short_description = f"Inject fault: {kind.replace('_', ' ')} ({faults.KINDS[kind]})"
    action.allowed_permissions = ("inject_faults",)  # NodeAdmin.has_inject_faults_permission
    return action


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster", "node_pool", "state", "slurm_state", "slurm_reason", "slurm_seen"]
    list_filter = ["state"]
    search_fields = ["name", "cluster__name"]
    actions = [fault_action(kind) for kind in faults.KINDS]

    def has_inject_faults_permission(self, request):
        return request.user.has_perm("clusters.inject_faults")


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    list_display = ["uuid", "cluster", "kind", "status", "progress", "step", "attempts", "created", "finished"]
    list_filter = ["kind", "status"]


@admin.register(ClusterEvent)
class ClusterEventAdmin(admin.ModelAdmin):
    list_display = ["created", "cluster", "level", "node", "message"]
    list_filter = ["level"]


@admin.register(SlurmJob)
class SlurmJobAdmin(admin.ModelAdmin):
    list_display = ["job_id", "cluster", "name", "user", "state", "partition", "node_count", "exit_code", "seen"]
    list_filter = ["state"]
