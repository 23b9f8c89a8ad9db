"""API of environments."""

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.selectors import project_get_for_user, project_resolve_for_user
from config.pagination import PageNumberPagination
from config.query_params import int_query_param
from tandem.contracts import EnvironmentSpec

from .selectors import environment_list
from .serializers import EnvironmentRegisterSerializer, EnvironmentSerializer
from .services import environment_register


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
        spec = EnvironmentSpec(
            name=data["name"],
            kind=data["kind"],
            entrypoint=data["entrypoint"],
            params=data["params"],
        )
        environment = environment_register(user=request.user, project=project, spec=spec)
        return Response(EnvironmentSerializer(environment).data, status=status.HTTP_201_CREATED)
