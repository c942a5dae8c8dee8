"""Every route of the runner's REST surface, under ``api/v1/runner/``
(``backend/config/urls.py`` includes this module there, once).

``register/`` is authenticated by the registration token in its body; every
``jobs/<job>/…`` route by the runner's own token and fenced to the attempt it
names (``runner_auth``). The runner (``runner/trainyard_runner``) calls these
paths; docs/API.md lists them."""

from __future__ import annotations

from django.urls import URLPattern, path

from backend.clouds.api_selfhosted import RunnerRegisterView
from backend.runs.api import runner, runner_artifacts

job = "jobs/<uuid:job>"

urlpatterns: list[URLPattern] = [
    path("register/", RunnerRegisterView.as_view()),
    path(f"{job}/secrets/", runner.RunnerJobSecretsView.as_view()),
    path(f"{job}/inputs/", runner.RunnerJobInputsView.as_view()),
    path(f"{job}/urls/", runner.RunnerDownloadUrlView.as_view()),
    path(f"{job}/data/", runner.RunnerJobDataView.as_view()),
    path(f"{job}/data/url/", runner.RunnerJobDataUrlView.as_view()),
    path(f"{job}/environment/", runner.RunnerEnvironmentView.as_view()),
    path(f"{job}/environment/done/", runner.RunnerEnvironmentDoneView.as_view()),
    path(f"{job}/artifacts/", runner_artifacts.RunnerArtifactBeginView.as_view()),
    path(f"{job}/artifacts/<uuid:artifact>/urls/", runner_artifacts.RunnerArtifactUploadUrlsView.as_view()),
    path(f"{job}/artifacts/<uuid:artifact>/parts/", runner_artifacts.RunnerArtifactPartsView.as_view()),
    path(f"{job}/artifacts/<uuid:artifact>/complete/", runner_artifacts.RunnerArtifactCompleteView.as_view()),
    path(f"{job}/checkpoints/", runner_artifacts.RunnerCheckpointBeginView.as_view()),
    path(f"{job}/checkpoints/done/", runner_artifacts.RunnerCheckpointDoneView.as_view()),
    path(f"{job}/caches/", runner_artifacts.RunnerCacheBeginView.as_view()),
    path(f"{job}/kept/", runner_artifacts.RunnerKeptView.as_view()),
]
