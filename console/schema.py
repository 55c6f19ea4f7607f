"""OpenAPI document tweaks: every /api/v1 operation documents the error answers it can give, in the
one error shape of console.safejson.api_exception_handler (so clients, and schemathesis, know them)."""

ERROR_BODY = {
    "type": "object",
    "description": (
        'Either {"detail": "<sentence>"} or {"<field path>": ["<reason>", ...]} (spec fields nested under "spec").'
    ),
    "additionalProperties": True,
}
ERRORS = {
    "400": "Bad input: every bad field with its reasons, or the sentence for a malformed body.",
    "401": "No valid API token (missing, revoked or expired).",
    "403": "The caller's role in the project does not allow this, or the project's quota is exhausted.",
    "404": "No such object, or not one of the caller's projects.",
    "409": "Not now: the cluster is busy with another operation or in a state this does not fit.",
    "413": "The request body is over the console's limit.",
    "503": "Something the request needs (the task queue, a cluster's Slurm) is not answering; see Retry-After.",
}


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: add the error responses to every operation."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_BODY
    for path in result.get("paths", {}).values():
        for method, operation in path.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            responses = operation.setdefault("responses", {})
            for code, description in ERRORS.items():
                responses.setdefault(
                    code,
                    {
                        "description": description,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                    },
                )
    return result
