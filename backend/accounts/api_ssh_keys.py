"""The caller's SSH public keys (``/api/v1/me/ssh-keys/``): a person's
credential, not a workspace's, so every workspace the person is a member of
records adding and removing one in its audit log (its admins see who may
now open a shell into its jobs). Removing one ends the person's live SSH
sessions (``backend.access.services.revocations``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.access.services.revocations import ssh_sessions_end_for_user
from backend.accounts.auth import signed_in_user
from backend.accounts.models import AuditKind, SshKey, User
from backend.accounts.selectors import memberships_of, ssh_keys_of
from backend.accounts.services.audit import Actor, audit_record
from backend.accounts.services.ssh_keys import MAX_KEY_CHARS, ssh_key_add, ssh_key_remove
from backend.core.errors import NotFound
from backend.core.ratelimit import client_ip


class SshKeyIn(serializers.Serializer):
    # Longer than any public key, so a pasted private key reaches the check that names it.
    public_key = serializers.CharField(max_length=4 * MAX_KEY_CHARS, trim_whitespace=False)
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")


class SshKeyOut(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    public_key = serializers.CharField(help_text="One OpenSSH line: <type> <base64>.")
    fingerprint = serializers.CharField(help_text="SHA256:…, as `ssh-keygen -l` prints it.")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)


class SshKeyListView(APIView):
    """The caller's SSH public keys, for SSH into their jobs."""

    throttle_scopes = {"POST": "token"}

    @extend_schema(responses=SshKeyOut(many=True))
    def get(self, request: Request) -> Response:
        return Response(SshKeyOut(ssh_keys_of(user=signed_in_user(request)), many=True).data)

    @extend_schema(request=SshKeyIn, responses={201: SshKeyOut})
    def post(self, request: Request) -> Response:
        data = SshKeyIn(data=request.data)
        data.is_valid(raise_exception=True)
        user = signed_in_user(request)
        key = ssh_key_add(user=user, public_key=data.validated_data["public_key"], name=data.validated_data["name"])
        _audit(request, user, "ssh_key.added", key)
        return Response(SshKeyOut(key).data, status=201)


class SshKeyDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, key: str) -> Response:
        """Removes the caller's key named by its id, fingerprint (SHA256:…) or
        name; the caller's live SSH sessions end (they may have used it)."""
        user = signed_in_user(request)
        removed = ssh_key_remove(user=user, ref=key)
        if removed is None:
            raise NotFound(f"You have no SSH key {key!r} (see `trainyard ssh-key ls`).")
        _audit(request, user, "ssh_key.removed", removed)
        ssh_sessions_end_for_user(user=user, reason=f"the SSH key {removed.name} ({removed.fingerprint}) was removed")
        return Response(status=204)


def _audit(request: Request, user: User, action: str, key: SshKey) -> None:
    actor = Actor(user=user, address=client_ip(request))
    for membership in memberships_of(user=user):
        audit_record(
            workspace_id=membership.workspace_id,
            kind=AuditKind.SSH_KEY,
            action=action,
            actor=actor,
            target=key.name,
            detail={"fingerprint": key.fingerprint},
        )
