"""API of environments."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response

from accounts.selectors import project_resolve_for_user
from config.openapi import ErrorSerializer
from config.query_params import project_query_param
from tandem.contracts import EnvironmentSpec

from .filters import EnvironmentFilter
from .models import Environment
from .selectors import environment_list
from .serializers import EnvironmentRegisterSerializer, EnvironmentSerializer
from .services import environment_register


@extend_schema(tags=["environments"])
class EnvironmentListCreateView(ListAPIView):
    queryset = Environment.objects.none()  # the model, for the schema
    serializer_class = EnvironmentSerializer
    filterset_class = EnvironmentFilter
    ordering_fields = {"name": "name", "created_at": "created_at", "id": "id"}
    ordering = ["project__name", "project_id", "name"]

    def get_queryset(self):
        project = project_query_param(self.request)  # another's project is a 404
        return environment_list(user=self.request.user, project=project)

    @extend_schema(
        request=EnvironmentRegisterSerializer,
        responses={
            201: EnvironmentSerializer,
            409: OpenApiResponse(ErrorSerializer, description="The name is taken."),
        },
    )
    def post(self, request):
        serializer = EnvironmentRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = project_resolve_for_user(user=request.user, project_id=data.get("project"))
        spec = EnvironmentSpec(
            name=data["name"],
            kind=data["kind"],
            entrypoint=data["entrypoint"],
            params=data["params"],
        )
        environment = environment_register(user=request.user, project=project, spec=spec)
        return Response(EnvironmentSerializer(environment).data, status=status.HTTP_201_CREATED)
