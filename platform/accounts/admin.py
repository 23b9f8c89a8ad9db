from django.contrib import admin

from .models import ApiToken, Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "owner", "created_at"]
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Staff may see and delete (revoke) tokens; making one is the user's own business."""

    list_display = ["id", "user", "name", "prefix", "created_at", "last_used_at"]
    readonly_fields = ["user", "name", "prefix", "created_at", "last_used_at"]
    exclude = ["digest"]

    def has_add_permission(self, request):
        return False
