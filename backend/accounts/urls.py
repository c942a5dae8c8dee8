"""Sign-in (GitHub via social-auth, local login), the caller, workspaces, members, tokens."""

from __future__ import annotations

from django.urls import include, path

from backend.accounts import api, api_device, api_ssh_keys, api_workspaces, views

ws = "api/v1/workspaces/<slug:workspace>"

# Only sign-in: social-auth's disconnect and launch views are not exposed.
social_patterns = (
    [
        path("login/<str:backend>/", views.github_begin, name="begin"),
        path("complete/<str:backend>/", views.github_complete, name="complete"),
    ],
    "social",
)

urlpatterns = [
    path("auth/", include(social_patterns)),
    path("api/v1/auth/config/", api.AuthConfigView.as_view()),
    path("api/v1/auth/login/", api.LoginView.as_view()),
    path("api/v1/auth/logout/", api.LogoutView.as_view()),
    # `trainyard login` in the browser (RFC 8628): the device starts and polls; the person decides.
    path("api/v1/auth/device/", api_device.DeviceStartView.as_view()),
    path("api/v1/auth/device/token/", api_device.DeviceTokenView.as_view()),
    path("api/v1/auth/device/<str:user_code>/", api_device.DeviceRequestView.as_view()),
    path("api/v1/auth/device/<str:user_code>/approve/", api_device.DeviceApproveView.as_view()),
    path("api/v1/auth/device/<str:user_code>/deny/", api_device.DeviceDenyView.as_view()),
    path("api/v1/tokens/", api.TokenListView.as_view()),
    path("api/v1/tokens/<uuid:token_id>/", api.TokenDetailView.as_view()),
    path("api/v1/me/ssh-keys/", api_ssh_keys.SshKeyListView.as_view()),
    # A fingerprint's base64 may hold "/".
    path("api/v1/me/ssh-keys/<path:key>/", api_ssh_keys.SshKeyDetailView.as_view()),
    path("api/v1/workspaces/", api_workspaces.WorkspaceListView.as_view()),
    path(f"{ws}/members/", api_workspaces.MemberListView.as_view()),
    path(f"{ws}/members/<str:username>/", api_workspaces.MemberDetailView.as_view()),
    path(f"{ws}/invitations/", api_workspaces.InvitationListView.as_view()),
    path(f"{ws}/invitations/<uuid:invitation>/", api_workspaces.InvitationDetailView.as_view()),
    path(f"{ws}/audit/", api_workspaces.AuditListView.as_view()),
    path(f"{ws}/guards/", api_workspaces.GuardDefaultsView.as_view()),
]
