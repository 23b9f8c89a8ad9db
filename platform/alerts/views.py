"""API of alerts: a project's rules (writers change them) and the caller's notifications."""

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status
from rest_framework.generics import GenericAPIView, ListAPIView
from rest_framework.response import Response

from accounts.query_params import project_query_param
from accounts.selectors import project_resolve_for_user
from common.openapi import ErrorSerializer

from .filters import AlertRuleFilter, NotificationFilter
from .models import AlertRule, Notification, WebhookDelivery
from .selectors import (
    alert_rule_get_for_user,
    alert_rule_list,
    notification_get_for_user,
    notification_list,
    notification_unread_count,
    webhook_delivery_list,
)
from .serializers import (
    AlertRuleSerializer,
    AlertRuleWriteSerializer,
    MarkedReadSerializer,
    NotificationSerializer,
    UnreadCountSerializer,
    WebhookDeliverySerializer,
)
from .services import (
    alert_rule_create,
    alert_rule_delete,
    alert_rule_update,
    notification_mark_read,
    notifications_mark_all_read,
)

CONFLICT = {409: OpenApiResponse(ErrorSerializer, description="The project has a rule of that name.")}


@extend_schema(tags=["alerts"])
@extend_schema_view(get=extend_schema(
    summary="List alert rules",
    description="The alert rules of the caller's projects. Webhook secrets are never returned."))
class AlertRuleListCreateView(ListAPIView):
    queryset = AlertRule.objects.none()  # the model, for the schema
    serializer_class = AlertRuleSerializer
    filterset_class = AlertRuleFilter
    ordering_fields = {"name": "name", "created_at": "created_at", "id": "id"}
    ordering = ["project__name", "project_id", "name", "id"]

    def get_queryset(self):
        project = project_query_param(self.request)  # another's project is a 404
        return alert_rule_list(user=self.request.user, project=project)

    @extend_schema(
        summary="Create an alert rule",
        description="Project writers (owners, members) only. A webhook URL must be allowed by "
        "TANDEM_WEBHOOK_ALLOWED_HOSTS and needs a webhook_secret (write-only).",
        request=AlertRuleWriteSerializer, responses={201: AlertRuleSerializer, **CONFLICT})
    def post(self, request):
        serializer = AlertRuleWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        project = project_resolve_for_user(user=request.user, project_id=data.pop("project", None))
        rule = alert_rule_create(user=request.user, project=project, **data)
        # Read back as the list shows it: with the caller's role and the delivery counts.
        rule = alert_rule_get_for_user(user=request.user, rule_id=rule.pk)
        return Response(AlertRuleSerializer(rule).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["alerts"])
class AlertRuleDetailView(GenericAPIView):
    serializer_class = AlertRuleSerializer

    @extend_schema(summary="Get an alert rule",
                   description="One rule of the caller's projects. Its webhook_secret is never returned; "
                   "webhook_secret_set says whether it has one.")
    def get(self, request, rule_id: int):
        return Response(AlertRuleSerializer(alert_rule_get_for_user(user=request.user, rule_id=rule_id)).data)

    @extend_schema(
        summary="Change an alert rule",
        description="Project writers only. Only the fields sent change; a webhook_secret left out is kept. "
        "A changed rule starts over: it may fire again for a condition that still holds.",
        request=AlertRuleWriteSerializer(partial=True), responses={200: AlertRuleSerializer, **CONFLICT})
    def patch(self, request, rule_id: int):
        rule = alert_rule_get_for_user(user=request.user, rule_id=rule_id)
        serializer = AlertRuleWriteSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        rule = alert_rule_update(user=request.user, rule=rule, changes=serializer.changes())
        return Response(AlertRuleSerializer(alert_rule_get_for_user(user=request.user, rule_id=rule.pk)).data)

    @extend_schema(summary="Delete an alert rule",
                   description="Project writers only. Its notifications and deliveries stay.",
                   responses={204: None})
    def delete(self, request, rule_id: int):
        alert_rule_delete(user=request.user, rule=alert_rule_get_for_user(user=request.user, rule_id=rule_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=["alerts"])
@extend_schema_view(get=extend_schema(
    summary="List a rule's webhook deliveries",
    description="Newest first, each with every attempt: its outcome, the receiver's status code and the "
    "start of its answer, or the error. A delivery past TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE is "
    "rate_limited (not posted; status_reason says so). Viewers read the URL redacted."))
class AlertRuleDeliveryListView(ListAPIView):
    queryset = WebhookDelivery.objects.none()
    serializer_class = WebhookDeliverySerializer
    ordering_fields = {"created_at": "created_at", "id": "id"}
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        self.rule = alert_rule_get_for_user(user=self.request.user, rule_id=self.kwargs["rule_id"])
        return webhook_delivery_list(rule=self.rule)

    def get_serializer_context(self):
        rule = getattr(self, "rule", None)  # none while the schema is generated
        return {**super().get_serializer_context(), "caller_role": getattr(rule, "caller_role", None)}


@extend_schema(tags=["notifications"])
@extend_schema_view(get=extend_schema(
    summary="List your notifications",
    description="One per alert firing in your projects, newest first; `?unread=true` for the unread only."))
class NotificationListView(ListAPIView):
    queryset = Notification.objects.none()
    serializer_class = NotificationSerializer
    filterset_class = NotificationFilter
    ordering_fields = {"created_at": "created_at", "id": "id"}
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        return notification_list(user=self.request.user)


@extend_schema(tags=["notifications"])
class NotificationUnreadCountView(GenericAPIView):
    serializer_class = UnreadCountSerializer

    @extend_schema(summary="Count your unread notifications", description="What the dashboard's badge shows.")
    def get(self, request):
        return Response({"unread": notification_unread_count(user=request.user)})


@extend_schema(tags=["notifications"])
class NotificationReadView(GenericAPIView):
    serializer_class = NotificationSerializer

    @extend_schema(summary="Mark a notification read", description="One of the caller's notifications; "
                   "marking it again keeps the first read_at.", request=None, responses={200: NotificationSerializer})
    def post(self, request, notification_id: int):
        notification = notification_get_for_user(user=request.user, notification_id=notification_id)
        return Response(NotificationSerializer(notification_mark_read(notification=notification)).data)


@extend_schema(tags=["notifications"])
class NotificationsReadAllView(GenericAPIView):
    serializer_class = MarkedReadSerializer

    @extend_schema(summary="Mark all your notifications read",
                   description="Every unread notification of the caller; answers how many were marked.", request=None,
                   responses={200: MarkedReadSerializer})
    def post(self, request):
        return Response({"marked": notifications_mark_all_read(user=request.user)})
