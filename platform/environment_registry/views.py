"""API of the environment registry."""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.response import Response

from accounts.query_params import project_query_param
from accounts.selectors import project_resolve_for_user
from common.openapi import ErrorSerializer

from .filters import EnvironmentFilter
from .models import Environment
from .selectors import (
    PROBES_SHOWN,
    environment_get_for_user,
    environment_list,
    environment_probe_list,
    environment_version_get,
)
from .serializers import (
    EnvironmentDetailSerializer,
    EnvironmentProbeRequestSerializer,
    EnvironmentProbeSerializer,
    EnvironmentRegisterSerializer,
    EnvironmentSerializer,
    EnvironmentVersionDetailSerializer,
    EnvironmentVersionRegisterSerializer,
)
from .services import (
    environment_probe_request,
    environment_register,
    environment_version_register,
    probe_baseline_parse,
)


def _version_body(version) -> dict:
    probes = environment_probe_list(version=version)[:PROBES_SHOWN]
    return EnvironmentVersionDetailSerializer(version, context={"probes": probes}).data


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
        version = environment_register(
            user=request.user, project=project, spec=serializer.to_spec(name=data["name"]),
            secret_settings=serializer.secret_settings_sent(), baseline=probe_baseline_parse(data["baseline"]),
        )
        environment = environment_get_for_user(user=request.user, environment_id=version.environment_id)
        body = EnvironmentDetailSerializer(environment).data
        return Response(body, status=status.HTTP_201_CREATED)


@extend_schema(tags=["environments"])
class EnvironmentDetailView(GenericAPIView):
    serializer_class = EnvironmentDetailSerializer

    def get(self, request, environment_id: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        return Response(EnvironmentDetailSerializer(environment).data)


@extend_schema(tags=["environments"])
class EnvironmentVersionCreateView(GenericAPIView):
    serializer_class = EnvironmentVersionRegisterSerializer

    @extend_schema(request=EnvironmentVersionRegisterSerializer,
                   responses={201: EnvironmentVersionDetailSerializer})
    def post(self, request, environment_id: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        serializer = EnvironmentVersionRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        version = environment_version_register(
            user=request.user, environment=environment, spec=serializer.to_spec(name=environment.name),
            secret_settings=serializer.secret_settings_sent(),
            baseline=probe_baseline_parse(serializer.validated_data["baseline"]),
        )
        return Response(_version_body(version), status=status.HTTP_201_CREATED)


@extend_schema(tags=["environments"])
class EnvironmentVersionDetailView(GenericAPIView):
    serializer_class = EnvironmentVersionDetailSerializer

    def get(self, request, environment_id: int, number: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        version = environment_version_get(environment=environment, number=number)
        return Response(_version_body(version))


@extend_schema(tags=["environments"])
class EnvironmentVersionProbeView(GenericAPIView):
    serializer_class = EnvironmentProbeSerializer

    @extend_schema(request=EnvironmentProbeRequestSerializer, responses={202: EnvironmentProbeSerializer})
    def post(self, request, environment_id: int, number: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        version = environment_version_get(environment=environment, number=number)
        asked = EnvironmentProbeRequestSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        probe = environment_probe_request(version=version, purpose="manual", user=request.user,
                                          baseline=probe_baseline_parse(asked.validated_data["baseline"]))
        return Response(EnvironmentProbeSerializer(probe).data, status=status.HTTP_202_ACCEPTED)
