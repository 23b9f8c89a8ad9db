"""The OpenAPI schema and its docs, and a schemathesis fuzz of the whole API on a live server."""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from urllib.parse import urlsplit

import pytest
import schemathesis
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from playwright.sync_api import sync_playwright
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from accounts.services import api_token_create, membership_add
from alerts.services import alert_fire, alert_rule_create
from checkpoints.services import checkpoints_report
from common.operation_docs import OPERATION_DOCS
from dataset_registry.services import dataset_upload
from runs.services import run_claim_next
from sweeps.services import sweep_create
from tandem.contracts import TRAINER_HEADER, CheckpointInfo, CheckpointReport
from telemetry.services import trace_request
from tests.browser import launch_chromium
from trajectories.services import trajectory_samples_record
from workspaces.services import report_create, saved_view_save

from .trajectory_builders import calculator_sample

# Examples per operation, per generation mode and per choice of path ids; the
# whole fuzz stays well under two minutes on a shared two-core machine. Raise it
# (TANDEM_FUZZ_EXAMPLES=200) for a deeper hunt.
MAX_EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", 12))
# What the schema promises about answers: no 5xx, and every status code, content
# type, header and body as documented. Left out are the checks of how strictly the
# API validates input (a schema cannot say that a name must not hold a NUL byte).
RESPONSE_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def test_the_schema_lists_every_api_route_with_the_error_shape(client_for, trainer):
    # A trainer's schema: only trainers see the trainer's routes.
    response = client_for(trainer).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    schema = json.loads(response.content)
    paths = schema["paths"]
    for path in (
        "/api/runs/",
        "/api/runs/{run_id}/",
        "/api/runs/{run_id}/cancel/",
        "/api/runs/{run_id}/metrics/",
        "/api/tokens/",
        "/api/tokens/{token_id}/",
        "/api/projects/{project_id}/members/{username}/",
        "/api/trainer/claim/",
    ):
        assert path in paths, path
    error = schema["components"]["schemas"]["Error"]
    assert error["properties"]["error"]["$ref"] == "#/components/schemas/ErrorDetail"
    assert set(schema["components"]["schemas"]["ErrorDetail"]["properties"]) == {
        "code",
        "message",
        "fields",
    }
    cancel = paths["/api/runs/{run_id}/cancel/"]["post"]["responses"]
    assert {"200", "401", "403", "404", "409"} <= set(cancel)
    assert cancel["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    created = paths["/api/tokens/"]["post"]["responses"]["201"]["content"]["application/json"]
    assert created["schema"]["$ref"].endswith("/ApiTokenCreated")
    listing = paths["/api/runs/"]["get"]
    parameters = {parameter["name"] for parameter in listing["parameters"]}
    assert {"status", "project", "environment", "ordering", "page", "page_size"} <= parameters
    ordering = next(p for p in listing["parameters"] if p["name"] == "ordering")
    assert "-created_at" in ordering["description"]
    security = schema["components"]["securitySchemes"]["tokenAuth"]
    assert security == {**security, "type": "apiKey", "in": "header", "name": "Authorization"}


def _schema(client) -> dict:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def _operations(schema: dict) -> dict[tuple[str, str], dict]:
    return {(method.upper(), path): operation for path, operations in schema["paths"].items()
            for method, operation in operations.items()}


def test_every_operation_has_a_short_summary_and_a_description(client_for, trainer):
    operations = _operations(_schema(client_for(trainer)))

    assert len(operations) >= 50
    for key, operation in operations.items():
        assert operation.get("summary"), key
        assert len(operation["summary"]) <= 80, key
        assert operation.get("description"), key
    # Every entry of the table names an operation that exists (no typo leaves one undocumented).
    assert set(OPERATION_DOCS) <= set(operations), set(OPERATION_DOCS) - set(operations)


def test_the_methods_of_one_path_each_have_their_own_summary_and_description(api):
    operations = _operations(_schema(api))

    listing, creating = operations[("GET", "/api/runs/")], operations[("POST", "/api/runs/")]
    assert (listing["summary"], creating["summary"]) == ("List runs", "Start a run")
    assert listing["description"] != creating["description"]
    assert "Queue a new run" in creating["description"]
    paths = {path for _, path in operations}
    for path in paths:
        methods = [operation for (_, other), operation in operations.items() if other == path]
        assert len({operation["summary"] for operation in methods}) == len(methods), path
        assert len({operation["description"] for operation in methods}) == len(methods), path


def test_trainer_routes_are_in_a_trainers_schema_only(client_for, api, trainer, make_user, client):
    staff = make_user("operator", is_staff=True)

    def trainer_paths(schema: dict) -> set[str]:
        return {path for path in schema["paths"] if path.startswith("/api/trainer/")}

    assert trainer_paths(_schema(api)) == set()
    assert trainer_paths(_schema(client)) == set()  # nobody signed in
    assert trainer_paths(_schema(client_for(staff))) == set()  # staff are not trainers
    for_trainer = trainer_paths(_schema(client_for(trainer)))
    assert {"/api/trainer/claim/", "/api/trainer/runs/{run_id}/telemetry/"} <= for_trainer
    # The users' routes stay in everyone's schema.
    assert "/api/runs/" in _schema(api)["paths"]


def test_the_schema_generates_without_a_warning_and_validates(db):
    """A view drf-spectacular cannot describe (no serializer, say) fails here."""
    out = io.StringIO()

    call_command("spectacular", "--validate", "--fail-on-warn", stdout=out, stderr=out)

    assert "openapi: 3" in out.getvalue()


def test_the_docs_page_serves_swagger_ui_from_our_own_static_files(client, db):
    page = client.get("/api/docs/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()
    asset = client.get("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert asset.status_code == 200
    b"".join(asset.streaming_content)


@pytest.fixture
def fuzz_target(server, make_user, make_project, make_environment, make_run, tmp_path):
    """A staff user who owns a project with a member, an environment and runs, on uvicorn."""
    user = make_user("fuzzer", trainer=True)
    project = make_project(owner=user, name="fuzzed")
    membership_add(project=project, user=make_user("teammate"), role="member")
    environment = make_environment(project)
    make_run(project, environment=environment)
    claimed = run_claim_next(worker="fuzz:1")
    queued = make_run(project, environment=environment)
    spare_token, _ = api_token_create(user=user, name="spare")
    sample = calculator_sample(claimed.pk)
    trajectory_samples_record(run=claimed, samples=[sample])
    trace = trace_request(user=user, run=claimed, steps=2)
    dataset = dataset_upload(user=user, project=project, name="fuzzed-rows", file_name="rows.jsonl", file=io.BytesIO(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
        .encode() + b"\n"))
    # Checkpoint directories the fuzzer may delete (or export, queued to no worker).
    checkpoints_report(run=claimed, report=CheckpointReport(checkpoints=[
        CheckpointInfo(step=step, policy_version=step, path=str(tmp_path / f"run-{claimed.pk}" / str(step)),
                       size_bytes=1) for step in (1, 2)]))
    rule = alert_rule_create(user=user, project=project, name="fuzzed failures", kind="run_failed")
    firing = alert_fire(rule=rule, subject=f"run:{claimed.pk}", text="Run failed.", details={}, run_id=claimed.pk)
    sweep = sweep_create(user=user, project=project, environment=environment.name, name="fuzzed sweep",
                         base_config={"sft_steps": 0}, search_space={"rl_steps": {"type": "int", "low": 1, "high": 3}},
                         sampler="random", metric="reward_mean", goal="maximize", max_runs=2, concurrency=1)
    view = saved_view_save(user=user, project=project, name="fuzzed view", query="g=tag&m=reward_mean,loss")
    report = report_create(user=user, project=project, title="fuzzed report", body="{{view: fuzzed view}}")
    return {
        "base": server,
        # The trainer's writes name it: as the holder of ``claimed``, they reach past the holder check.
        "headers": {"Authorization": f"Token {user.raw_token}", TRAINER_HEADER: "fuzz:1"},
        # Real ids, so that fuzzed bodies and queries reach more than the 404 of a random id.
        "path_parameters": {
            "run_id": st.sampled_from([claimed.pk, queued.pk]),
            "project_id": st.just(project.pk),
            "token_id": st.just(spare_token.pk),
            "username": st.sampled_from(["teammate", "fuzzer"]),
            "environment_id": st.just(environment.pk),
            "trajectory_id": st.just(sample.trajectory_id),
            "trace_id": st.just(trace.pk),
            "dataset_id": st.just(dataset.dataset_id),
            "name": st.just("fuzzed-rows"),
            "number": st.sampled_from([1, 2]),
            "step": st.sampled_from([1, 2]),
            "rule_id": st.just(rule.pk),
            "notification_id": st.just(firing.notifications.get(user=user).pk),
            "group_id": st.just(sample.group_id),
            "sweep_id": st.just(sweep.pk),
            "view_id": st.just(view.pk),
            "report_id": st.just(report.pk),
        },
    }


def test_schemathesis_finds_no_server_error_anywhere_in_the_api(fuzz_target):
    schema = schemathesis.openapi.from_url(
        f"{fuzz_target['base']}/api/schema/?format=json", headers=fuzz_target["headers"]
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    statuses: Counter[int] = Counter()
    server_errors: list[str] = []
    unsatisfiable: list[str] = []
    nonconforming: list[str] = []

    def fuzz(operation, mode: GenerationMode, real_ids: bool) -> None:
        strategy = operation.as_strategy(generation_mode=mode)
        names = [p.name for p in operation.path_parameters]
        if real_ids:
            chosen = {name: fuzz_target["path_parameters"][name] for name in names}
        else:
            # Random ids, except that DELETE /api/tokens/<id>/ must not revoke the fuzzer's own.
            chosen = {"token_id": st.integers(min_value=10**6)} if "token_id" in names else {}
        strategy = st.tuples(strategy, st.fixed_dictionaries(chosen)).map(_with_path)

        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case):
            response = case.call(base_url=fuzz_target["base"], headers=fuzz_target["headers"])
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                server_errors.append(f"{operation.label}: {case.as_curl_command()}")
            try:
                case.validate_response(
                    response, checks=RESPONSE_CHECKS, headers=fuzz_target["headers"]
                )
            except (AssertionError, BaseExceptionGroup) as failure:
                nonconforming.append(f"{operation.label} {response.status_code}: {failure}")

        try:
            run()
        except Unsatisfiable:
            # No invalid input exists for an operation that takes none (GET /api/).
            assert mode is GenerationMode.NEGATIVE, operation.label
            unsatisfiable.append(operation.label)

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(operation, mode, real_ids=False)
            if operation.path_parameters:
                fuzz(operation, mode, real_ids=True)

    cases = sum(statuses.values())
    print(
        f"schemathesis: {len(operations)} operations, {cases} test cases, "
        f"{len(server_errors)} server errors, {len(nonconforming)} answers unlike the schema; statuses {dict(sorted(statuses.items()))}; "
        f"no negative cases for {unsatisfiable}"
    )
    assert len(operations) >= 20
    assert cases >= len(operations) * MAX_EXAMPLES
    assert not server_errors, "\n".join(server_errors[:20])
    assert not nonconforming, "\n\n".join(nonconforming[:10])
    assert statuses[200] and statuses[201] and statuses[400] and statuses[404]


def _with_path(pair):
    case, path_parameters = pair
    case.path_parameters = {**(case.path_parameters or {}), **path_parameters}
    return case


def test_the_docs_page_works_in_chromium_with_no_outside_request(server, user):
    """Swagger UI renders every operation from /api/schema/ with nothing fetched elsewhere."""
    outside: list[str] = []
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page()
        page.on(
            "request",
            lambda request: (
                outside.append(request.url)
                if urlsplit(request.url).netloc != urlsplit(server).netloc
                and not request.url.startswith("data:")
                else None
            ),
        )
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{server}/api/docs/")
        page.wait_for_selector(".swagger-ui .opblock", timeout=20_000)
        operations = page.locator(".swagger-ui .opblock").count()
        browser.close()

    assert operations >= 20
    assert not outside, outside
    assert not errors, errors
