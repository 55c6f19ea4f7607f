"""An OpenAPI 3 document for the v1beta1 paths the console serves (GET /v1beta1/openapi.json), so
clients and schemathesis can check them as /api/schema/ lets them check /api/v1."""

SLUG = {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$", "maxLength": 63}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "status"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "status": {"type": "string"},
                "details": {"type": "array", "items": {"type": "object"}},
            },
        }
    },
}
OPERATION = {
    "type": "object",
    "required": ["name", "metadata"],
    "properties": {
        "name": {"type": "string"},
        "metadata": {"type": "object"},
        "done": {"type": "boolean"},
        "error": {"type": "object"},
        "response": {"type": "object"},
    },
}
CLUSTER = {
    "type": "object",
    "description": "The service's ModelDevelopmentCluster JSON (display_name, node_pools, orchestrator_spec, ...).",
    "additionalProperties": True,
}
ERROR_CODES = {
    "400": "INVALID_ARGUMENT or FAILED_PRECONDITION, with google.rpc.BadRequest field violations",
    "401": "UNAUTHENTICATED",
    "403": "PERMISSION_DENIED (not the caller's project, or the role lacks the permission)",
    "404": "NOT_FOUND",
    "409": "ALREADY_EXISTS",
    "429": "RESOURCE_EXHAUSTED (quota)",
    "503": "UNAVAILABLE, with google.rpc.RetryInfo",
}


FILTER_HELP = "key=value terms joined by AND; keys: state, user, partition, q"
SLURM_JOB = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "jobId": {"type": "integer"},
        "jobName": {"type": "string"},
        "user": {"type": "string"},
        "state": {"type": "string"},
        "partition": {"type": "string"},
        "nodes": {"type": "string"},
        "nodeCount": {"type": "integer"},
        "reason": {"type": "string"},
        "exitCode": {"type": "integer", "nullable": True},
        "submitTime": {"type": "string", "format": "date-time", "nullable": True},
        "startTime": {"type": "string", "format": "date-time", "nullable": True},
        "endTime": {"type": "string", "format": "date-time", "nullable": True},
    },
}


def json_body(schema):
    return {"content": {"application/json": {"schema": schema}}}


def answers(ok_schema):
    responses = {"200": {"description": "OK", **json_body(ok_schema)}}
    for code, description in ERROR_CODES.items():
        responses[code] = {"description": description, **json_body({"$ref": "#/components/schemas/Status"})}
    return responses


def path_params(*names):
    return [{"name": name, "in": "path", "required": True, "schema": SLUG} for name in names]


BASE = "/v1beta1/projects/{project}/locations/{location}"
CLUSTER_PATH = BASE + "/modelDevelopmentClusters/{cluster}"
CLUSTER_REF = {"$ref": "#/components/schemas/ModelDevelopmentCluster"}
OPERATION_REF = {"$ref": "#/components/schemas/Operation"}


def document():
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "Training cluster console: the managed service's v1beta1 paths",
            "version": "v1beta1",
            "description": "The service's REST paths, served by the console (clusters/api/compat.py).",
        },
        "components": {
            "schemas": {"Status": ERROR, "Operation": OPERATION, "ModelDevelopmentCluster": CLUSTER},
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearerAuth": []}],
        "paths": {
            BASE + "/modelDevelopmentClusters": {
                "parameters": path_params("project", "location"),
                "get": {
                    "operationId": "listModelDevelopmentClusters",
                    "parameters": [
                        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                        {"name": "pageToken", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": answers(
                        {
                            "type": "object",
                            "properties": {
                                "clusters": {"type": "array", "items": CLUSTER_REF},
                                "nextPageToken": {"type": "string"},
                            },
                        }
                    ),
                },
                "post": {
                    "operationId": "createModelDevelopmentCluster",
                    "parameters": [
                        {"name": "model_development_cluster_id", "in": "query", "required": True, "schema": SLUG}
                    ],
                    "requestBody": {"required": True, **json_body(CLUSTER_REF)},
                    "responses": answers(OPERATION_REF),
                },
            },
            CLUSTER_PATH: {
                "parameters": path_params("project", "location", "cluster"),
                "get": {"operationId": "getModelDevelopmentCluster", "responses": answers(CLUSTER_REF)},
                "patch": {
                    "operationId": "updateModelDevelopmentCluster",
                    "requestBody": {"required": True, **json_body(CLUSTER_REF)},
                    "responses": answers(OPERATION_REF),
                },
                "delete": {"operationId": "deleteModelDevelopmentCluster", "responses": answers(OPERATION_REF)},
            },
            CLUSTER_PATH + "/slurmJobs": {
                "parameters": path_params("project", "location", "cluster"),
                "get": {
                    "operationId": "listSlurmJobs",
                    "description": "Console extension: the cluster's Slurm jobs as of the last sync, newest first.",
                    "parameters": [
                        {"name": "pageSize", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                        {"name": "pageToken", "in": "query", "schema": {"type": "string"}},
                        {"name": "filter", "in": "query", "schema": {"type": "string"}, "description": FILTER_HELP},
                    ],
                    "responses": answers(
                        {
                            "type": "object",
                            "properties": {
                                "slurmJobs": {"type": "array", "items": SLURM_JOB},
                                "nextPageToken": {"type": "string"},
                                "syncTime": {"type": "string", "format": "date-time", "nullable": True},
                                "syncError": {"type": "string"},
                            },
                        }
                    ),
                },
            },
            CLUSTER_PATH + ":callSlurmRestApi": {
                "parameters": path_params("project", "location", "cluster"),
                "post": {
                    "operationId": "callSlurmRestApi",
                    "requestBody": {
                        "required": True,
                        **json_body(
                            {
                                "type": "object",
                                "required": ["method", "path"],
                                "properties": {
                                    "method": {
                                        "type": "string",
                                        "enum": ["HTTP_METHOD_GET", "HTTP_METHOD_POST", "HTTP_METHOD_DELETE"],
                                    },
                                    "path": {"type": "string"},
                                    "body": {},
                                },
                            }
                        ),
                    },
                    "responses": answers(
                        {"type": "object", "properties": {"status_code": {"type": "integer"}, "body": {}}}
                    ),
                },
            },
            BASE + "/operations/{operation}": {
                "parameters": [
                    *path_params("project", "location"),
                    {"name": "operation", "in": "path", "required": True, "schema": {"type": "string"}},
                ],
                "get": {"operationId": "getOperation", "responses": answers(OPERATION_REF)},
            },
        },
    }
