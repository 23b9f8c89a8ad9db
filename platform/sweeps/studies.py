"""Where sweeps' Optuna studies live: the platform's own database, through Optuna's RDBStorage (its tables
beside the platform's), so that a sweep survives a restart of the platform and its workers."""

from __future__ import annotations

import functools

import optuna
from django.db import connection
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from .models import Sweep
from .search_space import grid, search_space_distributions

# Optuna logs each trial it creates or finishes at INFO: the sweep's records already say so.
optuna.logging.set_verbosity(optuna.logging.WARNING)

_DRIVERS = {"postgresql": "postgresql+psycopg", "sqlite": "sqlite"}


def _database_url() -> URL:
    settings = connection.settings_dict
    vendor = connection.vendor
    if vendor not in _DRIVERS:
        raise RuntimeError(f"sweeps keep their studies in PostgreSQL or SQLite, not {vendor}")
    if vendor == "sqlite":
        return URL.create("sqlite", database=str(settings["NAME"]))
    return URL.create(_DRIVERS[vendor], username=settings["USER"] or None, password=settings["PASSWORD"] or None,
                      host=settings["HOST"] or None, port=int(settings["PORT"]) if settings["PORT"] else None,
                      database=settings["NAME"])


@functools.cache
def _storage(url: str) -> optuna.storages.RDBStorage:
    # No pool: a sweep's advance is a few statements every few seconds, and a pooled connection would
    # outlive its use (a restarted database, a test database being dropped).
    return optuna.storages.RDBStorage(url, engine_kwargs={"poolclass": NullPool})


def study_storage() -> optuna.storages.RDBStorage:
    """The study storage of this process's database (one engine per database, made once)."""
    return _storage(_database_url().render_as_string(hide_password=False))


#: Completed trials a pruner waits for before it prunes (Optuna's n_startup_trials): until then every
#: trial runs to its end, to give the pruner something to compare with.
PRUNER_STARTUP_TRIALS = 2


def sweep_study(sweep: Sweep) -> optuna.Study:
    """The sweep's study, with its sampler and pruner (made anew each time: the study holds the state)."""
    # Samplers hold no state a restart would lose: the grid's visits and TPE's history are the study's
    # trials. The seed moves with the trials started, so that a re-created random sampler draws anew.
    seed = sweep.seed + sweep.trials.count()
    sampler = {
        Sweep.Sampler.GRID: lambda: optuna.samplers.GridSampler(
            grid(search_space_distributions(sweep.search_space, sampler=sweep.sampler)), seed=sweep.seed),
        Sweep.Sampler.RANDOM: lambda: optuna.samplers.RandomSampler(seed=seed),
        Sweep.Sampler.TPE: lambda: optuna.samplers.TPESampler(seed=seed),
    }[sweep.sampler]()
    pruner = {
        Sweep.Pruner.NONE: optuna.pruners.NopPruner,
        Sweep.Pruner.MEDIAN: lambda: optuna.pruners.MedianPruner(n_startup_trials=PRUNER_STARTUP_TRIALS),
        Sweep.Pruner.SUCCESSIVE_HALVING: lambda: optuna.pruners.SuccessiveHalvingPruner(),
    }[sweep.pruner]()
    return optuna.create_study(study_name=sweep.study_name, storage=study_storage(), sampler=sampler, pruner=pruner,
                               direction=sweep.goal, load_if_exists=True)
