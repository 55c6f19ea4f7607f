"""Node images for gce clusters: `manage.py gce_image build` bakes one image family with everything a
node installs, so nodes boot without the internet (they have no external address and, unless the spec
asks for Cloud NAT, no route out) and the startup script only configures.

The build, all through the Compute API: a builder VM from the base image (Debian 12 for CPU nodes, the
Ubuntu accelerator image with the NVIDIA driver for GPU nodes) with an external address and bake.sh as
its startup script; its serial console says `tcc-startup: done` (or the failing step); the VM is
stopped, an image made from its boot disk into the family (an image is made from a disk no running VM
uses: https://cloud.google.com/compute/docs/images/create-custom), and the VM deleted. Then
GCE_IMAGE (or GCE_GPU_IMAGE) names `projects/P/global/images/family/<family>`: new nodes boot the
newest image of the family (https://cloud.google.com/compute/docs/images/image-families-best-practices).
"""

import time
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from ...spec.catalog import nccl_networks
from ...work import PermanentBackendError
from .cloud import wait_operation
from .errors import map_api_error
from .instances import serial_outcome

BAKE = Path(__file__).resolve().parent / "bake.sh"
# Base images: Debian 12 for CPU nodes; for GPU nodes Ubuntu's accelerator image, which carries the
# NVIDIA driver (https://cloud.google.com/compute/docs/gpus/install-drivers-gpu).
CPU_BASE = "projects/debian-cloud/global/images/family/debian-12"
GPU_BASE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"
BUILDER_MACHINE = "n2-standard-8"
# Arm64 GPU nodes (A4X, Grace CPUs) boot only Arm images (cloud.google.com/compute/docs/instances/arm-on-compute):
# baked from Ubuntu's Arm64 accelerator image on an Arm builder, C4A, which takes Hyperdisk only, as
# Cluster Toolkit's examples/machine-learning/a4x-highgpu-4g blueprint builds its image.
ARM64_GPU_BASE = (
    "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2404-arm64-with-nvidia-570"
)
ARM64_BUILDER_MACHINE = "c4a-highcpu-16"


class Baked:
    def __init__(self, image, family, project):
        self.image, self.family, self.project = image, family, project

    @property
    def family_url(self):
        return f"projects/{self.project}/global/images/family/{self.family}"


def build(clients, project, zone, *, gpu=False, arm64=False, family="", base="", report=print):
    """Bake an image into `family` (default tcc-node, tcc-gpu-node or tcc-gpu-node-arm64) in Google Cloud
    project `project`; arm64: a GPU image for Arm machine types (A4X)."""
    from google.api_core import exceptions
    from google.cloud import compute_v1

    if arm64 and not gpu:
        raise PermanentBackendError("an Arm64 image is baked for A4X's GPU nodes: add --gpu")
    family = family or ("tcc-gpu-node-arm64" if arm64 else "tcc-gpu-node" if gpu else "tcc-node")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    builder, image = f"{family}-builder-{stamp}", f"{family}-{stamp}"
    labels = {"managed-by": "training-cluster-console", "tcc-image": family}
    instance = compute_v1.Instance(
        name=builder,
        machine_type=f"zones/{zone}/machineTypes/{ARM64_BUILDER_MACHINE if arm64 else BUILDER_MACHINE}",
        labels=labels,
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=base or (ARM64_GPU_BASE if arm64 else GPU_BASE if gpu else CPU_BASE),
                    disk_size_gb=100 if gpu else 30,
                    disk_type=f"zones/{zone}/diskTypes/{'hyperdisk-balanced' if arm64 else 'pd-balanced'}",
                ),
            )
        ],
        # The builder downloads packages: an external address on the default network for the bake only.
        network_interfaces=[
            compute_v1.NetworkInterface(
                network=f"projects/{project}/global/networks/default",
                access_configs=[compute_v1.AccessConfig(name="External NAT")],
            )
        ],
        scheduling=compute_v1.Scheduling(on_host_maintenance="MIGRATE", automatic_restart=True),
        metadata=compute_v1.Metadata(
            items=[compute_v1.Items(key="startup-script", value=bake_script(gpu=gpu, family=family, stamp=stamp))]
        ),
    )

    def wait(operation, what):
        return wait_operation(clients, project, operation, what)

    try:
        report(f"Creating the builder VM {builder} in {zone}")
        wait(clients.instances.insert_unary(project=project, zone=zone, instance_resource=instance), "the builder VM")
        report("Installing Slurm, munge, gcsfuse and the node runtime (the builder's startup script)")
        outcome = until_started(clients, project, zone, builder)
        if outcome != "done":
            raise PermanentBackendError(f"the bake failed on {builder}: {outcome} (from its serial console)")
        report(f"Stopping {builder}")
        wait(clients.instances.stop_unary(project=project, zone=zone, instance=builder), f"stopping {builder}")
        report(f"Making image {image} in family {family}")
        wait(
            clients.images.insert_unary(
                project=project,
                image_resource=compute_v1.Image(
                    name=image,
                    family=family,
                    labels=labels,
                    source_disk=f"projects/{project}/zones/{zone}/disks/{builder}",
                    description=f"Training cluster console node image ({'GPU' if gpu else 'CPU'}), baked {stamp}",
                ),
            ),
            f"making image {image}",
        )
    except exceptions.GoogleAPICallError as exc:
        raise map_api_error(exc, "baking the node image") from None
    finally:
        try:
            report(f"Deleting {builder}")
            wait(clients.instances.delete_unary(project=project, zone=zone, instance=builder), f"deleting {builder}")
        except exceptions.NotFound:
            pass
    return Baked(image, family, project)


def bake_script(*, gpu, family, stamp):
    nccl = nccl_networks()
    images = {"GIB_INSTALLER": nccl["rdma"]["installer"], "TCPXO_INSTALLER": nccl["tcpxo"]["installer"],
              "TCPXO_DAEMON": nccl["tcpxo"]["daemon"]}  # fmt: skip
    text = BAKE.read_text()
    for key, value in {"GPU": "1" if gpu else "", "FAMILY": family, "STAMP": stamp, **images}.items():
        text = text.replace(f"@{key}@", value)
    return text


def until_started(clients, project, zone, name):
    """The builder's verdict from its serial console: "done", "FAILED: ...", or why it is neither."""
    deadline = time.monotonic() + settings.GCE_STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        outcome = serial_outcome(clients, project, zone, name)
        if outcome == "done" or outcome.startswith("FAILED"):
            return outcome
        time.sleep(settings.GCE_POLL_INTERVAL)
    return f"not finished after {settings.GCE_STARTUP_TIMEOUT:.0f} s"
