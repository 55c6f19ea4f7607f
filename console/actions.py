"""The POST-action views' one shape: do the service call, flash its outcome, redirect."""

from django.contrib import messages
from django.shortcuts import redirect

from .errors import ConsoleError, page_message


def act(request, action, *, done, then, failed_then=None):
    """Call `action()`. A ConsoleError (a service's refusal) becomes the page's error message and the
    answer redirects to `failed_then` (default `then`); otherwise `done` (a sentence, or a function of
    action's result giving one) is the success message and the answer redirects to `then` (a URL, a
    model with get_absolute_url, or a function of the result giving one, with `failed_then` given)."""
    try:
        result = action()
    except ConsoleError as exc:
        messages.error(request, page_message(exc))
        return redirect(failed_then if failed_then is not None else then)
    messages.success(request, done(result) if callable(done) else done)
    return redirect(then(result) if callable(then) else then)
