from datetime import UTC, datetime, time, timedelta

from django import forms
from django.utils import timezone

from controlplane.models import ApiKeyScope
from controlplane.roles import Role

ROLE_CHOICES = [(role.label, role.label) for role in Role]


class RoleField(forms.TypedChoiceField):
    def __init__(self, **kwargs):
        super().__init__(choices=ROLE_CHOICES, coerce=Role.from_name, **kwargs)


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="An existing user, or a new one to create")
    email = forms.EmailField(required=False, help_text="Only used when the user is new")
    role = RoleField(initial=Role.VIEWER.label)


class MemberRoleForm(forms.Form):
    role = RoleField()


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(choices=ApiKeyScope.choices, widget=forms.CheckboxSelectMultiple)
    expires_in_days = forms.IntegerField(
        required=False, min_value=1, max_value=3650, help_text="Empty: never expires"
    )

    def expires_at(self):
        days = self.cleaned_data.get("expires_in_days")
        return timezone.now() + timedelta(days=days) if days else None


PERIODS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=200)
    action = forms.CharField(required=False, max_length=100)
    period = forms.ChoiceField(
        required=False, choices=[("", "any time")] + [(key, f"last {key}") for key in PERIODS]
    )
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            self.add_error("until", "must not be before 'since'")
        return data

    def filters(self) -> dict:
        data = self.cleaned_data
        since = until = None
        if data.get("period"):
            since = timezone.now() - PERIODS[data["period"]]
        if data.get("since"):
            since = _start_of_day(data["since"])
        if data.get("until"):
            until = _start_of_day(data["until"]) + timedelta(days=1)
        return {"actor": data.get("actor", ""), "action": data.get("action", ""), "since": since, "until": until}


def _start_of_day(day) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)
