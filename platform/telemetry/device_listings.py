"""The devices page's two listings, as its first paint and its API both serve them.

Each reads through the selectors and serializes as the API does, so that the
page's first paint and devices.js's later polls draw the same data.
"""

from __future__ import annotations

from .selectors import process_listing, producer_reports_by_run, run_list_trainer_held
from .serializers import ActiveRunDevicesSerializer, ProcessListSerializer


def active_run_devices(*, user) -> list[dict]:
    """What the devices page shows, for the page's first paint and its API alike."""
    runs = list(run_list_trainer_held(user=user))
    producers = producer_reports_by_run(run_ids=[run.pk for run in runs])
    return ActiveRunDevicesSerializer(runs, many=True, context={"producers": producers}).data


def tandem_processes(*, user) -> dict:
    """Every live Tandem process, for the devices page's first paint and its API alike."""
    listing = process_listing(user=user)
    if listing is None:
        return {"processes": None}
    return ProcessListSerializer(
        {"processes": listing.reports}, context={"visible_run_ids": listing.visible_run_ids}
    ).data
