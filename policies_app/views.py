from django.shortcuts import render

from controlplane.decorators import tenant_view


@tenant_view("read")
def policy_list(request):
    return render(request, "policies_app/policy_list.html", {"section": "policies"})


@tenant_view("read")
def denials(request):
    return render(request, "policies_app/denials.html", {"section": "denials"})
