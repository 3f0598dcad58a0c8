"""The worker process's stores and settings: one store per database per
process, built on the first run that needs it."""

from __future__ import annotations

import threading
import weakref

from celery import Celery

from celery_routines.config import Settings, settings_from
from celery_routines.store import Store
from celery_routines.worker.connection import PING_AFTER_IDLE, close_kept

_stores: dict[str, Store] = {}
# Weak: an app that goes away (tests build many) must not hand its settings to
# a new app that happens to get the same id().
_settings: weakref.WeakKeyDictionary[Celery, Settings] = weakref.WeakKeyDictionary()
_stores_lock = threading.Lock()


def settings_for(app: Celery) -> Settings:
    settings = _settings.get(app)
    if settings is None:
        settings = _settings[app] = settings_from(app)
    return settings


def store_for(app: Celery) -> Store:
    """One store per database per process (engines are not shared across a fork)."""
    url = settings_for(app).database_url
    store = _stores.get(url)
    if store is None:
        with _stores_lock:
            store = _stores.get(url)
            if store is None:
                store = Store.from_settings(settings_for(app), ping_after_idle=PING_AFTER_IDLE)
                _stores[url] = store
    return store


def forget_stores() -> None:
    """Close this process's stores and their kept connections (tests,
    benchmarks: a store per throwaway database)."""
    with _stores_lock:
        stores = list(_stores.values())
        _stores.clear()
    for store in stores:
        close_kept(store)
        store.dispose()
    _settings.clear()


def forget_inherited_connections() -> None:
    """After a fork: the connections inherited from the parent must not be
    used (nor closed) in the child."""
    with _stores_lock:
        for store in _stores.values():
            store.engine.dispose(close=False)
