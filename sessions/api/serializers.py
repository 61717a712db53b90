import re
import uuid

from rest_framework import serializers

from controlplane.api.fields import Bool, Slug, Text
from policies_app.api.serializers import ExecRequestSerializer
from policies_app.decisions import record_payload
from sessions.models import Artifact, CommandRun, Packed, Session, SessionState, Snapshot


class WorkspaceSerializer(serializers.Serializer):
    repo = Text(max_length=100, help_text="an allowlisted local git repository's name")


class SessionCreateSerializer(serializers.Serializer):
    conversation_id = Text(max_length=200, help_text="the agent's conversation this session serves")
    policy = Slug(max_length=63, default="default", help_text="the policy whose published "
                                   "version the session pins")
    workspace = WorkspaceSerializer(required=False, help_text="start from a filtered checkout; else empty")
    persist = Bool(default=False, help_text="snapshot the workspace when the session ends (the policy's "
                   "persistence must be enabled)")
    resume = Text(max_length=36, required=False, help_text='"latest", or the id of a snapshot of this '
                  "conversation: the workspace starts as it, once every check holds")

    def validate_resume(self, value: str) -> str:
        if value != "latest":
            try:
                value = str(uuid.UUID(value))
            except ValueError:
                raise serializers.ValidationError('give "latest" or a snapshot\'s id') from None
        return value

    def validate(self, data: dict) -> dict:
        if data.get("resume") and data.get("workspace"):
            raise serializers.ValidationError({"resume": "a session starts from a snapshot or from a checkout, "
                                               "not both"})
        return data


ARTIFACT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class ArtifactCreateSerializer(serializers.Serializer):
    name = Text(max_length=100, help_text="letters, digits, `.`, `_` and `-`, e.g. wheel or test-report")
    paths = serializers.ListField(child=Text(max_length=1024, trim_whitespace=False), min_length=1, max_length=100,
                                  help_text="workspace-relative paths of files or directories (a directory: all "
                                  "of it); links are never followed")

    def validate_name(self, value: str) -> str:
        if not re.fullmatch(ARTIFACT_NAME, value):
            raise serializers.ValidationError("use letters, digits, `.`, `_` and `-` (at most 100), starting with a "
                                              "letter or digit")
        return value


class SessionListParams(serializers.Serializer):
    state = serializers.ChoiceField(choices=["", "active", *SessionState.values], default="", required=False,
                                    help_text="active: starting or ready; or one state")
    conversation_id = Text(max_length=200, default="", required=False, allow_blank=True)


class FileListParams(serializers.Serializer):
    path = Text(max_length=1024, default=".", trim_whitespace=False,
                help_text="a workspace-relative directory; `.` (the default) lists the whole workspace")


class FileEntrySerializer(serializers.Serializer):
    path = serializers.CharField(help_text="workspace-relative")
    type = serializers.ChoiceField(choices=["file", "dir", "symlink", "other"])
    size = serializers.IntegerField(allow_null=True, help_text="bytes, for a regular file")
    mode = serializers.CharField(help_text="permission bits in octal, e.g. 0o644")
    mtime = serializers.IntegerField(help_text="seconds since the epoch")


class FileListSerializer(serializers.Serializer):
    path = serializers.CharField()
    entries = FileEntrySerializer(many=True)
    truncated = serializers.BooleanField(help_text="more entries than were listed (10,000), or deeper than 32 levels")


class CommandCreateSerializer(ExecRequestSerializer):
    wait = Bool(default=False, help_text="answer with the result when the command ends")


class PolicyVersionRefSerializer(serializers.Serializer):
    policy = serializers.CharField()
    number = serializers.IntegerField()
    sha256 = serializers.CharField()


class SessionSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    policy_version = serializers.SerializerMethodField()
    stream_url = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = ["id", "conversation_id", "tenant", "state", "state_reason", "policy_version", "driver",
                  "rootfs_digest", "warm", "created_at", "ready_at", "ended_at", "expires_at", "stream_url",
                  "persist", "resumed_from", "snapshot", "snapshot_error"]

    snapshot = serializers.SerializerMethodField(help_text="the snapshot its end left (persist: true)")

    def get_snapshot(self, session: Session) -> str | None:
        if not session.persist:
            return None
        made = Snapshot.objects.filter(session=session).values_list("pk", flat=True).first()
        return str(made) if made else None

    def get_policy_version(self, session: Session) -> dict:
        version = session.policy_version
        return {"policy": version.policy.name, "number": version.number, "sha256": version.sha256}

    def get_stream_url(self, session: Session) -> str:
        return f"/ws/sessions/{session.pk}/"


class CommandSerializer(serializers.ModelSerializer):
    session = serializers.UUIDField(source="session_id")
    decision = serializers.SerializerMethodField()

    class Meta:
        model = CommandRun
        fields = ["id", "session", "state", "argv", "cwd", "timeout_s", "exit_code", "reason", "output", "truncated",
                  "output_bytes", "duration_ms", "created_at", "started_at", "ended_at", "decision"]

    def get_decision(self, command: CommandRun) -> dict:
        return record_payload(command.decision)


def command_body(command: CommandRun) -> dict:
    """What CommandSerializer makes of a command (the schema names its fields), built without
    the serializer's per-call field introspection: this answers every command of every agent."""
    return {"id": str(command.pk), "session": str(command.session_id), "state": command.state, "argv": command.argv,
            "cwd": command.cwd, "timeout_s": command.timeout_s, "exit_code": command.exit_code,
            "reason": command.reason, "output": command.output, "truncated": command.truncated,
            "output_bytes": command.output_bytes, "duration_ms": command.duration_ms,
            "created_at": _when(command.created_at), "started_at": _when(command.started_at),
            "ended_at": _when(command.ended_at), "decision": record_payload(command.decision)}


def _when(moment) -> str | None:
    return _DATETIME.to_representation(moment) if moment is not None else None


_DATETIME = serializers.DateTimeField()


def packed_body(row: Packed, *, manifest: bool = False) -> dict:
    """A snapshot or an artifact as the API shows it; with its whole signed manifest on request."""
    data = row.manifest if isinstance(row.manifest, dict) else {}
    body = {
        "id": str(row.pk), "kind": "artifact" if isinstance(row, Artifact) else "snapshot",
        "conversation_id": row.conversation_id, "session": str(row.session_id) if row.session_id else None,
        "digest": row.digest, "files": row.files, "bytes": row.plain_bytes, "stored_bytes": row.stored_bytes,
        "created_at": _when(row.created_at), "expires_at": _when(row.expires_at),
        "provenance": {key: data.get(key) for key in ("policy_version", "driver", "rootfs_digest", "commands_total")},
    }
    if isinstance(row, Artifact):
        body["name"] = row.name
    else:
        body["parent"] = str(row.parent_id) if row.parent_id else None
    if manifest:
        body["manifest"], body["signature"] = row.manifest, row.signature
    return body
