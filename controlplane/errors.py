"""Error pages: JSON under /api/, the dashboard's layout elsewhere; never a traceback."""

from django.http import JsonResponse
from django.shortcuts import render


def _wants_json(request) -> bool:
    return request.path.startswith("/api/")


def forbidden(request, exception=None):
    """Django's 403 handler, and the answer to a role that may not (`exception` may be the reason)."""
    reason = str(exception) if exception and str(exception) else "your role does not allow this"
    if _wants_json(request):
        return JsonResponse({"error": "permission_denied", "detail": reason}, status=403)
    return render(request, "error.html", {"title": "Not allowed", "reason": reason}, status=403)


def not_found(request, exception=None):
    if _wants_json(request):
        return JsonResponse({"error": "not_found", "detail": "not found"}, status=404)
    return render(
        request,
        "error.html",
        {"title": "Not found", "reason": "There is nothing here, or it is not yours to see."},
        status=404,
    )


def server_error(request):
    if _wants_json(request):
        return JsonResponse({"error": "server_error", "detail": "internal error; it has been logged"}, status=500)
    return render(
        request, "error.html", {"title": "Something broke", "reason": "The error has been logged."}, status=500
    )
