"""Pagination that refuses what it cannot read: ?limit=abc, ?offset=-1 or a forged cursor answer 400, not
page one."""

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination, LimitOffsetPagination


class StrictLimitOffsetPagination(LimitOffsetPagination):
    max_limit = 1000

    def get_limit(self, request):
        return self.number(request, self.limit_query_param, self.default_limit, minimum=1, maximum=self.max_limit)

    def get_offset(self, request):
        return self.number(request, self.offset_query_param, 0, minimum=0)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"].update(minimum=1, maximum=self.max_limit)
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"].update(minimum=0)
        return parameters

    @staticmethod
    def number(request, name, default, *, minimum, maximum=None):
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValidationError({name: ["must be a whole number"]}) from None
        if value < minimum or (maximum is not None and value > maximum):
            limit = f" and at most {maximum}" if maximum is not None else ""
            raise ValidationError({name: [f"must be at least {minimum}{limit}"]})
        return value


class JobCursorPagination(CursorPagination):
    """Cursor pagination over Slurm jobs, newest first: pages stay put while the sync adds jobs.

    A cursor that this API did not hand out, or a ?limit outside 1..1000, answers 400. The page
    carries how fresh it is: `synced` (the last sync that reached Slurm) and `slurm_error`."""

    ordering = "-job_id"
    page_size = 100
    max_page_size = 1000
    page_size_query_param = "limit"

    def get_page_size(self, request):
        return StrictLimitOffsetPagination.number(
            request, self.page_size_query_param, self.page_size, minimum=1, maximum=self.max_page_size
        )

    def decode_cursor(self, request):
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            cursor = False
        if cursor is False or (cursor and cursor.position is not None and not cursor.position.isdigit()):
            reason = "is not a cursor this API gave out; start again without it"
            raise ValidationError({self.cursor_query_param: [reason]})
        return cursor

    def get_paginated_response(self, data):
        response = super().get_paginated_response(data)
        response.data.update(getattr(self, "freshness", {}))
        return response

    def get_paginated_response_schema(self, schema):
        found = super().get_paginated_response_schema(schema)
        found["properties"]["synced"] = {"type": "string", "format": "date-time", "nullable": True}
        found["properties"]["slurm_error"] = {"type": "string"}
        return found
