"""Pagination that refuses what it cannot read: ?limit=abc or ?offset=-1 answer 400, not page one."""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination


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
