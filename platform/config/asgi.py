"""ASGI entry point: HTTP to Django, WebSockets to Channels consumers.

Run with ``cd platform && uvicorn config.asgi:application``.
"""

import os
import sys
from pathlib import Path

# The apps import the shared contracts from the `tandem` package at the repository root.
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")

from django.core.asgi import get_asgi_application  # noqa: E402

# Set up Django before anything imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from accounts.websocket_auth import TokenAuthMiddleware  # noqa: E402
from alerts.routing import websocket_urlpatterns as user_websocket_urlpatterns  # noqa: E402
from common.request_limits import RequestBodyLimits  # noqa: E402
from config.lifespan import lifespan  # noqa: E402
from runs.routing import websocket_urlpatterns as run_websocket_urlpatterns  # noqa: E402
from workspaces.routing import websocket_urlpatterns as project_websocket_urlpatterns  # noqa: E402

# A run's sockets, a project's (its runs' metrics, for the workspace), and a user's own (the unread
# count of the navigation's badge).
websocket_urlpatterns = [*run_websocket_urlpatterns, *project_websocket_urlpatterns, *user_websocket_urlpatterns]

application = ProtocolTypeRouter(
    {
        # Bodies past their route's cap or deadline are refused before Django reads them.
        "http": RequestBodyLimits.from_settings(django_asgi_app),
        "websocket": AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns))),
        # Starts and stops this process's ProcessReport (tandem/runtime/process_reports.py).
        "lifespan": lifespan,
    }
)
