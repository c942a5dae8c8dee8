"""The accounts in the Django admin; and sign-in lockouts, which admins see and lift here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.admin import UserAdmin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from backend.accounts.models import ApiToken, Invitation, Membership, SignInLockout, SshKey, User, Workspace
from backend.accounts.services import lockout

admin.site.register(User, UserAdmin)


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "personal_owner", "log_cap_bytes", "storage_quota_bytes", "created_at")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("workspace", "user", "role")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("token_hash", "prefix")


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "fingerprint", "created_at", "last_used_at")
    readonly_fields = ("public_key", "fingerprint")


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ("workspace", "github_login", "email", "role", "invited_by", "created_at", "accepted_at")


class LockoutActive(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "locked now"), ("ended", "ended")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[SignInLockout]) -> QuerySet[SignInLockout]:
        now = lockout.lockout_now()
        if self.value() == "active":
            return queryset.filter(locked_until__gt=now)
        if self.value() == "ended":
            return queryset.filter(locked_until__lte=now)
        return queryset


@admin.register(SignInLockout)
class SignInLockoutAdmin(admin.ModelAdmin):
    """Who is locked out of password sign-in, and until when; ``Lift`` ends a lockout now.
    Read-only otherwise: a lockout is begun by wrong passwords, never by hand."""

    list_display = (
        "identity", "per", "failures", "created_at", "locked_until", "active", "last_username", "last_address",
    )  # fmt: skip
    list_filter = (LockoutActive, "per")
    search_fields = ("identity", "last_username", "last_address")
    ordering = ("-locked_until",)
    actions = ("lift",)
    readonly_fields = ("per", "identity", "failures", "locked_until", "last_username", "last_address", "created_at")

    @admin.display(boolean=True, description="locked now")
    def active(self, row: SignInLockout) -> bool:
        return row.locked_until > lockout.lockout_now()

    @admin.action(description="Lift the selected lockouts now")
    def lift(self, request: HttpRequest, queryset: QuerySet[SignInLockout]) -> None:
        lifted = lockout.lockouts_end(queryset)
        self.message_user(request, f"Lifted {lifted} lockout(s).", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: SignInLockout | None = None) -> bool:
        return False


class AdminLoginForm(AdminAuthenticationForm):
    """The admin's sign-in form (a password sign-in too: the lockouts hold there), saying when one refused it."""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            locked = lockout.lockout_of(self.request) if self.request is not None else None
            if locked is not None:
                raise ValidationError(locked.message, code="locked_out") from None
            raise


admin.site.login_form = AdminLoginForm
