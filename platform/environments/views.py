"""API of the environment registry."""

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.selectors import project_get_for_user, project_resolve_for_user
from config.pagination import PageNumberPagination
from config.query_params import int_query_param

from .selectors import (
    PROBES_SHOWN,
    environment_get_for_user,
    environment_list,
    environment_probe_list,
    environment_version_get,
)
from .serializers import (
    EnvironmentDetailSerializer,
    EnvironmentProbeSerializer,
    EnvironmentRegisterSerializer,
    EnvironmentSerializer,
    EnvironmentVersionDetailSerializer,
    EnvironmentVersionRegisterSerializer,
)
from .services import environment_probe_request, environment_register, environment_version_register


def _version_body(version) -> dict:
    probes = environment_probe_list(version=version)[:PROBES_SHOWN]
    return EnvironmentVersionDetailSerializer(version, context={"probes": probes}).data


class EnvironmentListCreateView(APIView):
    def get(self, request):
        project_id = int_query_param(request, "project")
        project = None
        if project_id is not None:
            project = project_get_for_user(user=request.user, project_id=project_id)
        environments = environment_list(user=request.user, project=project)
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(environments, request, view=self)
        return paginator.get_paginated_response(EnvironmentSerializer(page, many=True).data)

    def post(self, request):
        serializer = EnvironmentRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = project_resolve_for_user(user=request.user, project_id=data.get("project"))
        version = environment_register(
            user=request.user, project=project, spec=serializer.to_spec(name=data["name"])
        )
        environment = environment_get_for_user(user=request.user, environment_id=version.environment_id)
        body = EnvironmentDetailSerializer(environment).data
        return Response(body, status=status.HTTP_201_CREATED)


class EnvironmentDetailView(APIView):
    def get(self, request, environment_id: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        return Response(EnvironmentDetailSerializer(environment).data)


class EnvironmentVersionCreateView(APIView):
    def post(self, request, environment_id: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        serializer = EnvironmentVersionRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        version = environment_version_register(
            user=request.user, environment=environment, spec=serializer.to_spec(name=environment.name)
        )
        return Response(_version_body(version), status=status.HTTP_201_CREATED)


class EnvironmentVersionDetailView(APIView):
    def get(self, request, environment_id: int, number: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        version = environment_version_get(environment=environment, number=number)
        return Response(_version_body(version))


class EnvironmentVersionProbeView(APIView):
    def post(self, request, environment_id: int, number: int):
        environment = environment_get_for_user(user=request.user, environment_id=environment_id)
        version = environment_version_get(environment=environment, number=number)
        probe = environment_probe_request(version=version, purpose="manual", user=request.user)
        return Response(EnvironmentProbeSerializer(probe).data, status=status.HTTP_202_ACCEPTED)
