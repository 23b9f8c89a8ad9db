"""API of projects, their members, and the caller's API tokens."""

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from common.domain_errors import InvalidInput
from common.openapi import ErrorSerializer

from .filters import ApiTokenFilter, MembershipFilter, ProjectFilter
from .models import ApiToken, Membership, MetricExplorerLayout, Project
from .selectors import (
    api_token_get_for_user,
    api_token_list,
    membership_get,
    membership_list,
    metric_explorer_layout_get,
    project_get_for_user,
    project_list,
)
from .serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    MembershipCreateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    MetricExplorerLayoutSerializer,
    ProjectCreateSerializer,
    ProjectSerializer,
)
from .services import (
    api_token_create,
    api_token_revoke,
    membership_change_role,
    membership_create,
    membership_remove,
    metric_explorer_layout_save,
    project_create,
)

CONFLICT = {409: OpenApiResponse(ErrorSerializer, description="Conflicts with existing data.")}


@extend_schema(tags=["projects"])
class ProjectListCreateView(ListAPIView):
    """The caller's projects, each with the caller's ``role`` in it."""

    queryset = Project.objects.none()  # the model, for the schema; get_queryset is the real one
    serializer_class = ProjectSerializer
    filterset_class = ProjectFilter
    ordering_fields = {"name": "name", "created_at": "created_at", "id": "id"}
    ordering = ["name", "id"]

    def get_queryset(self):
        return project_list(user=self.request.user)

    @extend_schema(request=ProjectCreateSerializer, responses={201: ProjectSerializer, **CONFLICT})
    def post(self, request):
        serializer = ProjectCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = project_create(owner=request.user, **serializer.validated_data)
        project = project_get_for_user(user=request.user, project_id=project.pk)
        return Response(ProjectSerializer(project).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["projects"])
class ProjectDetailView(GenericAPIView):
    serializer_class = ProjectSerializer

    def get(self, request, project_id: int):
        project = project_get_for_user(user=request.user, project_id=project_id)
        return Response(ProjectSerializer(project).data)


@extend_schema(tags=["projects"])
class MembershipListCreateView(ListAPIView):
    """Who belongs to the project; any member may read it, only owners change it."""

    queryset = Membership.objects.none()
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilter
    ordering_fields = {"username": "user__username", "role": "role", "created_at": "created_at"}
    ordering = ["user__username", "id"]

    def get_queryset(self):
        project = project_get_for_user(user=self.request.user, project_id=self.kwargs["project_id"])
        return membership_list(project=project)

    @extend_schema(
        request=MembershipCreateSerializer, responses={201: MembershipSerializer, **CONFLICT}
    )
    def post(self, request, project_id: int):
        project = project_get_for_user(user=request.user, project_id=project_id)
        serializer = MembershipCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = membership_create(
            actor=request.user, project=project, **serializer.validated_data
        )
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["projects"])
class MembershipDetailView(GenericAPIView):
    serializer_class = MembershipSerializer

    def _membership(self, request, project_id: int, username: str):
        project = project_get_for_user(user=request.user, project_id=project_id)
        return membership_get(project=project, username=username)

    def get(self, request, project_id: int, username: str):
        return Response(MembershipSerializer(self._membership(request, project_id, username)).data)

    @extend_schema(
        request=MembershipUpdateSerializer, responses={200: MembershipSerializer, **CONFLICT}
    )
    def patch(self, request, project_id: int, username: str):
        membership = self._membership(request, project_id, username)
        serializer = MembershipUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = membership_change_role(
            actor=request.user, membership=membership, role=serializer.validated_data["role"]
        )
        return Response(MembershipSerializer(membership).data)

    @extend_schema(responses={204: None, **CONFLICT})
    def delete(self, request, project_id: int, username: str):
        membership_remove(
            actor=request.user, membership=self._membership(request, project_id, username)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=["tokens"])
class ApiTokenListCreateView(ListAPIView):
    """The caller's API tokens. Only a hash is stored: the raw value is shown once, on creation."""

    queryset = ApiToken.objects.none()
    serializer_class = ApiTokenSerializer
    filterset_class = ApiTokenFilter
    # REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["token-create"]: TANDEM_TOKEN_CREATE_RATE.
    throttle_scope = "token-create"
    ordering_fields = {"name": "name", "created_at": "created_at", "last_used_at": "last_used_at"}
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        return api_token_list(user=self.request.user)

    def get_throttles(self):
        # Minting tokens is throttled per user (a stolen session cannot mint them by the
        # thousand); listing them is not.
        return [ScopedRateThrottle()] if self.request.method == "POST" else []

    @extend_schema(
        request=ApiTokenCreateSerializer,
        responses={201: ApiTokenCreatedSerializer, **CONFLICT, 429: OpenApiResponse(
            ErrorSerializer, description="Too many tokens minted lately (TANDEM_TOKEN_CREATE_RATE).")},
    )
    def post(self, request):
        serializer = ApiTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, raw = api_token_create(user=request.user, **serializer.validated_data)
        token.token = raw
        return Response(ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["tokens"])
class ApiTokenDetailView(GenericAPIView):
    serializer_class = ApiTokenSerializer

    def get(self, request, token_id: int):
        token = api_token_get_for_user(user=request.user, token_id=token_id)
        return Response(ApiTokenSerializer(token).data)

    @extend_schema(responses={204: None})
    def delete(self, request, token_id: int):
        """Revoke the token: the next request that presents it gets 401."""
        api_token_revoke(token=api_token_get_for_user(user=request.user, token_id=token_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=["dashboard"])
class MetricExplorerLayoutView(APIView):
    """``GET ?page=run|compare``, ``PUT {page, smoothing, panels}``: your metric explorer's panels on that page."""

    reads_query_parameters = True

    @extend_schema(summary="Your metric explorer layout", parameters=[
        OpenApiParameter("page", str, enum=MetricExplorerLayout.Page.values, default="run"),
    ], responses={200: MetricExplorerLayoutSerializer})
    def get(self, request):
        page = request.query_params.get("page", MetricExplorerLayout.Page.RUN)
        if page not in MetricExplorerLayout.Page.values:
            raise InvalidInput.for_field("page", f"One of {', '.join(MetricExplorerLayout.Page.values)}.")
        return Response({"page": page, **metric_explorer_layout_get(user=request.user, page=page)})

    @extend_schema(summary="Save your metric explorer layout", request=MetricExplorerLayoutSerializer,
                   responses={200: MetricExplorerLayoutSerializer})
    def put(self, request):
        serializer = MetricExplorerLayoutSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        page = serializer.validated_data.pop("page")
        metric_explorer_layout_save(user=request.user, page=page, layout=serializer.validated_data)
        return Response({"page": page, **serializer.validated_data})
