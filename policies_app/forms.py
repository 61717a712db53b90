from django import forms


class PolicyCreateForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="lowercase letters, digits and dashes")


class EditorForm(forms.Form):
    source = forms.CharField(widget=forms.Textarea(attrs={"spellcheck": "false", "rows": 28}), strip=False,
                             max_length=200_000)
    note = forms.CharField(required=False, max_length=2000)


class NoteForm(forms.Form):
    note = forms.CharField(max_length=2000, help_text="why: it goes to the audit log")


class ReplayForm(forms.Form):
    limit = forms.IntegerField(min_value=1, max_value=20_000, initial=10_000, required=False)
