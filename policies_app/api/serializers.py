from rest_framework import serializers

from controlplane.api.fields import Bool, Int, Slug, Text
from policies_app.models import Policy, PolicyVersion


class VersionRefSerializer(serializers.Serializer):
    policy = serializers.CharField()
    number = serializers.IntegerField()
    sha256 = serializers.CharField()


class DecisionSerializer(serializers.Serializer):
    id = serializers.UUIDField(allow_null=True)
    allowed = serializers.BooleanField()
    effect = serializers.ChoiceField(["allow", "deny", "audit_deny"])
    reason_code = serializers.CharField(allow_null=True)
    rule_id = serializers.CharField(allow_null=True)
    message = serializers.CharField()
    hint = serializers.CharField(allow_blank=True)
    mode = serializers.ChoiceField(["enforce", "audit"])
    policy_version = VersionRefSerializer(allow_null=True)


class VersionSerializer(serializers.ModelSerializer):
    state = serializers.SerializerMethodField()
    author = serializers.SlugRelatedField(slug_field="username", read_only=True)
    parent = serializers.SlugRelatedField(slug_field="number", read_only=True)

    class Meta:
        model = PolicyVersion
        fields = ["number", "sha256", "state", "author", "created_at", "parent", "note", "source", "document"]

    def get_state(self, version: PolicyVersion) -> str:
        return version.state(self.context.get("published"))


class PolicySerializer(serializers.ModelSerializer):
    published = serializers.SerializerMethodField()
    shadow = serializers.SlugRelatedField(source="shadow_version", slug_field="number", read_only=True)

    class Meta:
        model = Policy
        fields = ["name", "created_at", "published", "shadow"]

    def get_published(self, policy: Policy) -> int | None:
        version = policy.published_version()
        return version.number if version else None


class PolicyCreateSerializer(serializers.Serializer):
    name = Slug(max_length=63)


class VersionCreateSerializer(serializers.Serializer):
    source = Text(trim_whitespace=False, max_length=200_000)
    note = Text(required=False, allow_blank=True, default="", max_length=2000)


class ReviewSerializer(serializers.Serializer):
    source = Text(trim_whitespace=False, max_length=200_000)
    replay = Bool(default=False, help_text="also re-judge the recent recorded requests")


class NoteSerializer(serializers.Serializer):
    note = Text(max_length=2000)


class RollbackSerializer(NoteSerializer):
    to = Int(min_value=1)


class ShadowSerializer(serializers.Serializer):
    version = Int(min_value=1, allow_null=True)


class ReplaySerializer(serializers.Serializer):
    limit = Int(min_value=1, max_value=20_000, default=10_000)


class DenialParams(serializers.Serializer):
    period = serializers.ChoiceField(choices=["1h", "24h", "7d", "30d"], required=False, help_text="default 24h")
    reason = serializers.CharField(required=False, help_text="a reason code")
    mode = serializers.ChoiceField(choices=["enforce", "audit"], required=False,
                                   help_text="enforce: real denials (default); audit: would-be denials")
    version = serializers.IntegerField(required=False, help_text="a policy version's id")
    since_version = serializers.IntegerField(
        required=False, help_text="insights: what is denied since this version (an id) was published that was not "
                                  "before; default: the last published version")
    start = serializers.DateTimeField(required=False, help_text="from (UTC); with `end`, instead of `period`; at "
                                                                "most 366 days")
    end = serializers.DateTimeField(required=False, help_text="to (UTC); default now")
    rule = serializers.CharField(required=False, help_text="only this rule's denials (counted exactly)")
    subject = serializers.CharField(required=False, help_text="only this program, path or host:port")
    pattern = serializers.CharField(required=False, help_text="only this argument pattern, e.g. `make <arg>`")
    conversation = serializers.CharField(required=False, help_text="only this conversation's denials")
    session = serializers.UUIDField(required=False, help_text="only this session's denials")


ARGS_CHARS = 256 * 1024  # all arguments together; one command's argv is stored with its decision


class ExecRequestSerializer(serializers.Serializer):
    """A command as the policy judges it (sessions' command bodies add `wait` to it)."""

    bin = Text(max_length=255, trim_whitespace=False, help_text="a bare program name, e.g. pytest")
    args = serializers.ListField(child=Text(allow_blank=True, trim_whitespace=False, max_length=65536),
                                 max_length=1000, default=list)
    cwd = Text(max_length=4096, default="/workspace", trim_whitespace=False)
    timeout_s = Int(min_value=1, required=False, help_text="at most the policy's "
                                         "limits.command_timeout_s")

    def validate_args(self, args: list[str]) -> list[str]:
        if sum(len(arg) for arg in args) > ARGS_CHARS:
            raise serializers.ValidationError(f"at most {ARGS_CHARS} characters in all; send large content as a "
                                              "workspace file")
        return args


def exec_request(data: dict) -> dict:
    """What the policy judges of a validated ExecRequestSerializer body (or one that extends it)."""
    request = {"bin": data["bin"], "args": data["args"], "cwd": data["cwd"]}
    if "timeout_s" in data:
        request["timeout_s"] = data["timeout_s"]
    return request


class EgressRequestSerializer(serializers.Serializer):
    host = Text(max_length=253)
    port = Int(min_value=1, max_value=65535)


class EvaluateSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["exec", "egress"], default="exec",
                                   help_text="exec: {bin, args, cwd?, timeout_s?}; egress: {host, port}")
    request = serializers.DictField(help_text="typed as a command's body (exec) or {host, port} (egress)")
    version = Int(min_value=1, required=False)

    def validate(self, data):
        """The request's fields typed as the API's own bodies type them: `"timeout_s": "5"` is a 400
        here as it is on a command, not a request judged as if it were 5."""
        inner = (ExecRequestSerializer if data["kind"] == "exec" else EgressRequestSerializer)(data=data["request"])
        if not inner.is_valid():
            raise serializers.ValidationError({"request": inner.errors})
        data["request"] = exec_request(inner.validated_data) if data["kind"] == "exec" else dict(inner.validated_data)
        return data


class ExceptionSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    policy = serializers.CharField(source="policy.name")
    kind = serializers.CharField()
    host = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    bin = serializers.CharField()
    args = serializers.ListField(child=serializers.CharField())
    cwd = serializers.CharField()
    reason = serializers.CharField()
    ticket = serializers.CharField()
    expires_at = serializers.DateTimeField()
    state = serializers.SerializerMethodField()
    use_count = serializers.IntegerField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    from_decision = serializers.UUIDField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    revoked_by = serializers.CharField()

    def get_state(self, grant) -> str:
        return grant.state()


class ExceptionCreateSerializer(serializers.Serializer):
    """Either `decision` (a recorded denial: its program, arguments and cwd, or its host and
    port), or `policy` + `bin` (+ `args`, `cwd`), or `policy` + `host` + `port` (one egress
    destination); and either `expires_at` or `ttl_s`."""

    decision = serializers.UUIDField(required=False)
    policy = Slug(required=False, max_length=63)
    bin = Text(required=False, max_length=64)
    host = Text(required=False, max_length=253)
    port = Int(required=False, min_value=1, max_value=65535)
    args = serializers.ListField(child=Text(allow_blank=True, trim_whitespace=False),
                                 required=False, default=list, max_length=1000)
    cwd = Text(required=False, default="/workspace", max_length=1000)
    expires_at = serializers.DateTimeField(required=False)
    ttl_s = Int(required=False, min_value=60, max_value=90 * 86400)
    reason = Text(max_length=2000)
    ticket = Text(required=False, allow_blank=True, default="", max_length=100)

    def validate(self, data):
        if ("expires_at" in data) == ("ttl_s" in data):
            raise serializers.ValidationError({"expires_at": "give expires_at or ttl_s (one of them)"})
        if "decision" in data:
            return data
        if data.get("host") or "port" in data:
            if data.get("bin"):
                raise serializers.ValidationError({"bin": "an exception is for a command or for a host, not both"})
            if not (data.get("policy") and data.get("host") and "port" in data):
                raise serializers.ValidationError({"host": "give policy, host and port"})
        elif not (data.get("policy") and data.get("bin")):
            raise serializers.ValidationError({"bin": "give decision, or policy and bin, or policy, host and port"})
        return data
