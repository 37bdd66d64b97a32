"""Once started, the server's long-lived start-up objects are out of the collector's walks."""

from __future__ import annotations

import gc

from starlette.testclient import TestClient

from gate.config import default_settings
from gate.gate import PaymentGate
from server.app import YOUNG_COLLECTION_THRESHOLD, create_app


def test_a_started_server_freezes_its_start_up_heap_and_collects_young_objects_less_often(tmp_path):
    before = gc.get_threshold()
    gc.unfreeze()
    try:
        app = create_app(default_settings(str(tmp_path / "gate.db")), PaymentGate.from_parts)
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200
            assert gc.get_freeze_count() > 1000  # the modules, the configuration, the agents
            assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
