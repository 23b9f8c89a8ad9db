"""API of projects."""

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.pagination import PageNumberPagination

from .selectors import project_get_for_user, project_list
from .serializers import ProjectCreateSerializer, ProjectSerializer
from .services import project_create


class ProjectListCreateView(APIView):
    def get(self, request):
        paginator = PageNumberPagination()
        page = paginator.paginate_queryset(project_list(user=request.user), request, view=self)
        return paginator.get_paginated_response(ProjectSerializer(page, many=True).data)

    def post(self, request):
        serializer = ProjectCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = project_create(owner=request.user, **serializer.validated_data)
        project = project_get_for_user(user=request.user, project_id=project.pk)
        return Response(ProjectSerializer(project).data, status=status.HTTP_201_CREATED)
