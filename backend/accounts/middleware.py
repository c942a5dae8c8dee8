"""Sign-in failures end at ``/?auth_error=<short message>``: never a traceback or an error page."""

from __future__ import annotations

import logging
from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from social_core.exceptions import (
    AuthCanceled,
    AuthConfigurationError,
    AuthCredentialError,
    AuthInputError,
    AuthPolicyError,
    AuthProviderError,
    AuthSessionError,
    SocialAuthBaseException,
)
from social_django.middleware import SocialAuthExceptionMiddleware

from backend.accounts.pipeline import NotOnAllowlist

logger = logging.getLogger(__name__)

# Most specific first: the first matching class gives the message.
MESSAGES: list[tuple[type[SocialAuthBaseException], str]] = [
    (
        NotOnAllowlist,
        "This GitHub account may not sign in to this server: ask its administrator to add it"
        " (or an organization you belong to) to TRAINYARD_GITHUB_ALLOW.",
    ),
    (AuthCanceled, "GitHub sign-in was cancelled."),
    (AuthSessionError, "The sign-in expired or was started in another browser: please sign in again."),
    (AuthInputError, "GitHub's answer was incomplete: please sign in again."),
    (AuthCredentialError, "GitHub did not accept the sign-in: please sign in again."),
    (AuthProviderError, "GitHub could not be reached: please try again later."),
    (AuthPolicyError, "This account may not sign in."),
    (AuthConfigurationError, "GitHub sign-in is not configured correctly on this server."),
]
FALLBACK = "Sign-in failed: please try again."


class SignInErrorMiddleware(SocialAuthExceptionMiddleware):
    """Handles every exception raised in the sign-in views (those that set ``request.social_strategy``)
    but a 404 for an unknown backend.

    Social-auth's failures get a message by kind; anything else is logged
    with its traceback and reported with a generic message. Whatever
    ``DEBUG`` says, so development shows the same page as production.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if getattr(request, "social_strategy", None) is None or isinstance(exception, Http404):
            return None
        message = self.get_message(request, exception)
        if message == FALLBACK:
            logger.error("GitHub sign-in failed", exc_info=exception)
        else:
            logger.warning("GitHub sign-in failed: %s (%r)", message, exception)
        return HttpResponseRedirect("/?" + urlencode({"auth_error": message}))

    def get_message(self, request: HttpRequest, exception: Exception) -> str:
        for kind, message in MESSAGES:
            if isinstance(exception, kind):
                return message
        return FALLBACK
