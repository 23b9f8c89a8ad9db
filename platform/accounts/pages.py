"""The dashboard's API tokens page: list, create (the raw value shown once), revoke."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from common.confirmation import action_confirmed, confirmation_page
from common.domain_errors import DomainError, NotFound

from .forms import ApiTokenCreateForm
from .selectors import api_token_get_for_user, api_token_list, auth_locked_out
from .services import api_token_create, api_token_revoke


@login_required
@require_http_methods(["GET", "POST"])
def token_list_page(request):
    form = ApiTokenCreateForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            token, raw = api_token_create(user=request.user, name=form.cleaned_data["name"])
        except DomainError as error:
            form.add_domain_error(error)
        else:
            # Rendered, not redirected: the raw value must not be kept in a session
            # message, and this answer is the only time it is shown.
            created = {"token": token, "raw": raw}
            form = ApiTokenCreateForm()
    context = {"tokens": api_token_list(user=request.user), "form": form, "created": created}
    return render(request, "accounts/tokens.html", context)


@login_required
@require_POST
def token_revoke_page(request, token_id: int):
    try:
        token = api_token_get_for_user(user=request.user, token_id=token_id)
    except NotFound as error:
        raise Http404(error.message) from None
    if not action_confirmed(request):
        return confirmation_page(
            request, question=f"Revoke token '{token.name}'?",
            consequence="Every client that uses it is refused from its next request on. This cannot be undone.",
            confirm_label="Revoke token", back_url=reverse("token-list-page"))
    api_token_revoke(token=token)
    messages.success(request, f"Token '{token.name}' revoked.")
    return redirect("token-list-page")


class ThrottledLoginView(LoginView):
    """The login page, refusing (429) a user name or client address that failed too often.

    The authentication backend (accounts.backends) counts the failures and refuses too, on
    this login and the admin's alike; this view only answers 429 where it would refuse.
    """

    template_name = "accounts/login.html"

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        address = request.META.get("REMOTE_ADDR")
        if auth_locked_out(username=username, address=address):
            form = self.get_form()
            form.errors.clear()
            form.add_error(None, "Too many failed logins; try again later.")
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

