"""Tenant fixtures for these tests."""

from tests.support.fixtures import *  # noqa: F403
