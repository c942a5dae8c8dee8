from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from backend.access import api as access
from backend.access.webapps import views as apps_views
from backend.accounts.api import HealthView, MeView
from backend.artifacts import api as artifacts
from backend.artifacts.views import storage_archive, storage_object
from backend.billing import api as billing
from backend.clouds import api as clouds
from backend.clouds import api_selfhosted as selfhosted
from backend.clouds import api_volumes as volumes
from backend.clouds import views as clouds_views
from backend.core import spa
from backend.data import api as data
from backend.metrics import api as metrics
from backend.notify import api as notify
from backend.repos import api as repos
from backend.runs.api import run_artifacts
from backend.runs.api import views as runs
from backend.vault import api as vault

ws = "api/v1/workspaces/<slug:workspace>"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("storage/<str:token>", storage_object, name="storage-object"),
    path("storage-archive/<str:token>", storage_archive, name="storage-archive"),
    path("api/v1/health/", HealthView.as_view()),
    path("api/v1/me/", MeView.as_view()),
    path("", include("backend.accounts.urls")),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file: no inline script (backend/core/csp.py).
    path("api/v1/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path(f"{ws}/runs/", runs.RunListView.as_view()),
    path(f"{ws}/runs/plan/", runs.RunPlanView.as_view()),
    path(f"{ws}/runs/sources/", runs.RunSourceListView.as_view()),
    path(f"{ws}/runs/<str:run>/", runs.RunDetailView.as_view()),
    path(f"{ws}/runs/<str:run>/stop/", runs.RunStopView.as_view()),
    path(f"{ws}/runs/<str:run>/rerun/", runs.RunRerunView.as_view()),
    path(f"{ws}/runs/<str:run>/lineage/", runs.RunLineageView.as_view()),
    path(f"{ws}/runs/<str:run>/artifacts/", run_artifacts.RunArtifactsView.as_view()),
    path(f"{ws}/runs/<str:run>/exports/", run_artifacts.RunExportsView.as_view()),
    path(f"{ws}/runs/<str:run>/sessions/", access.SessionGrantView.as_view()),
    path(f"{ws}/runs/<str:run>/metrics/", metrics.RunMetricsView.as_view()),
    path(f"{ws}/runs/<str:run>/metrics/series/", metrics.JobSeriesView.as_view()),
    path(f"{ws}/metrics/compare/", metrics.CompareView.as_view()),
    path(f"{ws}/costs/", billing.CostReportView.as_view()),
    path(f"{ws}/budgets/", billing.BudgetsView.as_view()),
    # The workspace's own budget; any other name is a member's.
    path(f"{ws}/budgets/workspace/", billing.BudgetView.as_view()),
    path(f"{ws}/budgets/<str:username>/", billing.BudgetView.as_view()),
    path(f"{ws}/sessions/", access.SessionListView.as_view()),
    path(f"{ws}/sessions/<uuid:session>/end/", access.SessionEndView.as_view()),
    path(f"{ws}/jobs/<uuid:job>/logs/", runs.JobLogsView.as_view()),
    path(f"{ws}/jobs/<uuid:job>/logs/raw", runs.JobRawLogView.as_view()),
    path(f"{ws}/blobs/", runs.BlobCreateView.as_view()),
    path(f"{ws}/environments/", runs.EnvironmentListView.as_view()),
    path(f"{ws}/names/", runs.NamesView.as_view()),
    path(f"{ws}/environments/<str:key>/", runs.EnvironmentDetailView.as_view()),
    path(f"{ws}/environments/<str:key>/lock", runs.EnvironmentLockView.as_view()),
    path(f"{ws}/tags/", runs.TagListView.as_view()),
    path(f"{ws}/tags/<str:name>/", runs.TagDetailView.as_view()),
    path(f"{ws}/secrets/", vault.SecretListView.as_view()),
    path(f"{ws}/secrets/<str:name>/", vault.SecretDetailView.as_view()),
    path(f"{ws}/artifacts/<uuid:artifact>/files/<path:path>", artifacts.ArtifactFileView.as_view()),
    path(f"{ws}/artifacts/<uuid:artifact>/archive/", artifacts.ArtifactArchiveView.as_view()),
    path(f"{ws}/repos/", repos.RepoListView.as_view()),
    path(f"{ws}/repos/credential/", repos.RepoCredentialView.as_view()),
    path(f"{ws}/instances/", clouds.InstanceListView.as_view()),
    path(f"{ws}/instances/<str:name>/terminate/", clouds.InstanceTerminateView.as_view()),
    path(f"{ws}/runners/", selfhosted.SelfHostedRunnerListView.as_view()),
    path(f"{ws}/runners/registration-tokens/", selfhosted.RegistrationTokenListView.as_view()),
    path(f"{ws}/runners/registration-tokens/<uuid:token>/", selfhosted.RegistrationTokenDetailView.as_view()),
    path(f"{ws}/runners/<uuid:runner>/", selfhosted.SelfHostedRunnerView.as_view()),
    path(f"{ws}/runners/<uuid:runner>/revoke/", selfhosted.SelfHostedRunnerRevokeView.as_view()),
    path(f"{ws}/backends/", clouds.BackendListView.as_view()),
    path(f"{ws}/data/endpoint/", data.DataEndpointView.as_view()),
    path(f"{ws}/notifications/", notify.NotificationsView.as_view()),
    path(f"{ws}/notifications/<uuid:pk>/", notify.NotificationView.as_view()),
    path(f"{ws}/notifications/<uuid:pk>/test/", notify.NotificationTestView.as_view()),
    path(f"{ws}/notifications/<uuid:pk>/deliveries/", notify.NotificationDeliveriesView.as_view()),
    path(f"{ws}/backends/aws/setup/", clouds.AwsSetupView.as_view()),
    path(f"{ws}/backends/<str:name>/", clouds.BackendDetailView.as_view()),
    path(f"{ws}/backends/<str:name>/validate/", clouds.BackendValidateView.as_view()),
    path(f"{ws}/offers/", clouds.OfferListView.as_view()),
    path(f"{ws}/volumes/", volumes.VolumeListView.as_view()),
    path(f"{ws}/volumes/<str:name>/", volumes.VolumeDetailView.as_view()),
    # Every runner call but its websocket (backend/runs/api/runner_urls.py).
    path("api/v1/runner/", include("backend.runs.api.runner_urls")),
    # The runner and the CLI as pip installs them (no auth: public code): a find-links page,
    # a PEP 503 project page, a wheel.
    path("runner/wheels/", clouds_views.runner_wheels_index),
    path("runner/wheels/<str:project>/", clouds_views.runner_wheels_project),
    path("runner/wheels/<str:name>", clouds_views.runner_wheel),
    path("cli/wheels/", clouds_views.cli_wheels_index),
    path("cli/wheels/<str:project>/", clouds_views.cli_wheels_project),
    path("cli/wheels/<str:name>", clouds_views.cli_wheel),
    # A job's port in the browser: grants, then redirects to the app's own origin (backend/access/webapps).
    path("open/<slug:workspace>/<str:run>/<str:job>/<int:port>/", apps_views.open_app),
    # Last: `/` and every client-side route of the web dashboard.
    spa.urlpattern,
]
