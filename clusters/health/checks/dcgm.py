"""`dcgmi diag -r LEVEL -j`, read per test and per GPU.

dcgmi exits non-zero when a test fails (DCGM_ST_NVVS_ERROR, -30, or DCGM_ST_NVVS_ISOLATE_ERROR, -51:
NVIDIA/DCGM dcgmlib/dcgm_structs.h, returned by dcgmi/main_dcgmi.cpp), so the JSON is read whatever the
exit code; only a node without dcgmi skips. Two report shapes exist: DCGM 3 ("DCGM GPU Diagnostic",
results by "gpu_id"/"gpu_ids") and DCGM 4 ("DCGM Diagnostic", results by "entity_group"/"entity_id",
warnings with DCGM_FR_* error ids: testing/python3/dcgm_diag_schema.json in NVIDIA/DCGM 4.6). Statuses
are compared case-insensitively ("Fail", "fail").
"""

import json

from .. import FAIL, PASS, SKIPPED, WARN, Result, check, thresholds
from .gpu import run

REPORTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")


def report(text):
    """The diagnostic's report from dcgmi's stdout (DCGM 3 prints a line before the JSON); ValueError
    when there is none."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in dcgmi's output")
    document = json.loads(text[start:])
    if "iterations" in document:  # dcgmi diag --iterations N: the last one's report
        document = document["iterations"][-1]
    for name in REPORTS:
        if name in document:
            return document[name]
    raise ValueError(f"no {' or '.join(REPORTS)} in dcgmi's JSON")


def entity(result):
    if "entity_id" in result:
        group = result.get("entity_group", "GPU")
        return f"{group} {result['entity_id']}" if group != "GPU" else f"GPU {result['entity_id']}"
    return f"GPU {result.get('gpu_id', result.get('gpu_ids', '?'))}"


def warnings_of(result):
    texts = []
    for warning in result.get("warnings", []):
        texts.append(warning.get("warning", "") if isinstance(warning, dict) else str(warning))
    return [t for t in texts if t]


def read(text, level):
    try:
        diagnostic = report(text)
    except ValueError as exc:
        return None, str(exc)
    tests, failed, warned = {}, [], []
    for category in diagnostic.get("test_categories", []):
        for test in category.get("tests", []):
            statuses = {}
            for result in test.get("results", []):
                status = str(result.get("status", "")).lower()
                statuses[entity(result)] = status
                if status == "fail":
                    detail = "; ".join(warnings_of(result))[:300]
                    failed.append(f"{test['name']} on {entity(result)}" + (f" ({detail})" if detail else ""))
                elif status == "warn":
                    warned.append(f"{test['name']} on {entity(result)}")
            tests[test["name"]] = statuses
    values = {"tests": tests}
    if diagnostic.get("runtime_error"):
        return Result(FAIL, values, {"level": level}, f"dcgmi could not run: {diagnostic['runtime_error']}"), ""
    if failed:
        return Result(FAIL, values, {"level": level}, "; ".join(failed)), ""
    if warned:
        return Result(WARN, values, {"level": level}, "; ".join(warned)), ""
    return Result(PASS, values, {"level": level}), ""


@check("dcgm")
def dcgm(context):
    level = thresholds(context)["dcgm"]["level"]
    output = run(["dcgmi", "diag", "-r", str(level), "-j"], context, timeout=1800)
    if output is None:
        return Result(SKIPPED, reason="no GPU or DCGM (dcgmi not found)")
    result, problem = read(output.stdout, level)
    if result is None:
        # No report at all: the diagnostic did not run (no host engine, a GPU gone from the bus).
        return Result(FAIL, {}, {"level": level}, f"dcgmi diag failed ({output.problem()}; {problem})")
    return result
