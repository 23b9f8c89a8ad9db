"""``GET /api/``: a map of the API, open to anyone, which doubles as a liveness probe."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView


class ApiRootView(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request):
        return Response(
            {
                "schema": "/api/schema/",
                "docs": "/api/docs/",
                "tokens": "/api/tokens/",
                "projects": "/api/projects/",
                "environments": "/api/environments/",
                "runs": "/api/runs/",
                "run_config_schema": "/api/run-config/schema/",
                "trainer_claim": "/api/trainer/claim/",
            }
        )
