from django import forms


class PolicyCreateForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="lowercase letters, digits and dashes")


class EditorForm(forms.Form):
    source = forms.CharField(widget=forms.Textarea(attrs={"spellcheck": "false", "rows": 28}), strip=False,
                             max_length=200_000)
    note = forms.CharField(required=False, max_length=2000)


class TryForm(forms.Form):
    """One exec request to judge with the editor's document (its arguments written as a shell would
    split them, for convenience: nothing runs them through a shell)."""

    source = forms.CharField(strip=False, max_length=200_000, widget=forms.HiddenInput)
    bin = forms.CharField(max_length=255, widget=forms.TextInput(attrs={"placeholder": "pytest", "size": 10}))
    args = forms.CharField(required=False, strip=False, max_length=20_000,
                           widget=forms.TextInput(attrs={"placeholder": "-q tests/", "size": 22}))
    cwd = forms.CharField(required=False, max_length=4096,
                          widget=forms.TextInput(attrs={"placeholder": "/workspace", "size": 12}))


class NoteForm(forms.Form):
    note = forms.CharField(max_length=2000, help_text="why: it goes to the audit log")


class ReplayForm(forms.Form):
    limit = forms.IntegerField(min_value=1, max_value=20_000, initial=10_000, required=False)


LIFETIMES = {"1h": 1, "8h": 8, "24h": 24, "7d": 7 * 24, "30d": 30 * 24}  # hours


class ExceptionForm(forms.Form):
    """A temporary exception granted from a denial: how long, and why."""

    lifetime = forms.ChoiceField(choices=[(key, key) for key in LIFETIMES], initial="24h",
                                 help_text="it is never honoured after this")
    reason = forms.CharField(min_length=3, max_length=2000, help_text="why it cannot wait for a policy version")
    ticket = forms.CharField(required=False, max_length=100, help_text="e.g. SEC-1234")


class AllowThisForm(forms.Form):
    expires = forms.ChoiceField(choices=[("", "never"), *((key, key) for key in LIFETIMES)], required=False)
