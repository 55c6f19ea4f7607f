"""Parsers for request fields that every form and API shares, adding their message to FieldErrors' dict."""


def whole_number(value, field, errors, *, low=None, high=None):
    """The whole number `value` spells, or None with the reason added to `errors[field]`."""
    try:
        number = int(value)
        if isinstance(value, float) and number != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        errors.setdefault(field, []).append("must be a whole number")
        return None
    if (low is not None and number < low) or (high is not None and number > high):
        rule = f"from {low} to {high}" if low is not None and high is not None else (
            f"at least {low}" if low is not None else f"at most {high}")  # fmt: skip
        errors.setdefault(field, []).append(f"must be {rule}")
        return None
    return number
