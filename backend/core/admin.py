"""Operators see parked tasks in the Django admin."""

from __future__ import annotations

from django.contrib import admin

from backend.core.models import ParkedTask


@admin.register(ParkedTask)
class ParkedTaskAdmin(admin.ModelAdmin):
    list_display = ("created_at", "task_name", "task_id", "deaths", "subject", "outcome")
    readonly_fields = ("task_name", "task_id", "args", "kwargs", "deaths", "subject", "outcome")
