"""Whether the Hugging Face hub can be reached now, asked once and cheaply, so that a model name that is neither local
nor cached is refused at once when it cannot (:func:`models.loading.load_model` then reads the local cache only)."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

HUB_PROBE_SECONDS = 3.0  # how long the one request of :func:`hub_offline` may take
HUB_PROBE_TTL = 30.0  # how long its answer is kept (seconds)
_hub_probe: dict = {}  # {"at": monotonic time, "offline": bool} of the last probe
_hub_probe_lock = threading.Lock()


def hub_offline() -> bool:
    """Whether the Hugging Face hub is out of reach now: ``HF_HUB_OFFLINE`` is set, or one HEAD request to its
    endpoint (``HF_ENDPOINT``; huggingface_hub's own HTTP session, so its proxies and certificates) gets no answer
    within :data:`HUB_PROBE_SECONDS`. Any HTTP answer, an error status included, means reachable. The answer is
    kept for :data:`HUB_PROBE_TTL` seconds, so the loads of one page probe once.

    Without it, a name that is neither local nor cached waits through huggingface_hub's retries (6 tries per file,
    1+2+4+8+8 s apart: 23 s measured with the endpoint refusing connections) before the offline message; a cached
    hub model waits as long per file before its cached copy is read."""
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return True
    with _hub_probe_lock:
        now = time.monotonic()
        if _hub_probe and now - _hub_probe["at"] < HUB_PROBE_TTL:
            return _hub_probe["offline"]
        from huggingface_hub.utils import get_session

        try:
            get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_SECONDS)
            offline = False
        except Exception:  # noqa: BLE001 - refused, unresolved, timed out, a proxy's failure: no hub now
            offline = True
        _hub_probe.update(at=time.monotonic(), offline=offline)
        if offline:
            log.warning("the Hugging Face hub (%s) cannot be reached: models are read from the local cache only",
                        constants.ENDPOINT)
        return offline
