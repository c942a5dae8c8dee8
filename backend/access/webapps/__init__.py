"""Jobs' web apps in the browser: a job's declared port served through the
server on an origin of its own (TRAINYARD_APPS_URL), behind a grant tied to
the user's dashboard session (docs/decisions/0102-apps-origin.md)."""
