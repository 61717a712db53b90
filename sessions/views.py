from django.shortcuts import render

from controlplane.decorators import tenant_view


@tenant_view("read")
def session_list(request):
    return render(request, "sessions/session_list.html", {"section": "sessions"})
