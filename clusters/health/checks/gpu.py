"""Helpers for the GPU checks: nvidia-smi and dcgmi, when the node has them."""

import shutil
import subprocess


def run(argv, timeout=120):
    if shutil.which(argv[0]) is None:
        return None
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return result.stdout if result.returncode == 0 else None
