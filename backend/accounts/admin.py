from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from backend.accounts.models import ApiToken, Invitation, Membership, User, Workspace

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


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ("workspace", "github_login", "email", "role", "invited_by", "created_at", "accepted_at")
